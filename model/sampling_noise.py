"""The random numbers of model/sampling.py and the draft's race, in a few launches instead of about a
hundred, bit for bit the same.

model/sampling.py computes its counter hash with torch integer ops: every shift, xor and 32-bit
multiply over the vocabulary is its own launch (about 55 over V per noise row, and about 50 more on
one element for the key), which made a sampled draft step cost about 0.22 ms on an H100 whatever
its head. Here the key and the hash of every (key, token) are one Triton launch (`uniforms`: plain
uint32 arithmetic, which wraps as the torch emulation masks, so the bits are exactly equal).

The logarithm of the exponential noise stays torch's own `torch.log`: Triton's log (numpy's under
the interpreter, libdevice's or an approximation on a GPU) need not round as torch's does, and a
different last bit could reorder two quotients of the race. So a draw is three launches: the
uniforms, `torch.log`, and `_race_kernel`, which races q / -log(u) (IEEE division, as torch's `/`;
-log(u) is exact negation) with the verify kernel's packed 64-bit atomic max (highest quotient,
lowest token on ties: torch.argmax's choice) and a last-program ticket that returns the workspace
to zero, so a draw needs no host sync and runs inside CUDA graphs. Given the token ids of a head's
scored slots (model/draft_q.py), both kernels read each slot's id from them: the noise is keyed by
the real token id and ties go to the lowest id, so a draw over the scored tokens alone is the draw over
the whole vocabulary. Where the kernels run: model/triton_support.py.
"""

from __future__ import annotations

import torch

from contracts import UsageError
from model import sampling, triton_support
from model.triton_support import launching_on, tl, triton

# Vocabulary entries per program on a GPU; under the interpreter the fewest, widest programs.
NOISE_LAUNCH = {"BLOCK_V": 2048, "num_warps": 4}
_INTERPRETER_BLOCK_V = 16384
_BEST, _TICKET = range(2)  # workspace slots: the best packed key, the ticket of programs done
WORKSPACE_SLOTS = 2


def _shape(device: torch.device, launch: dict | None) -> dict:
    shape = dict(NOISE_LAUNCH if device.type == "cuda" else {"BLOCK_V": _INTERPRETER_BLOCK_V})
    shape.update(launch or {})
    return shape


def uniforms(
    seed: torch.Tensor,
    positions: torch.Tensor,
    purpose: int,
    count: int,
    open_interval: bool = False,
    launch=None,
    tokens: torch.Tensor | None = None,
) -> torch.Tensor:
    """sampling.uniforms(sampling.keys(seed, positions, purpose), tokens) [n, count] in one launch, tokens
    [count] (None: arange(count)); open_interval: the uniforms in (0, 1) that sampling.exponentials
    takes the -log of."""
    if seed.numel() != 1 or positions.dim() != 1 or seed.dtype != torch.int64 or positions.dtype != torch.int64:
        raise UsageError("seed must be [1] int64 and positions [n] int64")
    if purpose not in (sampling.DRAFT, sampling.ACCEPT, sampling.RACE):
        raise UsageError(f"purpose must be one of {[sampling.DRAFT, sampling.ACCEPT, sampling.RACE]}, got {purpose}")
    device = positions.device
    shape = _shape(device, launch)
    out = torch.empty(positions.numel(), count, dtype=torch.float32, device=device)
    if out.numel() == 0:
        return out
    with launching_on(device):
        _uniform_kernel[(triton.cdiv(count, shape["BLOCK_V"]), positions.numel())](
            seed,
            positions.contiguous(),
            out if tokens is None else tokens.contiguous(),
            out,
            count,
            PURPOSE=purpose,
            OPEN=open_interval,
            GATHERED=tokens is not None,
            **shape,
        )
    return out


def exponentials(seed: torch.Tensor, positions: torch.Tensor, purpose: int, count: int) -> torch.Tensor:
    """sampling.exponentials(sampling.keys(seed, positions, purpose), arange(count)): torch's -log of the
    open uniforms (three launches)."""
    return torch.log(uniforms(seed, positions, purpose, count, open_interval=True)).neg_()


def new_workspace(device: torch.device) -> torch.Tensor:
    """A zeroed race workspace; every draw leaves it zeroed. Draws sharing one run one after another."""
    return torch.zeros(WORKSPACE_SLOTS, dtype=torch.int64, device=device)


def draw(
    probs: torch.Tensor,
    seed: torch.Tensor,
    position: torch.Tensor,
    workspace: torch.Tensor | None = None,
    launch=None,
    tokens: torch.Tensor | None = None,
) -> torch.Tensor:
    """The draft's proposal from probs [1, V] at `position` [1]: exactly
    sampling.race(probs, sampling.exponentials(sampling.keys(seed, position, DRAFT), arange(V))), as [1] long.
    With the token ids [1, N] of probs [1, N] (a head's scored slots): sampling.race_scored, the same token
    as the race over the whole vocabulary with zeros elsewhere."""
    if probs.dim() != 2 or probs.shape[0] != 1 or probs.dtype != torch.float32 or probs.stride(1) != 1:
        raise UsageError(f"probs must be one contiguous float32 row [1, V], got {tuple(probs.shape)} {probs.dtype}")
    if tokens is not None and tokens.shape != probs.shape:
        raise UsageError(f"tokens must name the {probs.shape[1]} slots of probs, got shape {tuple(tokens.shape)}")
    device = probs.device
    V = probs.shape[1]
    shape = _shape(device, launch)
    ids = None if tokens is None else tokens.view(-1)
    log_uniforms = torch.log(
        uniforms(seed, position.view(1), sampling.DRAFT, V, open_interval=True, launch=launch, tokens=ids)
    )
    work = new_workspace(device) if workspace is None else workspace
    token = torch.empty(1, dtype=torch.int64, device=device)
    programs = triton.cdiv(V, shape["BLOCK_V"])
    with launching_on(device):
        _race_kernel[(programs,)](
            probs,
            log_uniforms,
            token if ids is None else ids.contiguous(),
            work,
            token,
            V,
            programs,
            GATHERED=ids is not None,
            **shape,
        )
    return token


class SamplingNoise:
    """model/sampling.py's random numbers and the draft's race on one device: the kernels where they can
    run, else sampling.py's torch ops (the reference), with the same values either way.

    backend: "triton" or "torch"; None picks triton on CUDA (the interpreter, on CPU, only when asked).
    The triton backend keeps one race workspace, so draws must run one after another, on one stream."""

    def __init__(self, device: torch.device, vocab_size: int, backend: str | None = None):
        device = torch.device(device)
        self.backend = triton_support.choose_backend(backend, device)
        self.workspace = new_workspace(device) if self.backend == "triton" else None
        self.tokens = torch.arange(vocab_size, device=device)  # the torch backend's token ids

    def uniforms(self, seed: torch.Tensor, positions: torch.Tensor, purpose: int, count: int) -> torch.Tensor:
        """[n, count]: sampling.uniforms(sampling.keys(seed, positions, purpose), arange(count))."""
        if self.backend == "triton":
            return uniforms(seed, positions, purpose, count)
        return sampling.uniforms(sampling.keys(seed, positions, purpose), self.tokens[:count])

    def exponentials(self, seed: torch.Tensor, positions: torch.Tensor, purpose: int, count: int) -> torch.Tensor:
        """[n, count]: sampling.exponentials(sampling.keys(seed, positions, purpose), arange(count))."""
        if self.backend == "triton":
            return exponentials(seed, positions, purpose, count)
        return sampling.exponentials(sampling.keys(seed, positions, purpose), self.tokens[:count])

    def draw(
        self, probs: torch.Tensor, seed: torch.Tensor, position: torch.Tensor, tokens: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The draft's proposal [1] from probs [1, V] with the draft noise keyed at position [1]; given
        the token ids [1, N] of probs [1, N], from those tokens alone (`draw`)."""
        if self.backend == "triton":
            return draw(probs, seed, position, self.workspace, tokens=tokens)
        if tokens is None:
            return sampling.race(probs, self.exponentials(seed, position.view(1), sampling.DRAFT, probs.shape[-1]))
        noise = sampling.exponentials(sampling.keys(seed, position.view(1), sampling.DRAFT), tokens.view(-1))
        return sampling.race_scored(probs.view(-1), noise.view(-1), tokens.view(-1))


if triton is not None:
    _LOW_MASK = tl.constexpr(4294967295)
    _GOLDEN = tl.constexpr(0x9E3779B9)
    _FIRST_MULTIPLIER = tl.constexpr(0x7FEB352D)
    _SECOND_MULTIPLIER = tl.constexpr(0x846CA68B)
    _SLOT_BEST = tl.constexpr(_BEST)
    _SLOT_TICKET = tl.constexpr(_TICKET)

    @triton.jit
    def _mix(x):
        """lowbias32 on uint32 (model/sampling.py's _mix, whose masks are uint32 wrap-around here)."""
        x = x ^ (x >> 16)
        x = x * tl.full([], _FIRST_MULTIPLIER, tl.uint32)
        x = x ^ (x >> 15)
        x = x * tl.full([], _SECOND_MULTIPLIER, tl.uint32)
        return x ^ (x >> 16)

    @triton.jit
    def _uniform_kernel(
        seed_ptr,
        position_ptr,
        token_ptr,
        out_ptr,
        count,
        PURPOSE: tl.constexpr,
        OPEN: tl.constexpr,
        GATHERED: tl.constexpr,
        BLOCK_V: tl.constexpr,
    ):
        row = tl.program_id(1)
        seed = (tl.load(seed_ptr) & _LOW_MASK).to(tl.uint32)
        counter = ((tl.load(position_ptr + row) * 4 + PURPOSE) & _LOW_MASK).to(tl.uint32)
        key = _mix(_mix(seed) ^ _mix(counter))
        slot = tl.program_id(0) * BLOCK_V + tl.arange(0, BLOCK_V)
        valid = slot < count
        if GATHERED:  # a head's scored slots: the noise of their token ids
            token = tl.load(token_ptr + slot, mask=valid, other=0)
        else:
            token = slot
        step = (token + 1).to(tl.uint32) * tl.full([], _GOLDEN, tl.uint32)
        bits = _mix(_mix(key + step) ^ key) >> 8
        if OPEN:
            uniform = ((bits >> 1).to(tl.float32) + 0.5) * (2.0**-23)
        else:
            uniform = bits.to(tl.float32) * (2.0**-24)
        tl.store(out_ptr + row.to(tl.int64) * count + slot, uniform, mask=valid)

    @triton.jit
    def _race_kernel(
        probs_ptr, log_ptr, ids_ptr, work_ptr, token_ptr, V, n_programs, GATHERED: tl.constexpr, BLOCK_V: tl.constexpr
    ):
        slot = tl.program_id(0) * BLOCK_V + tl.arange(0, BLOCK_V)
        valid = slot < V
        if GATHERED:  # a head's scored slots: keyed by their token ids
            token = tl.load(ids_ptr + slot, mask=valid, other=0)
        else:
            token = slot
        probs = tl.load(probs_ptr + slot, mask=valid, other=0.0)
        noise = -tl.load(log_ptr + slot, mask=valid, other=-1.0)
        quotient = tl.math.div_rn(probs, noise)
        quotient = tl.where(quotient == 0.0, 0.0, quotient)  # -0.0 ties with +0.0, as in torch
        bits = quotient.to(tl.int32, bitcast=True).to(tl.int64)
        low = tl.full([BLOCK_V], _LOW_MASK, tl.int64)
        key = (bits << 32) | (low - token.to(tl.int64))
        best = tl.max(tl.where(valid, key, 0), axis=0)  # 0 is below every key
        tl.atomic_max(work_ptr + _SLOT_BEST, best, sem="relaxed")
        if tl.atomic_add(work_ptr + _SLOT_TICKET, 1, sem="acq_rel") == n_programs - 1:
            zero = tl.zeros([], dtype=tl.int64)
            winner = tl.atomic_xchg(work_ptr + _SLOT_BEST, zero, sem="relaxed")
            tl.atomic_xchg(work_ptr + _SLOT_TICKET, zero, sem="relaxed")
            mask = tl.full([], _LOW_MASK, tl.int64)
            tl.store(token_ptr, mask - (winner & mask))
