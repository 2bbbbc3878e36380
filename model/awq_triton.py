"""Triton w4a16 GEMM on AWQ's GEMM layout, as it is or regrouped by column blocks, for the few rows of
a decode step.

y [M, N] = x [M, K] @ W, W = (q - z) * s, from the buffers AWQLinear holds (model/awq.py documents
the layout: qweight int32 [K, N/8], qzeros int32 [K/group, N/8], scales fp16 [K/group, N]; nibble i
of an int32 holds column AWQ_PACK_ORDER[i] of its block of 8).

At 16 rows the GEMM reads half a byte of weight per 16 multiply-adds, so it can run at memory
bandwidth only if unpacking costs a few instructions per weight (an H200 SM must consume ~37 codes
per clock, and issues 128 thread-instructions per clock). The kernel:
- A program owns BLOCK_N output columns and BLOCK_M = 16 rows (M is padded by masking; more rows
  take more programs along grid axis 2), and walks K in steps of BLOCK_K rows (a divisor of the
  group, normally the group itself, so one zero/scale row per step).
- Per step it loads the packed [BLOCK_K, BLOCK_N/8] int32 tile (contiguous rows) and makes the
  [BLOCK_K, BLOCK_N] tile of q - z in natural column order, in registers:
  16-bit activations ("magic-pairs-sub"): nibbles i and i + 4 of an int32 are columns 2i and 2i + 1,
  so each word is repeated 4 times in registers (tl.interleave) and each copy shifted by 4i and
  masked with 0x000F000F: two codes per operation. Or-ing in 0x4300 per half makes the bf16 bit
  pattern of OFFSET + q with OFFSET = 128 (0x6400 and 1024 for fp16), no int->float conversion; the
  zero points' pairs are made the same way and subtracted in the activation dtype, exactly
  ((OFFSET + q) - (OFFSET + z) = q - z), and the two halves interleaved back into column order.
  Float32 activations ("convert", for the tests): each word repeated 8 times,
  each copy shifted to its column's nibble, converted to float32, z subtracted.
- The dot computes y^T = W^T x^T (acc [BLOCK_N, BLOCK_M]): the weights are its wide left operand
  (Hopper: wgmma with the weights from registers); the scale is applied after it, once per step and
  output element. Compiled for sm_90, the loop issues 238 SASS instructions per step and warp, of
  which the dequantization is a minority (address arithmetic, the shared-memory trip of the tile
  and the wgmma make up most); the same dequantization written in PTX (lop3 on pairs, 11
  instructions per 8 weights) ran no faster (reports/h200/session4/awq_sweep_ptx.txt).
- Split-K over groups (grid axis 1): each split writes float32 partials to a [split_k, M, N] buffer
  and counts itself on its tile's ticket; the last split of a tile sums the partials in split order,
  casts and resets the ticket (no second launch). No atomics on values: results are bitwise
  reproducible, and output row i depends only on x row i (and the configuration, which for M <= 16
  does not depend on M), never on the other rows.
- Loads: each K step's tiles are loaded one step ahead (prefetch), and with `column_blocks` a
  program's codes for a step are one contiguous run of 4 KB rather than 128 runs of 32 bytes
  (AWQ's [K, N/8] rows); with 96 registers per thread, 5 programs share an SM instead of 4. Together
  these took the four Qwen3-32B GEMMs from 12.8 to 10.6 ms per step (64 layers, M = 8, H200:
  reports/h200/session4/awq_sweep.txt); the register cap and the prefetch alone gave nothing.
- Everything stays on the device: no host sync, outputs allocated with torch.empty, graph-capturable.

Measured and removed (reports/h200/session3/sweeps/awq_sweep.txt, H200, bf16, M = 16; e.g. down, K 25600 x N 5120,
at block_n 128, split_k 8, 4 warps, 3 stages): one code per operation with a broadcast shift of a
[.., 8] axis and y = x W (the design as first specified) 155.8 us; pairs, words repeated in
registers, y = x W 107.1; then all with y^T = W^T x^T: plain conversion with the zero point applied
through row sums of x 85.8, one code per operation ("magic") 77.4, pairs 71.3, magic with the zero
subtracted 72.2, pairs with the zero subtracted (kept) 66.6; the tuned configuration (block_n 64,
1 stage) 51.7 us, where torch's int4pack kernel takes 178.4 us and the bandwidth floor is 16.6 us.
Where the kernels run: model/triton_support.py.
"""

from __future__ import annotations

import functools

import torch

from model.triton_support import launching_on, tl, triton

BLOCK_M = 16
_MAGIC = {torch.bfloat16: 0x4300, torch.float16: 0x6400}  # bit pattern of OFFSET + 0 (OFFSET 128, 1024)
_DEFAULT_SMS = 132  # H100 / H200
_PROGRAMS_PER_SM = 4
_SPLITS = (4, 8)  # split-K at least the first, at most the second (where the group count allows)

# Launch configurations measured best on H200 for 16-bit activations and M <= 16, by (K, N,
# group_size): Qwen3-32B's merged qkv, o_proj, gate_up and down projections, with column_blocks
# (reports/h200/awq_sweep.py prints these entries; its record is reports/h200/session4/awq_sweep.txt,
# at M = 8). Other shapes use the heuristic, which gives these same values on a 132-SM GPU.
_TUNED_BASE = {"block_n": 64, "num_warps": 4, "num_stages": 1, "block_k": 128, "prefetch": True, "maxnreg": 96}
TUNED: dict[tuple[int, int, int], dict] = {
    (5120, 10240, 128): {**_TUNED_BASE, "split_k": 4},
    (8192, 5120, 128): {**_TUNED_BASE, "split_k": 8},
    (5120, 51200, 128): {**_TUNED_BASE, "split_k": 4},
    (25600, 5120, 128): {**_TUNED_BASE, "split_k": 8},
}


def unsupported(in_features: int, out_features: int, group_size: int, dtype: torch.dtype) -> str | None:
    """Why w4a16_matmul cannot run this layer (None when it can)."""
    if dtype not in (torch.bfloat16, torch.float16, torch.float32):
        return f"activations of {dtype} (bfloat16, float16 or float32 only)"
    if group_size < 16 or group_size & (group_size - 1):
        return f"group size {group_size} is not a power of two >= 16"
    if in_features % group_size or out_features % 8:
        return f"shape {in_features} x {out_features} does not fit group {group_size} and 8 codes per int32"
    return None


@functools.lru_cache(maxsize=None)
def _sm_count(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return _DEFAULT_SMS


def default_config(M: int, K: int, N: int, group_size: int, dtype: torch.dtype, device: torch.device) -> dict:
    """The launch configuration w4a16_matmul uses when none is given: TUNED where it has the shape
    (16-bit activations, M <= 16), else what won there: block_n 64, 4 warps, 1 stage, block_k the
    group (at most 128), the next step's loads prefetched, at most 96 registers per thread (5
    programs per SM instead of 4; CUDA only), and split_k the smallest divisor of the group count
    from 4 up that gives at least 4 programs per SM, capped at 8 (the largest divisor <= 8 when none
    does)."""
    block_n = 64 if N >= 64 else max(16, triton.next_power_of_2(N))
    groups = K // group_size
    tiles = triton.cdiv(N, block_n) * triton.cdiv(M, BLOCK_M)
    divisors = [d for d in range(1, min(groups, _SPLITS[1]) + 1) if groups % d == 0]
    want = _PROGRAMS_PER_SM * _sm_count(device)
    split_k = next((d for d in divisors if d >= _SPLITS[0] and tiles * d >= want), divisors[-1])
    config = {"block_n": block_n, "split_k": split_k, "block_k": min(group_size, 128), "num_warps": 4,
              "num_stages": 1, "prefetch": True, "maxnreg": 96}
    if dtype != torch.float32 and M <= BLOCK_M:
        config.update(TUNED.get((K, N, group_size), {}))
    return config


def column_blocks(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor,
                  block_n: int = 64) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The AWQ buffers regrouped by block_n columns, each [N / block_n, rows, its row width /
    (N / block_n)], so a program reads each K step's codes as one contiguous run of
    BLOCK_K * block_n / 2 bytes (instead of BLOCK_K runs of block_n / 2: 32 at block_n 64, which
    holds the GEMM to ~1.4 TB/s on H200), and its zero points and scales from contiguous rows."""
    N = scales.shape[1]
    if N % block_n:
        raise ValueError(f"{N} columns are not a multiple of block_n {block_n}")
    return tuple(t.view(t.shape[0], N // block_n, -1).transpose(0, 1).contiguous() for t in (qweight, qzeros, scales))


def w4a16_matmul(x: torch.Tensor, qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor,
                 group_size: int, split_k: int | None = None, block_n: int | None = None,
                 num_warps: int | None = None, num_stages: int | None = None,
                 block_k: int | None = None, prefetch: bool | None = None, maxnreg: int | None = None,
                 blocks: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
                 tickets: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] (bf16, fp16 or fp32) @ AWQ int4 weights -> y [M, N] in x's dtype.

    Configuration arguments left None take default_config's values. split_k must divide the group
    count K / group_size; block_k (rows per loop step) must divide group_size; block_n is a power of
    two >= 16. blocks: column_blocks of the three buffers (then block_n is their block width).
    tickets: int32 zeros, one per (column block, 16 rows), that the call leaves zero: a layer keeps
    them so a split-K call needs no memset; without enough, the call makes its own."""
    M, K = x.shape
    N = scales.shape[1]
    if (qweight.shape != (K, N // 8) or qzeros.shape != (K // group_size, N // 8) or scales.shape[0] != K // group_size
            or not (qweight.is_contiguous() and qzeros.is_contiguous() and scales.is_contiguous())):
        raise ValueError(f"AWQ buffers {tuple(qweight.shape)}, {tuple(qzeros.shape)}, {tuple(scales.shape)} "
                         f"do not fit x {tuple(x.shape)} and group {group_size}, or are not contiguous")
    reason = unsupported(K, N, group_size, x.dtype)
    if reason:
        raise ValueError(reason)
    config = default_config(M, K, N, group_size, x.dtype, x.device)
    given = {"split_k": split_k, "block_n": block_n, "num_warps": num_warps, "num_stages": num_stages,
             "block_k": block_k, "prefetch": prefetch, "maxnreg": maxnreg}
    config.update({name: value for name, value in given.items() if value is not None})
    if blocks is not None:  # column_blocks(qweight, qzeros, scales): their block width is the launch's
        shapes = [tuple(t.shape) for t in blocks]
        width = N // shapes[0][0]
        if shapes != [(N // width, K, width // 8), (N // width, K // group_size, width // 8),
                      (N // width, K // group_size, width)] or not all(t.is_contiguous() for t in blocks):
            raise ValueError(f"column blocks {shapes} are not column_blocks of a {K} x {N} layer")
        config["block_n"] = width
    split_k, block_n, block_k = config["split_k"], config["block_n"], config["block_k"]
    groups = K // group_size
    if groups % split_k or group_size % block_k or block_k < 16 or block_k & (block_k - 1):
        raise ValueError(f"split_k {split_k} must divide the {groups} groups and block_k {block_k} "
                         f"(a power of two >= 16) the group size {group_size}")
    if block_n < 16 or block_n & (block_n - 1):
        raise ValueError(f"block_n {block_n} is not a power of two >= 16")

    y = torch.empty((M, N), dtype=x.dtype, device=x.device)
    if M == 0:
        return y
    if x.stride(1) != 1:
        x = x.contiguous()
    grid = (triton.cdiv(N, block_n), split_k, triton.cdiv(M, BLOCK_M))
    partials = y if split_k == 1 else torch.empty((split_k, M, N), dtype=torch.float32, device=x.device)
    if split_k == 1:
        tickets = y  # unused
    elif tickets is None or tickets.numel() < grid[0] * grid[2] or tickets.dtype != torch.int32:
        tickets = torch.zeros(grid[0] * grid[2], dtype=torch.int32, device=x.device)  # fresh (a memset launch)
    with launching_on(x.device):
        _w4a16_kernel[grid](
            x, *((qweight, qzeros, scales) if blocks is None else blocks), partials, y, tickets, M, N, K,
            x.stride(0), (K // block_k) // split_k,
            _MAGIC.get(x.dtype, 0) * 0x10001, GROUP=group_size, BLOCK_M=BLOCK_M, BLOCK_N=block_n,
            BLOCK_K=block_k, SPLIT_K=split_k, EVEN_N=N % block_n == 0, PREFETCH=config["prefetch"],
            BLOCKED=blocks is not None, num_warps=config["num_warps"], num_stages=config["num_stages"],
            **({"maxnreg": config["maxnreg"]} if config["maxnreg"] and x.is_cuda else {}))
    return y


if triton is not None:
    @triton.jit
    def _w4a16_kernel(x_ptr, qw_ptr, qz_ptr, s_ptr, part_ptr, y_ptr, ticket_ptr, M, N, K, stride_xm,
                      steps_per_split, magic_pair,
                      GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                      SPLIT_K: tl.constexpr, EVEN_N: tl.constexpr, PREFETCH: tl.constexpr, BLOCKED: tl.constexpr):
        """Program (column block, split, row block): its rows x columns summed over the split's K steps,
        written to y when there is one split; else to part[split], and the tile's last split to
        arrive (a ticket per tile) sums the parts in split order into y and resets the ticket. magic_pair is
        the bit pattern of OFFSET in both halves of an int32 (16-bit activations; unused for float32).
        It is a runtime argument: as a constexpr, constant folding lengthens the sm_90 loop (278
        instructions instead of 239 at the tuned configuration)."""
        pid_n = tl.program_id(0)
        pid_k = tl.program_id(1)
        pid_m = tl.program_id(2)
        PACKED: tl.constexpr = BLOCK_N // 8
        dtype = x_ptr.dtype.element_ty
        n_packed = N // 8
        rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        rk = tl.arange(0, BLOCK_K)
        rp = pid_n * PACKED + tl.arange(0, PACKED)
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        c = tl.arange(0, BLOCK_N) % 8
        column_shifts = ((c // 2) + (c % 2) * 4) * 4  # bit offset of column c's nibble (AWQ_PACK_ORDER inverted)
        pair_shifts = (tl.arange(0, BLOCK_N // 2) % 4) * 4  # columns 2i, 2i + 1: nibbles i, i + 4
        m_in = rm < M
        p_in = rp < n_packed
        n_in = rn < N
        x_rows = x_ptr + rm.to(tl.int64)[:, None] * stride_xm
        if BLOCKED:  # column_blocks: this program's columns are K (K / GROUP) rows of PACKED words (BLOCK_N scales)
            w_rows = qw_ptr + pid_n.to(tl.int64) * K * PACKED + tl.arange(0, PACKED)[None, :]
            z_rows = qz_ptr + pid_n.to(tl.int64) * (K // GROUP) * PACKED + tl.arange(0, PACKED)
            s_rows = s_ptr + pid_n.to(tl.int64) * (K // GROUP) * BLOCK_N + tl.arange(0, BLOCK_N)
            w_stride, z_stride, s_stride = PACKED, PACKED, BLOCK_N
        else:
            w_rows, z_rows, s_rows = qw_ptr + rp[None, :], qz_ptr + rp, s_ptr + rn
            w_stride, z_stride, s_stride = n_packed, n_packed, N
        acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
        k_begin = pid_k * steps_per_split * BLOCK_K
        x, packed, zp, s = _step_tiles(x_rows, w_rows, w_stride, z_rows, z_stride, s_rows, s_stride, k_begin, rk,
                                       m_in, p_in, n_in, GROUP, EVEN_N)
        for step in range(steps_per_split):
            k_next = k_begin + tl.minimum(step + 1, steps_per_split - 1) * BLOCK_K  # the last step reloads its own
            if PREFETCH:  # the next step's loads in flight during this step's math
                x_next, packed_next, zp_next, s_next = _step_tiles(
                    x_rows, w_rows, w_stride, z_rows, z_stride, s_rows, s_stride, k_next, rk, m_in, p_in, n_in,
                    GROUP, EVEN_N)
            if dtype == tl.float32:  # "convert"
                w = ((_repeat(packed, 8) >> column_shifts[None, :]) & 0xF).to(tl.float32)
                w -= ((_repeat(zp, 8) >> column_shifts) & 0xF).to(tl.float32)[None, :]
            else:  # "magic-pairs-sub": OFFSET + q and OFFSET + z two at a time, subtracted exactly
                pairs = ((_repeat(packed, 4) >> pair_shifts[None, :]) & 0x000F000F) | magic_pair
                z_pairs = ((_repeat(zp, 4) >> pair_shifts) & 0x000F000F) | magic_pair
                low = pairs.to(tl.int16).to(dtype, bitcast=True)
                low -= z_pairs.to(tl.int16).to(dtype, bitcast=True)[None, :]
                high = (pairs >> 16).to(tl.int16).to(dtype, bitcast=True)
                high -= (z_pairs >> 16).to(tl.int16).to(dtype, bitcast=True)[None, :]
                w = tl.interleave(low, high)
            # acc^T [BLOCK_N, BLOCK_M]; "ieee" matters only for float32 (no TF32 rounding)
            acc += s[:, None] * tl.dot(tl.trans(w), tl.trans(x), input_precision="ieee")
            if not PREFETCH:
                x_next, packed_next, zp_next, s_next = _step_tiles(
                    x_rows, w_rows, w_stride, z_rows, z_stride, s_rows, s_stride, k_next, rk, m_in, p_in, n_in,
                    GROUP, EVEN_N)
            x, packed, zp, s = x_next, packed_next, zp_next, s_next
        tile = (rm.to(tl.int64) * N)[None, :] + rn[:, None]
        inside = m_in[None, :] & n_in[:, None]
        if SPLIT_K == 1:
            tl.store(y_ptr + tile, acc.to(y_ptr.dtype.element_ty), mask=inside)
        else:
            tl.store(part_ptr + pid_k.to(tl.int64) * M * N + tile, acc, mask=inside)
            ticket = ticket_ptr + pid_m * tl.num_programs(0) + pid_n
            if tl.atomic_add(ticket, 1, sem="acq_rel") == SPLIT_K - 1:  # every part is written
                total = tl.load(part_ptr + tile, mask=inside, other=0.0, cache_modifier=".cg")
                for split in tl.static_range(1, SPLIT_K):
                    total += tl.load(part_ptr + split * M * N + tile, mask=inside, other=0.0, cache_modifier=".cg")
                tl.store(y_ptr + tile, total.to(y_ptr.dtype.element_ty), mask=inside)
                tl.store(ticket, 0)

    @triton.jit
    def _step_tiles(x_rows, w_rows, w_stride, z_rows, z_stride, s_rows, s_stride, k0, rk, m_in, p_in, n_in,
                    GROUP: tl.constexpr, EVEN_N: tl.constexpr):
        """The loads of the K step at row k0: x [BLOCK_M, BLOCK_K], the packed codes, the zero points and
        the scales (as float32) of its group."""
        group = k0 // GROUP
        x = tl.load(x_rows + (k0 + rk)[None, :], mask=m_in[:, None], other=0.0)
        w_ptrs = w_rows + (k0 + rk)[:, None] * w_stride
        z_ptrs = z_rows + group * z_stride
        s_ptrs = s_rows + group * s_stride
        if EVEN_N:
            return x, tl.load(w_ptrs), tl.load(z_ptrs), tl.load(s_ptrs).to(tl.float32)
        else:
            return (x, tl.load(w_ptrs, mask=p_in[None, :], other=0), tl.load(z_ptrs, mask=p_in, other=0),
                    tl.load(s_ptrs, mask=n_in, other=0.0).to(tl.float32))

    @triton.jit
    def _repeat(a, TIMES: tl.constexpr):
        """a with each element repeated TIMES (4 or 8) times along its last axis, in registers."""
        a = tl.interleave(a, a)
        a = tl.interleave(a, a)
        if TIMES == 8:
            a = tl.interleave(a, a)
        return a

