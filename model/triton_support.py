"""Whether our Triton kernels can run here, and where they launch.

Importing never fails. The kernels run on CUDA tensors, or on CPU tensors under triton's
interpreter (TRITON_INTERPRET=1, set by the tests on machines without a GPU: slow, float32 only,
since the interpreter's bfloat16 matmul is not exact).
"""

from __future__ import annotations

import contextlib
import functools
import os

import torch

from contracts.cli import UsageError

try:
    import triton
    import triton.language as tl
except ImportError:
    triton = tl = None

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
AVAILABLE = triton is not None and (torch.cuda.is_available() or INTERPRETED)


def runs_on(device: torch.device) -> bool:
    """Whether the kernels can run on tensors of `device` here."""
    return AVAILABLE and (device.type == "cuda" or (INTERPRETED and device.type == "cpu"))


def launching_on(device: torch.device):
    """Triton launches on the current CUDA device, not the tensors': make it the tensors'."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


def choose_backend(backend: str | None, device: torch.device) -> str:
    """ "triton" (our kernels) or "torch" (the reference); None picks triton on CUDA where it runs (the
    CPU interpreter runs the kernels too, but slowly: only when asked). Anything else is bad input."""
    can_fuse = runs_on(device)
    if backend is None:
        backend = "triton" if can_fuse and device.type == "cuda" else "torch"
    if backend not in ("triton", "torch") or (backend == "triton" and not can_fuse):
        raise UsageError(
            f"backend {backend!r} is not usable here; choose from {['triton', 'torch'] if can_fuse else ['torch']}"
        )
    return backend


# Programmatic dependent launch (Hopper and later): a kernel's programs start while the kernel before it
# drains, and wait (`after_previous`) before they touch memory. SPECLOOP_OVERLAP=0 turns it off, to measure it.
OVERLAP = os.environ.get("SPECLOOP_OVERLAP", "1") != "0"


@functools.cache
def overlap(device: torch.device) -> dict:
    """Launch options for a kernel that calls `after_previous` first: launched early where the GPU can
    (asked once per device: every eager launch reads it)."""
    if OVERLAP and device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 9:
        return {"launch_pdl": True, "PDL": True}
    return {"PDL": False}


after_previous = launch_next = None  # without triton (below otherwise)

if triton is not None:
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

    @triton.jit
    def after_previous(PDL: tl.constexpr, LAUNCH_NEXT: tl.constexpr = True):
        """Wait until the previous kernel is done and its writes are visible (first letting the next
        kernel's programs launch, with LAUNCH_NEXT): called before a program reads or writes anything,
        so launching early changes no value."""
        if PDL:
            if LAUNCH_NEXT:
                gdc_launch_dependents()
            gdc_wait()

    @triton.jit
    def launch_next(PDL: tl.constexpr):
        """Let the next kernel's programs launch (a GEMM calls it after its main loop, so that waiting
        programs do not hold an SM's resources while its weights stream)."""
        if PDL:
            gdc_launch_dependents()
