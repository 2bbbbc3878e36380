"""FlashHead's greedy path with no host sync: centroid scores, top-p selection, then stage 2 (gather
the probed clusters' rows, score them, argmax) and its final reduction.

Stage 1 (`select_clusters`): every centroid's score is the fp32 dot product with the hidden state,
rounded to the head's dtype as F.linear's output is, stored as an order-preserving integer key.
The p-th highest key is found a byte at a time, highest first (2 levels for bf16 scores, which
differ only in their top 16 bits): at each level programs count the keys at or above each of the
256 candidate bytes, in parallel, so a level costs one launch over L2-resident keys rather than a
loop of block-wide reductions in one program (that bisection, and a one-program radix select with
tl.histogram, took 45-55 us of the head's ~80 on H200: reports/h200/decoder_speed.md). Then
programs over slices of the clusters write the p cluster ids scoring above the threshold, plus the
lowest-index ties at it, in id order. torch.topk, which the torch path uses, picks among ties at
the threshold in an unspecified order; otherwise the two choose the same clusters.
Stage 2 semantics, shared with `stage2_reference`: a candidate's score is the fp32 dot product of
the hidden state (cast to the head's dtype) and its head row, rounded to the head's dtype as the
dense head's logits are; the winner is the highest score, the lowest token id among exact ties
(as `torch.argmax` over dense logits picks). Where the kernels run: model/triton_support.py.
"""

from __future__ import annotations

import torch

from model.triton_support import AVAILABLE, launching_on, tl, triton

# Launch shapes (Triton meta-parameters), from a sweep on H200 (reports/h200/flashhead_bench.py,
# record in reports/h200/session3/flashhead_bench.txt).
CENTROID_LAUNCH = {"BLOCK_C": 4, "BLOCK_D": 256, "num_warps": 2}  # centroids per program, hidden per load
SELECT_LAUNCH = {"SLICE": 512, "num_warps": 8}  # keys whose chosen ids a select program writes
COUNT_LAUNCH = {"BINS": 2, "CHUNK": 8192, "num_warps": 8}  # byte values and keys per step of a count program
STAGE2_LAUNCH = {"BLOCK_T": 16, "BLOCK_D": 256, "num_warps": 8}  # candidate tokens per program
# Under triton's interpreter (CPU tests) every program is simulated in Python: fewest, widest programs.
_INTERPRETER_LAUNCH = {"BLOCK_C": 64, "BINS": 256, "CHUNK": 1024, "SLICE": 4096, "BLOCK_T": 64}

FINAL_BLOCK = 1024  # partial keys reduced per loop step of the final kernel
# Bytes of a key that can differ (one count level each): a score rounded to bf16 (fp16) keeps its
# top 16 (19) bits.
_KEY_BYTES = {torch.bfloat16: 2, torch.float16: 3, torch.float32: 4}


def _launch(shape: dict, device: torch.device) -> dict:
    return shape if device.type == "cuda" else {k: _INTERPRETER_LAUNCH.get(k, v) for k, v in shape.items()}


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
    clusters, in increasing id order. 2 + levels launches (4 for bf16), no sync."""
    n, d = hidden.shape
    c = centroids.shape[0]
    levels = _KEY_BYTES[centroids.dtype]
    keys = torch.empty((n, c), dtype=torch.int32, device=hidden.device)
    counts = torch.empty((levels, n, 256), dtype=torch.int32, device=hidden.device)
    out = torch.empty((n, probes), dtype=torch.int64, device=hidden.device)
    with launching_on(hidden.device):
        centroid_launch = _launch(CENTROID_LAUNCH, hidden.device)
        _centroid_keys_kernel[(n, triton.cdiv(c, centroid_launch["BLOCK_C"]))](
            hidden, centroids, keys, c, d, ROUND_BF16=centroids.dtype == torch.bfloat16,
            ROUND_FP16=centroids.dtype == torch.float16, **centroid_launch)
        count_launch = _launch(COUNT_LAUNCH, hidden.device)
        for level in range(levels):
            _count_kernel[(n, 256 // count_launch["BINS"])](keys, counts, c, probes, n, LEVEL=level, **count_launch)
        select_launch = _launch(SELECT_LAUNCH, hidden.device)
        _select_kernel[(n, triton.cdiv(c, select_launch["SLICE"]))](
            keys, counts, out, c, probes, n, LEVELS=levels, BLOCK=min(triton.next_power_of_2(c), 16384), **select_launch)
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
    launch = _launch(STAGE2_LAUNCH, hidden.device)
    blocks = triton.cdiv(p * b + a, launch["BLOCK_T"])
    partial = torch.empty((n, blocks), dtype=torch.int64, device=hidden.device)
    out = torch.empty((n,), dtype=torch.int64, device=hidden.device)
    with launching_on(hidden.device):
        _stage2_kernel[(n, blocks)](
            hidden, hidden.stride(0), cluster_ids, cluster_ids.stride(0), members, weight, weight.stride(0),
            always_ptr, partial, p, b, a, d, blocks,
            ROUND_BF16=weight.dtype == torch.bfloat16, ROUND_FP16=weight.dtype == torch.float16, **launch)
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
    def _unsigned_keys(key_ptr, row, C, start, CHUNK: tl.constexpr):
        """Keys [start, start + CHUNK) of a row as uint32 in the same order (absent ones: 0, the lowest)."""
        idx = start + tl.arange(0, CHUNK)
        valid = idx < C
        key = tl.load(key_ptr + row * C + idx, mask=valid, other=-2147483648)
        return (key ^ -2147483648).to(tl.uint32, bitcast=True), valid

    @triton.jit
    def _prefix(count_ptr, row, n_rows, P, LEVELS: tl.constexpr):
        """The top 8 * LEVELS bits of the p-th highest key, from the counts of levels 0..LEVELS-1:
        at each level the highest byte value b whose count (keys at or above prefix.b) is >= P."""
        bins = tl.arange(0, 256)
        prefix = tl.zeros([], dtype=tl.uint32)
        for level in tl.static_range(LEVELS):
            count = tl.load(count_ptr + (level * n_rows + row) * 256 + bins)
            best = tl.max(tl.where(count >= P, bins, 0), axis=0)
            prefix = (prefix << 8) | best.to(tl.uint32)
        return prefix

    @triton.jit
    def _count_kernel(key_ptr, count_ptr, C, P, n_rows, LEVEL: tl.constexpr, BINS: tl.constexpr,
                      CHUNK: tl.constexpr):
        """Program (row, j) counts, for each of BINS byte values b, the keys whose top 8 * (LEVEL + 1)
        bits are >= (prefix found so far).b. 256 / BINS programs per level read the row's keys
        (from L2) in parallel: a level is one launch."""
        row = tl.program_id(0).to(tl.int64)
        byte = tl.program_id(1) * BINS + tl.arange(0, BINS)
        probe = (_prefix(count_ptr, row, n_rows, P, LEVEL) << 8) | byte.to(tl.uint32)
        total = tl.zeros([BINS, CHUNK], dtype=tl.int32)
        for start in range(0, C, CHUNK):
            ukey, valid = _unsigned_keys(key_ptr, row, C, start, CHUNK)
            top = ukey >> (24 - 8 * LEVEL)
            total += (valid[None, :] & (top[None, :] >= probe[:, None])).to(tl.int32)
        tl.store(count_ptr + (LEVEL * n_rows + row) * 256 + byte, tl.sum(total, axis=1))

    @triton.jit
    def _select_kernel(key_ptr, count_ptr, out_ptr, C, P, n_rows, LEVELS: tl.constexpr, SLICE: tl.constexpr,
                       BLOCK: tl.constexpr):
        """Program (row, j) writes the chosen ids among keys [j * SLICE, (j + 1) * SLICE): the ids
        above the threshold T (the p-th highest key's top 8 * LEVELS bits, from the counts) and the
        first ties at T. Keys rounded to a 16-bit float differ only in those bits (constant low
        bits within a sign), so keys at T are exact ties. Each program counts the keys above T and
        at T before its slice itself (a read of the row's keys from L2), so the ids land in id
        order without a scan across programs."""
        row = tl.program_id(0).to(tl.int64)
        start = tl.program_id(1) * SLICE
        threshold = _prefix(count_ptr, row, n_rows, P, LEVELS)
        shift = 32 - 8 * LEVELS
        above_all = tl.zeros([BLOCK], dtype=tl.int32)
        above_before = tl.zeros([BLOCK], dtype=tl.int32)
        ties_before = tl.zeros([BLOCK], dtype=tl.int32)
        for s in range(0, C, BLOCK):
            ukey, valid = _unsigned_keys(key_ptr, row, C, s, BLOCK)
            before = (s + tl.arange(0, BLOCK)) < start
            above = (valid & ((ukey >> shift) > threshold)).to(tl.int32)
            above_all += above
            above_before += tl.where(before, above, 0)
            ties_before += (valid & before & ((ukey >> shift) == threshold)).to(tl.int32)
        need = P - tl.sum(above_all, axis=0)
        ties_earlier = tl.sum(ties_before, axis=0)
        ties_taken = tl.minimum(ties_earlier, need)
        ukey, valid = _unsigned_keys(key_ptr, row, C, start, SLICE)
        above = valid & ((ukey >> shift) > threshold)
        tie = valid & ((ukey >> shift) == threshold)
        tie_rank = ties_earlier + tl.cumsum(tie.to(tl.int32), axis=0)
        chosen = above | (tie & (tie_rank <= need))
        slot = tl.sum(above_before, axis=0) + ties_taken + tl.cumsum(chosen.to(tl.int32), axis=0) - 1
        tl.store(out_ptr + row * P + slot, (start + tl.arange(0, SLICE)).to(tl.int64), mask=chosen)

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
