"""The residual add and RMSNorm between two few-row GEMMs, fused into the GEMMs instead of a launch of its own.

Why: in a decode step each of o_proj and down_proj is followed by `h = h + delta; x = norm(h)`, a kernel
of a few microseconds whose cost is almost all launch and drain, twice per layer (56 of a Qwen3-0.6B
draft step's launches, 128 of the 32B target's). The add is elementwise, so the GEMM that makes delta
(the producer) finishes it per output tile, in the tile's final store; the norm needs the whole row, so
the producer also leaves each tile's sum of squares of h, and the GEMM that reads x (the consumer: the
merged q/k/v or gate/up) sums those per row in tile order and normalizes each input as it loads it. No
program waits on another, and no extra launch runs.

Numerics are fused_ops.rms_norm's: h rounded to the activation dtype after the add, x / rms rounded,
then times the weight and rounded; only the order of the sum of squares differs (tiles of the producer,
in order), so a row still depends on that row alone and on the launch configuration, never on the others.
A forward fuses every norm between its decode GEMMs or none (model/transformer.py); the prompt's wide
GEMMs keep the separate kernel.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from model.triton_support import tl, triton


class PendingNorm(NamedTuple):
    """x = RMSNorm(hidden) with `weight`, not computed yet: the next GEMM computes it as it loads its input.
    square_sums float32 [tiles, rows]: each producer tile's sum of hidden^2 over its columns."""

    hidden: torch.Tensor
    square_sums: torch.Tensor
    weight: torch.Tensor
    eps: float


def input_arguments(x: torch.Tensor | PendingNorm) -> tuple[torch.Tensor, dict]:
    """A consumer GEMM's input tensor, and the kernel arguments that normalize it as it loads (off for a
    plain x; the kernels' parameters norm_weight_ptr, squares_in_ptr, tiles_in, eps, NORM_IN, TILES_IN)."""
    if isinstance(x, PendingNorm):
        tiles = x.square_sums.shape[0]
        return x.hidden, {
            "norm_weight_ptr": x.weight,
            "squares_in_ptr": x.square_sums,
            "tiles_in": tiles,
            "eps": x.eps,
            "NORM_IN": True,
            "TILES_IN": triton.next_power_of_2(tiles),
        }
    return x, {"norm_weight_ptr": x, "squares_in_ptr": x, "tiles_in": 0, "eps": 0.0, "NORM_IN": False, "TILES_IN": 1}


def output_arguments(residual: torch.Tensor | None, y: torch.Tensor, tiles: int) -> tuple[dict, torch.Tensor | None]:
    """A producer GEMM's kernel arguments for adding its output to `residual` (off without one; the
    kernels' parameters residual_ptr, squares_ptr, RESIDUAL), and the tile sums of squares it fills."""
    if residual is None:
        return {"residual_ptr": y, "squares_ptr": y, "RESIDUAL": False}, None
    if residual.shape != y.shape or residual.dtype != y.dtype:
        raise ValueError(f"residual {tuple(residual.shape)} {residual.dtype} does not fit the output {tuple(y.shape)}")
    squares = torch.empty((tiles, y.shape[0]), dtype=torch.float32, device=y.device)
    return {"residual_ptr": residual.contiguous(), "squares_ptr": squares, "RESIDUAL": True}, squares


if triton is not None:

    @triton.jit
    def store_tile(value, y_ptr, tile, inside, residual_ptr, squares_ptr, rm, M, RESIDUAL: tl.constexpr):
        """A producer tile's final float32 values [columns, rows] into y: as they are, or with RESIDUAL,
        rounded, added to the residual stream, rounded again (fused_ops.rms_norm's h), with the tile's
        per-row sum of squares of that h stored at squares[column block, row]."""
        if RESIDUAL:
            delta = value.to(y_ptr.dtype.element_ty).to(tl.float32)
            residual = tl.load(residual_ptr + tile, mask=inside, other=0.0).to(tl.float32)
            hidden = (residual + delta).to(y_ptr.dtype.element_ty)
            tl.store(y_ptr + tile, hidden, mask=inside)
            squares = tl.where(inside, hidden.to(tl.float32) * hidden.to(tl.float32), 0.0)
            tl.store(squares_ptr + tl.program_id(0) * M + rm, tl.sum(squares, axis=0), mask=rm < M)
        else:
            tl.store(y_ptr + tile, value.to(y_ptr.dtype.element_ty), mask=inside)

    @triton.jit
    def inverse_rms(squares_ptr, tiles, rm, m_in, M, width, eps, TILES: tl.constexpr):
        """1 / rms of each row rm of a pending norm, from its producer's tile sums (one load, summed per row)."""
        tile = tl.arange(0, TILES)
        inside = (tile < tiles)[:, None] & m_in[None, :]
        sums = tl.load(squares_ptr + tile[:, None] * M + rm[None, :], mask=inside, other=0.0)
        return tl.rsqrt(tl.sum(sums, axis=0) / width + eps)

    @triton.jit
    def normalized(hidden, inverse, weight):
        """x^T [inputs, rows] from hidden^T: rounded to the dtype after the scale and after the weight."""
        scaled = (hidden.to(tl.float32) * inverse[None, :]).to(hidden.dtype).to(tl.float32)
        return (scaled * weight.to(tl.float32)[:, None]).to(hidden.dtype)
