"""The draft's q (model/draft_q.py) in three launches instead of about ten, bit for bit the same.

Spelled out in torch, q's transform is a launch per step (the temperature, top-k's topk and mask, the
max, the shift, the exponential, the fixed-point rounding, its sum, the division; top-p adds a sort, a
cumulative sum and two scatters), each over the head's N scored tokens: about ten small launches per
sampled draft step, which on a GPU cost more than the arithmetic. Here one program per row does:

1. `_shift_kernel`: the temperature, the row's max and top-k's k-th largest value, then writes the
   shifted logits (-inf below the k-th value). The k-th value is searched for over the float's
   order-preserving integer, counting the entries at or above CANDIDATES values per pass over the row
   (11 passes) instead of sorting.
2. `torch.exp` of the shifted logits, in place: Triton's exponential (libdevice's, or numpy's under the
   interpreter) need not round as torch's does, and one last bit changes q (the same reason
   model/sampling_noise.py keeps torch's log).
3. `_normalize_kernel`: each weight rounded to a multiple of 2^-40 and summed as 64-bit integers; for
   top-p, the same search over the 64-bit rank key (weight bits << 32 | 2^32 - 1 - token id, 21 passes)
   finds the lowest key whose fixed-point mass ranked above it is below top_p times the total, which is
   exactly the set draft_q.probabilities keeps after its sort (the mass above a key never grows with
   the key); then q = weight / total.

Every step is the reference's arithmetic: torch divides a tensor by a Python number with IEEE division
on the CPU and multiplies by the number's reciprocal (computed once on the host) on CUDA, so the kernel
does the same on each (`DraftQ` takes the reciprocal from torch itself); the kernels are compiled with
floating-point contraction off, so no multiply fuses into an add; rounding to an integer is the
round-to-nearest-even of float addition (x + 2^23 - 2^23), as torch.round. The ranking and the sums do
not depend on the order a program reads the row in. Where the kernels run: model/triton_support.py.
"""

from __future__ import annotations

import torch

from contracts import UsageError
from model import draft_q, triton_support
from model.sampling import SamplingSettings
from model.triton_support import launching_on, tl, triton

MAX_BLOCK = 2048  # row entries a program holds at once on a GPU; a wider row loops over blocks
# Rows wider than this take draft_q.probabilities (the same values): one program walks a row, so the dense
# head's 151,936 tokens took 156.1 us for q + draw against torch's 122.9, while the scored tokens of FlashHead,
# shortlist and router heads (at most about 10,000 here) ran 8-37% faster (one H200,
# reports/heads/h200_sampled_heads_fused.json against h200_sampled_heads_compact.json).
KERNEL_MAX_WIDTH = 32768
_INTERPRETER_MAX_BLOCK = 16384
CANDIDATE_BITS = 3  # a search pass tests 2^3 values at once
# The searched ranges: top-k's k-th value over int32, top-p's rank key over [-1, weight 1.0 with id 0].
_ORDERED_LOW, _ORDERED_HIGH = -(2**31), 2**31
_KEY_LOW, _KEY_HIGH = -1, 0x3F800000FFFFFFFF
EXACT = {"enable_fp_fusion": False}  # compile options: no multiply fused into an add (the interpreter ignores it)


def search_passes(low: int, high: int) -> int:
    """Passes that narrow (low, high) to neighbours when each tests 2^CANDIDATE_BITS evenly spaced values
    and keeps the bracket around the boundary (at worst the larger of a step and what lies past the last)."""
    passes, gap, candidates = 0, high - low, 1 << CANDIDATE_BITS
    while gap > 1:
        step = max(1, gap >> CANDIDATE_BITS)
        gap, passes = max(step, gap - candidates * step), passes + 1
    return passes


_K_PASSES = search_passes(_ORDERED_LOW, _ORDERED_HIGH)  # 11
_P_PASSES = search_passes(_KEY_LOW, _KEY_HIGH)  # 21


def _launch(device: torch.device, width: int, launch: dict | None) -> dict:
    block = min(triton.next_power_of_2(width), MAX_BLOCK if device.type == "cuda" else _INTERPRETER_MAX_BLOCK)
    shape = {"BLOCK": block, "num_warps": max(1, min(16, block // 128))}
    shape.update(launch or {})
    return shape


class DraftQ:
    """The draft's q on one device: the kernels where they can run, else draft_q.probabilities (the
    reference, which the CPU decoder runs), with the same values either way.

    backend: "triton" or "torch"; None picks triton on CUDA (the interpreter, on CPU, only when asked)."""

    def __init__(self, device: torch.device, settings: SamplingSettings, backend: str | None = None):
        device = torch.device(device)
        if settings.greedy:
            raise UsageError("the draft's q needs a temperature > 0 (greedy drafting takes the argmax)")
        self.backend = triton_support.choose_backend(backend, device)
        self.settings = settings
        # torch's `/` by a Python number: IEEE division on the CPU, times torch's own reciprocal on CUDA
        self.reciprocal = device.type == "cuda"
        if self.reciprocal:
            self.scale = torch.ones(1, device=device) / settings.temperature
        else:
            self.scale = torch.tensor([settings.temperature], dtype=torch.float32, device=device)
        self.top_p = torch.tensor([settings.top_p], dtype=torch.float64, device=device)

    def __call__(self, logits: torch.Tensor, tokens: torch.Tensor | None = None, launch: dict | None = None):
        """q [n, N] float32 of logits [n, N] over the token ids `tokens` [n, N] (None: the vocabulary):
        draft_q.probabilities(logits, settings, tokens). The triton backend: three launches, no host
        sync; compile (call once) before CUDA-graph capture. Rows wider than KERNEL_MAX_WIDTH take torch's
        kernels. `launch` replaces the launch shape (tests)."""
        if self.backend == "torch" or logits.shape[-1] > KERNEL_MAX_WIDTH:
            return draft_q.probabilities(logits, self.settings, tokens)
        if logits.dim() != 2 or (tokens is not None and tokens.shape != logits.shape):
            raise UsageError(f"logits must be [n, N] with tokens of the same shape, got {tuple(logits.shape)}")
        rows, width = logits.shape
        device = logits.device
        shape = _launch(device, width, launch)
        q = torch.empty(rows, width, dtype=torch.float32, device=device)
        if q.numel() == 0:
            return q
        top_k = self.settings.top_k
        with launching_on(device):
            _shift_kernel[(rows,)](
                logits.contiguous(),
                self.scale,
                q,
                width,
                top_k,
                RECIPROCAL=self.reciprocal,
                TOP_K=0 < top_k < width,
                PASSES=_K_PASSES,
                **shape,
                **EXACT,
            )
            q.exp_()
            _normalize_kernel[(rows,)](
                q,
                q if tokens is None else tokens.contiguous(),
                self.top_p,
                width,
                GATHERED=tokens is not None,
                TOP_P=self.settings.top_p < 1,
                PASSES=_P_PASSES,
                **shape,
                **EXACT,
            )
        return q


if triton is not None:
    _LOW_MASK = tl.constexpr(4294967295)
    _FIXED_POINT = tl.constexpr(draft_q.FIXED_POINT)
    _UNIT = tl.constexpr(1.0 / draft_q.FIXED_POINT)
    _ROUNDING = tl.constexpr(8388608.0)  # 2^23: below it, x + 2^23 - 2^23 rounds x to the nearest even integer
    _BITS = tl.constexpr(CANDIDATE_BITS)
    _CANDIDATES = tl.constexpr(1 << CANDIDATE_BITS)
    _ORDERED_FROM, _ORDERED_TO = tl.constexpr(_ORDERED_LOW), tl.constexpr(_ORDERED_HIGH)
    _KEY_FROM, _KEY_TO = tl.constexpr(_KEY_LOW), tl.constexpr(_KEY_HIGH)

    @triton.jit
    def _candidates(low, high):
        """CANDIDATES values evenly spaced above low, none above high."""
        step = tl.maximum((high - low) >> _BITS, 1)
        return tl.minimum(low + (tl.arange(0, _CANDIDATES) + 1).to(tl.int64) * step, high)

    @triton.jit
    def _narrow(low, high, candidates, holds):
        """The bracket after a pass and the next pass's candidates: `holds` [CANDIDATES] is true below the
        boundary and false from it on."""
        low = tl.maximum(low, tl.max(tl.where(holds, candidates, low), axis=0))
        high = tl.minimum(high, tl.min(tl.where(holds, high, candidates), axis=0))
        return low, high, _candidates(low, high)

    @triton.jit
    def _scaled(logits_ptr, offsets, valid, scale, RECIPROCAL: tl.constexpr):
        x = tl.load(logits_ptr + offsets, mask=valid, other=float("-inf")).to(tl.float32)
        if RECIPROCAL:
            return x * scale
        return tl.math.div_rn(x, scale)

    @triton.jit
    def _ordered(values):
        """float32 -> int32 in the same order (-0.0 just below +0.0; the map is its own inverse)."""
        bits = values.to(tl.int32, bitcast=True)
        return bits ^ ((bits >> 31) & 0x7FFFFFFF)

    @triton.jit
    def _shift_kernel(
        logits_ptr,
        scale_ptr,
        out_ptr,
        N,
        top_k,
        RECIPROCAL: tl.constexpr,
        TOP_K: tl.constexpr,
        PASSES: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        base = tl.program_id(0).to(tl.int64) * N
        scale = tl.load(scale_ptr)
        lanes = tl.arange(0, BLOCK)
        best = tl.full([BLOCK], float("-inf"), tl.float32)
        for start in range(0, N, BLOCK):
            best = tl.maximum(best, _scaled(logits_ptr + base, start + lanes, start + lanes < N, scale, RECIPROCAL))
        top = tl.max(best, axis=0)
        kth = float("-inf")
        if TOP_K:  # the largest ordered value with at least top_k entries at or above it: torch.topk's k-th
            low = tl.full([], _ORDERED_FROM, tl.int64)  # every entry is at or above it
            high = tl.full([], _ORDERED_TO, tl.int64)  # none is
            candidates = _candidates(low, high)
            for _ in range(PASSES):
                count = tl.zeros([_CANDIDATES], tl.int32)
                for start in range(0, N, BLOCK):
                    valid = start + lanes < N
                    ordered = _ordered(_scaled(logits_ptr + base, start + lanes, valid, scale, RECIPROCAL))
                    above = valid[:, None] & (ordered.to(tl.int64)[:, None] >= candidates[None, :])
                    count += tl.sum(above.to(tl.int32), axis=0)
                low, high, candidates = _narrow(low, high, candidates, count >= top_k)
            kth = _ordered(low.to(tl.int32)).to(tl.float32, bitcast=True)
        for start in range(0, N, BLOCK):
            valid = start + lanes < N
            scaled = _scaled(logits_ptr + base, start + lanes, valid, scale, RECIPROCAL)
            scaled = tl.where(scaled < kth, float("-inf"), scaled)  # a float compare: -0.0 ties +0.0
            tl.store(out_ptr + base + start + lanes, scaled - top, mask=valid)

    @triton.jit
    def _block(weights_ptr, ids_ptr, offsets, valid, GATHERED: tl.constexpr):
        """A block's weights, their fixed-point values round(weights * 2^40) (ties to even: weights are in
        [0, 1], and from 2^23 on already integers) and their rank keys."""
        weights = tl.load(weights_ptr + offsets, mask=valid, other=0.0)
        scaled = weights * _FIXED_POINT
        fixed = tl.where(scaled < _ROUNDING, (scaled + _ROUNDING) - _ROUNDING, scaled).to(tl.int64)
        if GATHERED:
            token = tl.load(ids_ptr + offsets, mask=valid, other=0).to(tl.int64)
        else:
            token = offsets.to(tl.int64)
        key = (weights.to(tl.int32, bitcast=True).to(tl.int64) << 32) | (_LOW_MASK - token)
        return weights, fixed, key

    @triton.jit
    def _normalize_kernel(
        weights_ptr,
        ids_ptr,
        top_p_ptr,
        N,
        GATHERED: tl.constexpr,
        TOP_P: tl.constexpr,
        PASSES: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        base = tl.program_id(0).to(tl.int64) * N
        weights_ptr += base
        ids_ptr += base
        lanes = tl.arange(0, BLOCK)
        mass = tl.zeros([BLOCK], tl.int64)
        for start in range(0, N, BLOCK):
            mass += _block(weights_ptr, ids_ptr, start + lanes, start + lanes < N, False)[1]
        total = tl.sum(mass, axis=0)
        if TOP_P:  # the lowest key whose mass ranked above it is below top_p x total
            threshold = tl.load(top_p_ptr) * total.to(tl.float64)
            low = tl.full([], _KEY_FROM, tl.int64)  # the mass above it is the total
            high = tl.full([], _KEY_TO, tl.int64)  # nothing ranks above it
            candidates = _candidates(low, high)
            for _ in range(PASSES):
                above = tl.zeros([_CANDIDATES], tl.int64)
                for start in range(0, N, BLOCK):
                    weights, fixed, key = _block(weights_ptr, ids_ptr, start + lanes, start + lanes < N, GATHERED)
                    above += tl.sum(tl.where(key[:, None] > candidates[None, :], fixed[:, None], 0), axis=0)
                low, high, candidates = _narrow(low, high, candidates, above.to(tl.float64) >= threshold)
            cut = high
            mass = tl.zeros([BLOCK], tl.int64)
            for start in range(0, N, BLOCK):
                weights, fixed, key = _block(weights_ptr, ids_ptr, start + lanes, start + lanes < N, GATHERED)
                mass += tl.where(key >= cut, fixed, 0)
            total = tl.sum(mass, axis=0)
        normalizer = total.to(tl.float32) * _UNIT
        for start in range(0, N, BLOCK):
            valid = start + lanes < N
            weights, fixed, key = _block(weights_ptr, ids_ptr, start + lanes, valid, GATHERED)
            if TOP_P:
                weights = tl.where(key >= cut, weights, 0.0)
            tl.store(weights_ptr + start + lanes, tl.math.div_rn(weights, normalizer), mask=valid)
