"""Split-K for the few-row GEMMs (model/awq_triton.py, model/dense_gemv.py): how many splits, and one launch.

At a handful of rows a GEMM's cost is reading its weights, and a layer's output columns alone make too
few programs to keep every SM's loads in flight. So the input rows are split too (grid axis 1): each split
writes float32 partials to a [splits, M, N] buffer and counts itself on its tile's ticket; the last split
of a tile sums the partials in split order, casts and resets the ticket (no second launch, no atomics on
values). Results are bitwise reproducible, and an output row depends only on its own input row and the
launch configuration.
"""

from __future__ import annotations

import functools

import torch

from model.triton_support import tl, triton

_DEFAULT_SMS = 132  # H100 / H200
PROGRAMS_PER_SM = 2


@functools.cache
def sm_count(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return _DEFAULT_SMS


def split_count(tiles: int, steps: int, device: torch.device, least: int = 1, most: int = 8) -> int:
    """The smallest divisor of `steps` from `least` up to `most` that gives PROGRAMS_PER_SM programs per
    SM with `tiles` output tiles (the largest divisor <= most when none does)."""
    divisors = [d for d in range(1, min(steps, most) + 1) if steps % d == 0]
    want = PROGRAMS_PER_SM * sm_count(device)
    return next((d for d in divisors if d >= least and tiles * d >= want), divisors[-1])


def tickets_for(tickets: torch.Tensor | None, count: int, device: torch.device) -> torch.Tensor:
    """`tickets` when it holds `count` int32 zeros to spare, else fresh ones (a memset launch)."""
    if tickets is None or tickets.numel() < count or tickets.dtype != torch.int32:
        return torch.zeros(count, dtype=torch.int32, device=device)
    return tickets


if triton is not None:

    @triton.jit
    def store_split(acc, part_ptr, y_ptr, ticket_ptr, rm, rn, M, N, SPLITS: tl.constexpr):
        """Program (column block, split, row block)'s float32 tile acc [columns rn, rows rm] of y [M, N]:
        written to y with one split; else to part[split], and the tile's last split to arrive sums the
        parts in split order into y and resets the tile's ticket."""
        tile = (rm.to(tl.int64) * N)[None, :] + rn[:, None]
        inside = (rm < M)[None, :] & (rn < N)[:, None]
        if SPLITS == 1:
            tl.store(y_ptr + tile, acc.to(y_ptr.dtype.element_ty), mask=inside)
        elif arrived_last(acc, part_ptr, ticket_ptr, tile, inside, M, N):
            total = summed_parts(part_ptr, tile, inside, M, N, SPLITS)
            tl.store(y_ptr + tile, total.to(y_ptr.dtype.element_ty), mask=inside)
            tl.store(tile_ticket(ticket_ptr), 0)

    @triton.jit
    def tile_ticket(ticket_ptr):
        """The ticket of the program's tile (column block, row block)."""
        return ticket_ptr + tl.program_id(2) * tl.num_programs(0) + tl.program_id(0)

    @triton.jit
    def arrived_last(acc, part_ptr, ticket_ptr, tile, inside, M, N):
        """Writes the program's part (acc at the `tile` offsets of part[split]) and counts it on the tile's
        ticket: whether it was the tile's last split, which then sums the parts and resets the ticket."""
        tl.store(part_ptr + tl.program_id(1).to(tl.int64) * M * N + tile, acc, mask=inside)
        return tl.atomic_add(tile_ticket(ticket_ptr), 1, sem="acq_rel") == tl.num_programs(1) - 1

    @triton.jit
    def summed_parts(part_ptr, tile, inside, M, N, SPLITS: tl.constexpr):
        """The splits' float32 parts of the `tile` offsets summed in split order (read past L1: other
        programs wrote them)."""
        total = tl.load(part_ptr + tile, mask=inside, other=0.0, cache_modifier=".cg")
        for split in tl.static_range(1, SPLITS):
            total += tl.load(part_ptr + split * M * N + tile, mask=inside, other=0.0, cache_modifier=".cg")
        return total
