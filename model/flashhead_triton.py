"""Fused FlashHead stage 2 (gather the probed clusters' rows, score them, argmax) without host sync.

Semantics shared by the Triton kernels and `stage2_reference`: a candidate's score is the fp32 dot
product of the hidden state (cast to the head's dtype) and its head row, rounded to the head's
dtype as the dense head's logits are; the winner is the highest score, the lowest token id among
exact ties (as `torch.argmax` over dense logits picks). Importing this module never fails:
`AVAILABLE` says whether the kernels can run here (triton importable and CUDA present).
"""

from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl
except ImportError:
    triton = None

AVAILABLE = triton is not None and torch.cuda.is_available()

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


def stage2_argmax(hidden: torch.Tensor, cluster_ids: torch.Tensor, members: torch.Tensor,
                  weight: torch.Tensor, always: torch.Tensor | None = None) -> torch.Tensor:
    """Triton stage 2 with the signature and result of `stage2_reference`; two launches, no sync.

    Program (row, block) scores BLOCK_T candidates and writes one packed 64-bit key
    (order-preserving score bits << 32 | (2^32 - 1 - token id)), so the max key is the max score
    with the lowest id; a second kernel max-reduces the keys of each row. Integer max is
    order-independent, so the result is deterministic. Compile (call once) before CUDA-graph capture.
    """
    if not AVAILABLE:
        raise RuntimeError("flashhead_triton.stage2_argmax needs triton and CUDA")
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
    with torch.cuda.device(hidden.device):  # triton launches on the current device, not the tensors'
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
        s = tl.sum(acc, axis=1)
        if ROUND_BF16:
            s = s.to(tl.bfloat16, fp_downcast_rounding="rtne").to(tl.float32)
        if ROUND_FP16:
            s = s.to(tl.float16, fp_downcast_rounding="rtne").to(tl.float32)
        s = tl.where(s == 0.0, 0.0, s)  # -0.0 ties with +0.0, as in torch comparisons
        bits = s.to(tl.int32, bitcast=True)
        ordered = tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)  # signed int order == float order
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
