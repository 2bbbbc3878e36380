"""AWQ layers over many rows (prefill): dequantize to the activation dtype into one shared buffer, then cuBLAS.

Why: our Triton w4a16 GEMM (model/awq_triton.py) is built for the few rows of a decode step, where the
weights' bytes are the cost. A prompt's thousands of rows make the GEMM compute-bound, and there it
reaches about a fifth of the tensor cores (AWQ 32B prefill of 2,048 tokens on H200: 144 TFLOPS against
the 743 of an 8192^3 bf16 GEMM). Dequantizing a layer costs 4.5 bytes per weight (half a byte read, two
written, two read again by the GEMM) against the GEMM's 2 M FLOPs per weight: with ~4.8 TB/s and ~600
TFLOPS the dequantized route wins once M is past about 90 rows, if the Triton GEMM stays near 144 TFLOPS
there. Measured on an H200 (`python -m measure.routes`, reports/speed/h200_routes_dequant.json), with the
dequantization at 1.5 TB/s: at 128 rows the two routes tie on the 32B's q/k/v and o shapes and the Triton
GEMM wins on gate/up and down; from 256 rows the dequantized route wins on every shape, so PREFILL_ROWS is
256. Decode, verify and the fixed-width rows (16) stay on the Triton GEMM, so speculative and
target-only runs still share every decode kernel; both prefill the same way.

One buffer per model, as large as its largest AWQ linear (the merged gate/up projection under fused
kernels), is reused by every layer in turn: the layers run one after another on one stream.
model/loading.py counts it when it asks whether the model fits.
"""

from __future__ import annotations

import torch

from model import triton_support
from model.triton_support import launching_on, tl, triton

PREFILL_ROWS = 256  # rows from which an AWQ linear dequantizes and calls torch.matmul (see the docstring)
# a program's tile of the dequantized [in, out] weight, and its warps (python -m measure.routes --routes awq-dequant)
DEQUANT_LAUNCH = {"BLOCK_IN": 8, "BLOCK_OUT": 256, "num_warps": 4}  # 0.44 ms for the 32B's gate/up on an H200


def largest_linear_elements(config) -> int:
    """Weights of the model's largest projection as the fused kernels merge them (q/k/v and gate/up each
    one GEMM): an upper bound for the unmerged layers too."""
    hidden, attention = config.hidden_size, config.n_heads * config.head_dim
    return max(
        hidden * (attention + 2 * config.n_kv_heads * config.head_dim),
        attention * hidden,
        hidden * 2 * config.intermediate_size,
        config.intermediate_size * hidden,
    )


def buffer_bytes(config, dtype: torch.dtype) -> int:
    """What `attach` allocates for a model of `config` (0 for dense models)."""
    if config.quant != "awq":
        return 0
    return largest_linear_elements(config) * torch.empty((), dtype=dtype).element_size()


def attach(model, dtype: torch.dtype, rows: int | None = PREFILL_ROWS) -> None:
    """Gives every AWQ linear of `model` one shared dequantization buffer, used from `rows` rows up
    (None: never, every row count runs the layer's selected kernel)."""
    from model.awq import AWQLinear  # model.awq imports this module

    layers = [module for module in model.modules() if isinstance(module, AWQLinear)]
    if not layers:
        return
    device = layers[0].qweight.device
    size = max(layer.in_features * layer.out_features for layer in layers)
    buffer = torch.empty(size, dtype=dtype, device=device) if rows is not None else None
    for layer in layers:
        layer.prefill_rows, layer.prefill_buffer = rows, buffer


def set_rows(model, rows: int | None) -> None:
    """Moves the threshold of an attached model (None: the route off); the buffer stays allocated."""
    from model.awq import AWQLinear

    for module in model.modules():
        if isinstance(module, AWQLinear):
            module.prefill_rows = rows


def dequantize_into(
    qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, group_size: int, out: torch.Tensor
) -> torch.Tensor:
    """AWQ buffers -> out [in, out] = (q - z) * s in out's dtype, bit for bit AWQLinear.dequantize()'s
    float32 values rounded once to out's dtype. A Triton kernel where ours run; the reference elsewhere."""
    in_features, out_features = qweight.shape[0], qweight.shape[1] * 8
    if out.shape != (in_features, out_features) or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous [{in_features}, {out_features}] tensor, not {tuple(out.shape)}")
    if not triton_support.runs_on(out.device):
        from model.awq import unpack_int4

        codes = unpack_int4(qweight)
        zeros = unpack_int4(qzeros).repeat_interleave(group_size, dim=0)
        return out.copy_((codes - zeros) * scales.float().repeat_interleave(group_size, dim=0))
    launch = DEQUANT_LAUNCH
    grid = (triton.cdiv(in_features, launch["BLOCK_IN"]), triton.cdiv(out_features, launch["BLOCK_OUT"]))
    with launching_on(out.device):
        _dequantize_kernel[grid](
            qweight,
            qzeros,
            scales,
            out,
            in_features,
            out_features,
            GROUP=group_size,
            **launch,
        )
    return out


def dense_matmul(layer, x: torch.Tensor) -> torch.Tensor:
    """The layer's forward through its weights dequantized into the shared buffer, then torch.matmul."""
    weight = layer.prefill_buffer[: layer.in_features * layer.out_features].view(layer.in_features, -1)
    dequantize_into(layer.qweight, layer.qzeros, layer.scales, layer.group_size, weight)
    return torch.matmul(x.to(weight.dtype), weight).to(x.dtype)


if triton is not None:

    @triton.jit
    def _dequantize_kernel(
        q_ptr,
        z_ptr,
        s_ptr,
        out_ptr,
        IN,
        OUT,
        GROUP: tl.constexpr,
        BLOCK_IN: tl.constexpr,
        BLOCK_OUT: tl.constexpr,
    ):
        """Program (row block, column block) of out [IN, OUT]. Column c of a block of 8 sits in nibble
        c // 2 + 4 (c % 2) of its int32 (AWQ's order 0, 2, 4, 6, 1, 3, 5, 7); each word is read by the
        8 threads of its columns, from one cache line."""
        rows = tl.program_id(0) * BLOCK_IN + tl.arange(0, BLOCK_IN)
        cols = tl.program_id(1) * BLOCK_OUT + tl.arange(0, BLOCK_OUT)
        inside = (rows < IN)[:, None] & (cols < OUT)[None, :]
        shift = (4 * ((cols % 8) // 2 + 4 * (cols % 2)))[None, :]
        words = OUT // 8
        packed = tl.load(q_ptr + rows.to(tl.int64)[:, None] * words + (cols // 8)[None, :], mask=inside, other=0)
        group = (rows // GROUP).to(tl.int64)[:, None]
        zeros = tl.load(z_ptr + group * words + (cols // 8)[None, :], mask=inside, other=0)
        scales = tl.load(s_ptr + group * OUT + cols[None, :], mask=inside, other=0.0).to(tl.float32)
        codes = ((packed >> shift) & 0xF) - ((zeros >> shift) & 0xF)
        values = codes.to(tl.float32) * scales
        tl.store(
            out_ptr + rows.to(tl.int64)[:, None] * OUT + cols[None, :], values.to(out_ptr.dtype.element_ty), mask=inside
        )
