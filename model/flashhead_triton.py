"""FlashHead's greedy path with no host sync, in three launches: centroid scores (which also count
them), the selection of the p best clusters, then stage 2 (gather the probed clusters' rows, score
them, argmax), whose last program writes the winner.

Stage 1 (`select_clusters`): every centroid's score is the fp32 dot product with the hidden state,
rounded to the head's dtype as F.linear's output is, stored as an order-preserving integer key.
The p-th highest key is found a byte at a time, highest first, from histograms the centroid
programs build with atomic adds as they go: every key's top byte (level 0) and top 16 bits (level 1,
one 256-bin table per top byte), so bf16 scores, which differ only in their top 16 bits, need no
count pass at all (fp16 and fp32 keys add one count launch per further byte). Programs over slices
of the clusters then read the threshold off the histograms (two 256-bin scans) and write, in id
order, the ids scoring above it plus the lowest-index ties at it. Earlier designs spent 45-55 us
(a one-program bisection, a one-program radix select) and then 22 us (a count launch per byte,
each program re-reading every key) of the head's time here: reports/h200/decoder_speed.md.
torch.topk, which the torch path uses, picks among ties at the threshold in an unspecified order;
otherwise the two choose the same clusters.
Stage 2 semantics, shared with `stage2_reference`: a candidate's score is the fp32 dot product of
the hidden state (cast to the head's dtype) and its head row, rounded to the head's dtype as the
dense head's logits are; the winner is the highest score, the lowest token id among exact ties
(as `torch.argmax` over dense logits picks). Where the kernels run: model/triton_support.py.

Programs meet through a `Workspace` in device memory: histograms, tickets and best keys, in two
sets that alternate calls use, so each call's centroid kernel zeroes the previous call's set in
passing and no launch is spent resetting.
"""

from __future__ import annotations

import torch

from model.triton_support import AVAILABLE, launching_on, tl, triton

# Launch shapes (Triton meta-parameters), from a sweep on H200 (python -m measure.head_speed; record in
# git history at 10011a5, reports/h200/session4/flashhead_bench.txt).
CENTROID_LAUNCH = {"BLOCK_C": 4, "BLOCK_D": 256, "num_warps": 2}  # centroids per program, hidden per load
COUNT_LAUNCH = {"CHUNK": 1024, "num_warps": 4}  # keys per program of a count launch (fp16, fp32 only)
SELECT_LAUNCH = {"SLICE": 1024, "EARLIER": 16384, "num_warps": 4}  # keys a select program chooses from; at most
# EARLIER keys per load when it counts ties before them
STAGE2_LAUNCH = {"BLOCK_D": 128, "num_warps": 4}  # hidden elements per load of a stage-2 program
# Under triton's interpreter (CPU tests) every program is simulated in Python: fewest, widest programs.
_INTERPRETER_LAUNCH = {"BLOCK_C": 64, "CHUNK": 1024, "SLICE": 4096, "EARLIER": 2048}

# Bytes of a key that can differ (one histogram level each): a score rounded to bf16 (fp16) keeps
# its top 16 (19) bits.
_KEY_BYTES = {torch.bfloat16: 2, torch.float16: 3, torch.float32: 4}
# A row's counters: its histogram, level 0 (256 counts of the top byte), level 1 (256 x 256 counts
# of the top 16 bits), levels 2 and 3 (256 counts each, of the keys that match the prefix found above
# them); then (row 0 only) the count of stage-2 programs done.
_LEVEL1_AT, _DEEPER_AT = 256, 256 + 256 * 256
_SCORED_AT = _DEEPER_AT + 2 * 256
COUNTERS = _SCORED_AT + 1
# Below every finite score's key (only a negative NaN could map this low).
NO_KEY = -9223372036854775807


class Workspace:
    """Device state of the calls on `rows` hidden states: two sets of counters (and of each row's best
    key), which alternate calls use, and the number of calls made, which picks the set. A call's
    centroid kernel resets the other set (the previous call's) in passing and its stage 2 counts the
    call when it ends, so no launch or sync is spent on resetting. Calls sharing a workspace run one
    after another (one stream), each as select_clusters then stage2_argmax."""

    def __init__(self, rows: int, device: torch.device):
        self.rows = rows
        self.counters = torch.zeros((2, rows, COUNTERS), dtype=torch.int32, device=device)
        self.best = torch.full((2, rows), NO_KEY, dtype=torch.int64, device=device)
        self.calls = torch.zeros((1,), dtype=torch.int32, device=device)


def _launch(shape: dict, device: torch.device) -> dict:
    return dict(shape) if device.type == "cuda" else {k: _INTERPRETER_LAUNCH.get(k, v) for k, v in shape.items()}


def _workspace(workspace: Workspace | None, rows: int, device: torch.device) -> Workspace:
    if workspace is None:
        return Workspace(rows, device)
    if workspace.rows != rows or workspace.calls.device != device:
        raise ValueError(
            f"workspace is for {workspace.rows} rows on {workspace.calls.device}, the call has {rows} on {device}"
        )
    return workspace


def stage2_reference(
    hidden: torch.Tensor,
    cluster_ids: torch.Tensor,
    members: torch.Tensor,
    weight: torch.Tensor,
    always: torch.Tensor | None = None,
) -> torch.Tensor:
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


def select_clusters(
    hidden: torch.Tensor, centroids: torch.Tensor, probes: int, workspace: Workspace | None = None
) -> torch.Tensor:
    """hidden [n, d] (the head's dtype), centroids [c, d] -> the ids [n, probes] of the highest-scoring
    clusters, in increasing id order. 2 launches for bf16 (+1 per further key byte), no sync. With
    a shared workspace, stage2_argmax must follow (it ends the call)."""
    n, d = hidden.shape
    c = centroids.shape[0]
    levels = _KEY_BYTES[centroids.dtype]
    work = _workspace(workspace, n, hidden.device)
    keys = torch.empty((n, c), dtype=torch.int32, device=hidden.device)
    out = torch.empty((n, probes), dtype=torch.int64, device=hidden.device)
    with launching_on(hidden.device):
        centroid_launch = _launch(CENTROID_LAUNCH, hidden.device)
        programs = triton.cdiv(c, centroid_launch["BLOCK_C"])
        _centroid_keys_kernel[(n, programs)](
            hidden,
            centroids,
            keys,
            work.counters,
            work.best,
            work.calls,
            c,
            d,
            n,
            ROUND_BF16=centroids.dtype == torch.bfloat16,
            ROUND_FP16=centroids.dtype == torch.float16,
            RESET=triton.next_power_of_2(triton.cdiv(COUNTERS, programs)),
            **centroid_launch,
        )
        count_launch = _launch(COUNT_LAUNCH, hidden.device)
        for level in range(2, levels):
            _count_kernel[(n, triton.cdiv(c, count_launch["CHUNK"]))](
                keys, work.counters, work.calls, c, probes, n, LEVEL=level, **count_launch
            )
        select_launch = _launch(SELECT_LAUNCH, hidden.device)
        select_launch["EARLIER"] = min(triton.next_power_of_2(c), select_launch["EARLIER"])
        _select_kernel[(n, triton.cdiv(c, select_launch["SLICE"]))](
            keys, work.counters, work.calls, out, c, probes, n, LEVELS=levels, **select_launch
        )
    return out


def end_call(workspace: Workspace) -> None:
    """End a call that ran select_clusters without stage2_argmax (sampling scores the probed tokens
    itself): count it, as stage 2's last program would, so the next call uses the other set. Stage 1
    touches no best key and no count of stage-2 programs, so nothing else is left to reset."""
    workspace.calls.add_(1)


def stage2_argmax(
    hidden: torch.Tensor,
    cluster_ids: torch.Tensor,
    members: torch.Tensor,
    weight: torch.Tensor,
    always: torch.Tensor | None = None,
    workspace: Workspace | None = None,
) -> torch.Tensor:
    """Triton stage 2 with the signature and result of `stage2_reference`; one launch, no sync.

    Program (row, j) scores the tokens of the row's j-th probed cluster (past the p clusters: the
    next b always-scored tokens) and atomically maxes one packed 64-bit key
    (order-preserving score bits << 32 | (2^32 - 1 - token id)) into the row's best, so the max key
    is the max score with the lowest id; the last program of all writes the tokens, resets the best
    keys and its count for the set's next call, and counts the call. Integer max is
    order-independent, so the result is deterministic. Without select_clusters before it (indices
    given by a shortlist or a router) it needs no other launch. Compile (call once) before CUDA-graph
    capture.
    """
    if not AVAILABLE:
        raise RuntimeError("flashhead_triton.stage2_argmax needs triton")
    n, d = hidden.shape
    p = cluster_ids.shape[1]
    b = members.shape[1]
    if weight.stride(1) != 1 or members.stride() != (b, 1):
        raise ValueError("weight rows and members must be contiguous")
    work = _workspace(workspace, n, hidden.device)
    hidden = hidden.to(weight.dtype).contiguous()
    cluster_ids = cluster_ids.contiguous()
    a = 0 if always is None else always.numel()
    always_ptr = members if a == 0 else always.contiguous()
    launch = _launch(STAGE2_LAUNCH, hidden.device)
    blocks = p + triton.cdiv(a, b)
    out = torch.empty((n,), dtype=torch.int64, device=hidden.device)
    with launching_on(hidden.device):
        _stage2_kernel[(n, blocks)](
            hidden,
            hidden.stride(0),
            cluster_ids,
            cluster_ids.stride(0),
            members,
            weight,
            weight.stride(0),
            always_ptr,
            work.counters,
            work.best,
            work.calls,
            out,
            p,
            b,
            a,
            d,
            blocks,
            n,
            ROUND_BF16=weight.dtype == torch.bfloat16,
            ROUND_FP16=weight.dtype == torch.float16,
            BLOCK_B=triton.next_power_of_2(b),
            ROWS=min(triton.next_power_of_2(n), 64),
            **launch,
        )
    return out


if triton is not None:
    # Globals used in kernels must be constexpr; int64 constants are built with tl.full so no
    # literal is typed uint32.
    _NO_KEY = tl.constexpr(NO_KEY)
    _LOW_MASK = tl.constexpr(4294967295)
    _COUNTERS = tl.constexpr(COUNTERS)
    _LEVEL1 = tl.constexpr(_LEVEL1_AT)
    _DEEPER = tl.constexpr(_DEEPER_AT)
    _SCORED = tl.constexpr(_SCORED_AT)

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
    def _unsigned(key):
        """int32 keys -> uint32 in the same order."""
        return (key ^ -2147483648).to(tl.uint32, bitcast=True)

    @triton.jit
    def _set_rows(calls_ptr, row, n_rows):
        """Indices of `row` in this call's set of counters and in the previous call's."""
        parity = tl.load(calls_ptr) & 1
        return parity * n_rows + row, (1 - parity) * n_rows + row

    @triton.jit
    def _row_dots(h, rows, valid, D: tl.constexpr, R: tl.constexpr, BLOCK_D: tl.constexpr):
        """fp32 dot products of the D elements at h with the R rows starting at rows[i] (valid ones)."""
        acc = tl.zeros([R, BLOCK_D], dtype=tl.float32)
        for d0 in tl.static_range(0, D, BLOCK_D):  # unrolled: every chunk's load in flight at once
            dd = d0 + tl.arange(0, BLOCK_D)
            dm = dd < D
            x = tl.load(h + dd, mask=dm, other=0.0).to(tl.float32)
            w = tl.load(rows[:, None] + dd[None, :], mask=valid[:, None] & dm[None, :], other=0.0).to(tl.float32)
            acc += w * x[None, :]
        return tl.sum(acc, axis=1)

    @triton.jit
    def _centroid_keys_kernel(
        h_ptr,
        c_ptr,
        key_ptr,
        counter_ptr,
        best_ptr,
        calls_ptr,
        C,
        D: tl.constexpr,
        n_rows,
        ROUND_BF16: tl.constexpr,
        ROUND_FP16: tl.constexpr,
        RESET: tl.constexpr,
        BLOCK_C: tl.constexpr,
        BLOCK_D: tl.constexpr,
    ):
        """Program (row, j): the keys of BLOCK_C centroids, counted into the row's histogram levels 0
        and 1; and RESET of the previous call's counters for the row zeroed (its best key too)."""
        row = tl.program_id(0).to(tl.int64)
        j = tl.program_id(1)
        cl = j * BLOCK_C + tl.arange(0, BLOCK_C)
        valid = cl < C
        scores = _row_dots(h_ptr + row * D, c_ptr + cl.to(tl.int64) * D, valid, D, BLOCK_C, BLOCK_D)
        key = _ordered(scores, ROUND_BF16, ROUND_FP16)
        tl.store(key_ptr + row * C + cl, key, mask=valid)
        ukey = _unsigned(key)
        this, previous = _set_rows(calls_ptr, row, n_rows)
        hist = counter_ptr + this * _COUNTERS
        tl.atomic_add(hist + (ukey >> 24).to(tl.int32), 1, mask=valid, sem="relaxed")
        tl.atomic_add(hist + _LEVEL1 + (ukey >> 16).to(tl.int32), 1, mask=valid, sem="relaxed")
        done = j * RESET + tl.arange(0, RESET)
        tl.store(counter_ptr + previous * _COUNTERS + done, tl.zeros([RESET], dtype=tl.int32), mask=done < _COUNTERS)
        if j == 0:
            tl.store(best_ptr + previous, tl.full([], _NO_KEY, tl.int64))

    @triton.jit
    def _table(hist, level: tl.constexpr, prefix):
        """Level `level`'s 256 counts in a row's histogram, given the prefix of the levels above."""
        if level == 0:
            return hist
        elif level == 1:
            return hist + _LEVEL1 + prefix.to(tl.int32) * 256
        else:
            return hist + _DEEPER + (level - 2) * 256

    @triton.jit
    def _threshold(hist, P, LEVELS: tl.constexpr):
        """From a row's histogram: the top 8 * LEVELS bits T of the p-th highest key (at each level
        the highest byte value that keeps P keys at or above it), and how many keys lie above T."""
        bins = tl.arange(0, 256)
        prefix = tl.zeros([], dtype=tl.uint32)
        above = tl.zeros([], dtype=tl.int32)
        for level in tl.static_range(LEVELS):
            count = tl.load(_table(hist, level, prefix) + bins)
            reach = above + tl.cumsum(count, axis=0, reverse=True)  # keys at or above prefix.b, per b
            best = tl.max(tl.where(reach >= P, bins, 0), axis=0)
            above = tl.sum(tl.where(bins == best, reach - count, 0), axis=0)
            prefix = (prefix << 8) | best.to(tl.uint32)
        return prefix, above

    @triton.jit
    def _count_kernel(key_ptr, counter_ptr, calls_ptr, C, P, n_rows, LEVEL: tl.constexpr, CHUNK: tl.constexpr):
        """Level LEVEL (2 or 3) of the histogram: program (row, j) counts byte LEVEL of the keys in
        its chunk whose top 8 * LEVEL bits are the prefix found so far."""
        row = tl.program_id(0).to(tl.int64)
        hist = counter_ptr + _set_rows(calls_ptr, row, n_rows)[0] * _COUNTERS
        prefix, _ = _threshold(hist, P, LEVEL)
        idx = tl.program_id(1) * CHUNK + tl.arange(0, CHUNK)
        valid = idx < C
        ukey = _unsigned(tl.load(key_ptr + row * C + idx, mask=valid, other=0))
        match = valid & ((ukey >> (32 - 8 * LEVEL)) == prefix)
        byte = ((ukey >> (24 - 8 * LEVEL)) & 255).to(tl.int32)
        tl.atomic_add(_table(hist, LEVEL, prefix) + byte, 1, mask=match, sem="relaxed")

    @triton.jit
    def _select_kernel(
        key_ptr,
        counter_ptr,
        calls_ptr,
        out_ptr,
        C,
        P,
        n_rows,
        LEVELS: tl.constexpr,
        SLICE: tl.constexpr,
        EARLIER: tl.constexpr,
    ):
        """Program (row, j) writes the chosen ids among keys [j * SLICE, (j + 1) * SLICE): the ids
        above the threshold T and the first ties at T, in id order. Keys rounded to a 16-bit float
        differ only in T's bits (constant low bits within a sign), so keys at T are exact ties
        (common for bf16 scores: ~20 centroids share the threshold's value). Each program counts the
        keys above T and at T before its slice itself (EARLIER keys per load, issued with the
        histogram's), so the slots need no scan across programs."""
        row = tl.program_id(0).to(tl.int64)
        start = tl.program_id(1) * SLICE
        idx = start + tl.arange(0, SLICE)
        valid = idx < C
        key = tl.load(key_ptr + row * C + idx, mask=valid, other=0)
        hist = counter_ptr + _set_rows(calls_ptr, row, n_rows)[0] * _COUNTERS
        threshold, above = _threshold(hist, P, LEVELS)
        shift = 32 - 8 * LEVELS
        above_before = tl.zeros([], dtype=tl.int32)
        ties_before = tl.zeros([], dtype=tl.int32)
        for s in range(0, start, EARLIER):
            every = s + tl.arange(0, EARLIER)
            earlier = _unsigned(tl.load(key_ptr + row * C + every, mask=every < start, other=0)) >> shift
            above_before += tl.sum(((every < start) & (earlier > threshold)).to(tl.int32), axis=0)
            ties_before += tl.sum(((every < start) & (earlier == threshold)).to(tl.int32), axis=0)
        need = P - above
        top = _unsigned(key) >> shift
        tie = valid & (top == threshold)
        chosen = (valid & (top > threshold)) | (tie & (ties_before + tl.cumsum(tie.to(tl.int32), axis=0) <= need))
        slot = above_before + tl.minimum(ties_before, need) + tl.cumsum(chosen.to(tl.int32), axis=0) - 1
        tl.store(out_ptr + row * P + slot, idx.to(tl.int64), mask=chosen)

    @triton.jit
    def _stage2_kernel(
        h_ptr,
        h_stride,
        cl_ptr,
        cl_stride,
        mem_ptr,
        w_ptr,
        w_stride,
        always_ptr,
        counter_ptr,
        best_ptr,
        calls_ptr,
        out_ptr,
        P,
        B,
        A,
        D: tl.constexpr,
        n_blocks,
        n_rows,
        ROUND_BF16: tl.constexpr,
        ROUND_FP16: tl.constexpr,
        BLOCK_B: tl.constexpr,
        BLOCK_D: tl.constexpr,
        ROWS: tl.constexpr,
    ):
        row = tl.program_id(0)
        j = tl.program_id(1)
        t = tl.arange(0, BLOCK_B)
        if j < P:  # a probed cluster's tokens
            cluster = tl.load(cl_ptr + row.to(tl.int64) * cl_stride + j)
            valid = t < B
            tok = tl.load(mem_ptr + cluster * B + t, mask=valid, other=0).to(tl.int64)
        else:  # always-scored tokens
            a = (j - P) * B + t
            valid = (t < B) & (a < A)
            tok = tl.load(always_ptr + a, mask=valid, other=0).to(tl.int64)
        scores = _row_dots(h_ptr + row.to(tl.int64) * h_stride, w_ptr + tok * w_stride, valid, D, BLOCK_B, BLOCK_D)
        ordered = _ordered(scores, ROUND_BF16, ROUND_FP16)
        low = tl.full([BLOCK_B], _LOW_MASK, tl.int64)
        key = (ordered.to(tl.int64) << 32) | (low - tok)
        key = tl.max(tl.where(valid, key, tl.full([BLOCK_B], _NO_KEY, tl.int64)), axis=0)
        calls = tl.load(calls_ptr)
        first = (calls & 1) * n_rows  # this call's set, row 0
        tl.atomic_max(best_ptr + first + row, key, sem="relaxed")
        if tl.atomic_add(counter_ptr + first * _COUNTERS + _SCORED, 1, sem="acq_rel") == n_rows * n_blocks - 1:
            for r0 in range(0, n_rows, ROWS):  # the last program of all: every program's max is in
                r = r0 + tl.arange(0, ROWS)
                top = tl.atomic_xchg(  # read every row's best, and reset it for this set's next call
                    best_ptr + first + r, tl.full([ROWS], _NO_KEY, tl.int64), mask=r < n_rows, sem="relaxed"
                )
                mask = tl.full([ROWS], _LOW_MASK, tl.int64)
                tl.store(out_ptr + r, mask - (top & mask), mask=r < n_rows)
            # the call is over: the count of programs done is reset (so stage 2 may run without stage 1:
            # the shortlist and router heads), and the next call uses the other set
            tl.store(counter_ptr + first * _COUNTERS + _SCORED, 0)
            tl.store(calls_ptr, calls + 1)
