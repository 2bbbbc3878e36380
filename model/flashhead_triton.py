"""FlashHead's greedy path in four launches and no host sync: centroid scores, top-p selection,
then stage 2 (gather the probed clusters' rows, score them, argmax) and its final reduction.

Stage 1 (`select_clusters`): every centroid's score is the fp32 dot product with the hidden state,
rounded to the head's dtype as F.linear's output is; one program per hidden state then finds the
p-th highest score by bisection over order-preserving integer keys and writes the p cluster ids
scoring above it, plus the lowest-index ties at it. torch.topk, which the torch path uses, picks
among ties at the threshold in an unspecified order; otherwise the two choose the same clusters.
Stage 2 semantics, shared with `stage2_reference`: a candidate's score is the fp32 dot product of
the hidden state (cast to the head's dtype) and its head row, rounded to the head's dtype as the
dense head's logits are; the winner is the highest score, the lowest token id among exact ties
(as `torch.argmax` over dense logits picks). Where the kernels run: model/triton_support.py.
"""

from __future__ import annotations

import torch

from model.triton_support import AVAILABLE, launching_on, tl, triton

BLOCK_C = 64  # centroids per program of the score kernel
BLOCK_T = 32  # candidate tokens per program
BLOCK_D = 128  # hidden elements per load
FINAL_BLOCK = 1024  # partial keys reduced per loop step of the final kernel


def stage2_reference(hidden: torch.Tensor, cluster_ids: torch.Tensor, members: torch.Tensor,
                     weight: torch.Tensor, always: torch.Tensor | None = None) -> torch.Tensor:
    """Pure-torch stage 2: hidden [n, d], cluster_ids [n, p], members [c, b], weight [V, d],
    always [a] (token ids scored for every row) -> token ids [n]. Also the CPU/fallback path."""
    n = hidden.shape[0]
    tokens = members[cluster_ids].reshape(n, -1)
    if always is not None and always.numel():
        tokens = torch.cat([tokens, always.expand(n, -1)], dim=1)
    # A bmm in the head's dtype accumulates in fp32 and rounds its output to that dtype, as the dense
    # head's F.linear does, without materializing an fp32 copy of the gathered rows.
    scores = torch.bmm(weight[tokens], hidden.to(weight.dtype).unsqueeze(-1)).squeeze(-1).float()
    best = scores.amax(dim=1, keepdim=True)
    return torch.where(scores == best, tokens, weight.shape[0]).amin(dim=1)


def select_clusters(hidden: torch.Tensor, centroids: torch.Tensor, probes: int) -> torch.Tensor:
    """hidden [n, d] (the head's dtype), centroids [c, d] -> the ids [n, probes] of the highest-scoring
    clusters, in increasing id order. Two launches, no sync."""
    n, d = hidden.shape
    c = centroids.shape[0]
    keys = torch.empty((n, c), dtype=torch.int32, device=hidden.device)
    out = torch.empty((n, probes), dtype=torch.int64, device=hidden.device)
    block = triton.next_power_of_2(c)
    with launching_on(hidden.device):
        _centroid_keys_kernel[(n, triton.cdiv(c, BLOCK_C))](
            hidden, centroids, keys, c, d, ROUND_BF16=centroids.dtype == torch.bfloat16,
            ROUND_FP16=centroids.dtype == torch.float16, BLOCK_C=BLOCK_C, BLOCK_D=BLOCK_D, num_warps=4)
        _select_kernel[(n,)](keys, out, c, probes, BLOCK=block, num_warps=16 if block >= 8192 else 4)
    return out


def stage2_argmax(hidden: torch.Tensor, cluster_ids: torch.Tensor, members: torch.Tensor,
                  weight: torch.Tensor, always: torch.Tensor | None = None) -> torch.Tensor:
    """Triton stage 2 with the signature and result of `stage2_reference`; two launches, no sync.

    Program (row, block) scores BLOCK_T candidates and writes one packed 64-bit key
    (order-preserving score bits << 32 | (2^32 - 1 - token id)), so the max key is the max score
    with the lowest id; a second kernel max-reduces the keys of each row. Integer max is
    order-independent, so the result is deterministic. Compile (call once) before CUDA-graph capture.
    """
    if not AVAILABLE:
        raise RuntimeError("flashhead_triton.stage2_argmax needs triton")
    n, d = hidden.shape
    p = cluster_ids.shape[1]
    b = members.shape[1]
    if weight.stride(1) != 1 or members.stride() != (b, 1):
        raise ValueError("weight rows and members must be contiguous")
    hidden = hidden.to(weight.dtype).contiguous()
    cluster_ids = cluster_ids.contiguous()
    a = 0 if always is None else always.numel()
    always_ptr = members if a == 0 else always.contiguous()
    blocks = triton.cdiv(p * b + a, BLOCK_T)
    partial = torch.empty((n, blocks), dtype=torch.int64, device=hidden.device)
    out = torch.empty((n,), dtype=torch.int64, device=hidden.device)
    with launching_on(hidden.device):
        _stage2_kernel[(n, blocks)](
            hidden, hidden.stride(0), cluster_ids, cluster_ids.stride(0), members, weight, weight.stride(0),
            always_ptr, partial, p, b, a, d, blocks,
            ROUND_BF16=weight.dtype == torch.bfloat16, ROUND_FP16=weight.dtype == torch.float16,
            BLOCK_T=BLOCK_T, BLOCK_D=BLOCK_D, num_warps=4)
        _final_kernel[(n,)](partial, out, blocks, BLOCK=FINAL_BLOCK, num_warps=4)
    return out


if triton is not None:
    # Below every finite score's key (only a negative NaN could map this low). Globals used in
    # kernels must be constexpr; int64 constants are built with tl.full so no literal is typed uint32.
    _NO_KEY = tl.constexpr(-9223372036854775807)
    _LOW_MASK = tl.constexpr(4294967295)

    @triton.jit
    def _ordered(s, ROUND_BF16: tl.constexpr, ROUND_FP16: tl.constexpr):
        """fp32 scores rounded to the head's dtype -> int32 keys whose signed order is the scores' order."""
        if ROUND_BF16:
            s = s.to(tl.bfloat16, fp_downcast_rounding="rtne").to(tl.float32)
        if ROUND_FP16:
            s = s.to(tl.float16, fp_downcast_rounding="rtne").to(tl.float32)
        s = tl.where(s == 0.0, 0.0, s)  # -0.0 ties with +0.0, as in torch comparisons
        bits = s.to(tl.int32, bitcast=True)
        return tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)

    @triton.jit
    def _centroid_keys_kernel(h_ptr, c_ptr, key_ptr, C, D, ROUND_BF16: tl.constexpr, ROUND_FP16: tl.constexpr,
                              BLOCK_C: tl.constexpr, BLOCK_D: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        cl = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
        valid = cl < C
        acc = tl.zeros([BLOCK_C, BLOCK_D], dtype=tl.float32)
        for d0 in range(0, D, BLOCK_D):
            dd = d0 + tl.arange(0, BLOCK_D)
            dm = dd < D
            h = tl.load(h_ptr + row * D + dd, mask=dm, other=0.0).to(tl.float32)
            w = tl.load(c_ptr + cl.to(tl.int64)[:, None] * D + dd[None, :], mask=valid[:, None] & dm[None, :],
                        other=0.0).to(tl.float32)
            acc += w * h[None, :]
        key = _ordered(tl.sum(acc, axis=1), ROUND_BF16, ROUND_FP16)
        tl.store(key_ptr + row * C + cl, key, mask=valid)

    @triton.jit
    def _select_kernel(key_ptr, out_ptr, C, P, BLOCK: tl.constexpr):
        """The p-th highest key T by bisection (count(key >= T) >= P for the largest such T), then
        the ids above T and the first ties at T, written in id order."""
        row = tl.program_id(0).to(tl.int64)
        idx = tl.arange(0, BLOCK)
        valid = idx < C
        key = tl.load(key_ptr + row * C + idx, mask=valid, other=-2147483648)
        lo = tl.min(tl.where(valid, key, 2147483647), axis=0).to(tl.int64)
        hi = tl.max(key, axis=0).to(tl.int64)
        for _ in range(32):  # the key range spans at most 2^32 values
            mid = lo + (hi - lo + 1) // 2
            enough = tl.sum((valid & (key >= mid)).to(tl.int32), axis=0) >= P
            lo = tl.where(enough, mid, lo)
            hi = tl.where(enough, hi, mid - 1)
        above = valid & (key > lo)
        tie = valid & (key == lo)
        need = P - tl.sum(above.to(tl.int32), axis=0)
        chosen = above | (tie & (tl.cumsum(tie.to(tl.int32), axis=0) <= need))
        slot = tl.cumsum(chosen.to(tl.int32), axis=0) - 1
        tl.store(out_ptr + row * P + slot, idx.to(tl.int64), mask=chosen)

    @triton.jit
    def _stage2_kernel(h_ptr, h_stride, cl_ptr, cl_stride, mem_ptr, w_ptr, w_stride, always_ptr, part_ptr,
                       P, B, A, D, n_blocks,
                       ROUND_BF16: tl.constexpr, ROUND_FP16: tl.constexpr,
                       BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr):
        row = tl.program_id(0)
        blk = tl.program_id(1)
        t = blk * BLOCK_T + tl.arange(0, BLOCK_T)
        n_members = P * B
        is_member = t < n_members
        is_always = (t >= n_members) & (t < n_members + A)
        valid = is_member | is_always
        slot = tl.where(is_member, t, 0)
        cluster = tl.load(cl_ptr + row.to(tl.int64) * cl_stride + slot // B, mask=is_member, other=0)
        tok_m = tl.load(mem_ptr + cluster.to(tl.int64) * B + slot % B, mask=is_member, other=0)
        tok_a = tl.load(always_ptr + tl.where(is_always, t - n_members, 0), mask=is_always, other=0)
        tok = tl.where(is_member, tok_m, tok_a).to(tl.int64)
        acc = tl.zeros([BLOCK_T, BLOCK_D], dtype=tl.float32)
        for d0 in range(0, D, BLOCK_D):
            dd = d0 + tl.arange(0, BLOCK_D)
            dm = dd < D
            h = tl.load(h_ptr + row.to(tl.int64) * h_stride + dd, mask=dm, other=0.0).to(tl.float32)
            w = tl.load(w_ptr + tok[:, None] * w_stride + dd[None, :], mask=valid[:, None] & dm[None, :],
                        other=0.0).to(tl.float32)
            acc += w * h[None, :]
        ordered = _ordered(tl.sum(acc, axis=1), ROUND_BF16, ROUND_FP16)
        low = tl.full([BLOCK_T], _LOW_MASK, tl.int64)
        key = (ordered.to(tl.int64) << 32) | (low - tok)
        key = tl.where(valid, key, tl.full([BLOCK_T], _NO_KEY, tl.int64))
        tl.store(part_ptr + row.to(tl.int64) * n_blocks + blk, tl.max(key, axis=0))

    @triton.jit
    def _final_kernel(part_ptr, out_ptr, n_blocks, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        best = tl.full([BLOCK], _NO_KEY, dtype=tl.int64)
        for start in range(0, n_blocks, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            key = tl.load(part_ptr + row.to(tl.int64) * n_blocks + offs, mask=offs < n_blocks, other=_NO_KEY)
            best = tl.maximum(best, key)
        top = tl.max(best, axis=0)
        low = tl.full([], _LOW_MASK, tl.int64)
        tl.store(out_ptr + row, low - (top & low))
