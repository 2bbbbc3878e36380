"""Tensor-parallel targets: one process per rank, the target's attention heads and MLP split across
the ranks, the draft on one rank, and every rank running the same decoder loop in lockstep.

Sharding (Megatron-style, any number of ranks N that divides the KV heads and the MLP width): rank r
holds query heads [r H/N, (r+1) H/N) and KV heads [r Hkv/N, (r+1) Hkv/N) (q/k/v projections split
by output rows, o_proj by input columns) and the MLP's intermediate features [r I/N, (r+1) I/N)
(gate/up split by rows, down_proj by columns). AWQ int4 projections store W as [in, out] (model/awq.py), so the
same split falls on the other dimension: column-parallel layers split qweight, qzeros and scales by output
columns (whole blocks of 8 packed columns), row-parallel ones split them by input rows and groups, which
needs each rank's input width to be a whole number of quantization groups. Each rank's o_proj and
down_proj give a partial sum of the full output; a forward hook all-reduces it in place, so every rank
carries the whole residual stream. The embedding, the norms and the LM head are replicated, not
vocab-sharded: every rank computes the same logits and greedy tokens with no gather. Each rank's KV
cache holds its own heads.

Lockstep: every rank runs the same Decoder over its shard and issues the same forwards in the same
order, so the collectives inside them match. Only the draft rank runs the draft; the others hold a
stand-in of the same interface that does no real work. The decoder's copy of proposals to the target
(`Decoder.to_target`) becomes `share`: a broadcast from the draft rank, so every rank verifies the
same tokens, settles them the same way and reads the same values, and the host takes the same
branches on every rank. This relies on the all-reduce giving every rank the same sum, bit for bit,
which NCCL's and gloo's algorithms do (each element is reduced once, then copied to every rank).

CUDA graphs: the hooks' all-reduces run on the current stream inside the captured forwards, one
graph per shape on every rank, captured in the same order (the decoder captures up front). NCCL
collectives are capturable once the communicator exists: `init` runs one eager all-reduce on each
rank's device before any capture, and the device of each rank is set (`torch.cuda.set_device`) so
NCCL's streams live on it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from contracts import UsageError
from contracts.names import tensor_parallel_size
from model.config import ModelConfig

_SPLIT_OUTPUTS = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")  # weight rows split
_SPLIT_INPUTS = ("o_proj", "down_proj")  # weight columns split; their outputs are all-reduced
_AWQ_BUFFERS = ("qweight", "qzeros", "scales")  # model/awq.py: [in or groups, out], the transpose of nn.Linear


@dataclass(frozen=True)
class TensorParallel:
    """This process's place in a tensor-parallel target: its rank among `world` ranks, and the rank
    whose GPU runs the draft."""

    rank: int
    world: int
    draft_rank: int = 0

    @property
    def runs_draft(self) -> bool:
        return self.rank == self.draft_rank

    def shard_config(self, config: ModelConfig) -> ModelConfig:
        """The architecture of one rank's shard: its heads and MLP width (bad input when N does not divide
        them, or, for AWQ, when a shard's row-parallel input is not whole quantization groups)."""
        widths = {"KV heads": config.n_kv_heads, "MLP width": config.intermediate_size}
        for what, size in widths.items():
            if size % self.world:
                raise UsageError(
                    f"tensor parallelism over {self.world} ranks needs {self.world} to divide the {what} ({size})"
                )
        if config.quant == "awq":
            _check_awq_split(config, self.world)
        return dataclasses.replace(
            config,
            n_heads=config.n_heads // self.world,
            n_kv_heads=config.n_kv_heads // self.world,
            intermediate_size=config.intermediate_size // self.world,
        )

    def shard(self, name: str, full: torch.Tensor) -> torch.Tensor:
        """This rank's part of the full tensor `name` (a state-dict name); replicated tensors whole."""
        dim = _split_dim(name)
        return full if dim is None else full.chunk(self.world, dim)[self.rank]

    def full_shape(self, name: str, local: torch.Size) -> tuple[int, ...]:
        """The unsharded shape of the tensor whose shard has shape `local`."""
        dim = _split_dim(name)
        return tuple(size * self.world if i == dim else size for i, size in enumerate(local))

    def attach(self, model: nn.Module) -> None:
        """All-reduce the partial outputs of every o_proj and down_proj (in place, as a forward hook, so
        the torch and fused layer paths both get it)."""
        for module in _reducing(model):
            module.reduces_output = True
            module.register_forward_hook(_all_reduce_output)

    def share(self, tokens: torch.Tensor) -> torch.Tensor:
        """The draft rank's `tokens` on every rank (a broadcast; the others' values are replaced)."""
        tokens = tokens.contiguous()
        dist.broadcast(tokens, src=self.draft_rank)
        return tokens


def _split_dim(name: str) -> int | None:
    """The dimension a tensor is split on: dense weights are [out, in], AWQ buffers [in or groups, out]."""
    parts = name.split(".")
    module = parts[-2] if len(parts) >= 2 else ""
    split = 0 if module in _SPLIT_OUTPUTS else 1 if module in _SPLIT_INPUTS else None
    return None if split is None else 1 - split if parts[-1] in _AWQ_BUFFERS else split


def _check_awq_split(config: ModelConfig, world: int) -> None:
    """Each rank's packed output columns come in blocks of 8, and its row-parallel inputs (o_proj's
    heads, down_proj's MLP features) in whole quantization groups."""
    group = config.awq_group_size
    outputs = {
        "query width": config.n_heads * config.head_dim,
        "KV width": config.n_kv_heads * config.head_dim,
        "MLP width": config.intermediate_size,
    }
    for what, size in outputs.items():
        if size % (8 * world):
            raise UsageError(f"AWQ over {world} ranks needs the {what} ({size}) to split into blocks of 8 columns")
    inputs = {"o_proj input": config.n_heads * config.head_dim, "down_proj input": config.intermediate_size}
    for what, size in inputs.items():
        if size % (group * world):
            raise UsageError(
                f"AWQ over {world} ranks cannot split the {what} ({size}) on its {group}-wide quantization groups"
            )


def _reducing(model: nn.Module) -> list[nn.Module]:
    return [module for name, module in model.named_modules() if name.rsplit(".", 1)[-1] in _SPLIT_INPUTS]


def _all_reduce_output(module, inputs, output: torch.Tensor) -> None:
    if module.reduces_output:
        dist.all_reduce(output)


@contextlib.contextmanager
def compute_only(model: nn.Module):
    """The shard's forwards without their all-reduces (each rank's compute alone, as `measure` times it;
    the outputs are partial sums, not the model's). A CUDA graph captured inside stays without them."""
    modules = _reducing(model)
    for module in modules:
        module.reduces_output = False
    try:
        yield model
    finally:
        for module in modules:
            module.reduces_output = True


class DraftStandIn(nn.Module):
    """What a rank without the draft holds in its place: the draft's interface (a device, a cache
    size, a one-wide hidden state) and no real work. Its proposals are replaced by the draft rank's
    in `TensorParallel.share` before the target sees them."""

    def __init__(self, device: torch.device, max_seq_len: int):
        super().__init__()
        self.register_buffer("head_weight", torch.zeros(1, 1, device=device), persistent=False)
        self.max_seq_len = max_seq_len

    def setup_cache(self, max_seq_len: int, *_) -> None:
        self.max_seq_len = max_seq_len

    def forward_hidden(self, tokens: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        return self.head_weight.expand(1, tokens.shape[1], 1)


def init(placement: str, command: str = "model") -> tuple[TensorParallel, torch.device]:
    """Joins the process group of a `tpN` placement (launched by torchrun: RANK, WORLD_SIZE, LOCAL_RANK
    and the rendezvous in the environment; `command` is the module it runs, for the error message);
    this rank's TensorParallel and device. NCCL on GPUs (one
    per rank), gloo on the CPU."""
    world = tensor_parallel_size(placement)
    launched = int(os.environ.get("WORLD_SIZE", "1"))
    if launched != world:
        raise UsageError(
            f"placement {placement} runs one process per GPU: launch with "
            f"torchrun --nproc-per-node {world} -m {command} ... "
            f"(this run has {launched} process{'es' * (launched > 1)})"
        )
    local = int(os.environ.get("LOCAL_RANK", os.environ.get("RANK", "0")))
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus and gpus < world:
        raise UsageError(f"placement {placement} needs {world} CUDA GPUs, found {gpus}")
    device = torch.device("cuda", local) if gpus else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", device_id=device if gpus else None)
    warm = torch.ones(1, device=device)
    dist.all_reduce(warm)  # the communicator exists before any graph capture
    return TensorParallel(dist.get_rank(), dist.get_world_size()), device
