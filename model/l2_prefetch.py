"""Weights pulled into the GPU's L2 cache ahead of the kernels that read them (Hopper's bulk prefetch).

Why: a decode layer of a small model is a chain of short kernels, each a pass over a few megabytes of
weights (Qwen3-0.6B: 8 MB merged q/k/v, 4 MB o, 12 MB merged gate/up, 6 MB down). One such pass alone
reaches about a third of the GPU's bandwidth: its programs start, ramp up their loads and drain, and only
then does the next kernel start loading (reports/speed/h200_routes_gemv.json). A weight never depends on
the previous kernel's output, so a kernel early in the layer can ask the memory system for the weights of
the kernels after it: the norm at a layer's start issues `cp.async.bulk.prefetch.L2` over them before it
waits for the kernel before it (programmatic dependent launch: model/triton_support.py), and the
projections then find their weights in L2 or on the way. A prefetch is a hint: it changes no value.

Two ways, measured against each other by `python -m measure.routes --routes l2-prefetch`:
- Slices (`SLICES`): each program of the dense GEMV (model/dense_gemv.py) and of the int4 GEMM
  (model/awq_triton.py) prefetches its own weights, all of them, before it waits for the kernel before
  it: a GEMV launched early streams while the previous kernel drains, and a GEMM's program has its whole
  slice in flight rather than its pipeline's few stages.
- Layer plans (`PLANS`), for models whose layers fit the L2.

Plans: `off`; `layer`, each layer's projections at its first norm; `ahead`, as `layer` but the
next layer's q/k/v and o projections at the norm before the MLP, so they stream while the MLP runs. A
model takes a plan only where what it keeps in L2 at once fits `L2_SHARE` of the cache (the 32B targets'
layers are several times an L2: there the plan is off). The tables hold raw addresses: they are built
after the weights are final (Transformer.use_fused_kernels) and rebuilt by `attach`.
"""

from __future__ import annotations

import torch

from model.triton_support import tl, triton

PLANS = ("off", "layer", "ahead")
DEFAULT_PLAN = "layer"
CHUNK_BYTES = 64 * 1024  # bytes one prefetch instruction asks for
ALIGN = 16  # the instruction's address and size granule
SLICES = True  # GEMV and int4 GEMM programs prefetch their own weights where the GPU supports it
L2_SHARE = 0.75  # of the L2 a plan may keep filled with the weights it asked for
TABLE_BLOCK = 128  # chunks issued per step of the prefetching program (one a thread of 4 warps)


def chunk_table(tensors: list[torch.Tensor]) -> torch.Tensor:
    """(address, bytes) [n, 2] int64 on the tensors' device: each tensor's bytes in chunks of at most
    CHUNK_BYTES, in order, each starting ALIGN-aligned; a tail under ALIGN bytes is left out (a hint)."""
    rows = []
    for tensor in tensors:
        if not tensor.is_contiguous():
            raise ValueError(f"a prefetched weight must be contiguous, not of strides {tensor.stride()}")
        start = tensor.data_ptr()
        end = start + tensor.numel() * tensor.element_size()
        start = -(-start // ALIGN) * ALIGN
        for address in range(start, end - ALIGN + 1, CHUNK_BYTES):
            rows.append((address, min(CHUNK_BYTES, (end - address) // ALIGN * ALIGN)))
    device = tensors[0].device if tensors else "cpu"
    return torch.tensor(rows, dtype=torch.int64, device=device).reshape(-1, 2)


def projections(layer) -> list[torch.Tensor]:
    """A fused layer's projection weights in the order its kernels read them: q/k/v, o, gate/up, down."""
    attn, mlp = layer.self_attn, layer.mlp
    return [module.weight for module in (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj)]


def tables_for(layers: list, plan: str) -> list[tuple[torch.Tensor | None, torch.Tensor | None]]:
    """Per layer, what its first norm and its norm before the MLP prefetch (None: nothing)."""
    weights = [projections(layer) for layer in layers]
    if plan == "off":
        return [(None, None)] * len(layers)
    if plan == "layer":
        return [(chunk_table(layer), None) for layer in weights]
    ahead = []
    for index, layer in enumerate(weights):
        first = layer if index == 0 else layer[2:]  # q/k/v and o came with the layer before
        after_attention = weights[index + 1][:2] if index + 1 < len(weights) else []
        ahead.append((chunk_table(first), chunk_table(after_attention) if after_attention else None))
    return ahead


def resident_bytes(layers: list, plan: str) -> int:
    """The most weight bytes a plan has asked for that a layer has yet to read: a layer's projections,
    and with `ahead` its MLP's and the next layer's q/k/v and o."""
    sizes = [[w.numel() * w.element_size() for w in projections(layer)] for layer in layers]
    if plan == "off" or not sizes:
        return 0
    if plan == "layer":
        return max(sum(layer) for layer in sizes)
    return max(sum(layer) + (sum(sizes[i + 1][:2]) if i + 1 < len(sizes) else 0) for i, layer in enumerate(sizes))


def fits(layers: list, plan: str, l2_bytes: int) -> bool:
    return resident_bytes(layers, plan) <= L2_SHARE * l2_bytes


def supported(device: torch.device) -> bool:
    """The bulk prefetch is a Hopper instruction, and the CPU interpreter runs no inline assembly."""
    return device.type == "cuda" and triton is not None and torch.cuda.get_device_capability(device)[0] >= 9


def attach(model, plan: str = DEFAULT_PLAN) -> str:
    """Gives a fused Transformer the plan's tables where the GPU supports it and the plan fits its L2,
    else none. Returns the plan taken ("off" where it was not)."""
    if plan not in PLANS:
        raise ValueError(f"unknown L2 prefetch plan {plan!r} (choices: {', '.join(PLANS)})")
    device = model.embed_tokens.weight.device
    layers = list(model.layers)
    taken = plan
    if model.kernels != "fused" or model.config.quant == "awq" or not supported(device):
        taken = "off"
    elif not fits(layers, plan, torch.cuda.get_device_properties(device).L2_cache_size):
        taken = "off"
    model.l2_prefetch = None if taken == "off" else tables_for(layers, taken)
    return taken


def slices_on(device: torch.device) -> bool:
    """Whether kernels on `device` prefetch their own slices (a constexpr of theirs)."""
    return SLICES and supported(device)


if triton is not None:
    _BULK_PREFETCH = tl.constexpr(
        "{ .reg .pred issue; setp.ne.s32 issue, $2, 0; @issue cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }"
    )

    @triton.jit
    def prefetch_ranges(addresses, sizes):
        """The bulk L2 prefetch of each (address int64, bytes int32) element pair: addresses 16-aligned,
        sizes multiples of 16, 0 to skip."""
        tl.inline_asm_elementwise(_BULK_PREFETCH, "=r,l,r", [addresses, sizes], dtype=tl.int32, is_pure=False, pack=1)

    @triton.jit
    def prefetch_span(start_ptr, nbytes, BLOCK: tl.constexpr):
        """The bulk L2 prefetch of `nbytes` (a multiple of 16) from `start_ptr` (16-aligned), in BLOCK pieces."""
        piece = (nbytes // BLOCK + 15) // 16 * 16
        offsets = tl.arange(0, BLOCK).to(tl.int64) * piece
        sizes = tl.minimum(tl.maximum(nbytes - offsets, 0), piece).to(tl.int32)
        prefetch_ranges(start_ptr.to(tl.int64) + offsets, sizes)

    @triton.jit
    def prefetch_into_l2(table_ptr, count, first, stride, BLOCK: tl.constexpr):
        """Issues the bulk L2 prefetch of the table's (address, bytes) rows first, first + stride, ...,
        BLOCK rows a step (pass TABLE_BLOCK): one SM issues them at about 0.26 TB/s (one H200), so the
        table is spread over a program on each SM. Reads only the table, which no kernel writes, so it
        may run before the previous kernel is done."""
        for start in range(first, count, stride * BLOCK):
            row = start + stride * tl.arange(0, BLOCK)
            inside = row < count
            address = tl.load(table_ptr + 2 * row, mask=inside, other=0)
            size = tl.load(table_ptr + 2 * row + 1, mask=inside, other=0).to(tl.int32)
            prefetch_ranges(address, size)
