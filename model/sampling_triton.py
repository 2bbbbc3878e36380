"""One round of exact speculative sampling in one Triton launch, with no host sync: the acceptance of
all K draft tokens and the race that draws the residual or bonus token over the whole vocabulary.

Semantics are model/sampling.py's `verify_block_reference`, bit for bit from the same random numbers.
Program j of a grid over the vocabulary first recomputes the acceptance itself (2K gathers, which
every program reads from L2), so no program waits for another; it then races its slice of the row
a + 1: r / noise (tl.math.div_rn, IEEE-rounded as torch divides; Triton's `/` is approximate on
NVIDIA GPUs) for the residual r = max(0, p - q) and for
p itself, the fallback where the residual is all zero. Each race is one packed 64-bit key,
(quotient bits << 32) | (2^32 - 1 - token id), maxed atomically into a small workspace: the max key
is the highest quotient with the lowest id, and integer max does not depend on the order programs
finish in, so the result is deterministic. The last program to finish (a ticket counter) reads the
keys, writes (accepted, final) and zeroes the workspace for the next call, so no launch or sync is
spent resetting and the call can be captured in a CUDA graph. Where the kernel runs:
model/triton_support.py.
"""

from __future__ import annotations

import torch

from contracts import UsageError
from model import triton_support
from model.sampling import verify_block_reference
from model.triton_support import launching_on, tl, triton

# Launch shape (vocabulary entries per program, warps): python -m measure.verify_speed sweeps it.
VERIFY_LAUNCH = {"BLOCK_V": 2048, "num_warps": 4}
# Under triton's interpreter (CPU tests) every program is simulated in Python: fewest, widest programs.
_INTERPRETER_BLOCK_V = 16384
# The workspace: the best residual key and the best target key (slots 0 and 1, which the kernel
# maxes as a pair), whether any residual entry is positive, and the ticket of programs done.
_RESIDUAL, _TARGET, _POSITIVE, _TICKET = range(4)
WORKSPACE_SLOTS = 4
_FLOAT_BYTES, _TOKEN_BYTES = 4, 8


def verify_bytes(positions: int, vocab: int, bonus: bool = False) -> int:
    """Bytes a call must read (its bandwidth floor): per position the draft token, its uniform and
    p(d), q(d); then the raced row p_{a+1}, the noise, and q_{a+1} unless the block was all accepted."""
    rows = 2 if bonus else 3
    return positions * (_TOKEN_BYTES + 3 * _FLOAT_BYTES) + rows * vocab * _FLOAT_BYTES


def new_workspace(device: torch.device) -> torch.Tensor:
    """A zeroed workspace; every call leaves it zeroed again. Calls sharing one run one after another
    (one stream)."""
    return torch.zeros(WORKSPACE_SLOTS, dtype=torch.int64, device=device)


def _check(target_probs, draft_probs, draft_tokens, accept_uniforms, race_noise) -> None:
    K, V = draft_probs.shape
    if K < 1 or target_probs.shape != (K + 1, V):
        raise UsageError(f"target_probs must be [K+1, V] = [{K + 1}, {V}] for draft_probs [K, V] = [{K}, {V}]")
    if draft_tokens.shape != (K,) or accept_uniforms.shape != (K,) or race_noise.shape != (V,):
        raise UsageError(f"draft_tokens and accept_uniforms must be [{K}] and race_noise [{V}]")
    if any(t.dtype != torch.float32 for t in (target_probs, draft_probs, accept_uniforms, race_noise)):
        raise UsageError("probabilities, uniforms and noise must be float32 (the reference's arithmetic)")


def verify_block(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    draft_tokens: torch.Tensor,
    accept_uniforms: torch.Tensor,
    race_noise: torch.Tensor,
    workspace: torch.Tensor | None = None,
    launch: dict | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The Triton kernel with `verify_block_reference`'s signature and result: (accepted [1], final [1])
    long. One launch, no sync; compile (call once) before CUDA-graph capture. Without a workspace a
    zeroed one is made (one more launch); `launch` replaces VERIFY_LAUNCH (sweeps, tests)."""
    _check(target_probs, draft_probs, draft_tokens, accept_uniforms, race_noise)
    device = target_probs.device
    K, V = draft_probs.shape
    if target_probs.stride(1) != 1 or draft_probs.stride(1) != 1:
        raise ValueError("probability rows must be contiguous")
    work = new_workspace(device) if workspace is None else workspace
    shape = dict(VERIFY_LAUNCH if device.type == "cuda" else {"BLOCK_V": _INTERPRETER_BLOCK_V})
    shape.update(launch or {})
    programs = triton.cdiv(V, shape["BLOCK_V"])
    accepted = torch.empty(1, dtype=torch.int64, device=device)
    final = torch.empty(1, dtype=torch.int64, device=device)
    with launching_on(device):
        _verify_kernel[(programs,)](
            target_probs,
            target_probs.stride(0),
            draft_probs,
            draft_probs.stride(0),
            draft_tokens.contiguous(),
            accept_uniforms.contiguous(),
            race_noise.contiguous(),
            work,
            accepted,
            final,
            K,
            V,
            programs,
            BLOCK_K=triton.next_power_of_2(K),
            **shape,
        )
    return accepted, final


class BlockVerifier:
    """A round's verify on one device: the Triton kernel where it can run, else the torch reference.

    backend: "triton" or "torch"; None picks triton on CUDA (the interpreter, on CPU, is slow: only
    when asked). The triton backend keeps one workspace, so calls must run one after another, on one
    stream."""

    def __init__(self, device: torch.device, backend: str | None = None):
        device = torch.device(device)
        self.backend = triton_support.choose_backend(backend, device)
        self.workspace = new_workspace(device) if self.backend == "triton" else None

    def __call__(self, target_probs, draft_probs, draft_tokens, accept_uniforms, race_noise):
        if self.backend == "triton":
            return verify_block(
                target_probs, draft_probs, draft_tokens, accept_uniforms, race_noise, workspace=self.workspace
            )
        return verify_block_reference(target_probs, draft_probs, draft_tokens, accept_uniforms, race_noise)


if triton is not None:
    _LOW_MASK = tl.constexpr(4294967295)
    _SLOT_RESIDUAL = tl.constexpr(_RESIDUAL)
    _SLOT_TARGET = tl.constexpr(_TARGET)
    _SLOT_POSITIVE = tl.constexpr(_POSITIVE)
    _SLOT_TICKET = tl.constexpr(_TICKET)

    @triton.jit
    def _verify_kernel(
        p_ptr,
        p_stride,
        q_ptr,
        q_stride,
        token_ptr,
        uniform_ptr,
        noise_ptr,
        work_ptr,
        accepted_ptr,
        final_ptr,
        K,
        V,
        n_programs,
        BLOCK_K: tl.constexpr,
        BLOCK_V: tl.constexpr,
    ):
        # Acceptance: u_i q_i(d_i) < p_i(d_i); a = the first rejected position, or K.
        i = tl.arange(0, BLOCK_K)
        live = i < K
        drafted = tl.load(token_ptr + i, mask=live, other=0).to(tl.int64)
        uniform = tl.load(uniform_ptr + i, mask=live, other=0.0)
        p_drafted = tl.load(p_ptr + i.to(tl.int64) * p_stride + drafted, mask=live, other=0.0)
        q_drafted = tl.load(q_ptr + i.to(tl.int64) * q_stride + drafted, mask=live, other=0.0)
        rejected = live & ~(uniform * q_drafted < p_drafted)
        accepted = tl.min(tl.where(rejected, i, K), axis=0)
        # This program's slice of row a + 1: the residual (q read as 0 after a full block: r = p_{K+1}).
        token = tl.program_id(0) * BLOCK_V + tl.arange(0, BLOCK_V)
        valid = token < V
        row = accepted.to(tl.int64)
        p = tl.load(p_ptr + row * p_stride + token, mask=valid, other=0.0)
        q = tl.load(q_ptr + row * q_stride + token, mask=valid & (accepted < K), other=0.0)
        noise = tl.load(noise_ptr + token, mask=valid, other=1.0)
        residual = tl.maximum(p - q, 0.0)
        # Both races at once, [BLOCK_V, 2]: the residual's (slot 0) and the fallback's, p itself (slot 1).
        quotient = tl.math.div_rn(tl.join(residual, p), noise[:, None])
        quotient = tl.where(quotient == 0.0, 0.0, quotient)  # -0.0 ties with +0.0, as in torch
        bits = quotient.to(tl.int32, bitcast=True).to(tl.int64)
        low = tl.full([BLOCK_V], _LOW_MASK, tl.int64)
        key = (bits << 32) | (low - token.to(tl.int64))[:, None]
        best = tl.max(tl.where(valid[:, None], key, 0), axis=0)  # 0 is below every key
        tl.atomic_max(work_ptr + _SLOT_RESIDUAL + tl.arange(0, 2), best, sem="relaxed")
        positive = tl.max((valid & (residual > 0.0)).to(tl.int64), axis=0)
        tl.atomic_max(work_ptr + _SLOT_POSITIVE, positive, sem="relaxed")
        if tl.atomic_add(work_ptr + _SLOT_TICKET, 1, sem="acq_rel") == n_programs - 1:
            # The last program: every program's keys are in. Read them and leave the workspace zeroed.
            zero = tl.zeros([], dtype=tl.int64)
            best_residual = tl.atomic_xchg(work_ptr + _SLOT_RESIDUAL, zero, sem="relaxed")
            best_target = tl.atomic_xchg(work_ptr + _SLOT_TARGET, zero, sem="relaxed")
            any_positive = tl.atomic_xchg(work_ptr + _SLOT_POSITIVE, zero, sem="relaxed")
            tl.atomic_xchg(work_ptr + _SLOT_TICKET, zero, sem="relaxed")
            winner = tl.where(any_positive > 0, best_residual, best_target)
            mask = tl.full([], _LOW_MASK, tl.int64)
            tl.store(final_ptr, mask - (winner & mask))
            tl.store(accepted_ptr, row)
