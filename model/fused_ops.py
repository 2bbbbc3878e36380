"""Triton kernels for the Qwen3 and Llama decoder layer: few launches per layer, no host sync, graph-safe.

The eager layer launches ~40 small kernels (float32 norm casts and reductions, RoPE, cache index
copies, mask building, SDPA over every cache slot); under CUDA graphs the launches are cheap but the
kernels still run one after another, so a 0.6B draft step cost 4.8 ms against a 0.2 ms floor. Here
a layer is: norm (with the residual add), the merged q/k/v GEMM, one kernel for the q/k norms (Qwen3),
RoPE and the cache write, one attention kernel that reads only the slots up to the last query's position
(the bound is read on the device, so one graph serves every cache fill), o_proj, norm, the merged
gate/up GEMM, SiLU*mul, down_proj. At decode widths the attention kernel does the q/k norms, RoPE and
the cache write itself (qkv_attention); a draft's down_proj GEMV takes SiLU*mul on its load
(model/dense_gemv.py), so a draft's decode layer is 7 launches.

Numerics follow the torch path of model/transformer.py (float32 math, rounded to the activation
dtype wherever torch rounds), so the two paths agree to rounding, not bit for bit: a run uses one
path throughout. Attention differs from SDPA only in summation order. Every kernel computes a row
from that row's inputs alone, so a token's values do not depend on the other rows of the forward.
Where they can run: model/triton_support.py.
"""

from __future__ import annotations

import torch

from model.split_k import tickets_for
from model.triton_support import after_previous, overlap, tl, triton
from model.triton_support import launching_on as _on

ATTENTION_BLOCK_N = 64  # cache slots per attention loop step
# Query rows per attention program. 16 rather than up to 64: more programs walk the cache side by side
# (Qwen3-32B, 8 tokens at 300 positions, H200: 8.6 us against 12.8 at 64 rows; the same bits,
# record in git history at 10011a5, reports/h200/session5/attention_bench.txt).
ATTENTION_BLOCK_M = 16
# Split-KV ("flash-decoding"): cache slots per program, so a long cache is read by many programs at once
# rather than by one per KV head (8 programs for Qwen3-0.6B: its attention over 4,000 slots read at about
# 0.3 TB/s on H200). Splits start at fixed slots (split_starts), so a row's sum runs in the same order
# whatever the other rows' positions; None: one program per KV head and row block walks every slot.
SPLIT_SLOTS = 128
# Where one KV head serves WIDE_GROUP or more query heads, each split program prepares and merges that many
# more rows (times the forward's tokens), so fewer, longer splits pay: the 32B AWQ target step (8 query heads
# a KV head, the decoder's width of 8 tokens, one H200) took 11.13-11.19 ms at context 4,000 with 512 slots
# a split against 12.49-12.56 with 128 (300: 9.82-9.91 against 9.94-9.96; session 15). A model's split is
# one constant (Transformer.attention_split_slots), never chosen per forward: a row's sums run over the same
# splits whatever the forward's width, which keeps the target's verify and its own decoding exact.
WIDE_GROUP, WIDE_GROUP_SPLIT_SLOTS = 8, 512
# The slots below a model's split are split SHORT_SPLIT_SLOTS at a time (splits 0 .. split / SHORT - 1), and
# the rest split by split: a short cache, where the decoder mostly runs, is read by more programs, and a long
# one merges few partial sums. The 32B AWQ target step on one H200 at context 300 with uniform splits of 128
# against 512: 7.213-7.222 ms against 7.293-7.313 (32 slots a loop step), but at 4,000 8.706-8.724 against
# 7.940-8.025 (session 27). Fixed slots still: a row's sums run in the same order whatever the forward.
SHORT_SPLIT_SLOTS = 128


def split_slots_for(n_heads: int, n_kv_heads: int) -> int:
    """A model's split-KV slots per program (SPLIT_SLOTS, or WIDE_GROUP_SPLIT_SLOTS for wide groups)."""
    return WIDE_GROUP_SPLIT_SLOTS if n_heads // n_kv_heads >= WIDE_GROUP else SPLIT_SLOTS


def short_split_slots(split_slots: int) -> int:
    """The slots of each split below the first `split_slots` (SHORT_SPLIT_SLOTS, or the split where smaller)."""
    short = min(SHORT_SPLIT_SLOTS, split_slots)
    if short % ATTENTION_BLOCK_N:
        raise ValueError(f"split_slots {split_slots}: not a multiple of {ATTENTION_BLOCK_N} (an attention loop step)")
    if split_slots % short:
        raise ValueError(f"split_slots {split_slots}: not a multiple of {short} (the short splits below it)")
    return short


def split_starts(split_slots: int, slots: int) -> list[int]:
    """The first slot of every split of a cache of `slots` slots: short splits up to split_slots, then whole ones."""
    short = short_split_slots(split_slots)
    return [*range(0, min(slots, split_slots), short), *range(split_slots, slots, split_slots)]


# Forwards of more new tokens (prefill) take the one-pass kernel: they have row blocks enough, and the
# partial sums would grow with tokens x slots. The decoder's target decode forwards all have one width
# (model/decoder.py, width()), so they all take the same path.
SPLIT_MAX_TOKENS = 16
# Splits merged per step of the last split's combine, their loads in flight together (in the last step,
# splits past the last one are masked). On one H200 the draft step at context 4,000 took 1.213 ms with 8
# against 1.355 with 1 (300: 0.941 against 0.939); 128 slots against 256 per split: 0.941 against 1.030 ms at
# 300, 1.213 against 1.162 at 4,000 (session 14); measure.routes' draft-layer route had 4 ahead of 8 at both.
COMBINE_CHUNK = 4


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, delta: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Qwen3's RMSNorm of rows x [n, d], after the residual add x + delta when given.
    Returns (x + delta (or x), its norm)."""
    n, d = x.shape
    out = torch.empty_like(x)
    h = torch.empty_like(x) if delta is not None else x
    with _on(x.device):
        _rms_norm_kernel[(n,)](
            x,
            x if delta is None else delta,
            weight,
            h,
            out,
            d,
            eps,
            HAS_DELTA=delta is not None,
            BLOCK_D=triton.next_power_of_2(d),
            num_warps=8 if d > 2048 else 4,
            **overlap(x.device),
        )
    return h, out


def attention_tickets(n_heads: int, n_kv_heads: int, device: torch.device) -> torch.Tensor:
    """Zeroed tickets for every split attention call of a model with these heads (`attention`'s tickets)."""
    row_blocks = -(-(n_heads // n_kv_heads) * SPLIT_MAX_TOKENS // ATTENTION_BLOCK_M)
    return torch.zeros(n_kv_heads * row_blocks, dtype=torch.int32, device=device)


def qk_norm_rope_cache(
    qkv: torch.Tensor,
    q_weight: torch.Tensor | None,
    k_weight: torch.Tensor | None,
    cos: torch.Tensor,
    sin: torch.Tensor,
    pos: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    n_heads: int,
    eps: float,
    rope: torch.Tensor | None = None,
) -> torch.Tensor:
    """qkv [n, (H + 2 Hkv) * hd] from the merged projection -> q [n, H, hd] normed and rotated;
    k normed and rotated, and v, are written into the caches [1, Hkv, S, hd] at slots `pos`. Without
    norm weights (Llama) q and k are only rotated. Rotation is at positions `rope` (default `pos`:
    a tree's nodes sit at slots past their positions)."""
    n = qkv.shape[0]
    norm = q_weight is not None
    _, n_kv, slots, head_dim = k_cache.shape
    q = torch.empty((n, n_heads, head_dim), dtype=qkv.dtype, device=qkv.device)
    with _on(qkv.device):
        _qk_norm_rope_cache_kernel[(n, n_heads + n_kv)](
            qkv,
            q_weight if norm else qkv,  # unread without the norm
            k_weight if norm else qkv,
            cos,
            sin,
            pos,
            pos if rope is None else rope,
            q,
            k_cache,
            v_cache,
            n_heads,
            n_kv,
            slots,
            eps,
            HEAD_DIM=head_dim,
            NORM=norm,
            num_warps=1,
            **overlap(qkv.device),
        )
    return q


def attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    pos: torch.Tensor,
    scale: float,
    split_slots: int | None = SPLIT_SLOTS,
    tree=None,
    tickets: torch.Tensor | None = None,
) -> torch.Tensor:
    """q [n, H, hd] at slots pos [n] over the caches [1, Hkv, S, hd] -> [n, H * hd]; query i
    attends to slots <= pos[i], or with `tree` (rope, ancestors [n] int64, base [1]) to the slots
    below base and the slots base + j whose bit j is set in ancestors[i] (model.transformer.tree_visible).
    Slots above the largest position are never read.

    Three routes. Without `split_slots` (tree decoders) or with a tree, one path-ordered program per
    token: a tree query reads its ancestors' keys as if they sat at base, base + 1, ..., where a chain
    holds the same tokens, and a causal query runs the same compiled code with base = its position + 1;
    so a tree row is bit for bit the chain row of its path. With `split_slots` and at most
    SPLIT_MAX_TOKENS tokens, programs over the splits of `split_starts` (SHORT_SPLIT_SLOTS slots each up to
    split_slots, then split_slots each) write partial sums, and the last of a row block's splits to finish
    combines them per row, in split order (tickets: int32 zeros, one per KV head and block of
    ATTENTION_BLOCK_M stacked rows, left zero; a model keeps them so the call needs no memset). Otherwise (a prefill) one program per block of stacked query rows."""
    n, n_heads, head_dim = q.shape
    _, n_kv, slots, _ = k_cache.shape
    group = n_heads // n_kv
    rows = group * n  # the query rows of one KV head, stacked
    out = torch.empty((n, n_heads * head_dim), dtype=q.dtype, device=q.device)
    row_blocks = triton.cdiv(rows, ATTENTION_BLOCK_M)
    shape = {"GROUP": group, "HEAD_DIM": head_dim, "BLOCK_M": ATTENTION_BLOCK_M, "BLOCK_N": ATTENTION_BLOCK_N}
    if tree is not None or split_slots is None:
        ancestors, tree_base = (pos, pos) if tree is None else (tree[1], tree[2])
        head_blocks = triton.cdiv(group, ATTENTION_BLOCK_M)
        with _on(q.device):
            _path_ordered_attention_kernel[(n_kv, n * head_blocks)](
                q,
                k_cache,
                v_cache,
                pos,
                ancestors,
                tree_base,
                out,
                slots,
                scale,
                n_heads,
                int(tree is not None),
                HEAD_BLOCKS=head_blocks,
                **shape,
                num_warps=4,
                **overlap(q.device),
            )
        return out
    if n > SPLIT_MAX_TOKENS:
        with _on(q.device):
            _attention_kernel[(n_kv, row_blocks)](
                q, k_cache, v_cache, pos, out, n, slots, scale, n_heads, **shape, num_warps=4, **overlap(q.device)
            )
        return out
    return _split_attention(q, k_cache, v_cache, pos, scale, split_slots, tickets, out, n_heads)


def _split_attention(q, k_cache, v_cache, pos, scale, split_slots, tickets, out, n_heads, from_qkv=None):
    """The split route of `attention` (and of `qkv_attention`, whose launch arguments are `from_qkv`)."""
    n = pos.shape[0]
    _, n_kv, slots, head_dim = k_cache.shape
    group = n_heads // n_kv
    rows = group * n  # the query rows of one KV head, stacked
    row_blocks = triton.cdiv(rows, ATTENTION_BLOCK_M)
    short = short_split_slots(split_slots)
    splits = len(split_starts(split_slots, slots))
    partial_sums = torch.empty((n_kv, rows, splits, head_dim), dtype=torch.float32, device=q.device)
    partial_stats = torch.empty((n_kv, rows, splits, 2), dtype=torch.float32, device=q.device)  # max, total
    tickets = tickets_for(tickets, n_kv * row_blocks, q.device)
    prepare = from_qkv or {"qw": q, "kw": q, "cos": q, "sin": q, "eps": 0.0, "NORM": False}
    with _on(q.device):
        _attention_split_kernel[(n_kv, row_blocks, splits)](
            q,
            k_cache,
            v_cache,
            pos,
            partial_sums,
            partial_stats,
            tickets,
            out,
            n,
            slots,
            scale,
            n_heads,
            prepare["qw"],
            prepare["kw"],
            prepare["cos"],
            prepare["sin"],
            prepare["eps"],
            SPLIT=split_slots,
            SHORT=short,
            GROUP=group,
            HEAD_DIM=head_dim,
            BLOCK_M=ATTENTION_BLOCK_M,
            BLOCK_N=ATTENTION_BLOCK_N,
            CHUNK=COMBINE_CHUNK,
            FROM_QKV=from_qkv is not None,
            NORM=prepare["NORM"],
            BLOCK_T=SPLIT_MAX_TOKENS,
            num_warps=4,
            **overlap(q.device),
        )
    return out


def takes_qkv(n: int, split_slots: int | None, tree) -> bool:
    """Whether `qkv_attention` runs a forward of n new tokens: the causal split route (decode widths)."""
    return tree is None and split_slots is not None and n <= SPLIT_MAX_TOKENS


def qkv_attention(
    qkv: torch.Tensor,
    q_weight: torch.Tensor | None,
    k_weight: torch.Tensor | None,
    cos: torch.Tensor,
    sin: torch.Tensor,
    pos: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    n_heads: int,
    eps: float,
    scale: float,
    split_slots: int,
    tickets: torch.Tensor | None = None,
) -> torch.Tensor:
    """qk_norm_rope_cache then `attention`'s split route, in one launch (`takes_qkv` forwards): each
    program norms and rotates its own query rows from qkv [n, (H + 2 Hkv) * hd], and writes the new
    tokens' keys and values that fall in its split into the caches before it reads them (a row block's
    programs of one split write the same bits). The two kernels' formulas, one launch fewer a layer: bit for
    bit under the interpreter; on a GPU a head's sum of squares may run in another order (a decoder runs
    every decode forward of its target through one of the two, so exactness does not rest on it)."""
    n = pos.shape[0]
    n_kv = k_cache.shape[1]
    if qkv.shape != (n, (n_heads + 2 * n_kv) * k_cache.shape[-1]) or not takes_qkv(n, split_slots, None):
        raise ValueError(f"qkv {tuple(qkv.shape)} at {n} positions is not a split-route forward of this cache")
    out = torch.empty((n, n_heads * k_cache.shape[-1]), dtype=k_cache.dtype, device=qkv.device)
    norm = q_weight is not None
    from_qkv = {
        "qw": q_weight if norm else qkv,  # unread without the norm
        "kw": k_weight if norm else qkv,
        "cos": cos,
        "sin": sin,
        "eps": eps,
        "NORM": norm,
    }
    return _split_attention(qkv, k_cache, v_cache, pos, scale, split_slots, tickets, out, n_heads, from_qkv)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """[n, 2I] (gate, then up) -> silu(gate) * up [n, I], rounded as torch rounds each op."""
    n, width = gate_up.shape
    inner = width // 2
    out = torch.empty((n, inner), dtype=gate_up.dtype, device=gate_up.device)
    block = 1024
    with _on(gate_up.device):
        _silu_mul_kernel[(n, triton.cdiv(inner, block))](
            gate_up, out, inner, BLOCK=block, num_warps=4, **overlap(gate_up.device)
        )
    return out


if triton is not None:

    @triton.jit
    def _rounded(x, ptr):
        """x (float32) rounded to the element type of `ptr`, back in float32: torch's per-op rounding."""
        return x.to(ptr.dtype.element_ty).to(tl.float32)

    @triton.jit
    def _rms_norm_kernel(
        x_ptr,
        delta_ptr,
        w_ptr,
        h_ptr,
        out_ptr,
        D,
        eps,
        HAS_DELTA: tl.constexpr,
        BLOCK_D: tl.constexpr,
        PDL: tl.constexpr,
    ):
        after_previous(PDL)
        row = tl.program_id(0).to(tl.int64)
        d = tl.arange(0, BLOCK_D)
        mask = d < D
        x = tl.load(x_ptr + row * D + d, mask=mask, other=0.0).to(tl.float32)
        if HAS_DELTA:
            x = _rounded(x + tl.load(delta_ptr + row * D + d, mask=mask, other=0.0).to(tl.float32), h_ptr)
            tl.store(h_ptr + row * D + d, x.to(h_ptr.dtype.element_ty), mask=mask)
        normed = _rounded(x * tl.rsqrt(tl.sum(x * x, axis=0) / D + eps), out_ptr)
        w = tl.load(w_ptr + d, mask=mask, other=0.0).to(tl.float32)
        tl.store(out_ptr + row * D + d, (normed * w).to(out_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def _norm_rope(x1, x2, w_ptr, c, s, eps, out_ptr, HALF: tl.constexpr, NORM: tl.constexpr):
        """RMSNorm of heads (halves x1, x2 [rows, HALF]; skipped without NORM), then RoPE: out = x*cos + cat(-x2, x1)*sin."""
        half = tl.arange(0, HALF)
        if NORM:
            inv = tl.rsqrt((tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1)) / (2 * HALF) + eps)[:, None]
            y1 = _rounded(_rounded(x1 * inv, out_ptr) * tl.load(w_ptr + half).to(tl.float32)[None, :], out_ptr)
            y2 = _rounded(_rounded(x2 * inv, out_ptr) * tl.load(w_ptr + HALF + half).to(tl.float32)[None, :], out_ptr)
        else:
            y1, y2 = x1, x2
        r1 = _rounded(_rounded(y1 * c, out_ptr) + _rounded(-y2 * s, out_ptr), out_ptr)
        r2 = _rounded(_rounded(y2 * c, out_ptr) + _rounded(y1 * s, out_ptr), out_ptr)
        return r1, r2

    @triton.jit
    def _prepared_heads(
        ptr, offsets, mask, w_ptr, cos_ptr, sin_ptr, rope, eps, out_ptr, HEAD_DIM: tl.constexpr, NORM: tl.constexpr
    ):
        """Heads of the merged q/k/v output starting at `offsets` [rows, 1] (rows outside `mask` read as
        zeros), normed with w_ptr's weights (NORM) and rotated at positions `rope` [rows, 1]: the halves
        (r1, r2) in float32, rounded as out_ptr's type rounds."""
        HALF: tl.constexpr = HEAD_DIM // 2
        half = tl.arange(0, HALF)[None, :]
        c = tl.load(cos_ptr + rope * HEAD_DIM + half, mask=mask, other=0.0).to(tl.float32)  # cos[:half] == cos[half:]
        s = tl.load(sin_ptr + rope * HEAD_DIM + half, mask=mask, other=0.0).to(tl.float32)
        x1 = tl.load(ptr + offsets + half, mask=mask, other=0.0).to(tl.float32)
        x2 = tl.load(ptr + offsets + HALF + half, mask=mask, other=0.0).to(tl.float32)
        return _norm_rope(x1, x2, w_ptr, c, s, eps, out_ptr, HALF, NORM)

    @triton.jit
    def _qk_norm_rope_cache_kernel(
        qkv_ptr,
        qw_ptr,
        kw_ptr,
        cos_ptr,
        sin_ptr,
        pos_ptr,
        rope_ptr,
        q_ptr,
        k_ptr,
        v_ptr,
        H,
        HKV,
        S,
        eps,
        HEAD_DIM: tl.constexpr,
        NORM: tl.constexpr,
        PDL: tl.constexpr,
    ):
        after_previous(PDL)
        tok = tl.program_id(0).to(tl.int64)
        head = tl.program_id(1)
        HALF: tl.constexpr = HEAD_DIM // 2
        half = tl.arange(0, HALF)[None, :]
        p = tl.load(pos_ptr + tok)
        r = tl.load(rope_ptr + tok)
        src = tok * (H + 2 * HKV) * HEAD_DIM + head * HEAD_DIM
        every = head >= 0
        if head < H:
            r1, r2 = _prepared_heads(qkv_ptr, src, every, qw_ptr, cos_ptr, sin_ptr, r, eps, q_ptr, HEAD_DIM, NORM)
            dst = q_ptr + (tok * H + head) * HEAD_DIM
            tl.store(dst + half, r1.to(q_ptr.dtype.element_ty))
            tl.store(dst + HALF + half, r2.to(q_ptr.dtype.element_ty))
        else:
            kv = head - H
            r1, r2 = _prepared_heads(qkv_ptr, src, every, kw_ptr, cos_ptr, sin_ptr, r, eps, k_ptr, HEAD_DIM, NORM)
            slot = (kv * S + p) * HEAD_DIM
            tl.store(k_ptr + slot + half, r1.to(k_ptr.dtype.element_ty))
            tl.store(k_ptr + slot + HALF + half, r2.to(k_ptr.dtype.element_ty))
            v_src = qkv_ptr + src + HKV * HEAD_DIM
            tl.store(v_ptr + slot + half, tl.load(v_src + half))
            tl.store(v_ptr + slot + HALF + half, tl.load(v_src + HALF + half))

    @triton.jit
    def _online_softmax_step(q, k, v, visible, scale, running_max, total, acc):
        """One slot block of the online softmax. Masked scores are -inf and the running max starts
        finite, so a block past a row's own position adds exactly nothing to it."""
        scores = tl.where(visible, tl.dot(q, tl.trans(k)) * scale, float("-inf"))
        new_max = tl.maximum(running_max, tl.max(scores, axis=1))
        weights = tl.exp(scores - new_max[:, None])
        rescale = tl.exp(running_max - new_max)
        total = total * rescale + tl.sum(weights, axis=1)
        acc = acc * rescale[:, None] + tl.dot(weights.to(v.dtype), v)
        return new_max, total, acc

    @triton.jit
    def _causal_softmax(
        q,
        k_ptr,
        v_ptr,
        p,
        kv,
        S,
        first,
        stop,
        end,
        scale,
        BLOCK_M: tl.constexpr,
        HEAD_DIM: tl.constexpr,
        BLOCK_N: tl.constexpr,
    ):
        """The online softmax of stacked query rows at positions p over the slots first .. stop - 1 of kv
        head `kv` (none read at or past `end`): (running max, total, unnormalized sums)."""
        d = tl.arange(0, HEAD_DIM)
        running_max = tl.full([BLOCK_M], -1e30, tl.float32)
        total = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
        base = kv.to(tl.int64) * S * HEAD_DIM
        for start in range(first, stop, BLOCK_N):
            slot = start + tl.arange(0, BLOCK_N)
            inside = (slot < end)[:, None]
            offsets = base + slot[:, None] * HEAD_DIM + d[None, :]
            k = tl.load(k_ptr + offsets, mask=inside, other=0.0)
            v = tl.load(v_ptr + offsets, mask=inside, other=0.0)
            visible = slot[None, :] <= p[:, None]
            running_max, total, acc = _online_softmax_step(q, k, v, visible, scale, running_max, total, acc)
        return running_max, total, acc

    @triton.jit
    def _attention_kernel(
        q_ptr,
        k_ptr,
        v_ptr,
        pos_ptr,
        o_ptr,
        n,
        S,
        scale,
        H,
        GROUP: tl.constexpr,
        HEAD_DIM: tl.constexpr,
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
        PDL: tl.constexpr,
    ):
        """Program (kv head, row block): online softmax over slot blocks up to the block's largest position."""
        after_previous(PDL)
        kv = tl.program_id(0)
        m = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)  # stacked row: head kv*GROUP + m // n, token m % n
        valid = m < GROUP * n
        tok = tl.where(valid, m % n, 0).to(tl.int64)
        head = kv * GROUP + tl.where(valid, m // n, 0)
        d = tl.arange(0, HEAD_DIM)
        row_offsets = (tok * H + head)[:, None] * HEAD_DIM + d[None, :]
        q = tl.load(q_ptr + row_offsets, mask=valid[:, None], other=0.0)
        p = tl.load(pos_ptr + tok, mask=valid, other=-1)
        end = tl.max(p, axis=0) + 1
        _, total, acc = _causal_softmax(q, k_ptr, v_ptr, p, kv, S, 0, end, end, scale, BLOCK_M, HEAD_DIM, BLOCK_N)
        out = acc / tl.where(valid, total, 1.0)[:, None]
        tl.store(o_ptr + row_offsets, out.to(o_ptr.dtype.element_ty), mask=valid[:, None])

    @triton.jit(do_not_specialize=["tree_rows"])
    def _path_ordered_attention_kernel(
        q_ptr,
        k_ptr,
        v_ptr,
        pos_ptr,
        ancestors_ptr,
        base_ptr,
        o_ptr,
        S,
        scale,
        H,
        tree_rows,
        HEAD_BLOCKS: tl.constexpr,
        GROUP: tl.constexpr,
        HEAD_DIM: tl.constexpr,
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
        PDL: tl.constexpr,
    ):
        """Program (kv head, token and block of the kv head's query heads): online softmax over logical
        slots. Below the base a logical slot is the slot itself; base + j is the slot of the token's
        (j + 1)-th ancestor, its word's j-th set bit. A causal row (tree_rows 0, a runtime value so that
        both kinds run one compiled kernel) has base = its position + 1 and no ancestors."""
        after_previous(PDL)
        kv = tl.program_id(0)
        token = tl.program_id(1) // HEAD_BLOCKS
        r = (tl.program_id(1) % HEAD_BLOCKS) * BLOCK_M + tl.arange(0, BLOCK_M)
        valid = r < GROUP
        head = kv * GROUP + tl.where(valid, r, 0)
        d = tl.arange(0, HEAD_DIM)
        row_offsets = (token.to(tl.int64) * H + head)[:, None] * HEAD_DIM + d[None, :]
        q = tl.load(q_ptr + row_offsets, mask=valid[:, None], other=0.0)
        is_tree = tree_rows != 0
        tree_base = tl.where(is_tree, tl.load(base_ptr), tl.load(pos_ptr + token) + 1)
        word = tl.where(is_tree, tl.load(ancestors_ptr + token), 0)
        bit = tl.arange(0, 64)
        on = ((word >> bit.to(tl.int64)) & 1).to(tl.int32)
        depth_index = tl.cumsum(on, axis=0) - on  # a set bit's rank: its node's depth - 1
        end = tree_base + tl.sum(on, axis=0)
        running_max = tl.full([BLOCK_M], -1e30, tl.float32)
        total = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
        base = kv.to(tl.int64) * S * HEAD_DIM
        for start in range(0, end, BLOCK_N):
            slot = (start + tl.arange(0, BLOCK_N)).to(tl.int64)
            if start + BLOCK_N > tree_base:  # the path's nodes: the set bit of each rank
                depth = slot - tree_base
                chosen = (on[None, :] == 1) & (depth_index[None, :] == depth[:, None])
                node = tl.sum(tl.where(chosen, bit[None, :], 0), axis=1)
                physical = tl.where(depth >= 0, tree_base + node, slot)
            else:
                physical = slot
            inside = (slot < end)[:, None]
            offsets = base + physical[:, None] * HEAD_DIM + d[None, :]
            k = tl.load(k_ptr + offsets, mask=inside, other=0.0)
            v = tl.load(v_ptr + offsets, mask=inside, other=0.0)
            visible = (slot < end)[None, :]
            running_max, total, acc = _online_softmax_step(q, k, v, visible, scale, running_max, total, acc)
        out = acc / total[:, None]
        tl.store(o_ptr + row_offsets, out.to(o_ptr.dtype.element_ty), mask=valid[:, None])

    @triton.jit
    def _attention_split_kernel(
        q_ptr,
        k_ptr,
        v_ptr,
        pos_ptr,
        sums_ptr,
        stats_ptr,
        ticket_ptr,
        o_ptr,
        n,
        S,
        scale,
        H,
        qw_ptr,
        kw_ptr,
        cos_ptr,
        sin_ptr,
        eps,
        SPLIT: tl.constexpr,
        SHORT: tl.constexpr,
        GROUP: tl.constexpr,
        HEAD_DIM: tl.constexpr,
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
        CHUNK: tl.constexpr,
        FROM_QKV: tl.constexpr,
        NORM: tl.constexpr,
        BLOCK_T: tl.constexpr,
        PDL: tl.constexpr,
    ):
        """Program (kv head, row block, split): _attention_kernel's online softmax over the split's slots
        (`split_starts`: SHORT slots a split up to SPLIT, then SPLIT) below the block's largest position,
        left unnormalized with its running max and total. The last of the block's splits to finish
        combines them (_combine_splits) and resets the block's ticket; a split
        past that position does nothing (no ticket either: a long cache's many idle splits would queue on it).
        FROM_QKV: q_ptr is the merged projection's output, and the program first does qk_norm_rope_cache's
        work for its rows and slots (qkv_attention)."""
        after_previous(PDL)
        kv = tl.program_id(0)
        m = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
        split = tl.program_id(2)
        splits = tl.num_programs(2)
        valid = m < GROUP * n
        tok = tl.where(valid, m % n, 0).to(tl.int64)
        head = kv * GROUP + tl.where(valid, m // n, 0)
        d = tl.arange(0, HEAD_DIM)
        p = tl.load(pos_ptr + tok, mask=valid, other=-1)
        end = tl.max(p, axis=0) + 1
        first = _split_start(split, SPLIT, SHORT)
        after = _split_start(split + 1, SPLIT, SHORT)
        rows = (kv.to(tl.int64) * GROUP * n + m) * splits
        if first < end:
            if FROM_QKV:  # qk_norm_rope_cache's work: first the new keys and values of this split's slots
                HALF: tl.constexpr = HEAD_DIM // 2
                half = tl.arange(0, HALF)[None, :]
                width = (H + 2 * tl.num_programs(0)) * HEAD_DIM
                t = tl.arange(0, BLOCK_T)
                new = tl.load(pos_ptr + t, mask=t < n, other=-1)[:, None]
                mine = (t < n)[:, None] & (new >= first) & (new < after)
                row = t.to(tl.int64)[:, None] * width
                r1, r2 = _prepared_heads(
                    q_ptr, row + (H + kv) * HEAD_DIM, mine, kw_ptr, cos_ptr, sin_ptr, new, eps, k_ptr, HEAD_DIM, NORM
                )
                slot = (kv * S + new.to(tl.int64)) * HEAD_DIM + half
                tl.store(k_ptr + slot, r1.to(k_ptr.dtype.element_ty), mask=mine)
                tl.store(k_ptr + slot + HALF, r2.to(k_ptr.dtype.element_ty), mask=mine)
                v_src = q_ptr + row + (H + tl.num_programs(0) + kv) * HEAD_DIM + half
                tl.store(v_ptr + slot, tl.load(v_src, mask=mine), mask=mine)
                tl.store(v_ptr + slot + HALF, tl.load(v_src + HALF, mask=mine), mask=mine)
                tl.debug_barrier()  # the program's reads of these slots come after every thread's writes
                r1, r2 = _prepared_heads(  # then the program's own query rows
                    q_ptr,
                    (tok * width + head * HEAD_DIM)[:, None],
                    valid[:, None],
                    qw_ptr,
                    cos_ptr,
                    sin_ptr,
                    p[:, None],
                    eps,
                    o_ptr,
                    HEAD_DIM,
                    NORM,
                )
                q = tl.reshape(tl.permute(tl.join(r1, r2), (0, 2, 1)), (BLOCK_M, HEAD_DIM)).to(o_ptr.dtype.element_ty)
            else:
                q = tl.load(q_ptr + (tok * H + head)[:, None] * HEAD_DIM + d[None, :], mask=valid[:, None], other=0.0)
            stop = tl.minimum(after, end)
            running_max, total, acc = _causal_softmax(
                q, k_ptr, v_ptr, p, kv, S, first, stop, end, scale, BLOCK_M, HEAD_DIM, BLOCK_N
            )
            tl.store(sums_ptr + (rows + split)[:, None] * HEAD_DIM + d[None, :], acc, mask=valid[:, None])
            tl.store(stats_ptr + (rows + split) * 2, running_max, mask=valid)
            tl.store(stats_ptr + (rows + split) * 2 + 1, total, mask=valid)
            tl.debug_barrier()  # every thread's partial sums are written before the ticket says so
            ticket = ticket_ptr + kv * tl.num_programs(1) + tl.program_id(1)
            if tl.atomic_add(ticket, 1, sem="acq_rel") == _split_of(end - 1, SPLIT, SHORT):
                _combine_splits(
                    sums_ptr, stats_ptr, o_ptr, rows, p, valid, tok, head, H, SPLIT, SHORT, HEAD_DIM, BLOCK_M, CHUNK
                )
                tl.store(ticket, 0)

    @triton.jit
    def _split_start(split, SPLIT: tl.constexpr, SHORT: tl.constexpr):
        """The first slot of split `split` (split_starts)."""
        FIRST: tl.constexpr = SPLIT // SHORT  # the short splits
        return tl.where(split < FIRST, split * SHORT, (split - FIRST + 1) * SPLIT)

    @triton.jit
    def _split_of(slot, SPLIT: tl.constexpr, SHORT: tl.constexpr):
        """The split that holds `slot` (split_starts)."""
        FIRST: tl.constexpr = SPLIT // SHORT
        return tl.where(slot < SPLIT, slot // SHORT, slot // SPLIT + FIRST - 1)

    @triton.jit
    def _merge_split(sums_ptr, stats_ptr, rows, split, take, running_max, total, acc, HEAD_DIM: tl.constexpr):
        """One split's partial sums merged into the running (max, total, acc) of the rows that `take` it."""
        split_max = tl.load(stats_ptr + (rows + split) * 2, mask=take, other=float("-inf"), cache_modifier=".cg")
        split_total = tl.load(stats_ptr + (rows + split) * 2 + 1, mask=take, other=0.0, cache_modifier=".cg")
        d = tl.arange(0, HEAD_DIM)
        split_sums = tl.load(
            sums_ptr + (rows + split)[:, None] * HEAD_DIM + d[None, :],
            mask=take[:, None],
            other=0.0,
            cache_modifier=".cg",
        )
        new_max = tl.maximum(running_max, split_max)
        rescale = tl.exp(running_max - new_max)
        weight = tl.exp(split_max - new_max)
        return new_max, total * rescale + weight * split_total, acc * rescale[:, None] + weight[:, None] * split_sums

    @triton.jit
    def _combine_splits(
        sums_ptr,
        stats_ptr,
        o_ptr,
        rows,
        p,
        valid,
        tok,
        head,
        H,
        SPLIT: tl.constexpr,
        SHORT: tl.constexpr,
        HEAD_DIM: tl.constexpr,
        BLOCK_M: tl.constexpr,
        CHUNK: tl.constexpr,
    ):
        """Each row's splits 0 .. the one holding p merged in order, rescaled to their common max; the splits
        past a row's own are skipped exactly (weight 0, rescale 1). Read past L1: other programs wrote them.
        CHUNK splits a loop step, unrolled, so that their loads are in flight together (the merge is a chain
        of dependent reads otherwise: at 4,000 slots, 32 of them); the last step's splits past every row's
        are skipped the same way, so 3 splits take one step, not three."""
        last = _split_of(p, SPLIT, SHORT)  # each row's last split (padding rows take none: not valid)
        running_max = tl.full([BLOCK_M], -1e30, tl.float32)
        total = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
        splits = tl.max(last, axis=0) + 1
        for chunk in range(0, splits, CHUNK):
            for j in tl.static_range(CHUNK):
                running_max, total, acc = _merge_split(
                    sums_ptr, stats_ptr, rows, chunk + j, valid & (chunk + j <= last), running_max, total, acc, HEAD_DIM
                )
        out = acc / tl.where(valid, total, 1.0)[:, None]
        d = tl.arange(0, HEAD_DIM)
        tl.store(
            o_ptr + (tok * H + head)[:, None] * HEAD_DIM + d[None, :],
            out.to(o_ptr.dtype.element_ty),
            mask=valid[:, None],
        )

    @triton.jit
    def _silu_mul_kernel(gu_ptr, out_ptr, I, BLOCK: tl.constexpr, PDL: tl.constexpr):
        after_previous(PDL)
        row = tl.program_id(0).to(tl.int64)
        col = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = col < I
        gate = tl.load(gu_ptr + row * 2 * I + col, mask=mask, other=0.0).to(tl.float32)
        up = tl.load(gu_ptr + row * 2 * I + I + col, mask=mask, other=0.0).to(tl.float32)
        tl.store(out_ptr + row * I + col, swiglu(gate, up, out_ptr).to(out_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def swiglu(gate, up, ptr):
        """silu(gate) * up in float32, silu rounded to `ptr`'s element type as torch rounds it (gate and up:
        float32 holding values of that type). Every kernel that forms SwiGLU calls it, for the same bits."""
        return _rounded(gate / (1.0 + tl.exp(-gate)), ptr) * up
