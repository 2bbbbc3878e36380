"""Triton w4a16 GEMM for the few rows of a decode step, on AWQ int4 weights repacked once into planes.

y [M, N] = x [M, IN] @ W, W = (q - z) * s, one (z, s) per column and group of input rows (model/awq.py
documents AWQ's own layout). At 8 rows the GEMM reads half a byte of weight per 8 multiply-adds, so
it runs at memory bandwidth only if few instructions turn codes into matrix operands, and if enough
bytes are in flight. The layout and the kernel are built for both:

- Planes (`pack_planes`, once per layer): per block of BLOCK_N output columns and step of 128 input
  rows, a [BLOCK_N, 16] tile of int32 words, contiguous (8 KB at BLOCK_N 128). Nibble i + 4h of word
  (n, j) holds row 32 i + 2 j + h of column n: shifting a word right by 4 i and masking with
  0x000F000F leaves the codes of two adjacent rows, 32 i + 2 j and 32 i + 2 j + 1, in its two halves,
  which is what one 32-bit register of a tensor-core operand holds. So a group's rows in a step (all
  128 for groups of 128 and more, else 32 or 64) are one dot, its operand [BLOCK_N, rows] made from the
  word tile: the tile shifted by 0, 4, 8 and 12 bits side by side, shift major (`_stacked`), joined
  with itself (word j at columns 2 j and 2 j + 1, which Triton lays out as one register read twice)
  and then an elementwise function of each pair of columns. Operand column 32 i + 2 j + h is then row
  32 i + 2 j + h, and a thread holds the same words for one dot of 128 rows as for four of 32, so
  Triton loads the words straight into the dot's register layout (no shared-memory trip for the
  dequantized weights), and `num_stages` pipelines the raw words through shared memory with
  asynchronous copies (3 stages: 24 KB in flight per program). A group's scale
  (fp16 bits) and zero point share one int32 per column, so they too are 4-byte loads that the
  pipeline copies asynchronously (as separate 1- and 2-byte loads they were waited for every step).
- Dequantization, 16-bit activations: the masked halves or-ed with OFFSET's bit pattern (0x4300 bf16,
  128; 0x6400 fp16, 1024) are the floats OFFSET + q; subtracting OFFSET + z (exact) gives q - z. On a
  GPU it is PTX: per word and shift, one lop3 and one packed subtraction. The same bits in Triton
  operations (interpreter; and float32 activations: codes converted, z subtracted). The dot products
  of a group are summed in float32 and scaled once per group and column.
- Split-K over 128-row steps (model/split_k.py: partials and a ticket per tile, the last split sums
  them in split order): results are bitwise reproducible, and output row i depends only on x row i
  (and the configuration, which for M <= 8 does not depend on M), never on the other rows.
- Rows per program (`block_m`): 8 up to 8 rows (the decoder's target forwards at K <= 7; 16-row programs
  made the four GEMMs of Qwen3-32B at 8 rows 7-11% slower, session 20), then the power of two that
  holds M, up to 64. Each row block dequantizes every
  weight tile again, and the dequantization, not the bytes, bounds the kernel: at 16 rows per program
  a tree verify of 65 rows took 5 passes over the weights.
- Everything stays on the device: no host sync, outputs allocated with torch.empty, graph-capturable.
- The epilogue (docs/decoder-speed.md, "Decoder speed: the int4 GEMM's epilogue"): each program lets the next
  kernel launch once its sums are done (SIGNAL_NEXT), and planes of a merged gate/up weight packed in
  swiglu_order make the last split write silu(gate) * up, the bits of fused_ops.silu_mul after the GEMM.
- RMSNorms folded in (FoldedNorm; docs/decoder-speed.md, "Decoder speed: the RMSNorms folded into the int4 GEMMs"):
  o_proj's and down_proj's last splits add their tile onto the residual stream, and write it times the next
  norm's weight with each row's sum of squares over the tile (`w4a16_matmul_onto`); the q/k/v or gate/up
  GEMM after reads those rows as its x and scales each row's sums by 1 / RMS. The rows' normalization in
  the GEMM's loop instead made the 32B step 7-10% slower; this way it is 1-2% faster.

Measured (H200, Qwen3-32B's four GEMMs x 64 layers, M = 8, bf16, per call in a CUDA graph with L2
evicted; records in git history at 10011a5, reports/h200/session5/; see reports/HISTORY.md): the previous
kernel on AWQ's layout regrouped per 64 columns, which dequantized in a blocked layout and moved the bf16
tile through shared memory into the dot's layout (218 SASS instructions per 4 KB step and warp), 10.34 ms
per step; planes without PTX (LLVM splits each pair into 16-bit operations: 317 instructions per 4 KB
step) about level with it; with the PTX pairs (277) 9.06 ms; with each group's scale and zero point in
one int32 8.05 ms (2.09x the floor of 3.85 ms; 427 instructions per 8 KB step at BLOCK_N 128). Those
planes held rows 32 i + j and 32 i + 16 + j in a word's halves, so two prmt per two words gathered the
low and the high halves into operand registers, and a step was 8 dots over 16 rows. With adjacent rows
in a word (session 17) a step is 333 instructions, no prmt and half the dot waits: on one H200 the four
GEMMs took 14.9 / 13.4 / 48.3 / 29.3 us against 17.4-17.7 / 15.1-15.2 / 56.6-57.1 / 35.2-35.6 (qkv, o,
gate_up, down), 6.77 ms for the step's 256 against 8.0, and the 32B AWQ target step 8.52-8.59 ms
against 9.75-9.90 (both kernels timed in one process; records: reports/speed/h200.md, reports/README.md, session 17).
One dot a group rather than four of 32 rows (session 23): 315 instructions a step against 333, one wait
on the tensor cores a step against four, the same bits; the 32B AWQ step on one H200 8.03 ms against
8.25 at context 300, 9.37 against 9.47 at 4,000 (docs/decoder-speed.md, "Decoder speed: what bounds the int4 GEMM").
Where the kernels run: model/triton_support.py.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from model import fused_ops
from model.split_k import arrived_last, split_count, store_split, summed_parts, tickets_for, tile_ticket
from model.triton_support import after_previous, launch_next, launching_on, overlap, tl, triton

BLOCK_M = 8  # rows per program up to 8 rows (tl.dot pads its 8 columns for the tensor cores)
MAX_BLOCK_M = 64  # rows per program for more (a tree verify's 65): every row block dequantizes every weight again
STEP_IN = 128  # input rows per loop step: 8 codes per word x 16 rows per dot
_MAGIC = {torch.bfloat16: 0x4300, torch.float16: 0x6400}  # bit pattern of OFFSET + 0 (OFFSET 128, 1024)
_SPLITS = (4, 8)  # split-K at least the first, at most the second (where the step count allows)
BLOCK_N = 128  # output columns per program (pack_planes' default)
LAUNCH = {"num_warps": 4, "num_stages": 3}  # measured best on H200 for every Qwen3-32B shape
# Launched early (programmatic dependent launch, model/triton_support.py) behind a norm (the q/k/v and gate/up
# GEMMs) and behind the gate/up GEMM (down), not behind the attention (o): `early`, AWQLinear.launch_early, set
# by Transformer.use_fused_kernels. measure.routes' target-kernels route on one H200 (session 30, eight runs): the
# 32B AWQ step 2.5% faster at context 300 and 2.0% at 4,000 (medians), the same bits; o launched early as well
# made it 3-7% slower. (Every GEMM launched early: 10.22 ms against 9.91 in session 11; with its first step's
# words loaded before it waits, 0-1.5% slower in session 25.) Its programs let the next kernel launch once their
# main loop is done (SIGNAL_NEXT; the route turns it off), so that kernel's launch and start overlap the
# split-K tail. 4 stages were slower for every shape and level for o_proj and down_proj alone (docs/design.md).
SIGNAL_NEXT = True


class Planes(NamedTuple):
    """An AWQ layer's weights as pack_planes makes them: codes int32 [N' / block_n, IN' / 128, block_n,
    16] and groups int32 [N' / block_n, groups', block_n], each a group's fp16 scale (high half) and
    zero point (low bits) for a column (IN', N', groups' padded with zero codes and scales)."""

    codes: torch.Tensor
    groups: torch.Tensor
    in_features: int
    out_features: int
    group_size: int
    swiglu: bool = False  # columns in swiglu_order: the GEMM writes silu(gate) * up [M, out_features / 2]

    @property
    def block_n(self) -> int:
        return self.codes.shape[2]


class FoldedNorm(NamedTuple):
    """An RMSNorm folded into the GEMMs around it, so that it needs no kernel of its own: the GEMM before
    (`w4a16_matmul_onto`) writes the residual stream's rows times the norm's weight and their sums of squares
    by block of columns [blocks, M] (float32); the GEMM after reads those rows and scales its sums by each
    row's 1 / RMS. `eps` is the norm's."""

    eps: float
    squares: torch.Tensor


def unsupported(in_features: int, out_features: int, group_size: int, dtype: torch.dtype) -> str | None:
    """Why w4a16_matmul cannot run this layer (None when it can)."""
    if dtype not in (torch.bfloat16, torch.float16, torch.float32):
        return f"activations of {dtype} (bfloat16, float16 or float32 only)"
    if group_size < 32 or group_size & (group_size - 1):
        return f"group size {group_size} is not a power of two >= 32"
    if in_features % group_size or out_features % 8:
        return f"shape {in_features} x {out_features} does not fit group {group_size} and 8 codes per int32"
    return None


def int32_bits(values: torch.Tensor) -> torch.Tensor:
    """int64 values in 0 .. 2**32 - 1 -> int32 tensors with the same 32 bits."""
    return torch.where(values >= 2**31, values - 2**32, values).to(torch.int32)


def swiglu_fits(out_features: int, block_n: int = BLOCK_N) -> bool:
    """Whether a merged gate/up weight of out_features columns pairs into blocks (swiglu_order)."""
    return out_features % block_n == 0


def swiglu_order(out_features: int, block_n: int = BLOCK_N) -> torch.Tensor:
    """The column order of a merged gate/up weight [IN, 2I] whose GEMM forms silu(gate) * up itself: each
    block of block_n columns holds block_n / 2 gate columns, then the up columns of the same outputs."""
    if not swiglu_fits(out_features, block_n):
        raise ValueError(f"{out_features} columns are not gate and up halves in blocks of {block_n // 2}")
    half, inner = block_n // 2, out_features // 2
    gate = torch.arange(inner).view(-1, half)
    return torch.cat([gate, gate + inner], dim=1).flatten()


def pack_planes(
    codes: torch.Tensor,
    zeros: torch.Tensor,
    scales: torch.Tensor,
    group_size: int,
    block_n: int = BLOCK_N,
    swiglu: bool = False,
) -> Planes:
    """codes [IN, N] and zero points [IN / group, N] (integers 0..15, unpacked), scales [IN / group, N]
    -> Planes (see the module docstring for the word layout). swiglu: the columns are a merged gate/up
    weight's, packed in swiglu_order."""
    IN, N = codes.shape
    reason = unsupported(IN, N, group_size, torch.float32)
    if reason:
        raise ValueError(reason)
    if block_n < 16 or block_n & (block_n - 1):
        raise ValueError(f"block_n {block_n} is not a power of two >= 16")
    if swiglu:
        order = swiglu_order(N, block_n).to(codes.device)
        codes, zeros, scales = codes[:, order], zeros[:, order], scales[:, order]
    in_padded, n_padded = -(-IN // STEP_IN) * STEP_IN, -(-N // block_n) * block_n
    groups = -(-in_padded // group_size)
    blocks = n_padded // block_n
    padded = torch.zeros(in_padded, n_padded, dtype=torch.int64, device=codes.device)
    padded[:IN, :N] = codes
    # row 128 s + 32 i + 2 j + h, column block b, column n -> nibble i + 4 h of word (b, s, n, j)
    by_nibble = padded.view(in_padded // STEP_IN, 4, 16, 2, blocks, block_n).permute(4, 0, 5, 2, 3, 1)
    shifts = 4 * (torch.arange(4, device=codes.device) + 4 * torch.arange(2, device=codes.device)[:, None])
    words = (by_nibble << shifts).sum(dim=(-2, -1))
    words = int32_bits(words).contiguous()

    per_group = torch.zeros(groups, n_padded, dtype=torch.int64, device=codes.device)
    scale_bits = scales.to(torch.float16).view(torch.int16).to(torch.int64) & 0xFFFF
    per_group[: zeros.shape[0], :N] = (scale_bits << 16) | zeros.to(torch.int64)
    per_group = int32_bits(per_group)
    per_group = per_group.view(groups, blocks, block_n).transpose(0, 1).contiguous()
    return Planes(words, per_group, IN, N, group_size, swiglu)


def block_m(M: int) -> int:
    """Rows per program: BLOCK_M up to BLOCK_M rows, else the power of two that holds M, at most
    MAX_BLOCK_M. A row's result depends on it, so it is a function of M alone (a decoder's target
    runs every decode forward at its one fixed width)."""
    return min(max(BLOCK_M, triton.next_power_of_2(M)), MAX_BLOCK_M)


def default_splits(M: int, planes: Planes, device: torch.device) -> int:
    """The smallest divisor of the step count from 4 up to 8 that gives at least 2 programs per SM
    (the largest divisor <= 8 when none does): on H200 this is what measured best for each of
    Qwen3-32B's shapes (4 for qkv and gate_up, 8 for o_proj and down)."""
    tiles = planes.codes.shape[0] * triton.cdiv(M, block_m(M))
    return split_count(tiles, planes.codes.shape[1], device, *_SPLITS)


def w4a16_matmul(
    x: torch.Tensor,
    planes: Planes,
    splits: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    tickets: torch.Tensor | None = None,
    early: bool = False,
    norm: FoldedNorm | None = None,
) -> torch.Tensor:
    """x [M, IN] (bf16, fp16 or fp32) @ the planes' weights -> y [M, N] in x's dtype; for planes packed
    with swiglu, silu(gate) * up [M, N / 2], the same bits as fused_ops.silu_mul of the product.
    early: launched early where the GPU can (programmatic dependent launch); each program waits for the
    previous kernel to finish before it reads anything, so the bits are the same.
    norm: x is rows of a residual stream times an RMSNorm's weight (w4a16_matmul_onto's `weighted`), and
    each row's sums are scaled by its 1 / RMS from norm.squares.

    splits (default: default_splits) must divide the planes' 128-row step count. tickets: int32
    zeros, one per (column block, block of block_m(M) rows), that the call leaves zero: a layer keeps
    them so a split-K call needs no memset; without enough, the call makes its own."""
    M = x.shape[0]
    y = torch.empty(
        (M, planes.out_features // 2 if planes.swiglu else planes.out_features), dtype=x.dtype, device=x.device
    )
    _launch(x, planes, y, splits, num_warps, num_stages, tickets, early, norm=norm)
    return y


def w4a16_matmul_onto(
    x: torch.Tensor,
    planes: Planes,
    residual: torch.Tensor,
    norm_weight: torch.Tensor,
    splits: int | None = None,
    tickets: torch.Tensor | None = None,
    early: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(h, weighted, squares): h = residual + x @ W [M, N], rounded as fused_ops.rms_norm rounds a residual
    add; weighted = h times the next RMSNorm's weight [N], rounded; squares, each row of h's sums of squares
    by block of block_n columns [N / block_n, M] (float32). The GEMM after it takes weighted with
    FoldedNorm(eps, squares). residual [M, N] in x's dtype; planes without swiglu."""
    M = x.shape[0]
    if planes.swiglu or residual.shape != (M, planes.out_features) or residual.dtype != x.dtype:
        raise ValueError(
            f"a residual of {tuple(residual.shape)} {residual.dtype} for {M} rows of {x.dtype} onto "
            f"{planes.out_features} columns{' of swiglu planes' if planes.swiglu else ''}"
        )
    if norm_weight.shape != (planes.out_features,):
        raise ValueError(
            f"the norm's weight has shape {tuple(norm_weight.shape)}, the planes {planes.out_features} outputs"
        )
    h, weighted = torch.empty_like(residual), torch.empty_like(residual)
    squares = torch.empty((planes.codes.shape[0], M), dtype=torch.float32, device=x.device)
    onto = (residual.contiguous(), norm_weight, weighted, squares)
    _launch(x, planes, h, splits, None, None, tickets, early, onto=onto)
    return h, weighted, squares


def _launch(
    x: torch.Tensor,
    planes: Planes,
    y: torch.Tensor,
    splits: int | None,
    num_warps: int | None,
    num_stages: int | None,
    tickets: torch.Tensor | None,
    early: bool,
    norm: FoldedNorm | None = None,
    onto: tuple[torch.Tensor, ...] | None = None,
) -> None:
    """The GEMM into y, its sums scaled by FoldedNorm's 1 / RMS (norm) or added onto a residual stream
    (onto: the residual, the next norm's weight, and the outputs weighted and squares)."""
    M, IN = x.shape
    N = planes.out_features
    if planes.in_features != IN:
        raise ValueError(f"x has {IN} features, the planes {planes.in_features}")
    reason = unsupported(IN, N, planes.group_size, x.dtype)
    if reason:
        raise ValueError(reason)
    tiles, steps = planes.codes.shape[:2]
    splits = splits or default_splits(M, planes, x.device)
    if steps % splits:
        raise ValueError(f"splits {splits} does not divide the {steps} steps of {STEP_IN} rows")
    if M == 0:
        return
    if x.stride(1) != 1:
        x = x.contiguous()
    rows_per_program = block_m(M)
    grid = (tiles, splits, triton.cdiv(M, rows_per_program))
    through_parts = splits > 1 or planes.swiglu  # SwiGLU's last split pairs columns from the parts
    partials = torch.empty((splits, M, N), dtype=torch.float32, device=x.device) if through_parts else y
    if not through_parts:
        tickets = y  # unused
    else:
        tickets = tickets_for(tickets, grid[0] * grid[2], x.device)
    norm_blocks = norm.squares.shape[0] if norm is not None else 1
    residual, norm_weight, weighted, squares = onto or (y, y, y, y)  # unused without onto
    squares = norm.squares if norm is not None else squares  # read (norm), written (onto) or unused
    pdl = overlap(x.device)["PDL"]
    wait = early and pdl
    with launching_on(x.device):
        _w4a16_kernel[grid](
            x,
            planes.codes,
            planes.groups,
            partials,
            y,
            tickets,
            norm_weight,
            weighted,
            squares,
            residual,
            M,
            N,
            IN,
            x.stride(0),
            steps // splits,
            planes.groups.shape[1],
            norm_blocks,
            0.0 if norm is None else norm.eps,
            GROUP=planes.group_size,
            BLOCK_M=rows_per_program,
            BLOCK_N=planes.block_n,
            SPLITS=splits,
            EVEN_IN=IN % STEP_IN == 0,
            MAGIC=_MAGIC.get(x.dtype, 0),
            PTX=x.is_cuda,
            SWIGLU=planes.swiglu,
            NORM=norm is not None,
            ONTO=onto is not None,
            NORM_BLOCKS=triton.next_power_of_2(norm_blocks),
            PDL=SIGNAL_NEXT and pdl,
            WAIT=wait,
            num_warps=num_warps or LAUNCH["num_warps"],
            num_stages=num_stages or LAUNCH["num_stages"],
            **({"launch_pdl": True} if wait else {}),
        )


def _pairs_ptx(magic: int, subtract: str) -> str:
    """$0 <- word $1 (already shifted) masked to the codes in its two halves, or-ed with OFFSET and minus
    OFFSET + z ($3, both halves). $2 is the same word again (pack=2 hands the asm both of its columns)."""
    return f"{{ .reg .b32 a; lop3.b32 a, $1, 0x000F000F, {magic * 0x10001}, 0xea; {subtract} $0, a, $3; }}"


if triton is not None:
    _BF16_PAIRS = tl.constexpr(_pairs_ptx(_MAGIC[torch.bfloat16], "sub.rn.bf16x2"))
    _FP16_PAIRS = tl.constexpr(_pairs_ptx(_MAGIC[torch.float16], "sub.rn.f16x2"))

    @triton.jit
    def _w4a16_kernel(
        x_ptr,
        w_ptr,
        g_ptr,
        part_ptr,
        y_ptr,
        ticket_ptr,
        norm_weight_ptr,
        weighted_ptr,
        squares_ptr,
        residual_ptr,
        M,
        N,
        IN,
        stride_xm,
        steps_per_split,
        groups,
        norm_blocks,
        eps,
        GROUP: tl.constexpr,
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
        SPLITS: tl.constexpr,
        EVEN_IN: tl.constexpr,
        MAGIC: tl.constexpr,
        PTX: tl.constexpr,
        SWIGLU: tl.constexpr,
        NORM: tl.constexpr,
        ONTO: tl.constexpr,
        NORM_BLOCKS: tl.constexpr,
        PDL: tl.constexpr,
        WAIT: tl.constexpr,
    ):
        """Program (column block, split, row block): its rows x columns summed over the split's steps,
        stored by split_k.store_split (SWIGLU: _store_swiglu; ONTO: _store_onto, added to the residual
        stream, with the rows times the next norm's weight and their sums of squares); PDL: the next kernel
        may launch once the sums are done; WAIT: launched early, it waits for the kernel before it first.
        NORM: the sums scaled by each row's 1 / RMS (FoldedNorm). MAGIC: OFFSET's bit pattern (0 for float32
        activations); a constexpr, or Triton would not load the words in the dot's layout."""
        pid_n = tl.program_id(0)
        pid_k = tl.program_id(1)
        pid_m = tl.program_id(2)
        after_previous(WAIT, LAUNCH_NEXT=False)
        GROUP_ROWS: tl.constexpr = min(GROUP, 128)  # input rows per dot: one group, at most one step
        SHIFTS: tl.constexpr = GROUP_ROWS // 32
        dtype = x_ptr.dtype.element_ty
        rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        m_in = rm < M
        x_cols = x_ptr + rm.to(tl.int64)[None, :] * stride_xm  # x^T tiles [a group's rows of IN, BLOCK_M]
        words = (
            w_ptr
            + pid_n.to(tl.int64) * tl.num_programs(1) * steps_per_split * BLOCK_N * 16
            + tl.arange(0, BLOCK_N)[:, None] * 16
            + tl.arange(0, 16)[None, :]
        )
        group_rows = pid_n.to(tl.int64) * groups * BLOCK_N + tl.arange(0, BLOCK_N)
        acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
        if NORM:  # loaded now, applied to the sums at the end
            inverse_rms = _inverse_rms(squares_ptr, rm, m_in, M, norm_blocks, IN, eps, NORM_BLOCKS)
        first = pid_k * steps_per_split
        for step in range(first, first + steps_per_split):
            P = tl.load(words + step * BLOCK_N * 16)
            for g in tl.static_range(128 // GROUP_ROWS):
                k = step * 128 + g * GROUP_ROWS
                group = tl.load(g_ptr + group_rows + (k // GROUP) * BLOCK_N)
                s = (group >> 16).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
                operand = _operand(_stacked(P, g * SHIFTS, SHIFTS), group & 0xF, dtype, MAGIC, PTX)
                rows = _x_rows(x_cols, k, tl.arange(0, GROUP_ROWS), m_in, IN, EVEN_IN)
                acc += s[:, None] * tl.dot(operand, rows, input_precision="ieee")
        launch_next(PDL)
        if NORM:
            acc = acc * inverse_rms[None, :]
        if SWIGLU:
            _store_swiglu(acc, part_ptr, y_ptr, ticket_ptr, rm, rn, M, N, SPLITS, BLOCK_N)
        elif ONTO:
            _store_onto(
                acc,
                part_ptr,
                y_ptr,
                residual_ptr,
                norm_weight_ptr,
                weighted_ptr,
                squares_ptr,
                ticket_ptr,
                rm,
                rn,
                M,
                N,
                SPLITS,
            )
        else:
            store_split(acc, part_ptr, y_ptr, ticket_ptr, rm, rn, M, N, SPLITS)

    @triton.jit
    def _store_swiglu(acc, part_ptr, y_ptr, ticket_ptr, rm, rn, M, N, SPLITS: tl.constexpr, BLOCK_N: tl.constexpr):
        """store_split for planes in swiglu_order, through the parts even with one split: the tile's last
        split sums its gate and its up columns as store_split would, rounds each to y's type as the stored
        product is, and writes silu(gate) * up into the tile's BLOCK_N / 2 columns of y [M, N / 2]."""
        rows = (rm.to(tl.int64) * N)[None, :]
        m_in = (rm < M)[None, :]
        if arrived_last(acc, part_ptr, ticket_ptr, rows + rn[:, None], m_in, M, N):
            HALF: tl.constexpr = BLOCK_N // 2
            gate_cols = (tl.program_id(0) * BLOCK_N + tl.arange(0, HALF))[:, None]
            gate = fused_ops._rounded(summed_parts(part_ptr, rows + gate_cols, m_in, M, N, SPLITS), y_ptr)
            up = fused_ops._rounded(summed_parts(part_ptr, rows + gate_cols + HALF, m_in, M, N, SPLITS), y_ptr)
            cols = (tl.program_id(0) * HALF + tl.arange(0, HALF))[:, None]
            out = fused_ops.swiglu(gate, up, y_ptr)
            tl.store(y_ptr + (rm.to(tl.int64) * (N // 2))[None, :] + cols, out.to(y_ptr.dtype.element_ty), mask=m_in)
            tl.store(tile_ticket(ticket_ptr), 0)

    @triton.jit
    def _store_onto(
        acc,
        part_ptr,
        y_ptr,
        residual_ptr,
        w_ptr,
        weighted_ptr,
        squares_ptr,
        ticket_ptr,
        rm,
        rn,
        M,
        N,
        SPLITS: tl.constexpr,
    ):
        """store_split of the residual stream plus the product, with the tile times the next norm's weight and
        each row's sum of squares of the tile's columns into squares[column block, row] (FoldedNorm)."""
        tile = (rm.to(tl.int64) * N)[None, :] + rn[:, None]
        inside = (rm < M)[None, :] & (rn < N)[:, None]
        residual = tl.load(residual_ptr + tile, mask=inside, other=0.0).to(tl.float32)  # before the ticket's wait
        weight = tl.load(w_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)
        if SPLITS == 1:
            _add_onto(acc, residual, weight, y_ptr, weighted_ptr, squares_ptr, tile, inside, rm, M)
        elif arrived_last(acc, part_ptr, ticket_ptr, tile, inside, M, N):
            total = summed_parts(part_ptr, tile, inside, M, N, SPLITS)
            _add_onto(total, residual, weight, y_ptr, weighted_ptr, squares_ptr, tile, inside, rm, M)
            tl.store(tile_ticket(ticket_ptr), 0)

    @triton.jit
    def _add_onto(total, residual, weight, y_ptr, weighted_ptr, squares_ptr, tile, inside, rm, M):
        """The product rounded as the GEMM stores it, added to the residual and rounded as fused_ops.rms_norm
        adds a residual; stored, with it times the norm's weight (rounded) and its rows' sums of squares over
        the tile's columns."""
        h = tl.where(inside, fused_ops._rounded(residual + fused_ops._rounded(total, y_ptr), y_ptr), 0.0)
        tl.store(y_ptr + tile, h.to(y_ptr.dtype.element_ty), mask=inside)
        tl.store(weighted_ptr + tile, (h * weight[:, None]).to(y_ptr.dtype.element_ty), mask=inside)
        tl.store(squares_ptr + tl.program_id(0) * M + rm, tl.sum(h * h, axis=0), mask=rm < M)

    @triton.jit
    def _inverse_rms(squares_ptr, rm, m_in, M, blocks, IN, eps, BLOCKS: tl.constexpr):
        """1 / the RMS of each input row, from its sums of squares by column block (summed in one fixed
        order; read past L1: the GEMM before wrote them)."""
        block = tl.arange(0, BLOCKS)
        squares = tl.load(
            squares_ptr + block[:, None] * M + rm[None, :],
            mask=(block < blocks)[:, None] & m_in[None, :],
            other=0.0,
            cache_modifier=".cg",
        )
        return tl.rsqrt(tl.sum(squares, axis=0) / IN + eps)

    @triton.jit
    def _x_rows(x_cols, k, rk, m_in, IN, EVEN_IN: tl.constexpr):
        """x^T [len(rk), BLOCK_M]: input rows k + rk (zero past IN)."""
        if EVEN_IN:
            return tl.load(x_cols + (k + rk)[:, None], mask=m_in[None, :], other=0.0)
        else:
            return tl.load(x_cols + (k + rk)[:, None], mask=m_in[None, :] & (k + rk < IN)[:, None], other=0.0)

    @triton.jit
    def _stacked(P, first: tl.constexpr, SHIFTS: tl.constexpr):
        """The words [BLOCK_N, 16] shifted by 4 first .. 4 (first + SHIFTS - 1) bits, side by side
        [BLOCK_N, 16 SHIFTS] (shift major): word j of shift i holds rows 32 i + 2 j and 32 i + 2 j + 1."""
        if SHIFTS == 1:
            return P >> (4 * first)
        elif SHIFTS == 2:
            pair = tl.join(P >> (4 * first), P >> (4 * first + 4))  # [n, j, i]
            return tl.reshape(tl.permute(pair, (0, 2, 1)), [P.shape[0], 32])
        else:  # the whole step (first is 0)
            four = tl.join(tl.join(P, P >> 4), tl.join(P >> 8, P >> 12))  # [n, j, t, u], shift t + 2 u
            return tl.reshape(tl.permute(four, (0, 3, 2, 1)), [P.shape[0], 64])

    @triton.jit
    def _operand(words, z, dtype: tl.constexpr, MAGIC: tl.constexpr, PTX: tl.constexpr):
        """(q - z) of the rows in the low nibbles of each half of the (shifted) words [BLOCK_N, W], as the
        dot's left operand [BLOCK_N, 2 W]: column 2 j + h is half h of word j. Each word is taken twice, so
        that a pair of adjacent columns, one 32-bit register of the operand, is made from one word."""
        twice = tl.reshape(tl.join(words, words), [words.shape[0], 2 * words.shape[1]])
        if dtype == tl.float32 or not PTX:  # half h of each word's copy h, its low nibble
            halves = tl.where((tl.arange(0, 2 * words.shape[1]) % 2)[None, :] == 1, twice >> 16, twice) & 0xF
        if dtype == tl.float32:
            operand = halves.to(tl.float32) - z.to(tl.float32)[:, None]
        else:
            offset_z = (z | MAGIC).to(tl.int16).to(dtype, bitcast=True)  # OFFSET + z
            if PTX:
                z_pairs = tl.broadcast_to(offset_z[:, None], twice.shape)
                if dtype == tl.bfloat16:
                    operand = tl.inline_asm_elementwise(
                        _BF16_PAIRS, "=r,r,r,r", [twice, z_pairs], dtype=tl.bfloat16, is_pure=True, pack=2
                    )
                else:
                    operand = tl.inline_asm_elementwise(
                        _FP16_PAIRS, "=r,r,r,r", [twice, z_pairs], dtype=tl.float16, is_pure=True, pack=2
                    )
            else:
                operand = (halves | MAGIC).to(tl.int16).to(dtype, bitcast=True) - offset_z[:, None]
        return operand
