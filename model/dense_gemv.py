"""Triton GEMV for a dense (bf16) model's projections at 1 to 16 rows: the draft step's linear layers.

Why: a draft step feeds one row (a tree's frontier up to 16), so each projection is a pass over its
weights. cuBLAS runs these at a fifth to a quarter of an H200's bandwidth (Qwen3-0.6B draft, one
token: the 28 merged gate/up GEMMs take 11.5 us each against a 2.6 us floor; q/k/v and o 5.2 us; down
split-K plus a reduction kernel), and they are about 60% of the step. Here a program reads a
[BLOCK_N, BLOCK_K] tile of the weight [N, K] per step (rows contiguous, pipelined through shared memory
by `num_stages`) and multiplies it with the [BLOCK_K, 16] slice of x^T on the tensor cores, float32
sums; the input is split over the SMs as the AWQ kernel splits it (model/split_k.py), so a layer of a
few megabytes still has every SM loading.

- `silu=True` fuses SwiGLU into down_proj's input load: x is the merged gate/up output [M, 2K] and the
  kernel computes silu(gate) * up as fused_ops.silu_mul does, rounded to the dtype after each of the
  same two ops, so the result is bit for bit gemv(silu_mul(gate_up)): one launch less per layer.
- A launch configuration (tile, splits, warps, stages) is chosen per weight shape, never per row
  count: up to 16 rows, a row's result depends only on that row and the shape, bit for bit.
- The draft runs it through `Route` (`attach`): its fused forward sends a projection of at most
  `rows` rows here, and wider ones (the prompt) to F.linear. DRAFT_ROWS is the default for drafts,
  since `python -m measure.routes --routes draft-gemv` showed the step faster with it.

Where the kernels run: model/triton_support.py.
"""

from __future__ import annotations

import torch
from torch import nn

from model import fused_ops
from model.awq import AWQLinear
from model.split_k import split_count, store_split, tickets_for
from model.triton_support import after_previous, launch_next, launching_on, overlap, tl, triton

BLOCK_M = 16  # rows per program: tl.dot's least
MAX_ROWS = 16  # rows up to which the route takes a projection (one row block: the launch does not depend on M)
# drafts' default (model/pair.py, measure/speed*.py): on one H200 the Qwen3-0.6B draft step at context 300
# took 1.172 ms with the route against 1.415 ms without (reports/speed/h200_routes_gemv.json)
DRAFT_ROWS: int | None = MAX_ROWS
# launch per weight shape (in, out); splits None: split_count's choice. The fastest of measure.routes'
# sweep over 1, 4 and 16 rows on one H200 (reports/speed/h200_routes_gemv.json): Qwen3-0.6B, then Llama-3.2-1B
DEFAULT_LAUNCH = {"BLOCK_N": 64, "BLOCK_K": 128, "splits": None, "num_warps": 4, "num_stages": 4}
LAUNCHES: dict[tuple[int, int], dict] = {
    (1024, 4096): {"BLOCK_N": 64, "BLOCK_K": 128, "splits": 1, "num_warps": 4, "num_stages": 4},
    (2048, 1024): {"BLOCK_N": 64, "BLOCK_K": 128, "splits": 8, "num_warps": 4, "num_stages": 4},
    (1024, 6144): {"BLOCK_N": 64, "BLOCK_K": 128, "splits": 1, "num_warps": 4, "num_stages": 4},
    (3072, 1024): {"BLOCK_N": 64, "BLOCK_K": 128, "splits": 8, "num_warps": 4, "num_stages": 3},
    (2048, 3072): {"BLOCK_N": 32, "BLOCK_K": 256, "splits": 1, "num_warps": 4, "num_stages": 3},
    (2048, 2048): {"BLOCK_N": 64, "BLOCK_K": 128, "splits": 4, "num_warps": 4, "num_stages": 4},
    (2048, 16384): {"BLOCK_N": 64, "BLOCK_K": 128, "splits": 1, "num_warps": 4, "num_stages": 4},
    (8192, 2048): {"BLOCK_N": 128, "BLOCK_K": 128, "splits": 8, "num_warps": 8, "num_stages": 4},
}


def launch_for(in_features: int, out_features: int) -> dict:
    return LAUNCHES.get((in_features, out_features), DEFAULT_LAUNCH)


def default_splits(tiles: int, steps: int, device: torch.device) -> int:
    """split_count up to 8 splits: two programs per SM where the steps allow."""
    return split_count(tiles, steps, device)


def gemv(
    x: torch.Tensor,
    weight: torch.Tensor,
    silu: bool = False,
    launch: dict | None = None,
    tickets: torch.Tensor | None = None,
) -> torch.Tensor:
    """x [M, K] @ weight [N, K]^T -> y [M, N] in x's dtype (with `silu`, x is [M, 2K]: gate, then up,
    and the product is silu(gate) * up @ weight^T). `launch` (default launch_for(K, N)): BLOCK_N,
    BLOCK_K, splits (dividing the BLOCK_K steps; None: default_splits), num_warps, num_stages. tickets:
    int32 zeros, one per column block and 16 rows, left zero (a model keeps them so split-K needs no memset)."""
    M = x.shape[0]
    N, K = weight.shape
    if x.dim() != 2 or x.shape[1] != (2 * K if silu else K):
        raise ValueError(f"x {tuple(x.shape)} does not fit a weight of {K} inputs{' (gate and up)' if silu else ''}")
    if x.dtype != weight.dtype or x.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise ValueError(f"x of {x.dtype} and weight of {weight.dtype}: one of bfloat16, float16, float32")
    launch = launch or launch_for(K, N)
    block_n, block_k = launch["BLOCK_N"], launch["BLOCK_K"]
    tiles, steps = triton.cdiv(N, block_n), triton.cdiv(K, block_k)
    splits = launch["splits"] or default_splits(tiles, steps, x.device)
    if steps % splits:
        raise ValueError(f"splits {splits} does not divide the {steps} steps of {block_k} inputs")
    y = torch.empty((M, N), dtype=x.dtype, device=x.device)
    if M == 0:
        return y
    x = x if x.stride(1) == 1 else x.contiguous()
    weight = weight if weight.is_contiguous() else weight.contiguous()
    grid = (tiles, splits, triton.cdiv(M, BLOCK_M))
    partials = y if splits == 1 else torch.empty((splits, M, N), dtype=torch.float32, device=x.device)
    tickets = y if splits == 1 else tickets_for(tickets, grid[0] * grid[2], x.device)
    with launching_on(x.device):
        _gemv_kernel[grid](
            x,
            weight,
            partials,
            y,
            tickets,
            M,
            N,
            K,
            x.stride(0),
            steps // splits,
            BLOCK_M=BLOCK_M,
            BLOCK_N=block_n,
            BLOCK_K=block_k,
            SPLITS=splits,
            EVEN_N=N % block_n == 0,
            EVEN_K=K % block_k == 0,
            SILU=silu,
            num_warps=launch["num_warps"],
            num_stages=launch["num_stages"],
            **overlap(x.device),
        )
    return y


class Route:
    """Which projections of a dense model's fused forward run `gemv`: those of at most `rows` rows
    (None: none, every projection is F.linear). One ticket buffer serves every layer in turn."""

    def __init__(self, rows: int | None = None, tickets: torch.Tensor | None = None):
        self.rows, self.tickets = rows, tickets

    def _takes(self, layer: nn.Module, x: torch.Tensor) -> bool:
        return self.rows is not None and x.shape[0] <= self.rows and type(layer) is nn.Linear and layer.bias is None

    def project(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """layer(x) for rows x [n, in]."""
        return gemv(x, layer.weight, tickets=self.tickets) if self._takes(layer, x) else layer(x)

    def mlp(self, mlp: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """down(silu(gate) * up) of a fused forward's MLP (merged gate/up) for normed rows x [n, hidden]:
        SwiGLU on down_proj's load when routed, in an AWQ gate/up GEMM (AWQLinear.swiglu), else its own kernel."""
        gate_up, down = mlp.gate_up_proj, mlp.down_proj
        if self._takes(down, x):
            return gemv(self.project(gate_up, x), down.weight, silu=True, tickets=self.tickets)
        if isinstance(gate_up, AWQLinear):
            return down(gate_up.swiglu(x))
        return down(fused_ops.silu_mul(self.project(gate_up, x)))


OFF = Route()


def attach(model, rows: int | None = MAX_ROWS) -> None:
    """Gives `model` (a Transformer) the route for up to `rows` rows (None: off). Only a dense model on
    the fused kernels takes it: an AWQ model has its own int4 kernel, the torch path its own numerics."""
    if rows is not None and not 1 <= rows <= MAX_ROWS:
        raise ValueError(f"rows {rows} outside 1..{MAX_ROWS}")
    if rows is None or model.kernels != "fused" or model.config.quant == "awq":
        model.gemv_route = OFF
        return
    widest = max(module.out_features for module in model.modules() if isinstance(module, nn.Linear))
    tickets = torch.zeros(triton.cdiv(widest, 16), dtype=torch.int32, device=model.embed_tokens.weight.device)
    model.gemv_route = Route(rows, tickets)


if triton is not None:
    # one compiled kernel per launch whatever the row count and steps (triton would specialize a value of 1)
    @triton.jit(do_not_specialize=["M", "steps_per_split"])
    def _gemv_kernel(
        x_ptr,
        w_ptr,
        part_ptr,
        y_ptr,
        ticket_ptr,
        M,
        N,
        K,
        stride_xm,
        steps_per_split,
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_K: tl.constexpr,
        SPLITS: tl.constexpr,
        EVEN_N: tl.constexpr,
        EVEN_K: tl.constexpr,
        SILU: tl.constexpr,
        PDL: tl.constexpr,
    ):
        """Program (column block, split, row block): weight rows rn times x rows rm over the split's
        steps of BLOCK_K inputs, as acc [BLOCK_N, BLOCK_M] (the weight tile is the dot's left operand,
        so a tile of 64 or 128 columns fills the tensor cores' wide side), stored by split_k.store_split."""
        after_previous(PDL, False)
        rm = tl.program_id(2) * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        rk = tl.arange(0, BLOCK_K)
        m_in = rm < M
        n_in = rn < N
        weights = w_ptr + rn.to(tl.int64)[:, None] * K + rk[None, :]
        x_cols = x_ptr + rm.to(tl.int64)[None, :] * stride_xm + rk[:, None]  # x^T tiles [BLOCK_K, BLOCK_M]
        acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
        first = tl.program_id(1) * steps_per_split
        for step in range(first, first + steps_per_split):
            k = step * BLOCK_K
            if EVEN_N and EVEN_K:
                w = tl.load(weights + k)
            else:
                w = tl.load(weights + k, mask=n_in[:, None] & (k + rk < K)[None, :], other=0.0)
            x_mask = m_in[None, :] if EVEN_K else m_in[None, :] & (k + rk < K)[:, None]
            if SILU:  # as fused_ops._silu_mul_kernel: silu(gate) rounded, times up, rounded
                gate = tl.load(x_cols + k, mask=x_mask, other=0.0).to(tl.float32)
                up = tl.load(x_cols + K + k, mask=x_mask, other=0.0).to(tl.float32)
                x = fused_ops.swiglu(gate, up, w_ptr).to(w_ptr.dtype.element_ty)
            else:
                x = tl.load(x_cols + k, mask=x_mask, other=0.0)
            acc = tl.dot(w, x, acc, input_precision="ieee")
        launch_next(PDL)
        store_split(acc, part_ptr, y_ptr, ticket_ptr, rm, rn, M, N, SPLITS)
