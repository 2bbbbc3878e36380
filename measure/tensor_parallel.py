"""torchrun --nproc-per-node N -m measure --placement tpN --add-to PROFILE: what a target tensor-parallel over
N ranks costs on these GPUs, written into a copy of PROFILE as its `tensor_parallel.tpN` section
(contracts/profile.py). The draft and host costs stay PROFILE's: the draft shares rank 0's GPU, where it
costs what it costs on one GPU.

Every rank runs the same steps in lockstep and rank 0 writes. Three tables, each timing one rank:
- `all_reduce_ms`: one in-place all-reduce of `bytes` (rows x hidden values in the target's dtype: the
  message a TP layer sends twice per forward, after o_proj and after down_proj), per message size;
- `forward_ms` and `prefill_ms`: the rank's compute alone (`compute_only`: the all-reduces switched off),
  the decode step as the decoder runs it (`Decoder.target_forward`: CUDA graph, fixed width on GPUs) per
  token count and context, and a prompt's eager forward per prompt length;
- `measured_forward_ms`: the same decode step with its all-reduces, to check the simulator's sum.

On GPUs the all-reduce is a CUDA graph of `calls` operations, replayed after a barrier (so no rank waits
for another inside the timed window), timed with CUDA events and divided by `calls`; the decode steps
replay the decoder's own graphs. On the CPU (gloo) the host clock times eager calls.
"""

from __future__ import annotations

import datetime
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist

from contracts import UsageError
from contracts.files import check_output_file
from contracts.profile import read_profile, write_profile
from measure.profiling import check_settings
from model import tensor_parallel
from model.decoder import Decoder, cache_room, width
from model.graphs import capturing
from model.heads import DenseHead
from model.loading import load_model

ALL_REDUCE_CALLS = 16  # all-reduces per timed graph on GPUs
# Options of `python -m measure` that price the draft: a tpN measurement takes them from --add-to's profile.
DRAFT_OPTIONS = (
    "draft",
    "probes",
    "clustering",
    "prompts",
    "prompts_file",
    "agreement_max_len",
    "early_exit_layers",
    "lookup_ngram",
)


def check_request(settings, given: set[str], add_to: str | None, out: str) -> dict:
    """The profile to add to, read and checked, before any process group or model (bad input: UsageError)."""
    check_settings(settings)
    draft_options = sorted(given & set(DRAFT_OPTIONS))
    if draft_options:
        option = "--" + draft_options[0].replace("_", "-")
        raise UsageError(
            f"{option}: a {settings.placement} measurement times the target only; the draft's costs come "
            "from --add-to's profile"
        )
    if add_to is None:
        raise UsageError(
            f"--placement {settings.placement} adds a tensor_parallel section to a profile: give --add-to PROFILE "
            "(one measured by python -m measure with the draft, e.g. on one GPU)"
        )
    if settings.graphs is not None and len(settings.graphs) != 1:
        raise UsageError(f"--graphs: a {settings.placement} measurement takes one regime, on or off")
    if settings.graphs == ("on",) and not torch.cuda.is_available():
        raise UsageError("--graphs on needs GPUs (CUDA graphs)")
    check_output_file(Path(out), "--out")
    return read_profile(add_to)


def measure_into(settings, base: dict, out: Path, command: str) -> Path | None:
    """Measure the tensor-parallel target of `settings` on every rank; rank 0 writes `base` with the
    section added as `out` (returned; None on the other ranks)."""
    ranks, device = tensor_parallel.init(settings.placement, "measure")
    graphs = device.type == "cuda" and (settings.graphs or ("on",)) == ("on",)
    tokens = list(range(1, settings.K_max + 3))
    contexts, prompt_lengths = list(settings.contexts), list(settings.prompt_lengths)
    room = max(cache_room(max(contexts), 0, settings.K_max + 1), max(prompt_lengths))
    loaded = load_model(
        settings.target, device, settings.dtype, settings.seed, room, settings.kernels, tensor_parallel=ranks
    )
    model = loaded.model
    hidden, dtype = model.config.hidden_size, model.embed_tokens.weight.dtype
    fixed_width = width(settings.K_max + 1) if graphs else None
    rows = sorted(set(tokens) | set(prompt_lengths) | ({fixed_width} if fixed_width else set()))
    timing = Timing(device, settings.reps, settings.warmup)
    all_reduce = []
    for n in rows:
        message = torch.ones(n, hidden, device=device, dtype=dtype)
        cost = timing.graphed(lambda message=message: dist.all_reduce(message))
        all_reduce.append({"bytes": message.numel() * message.element_size(), **cost})
    measured = _decode_steps(model, settings.K_max, graphs, tokens, contexts, timing)
    with tensor_parallel.compute_only(model):
        forward = _decode_steps(model, settings.K_max, graphs, tokens, contexts, timing)
        head = DenseHead(model.head_weight)
        prefill = []
        for length in prompt_lengths:
            ids, pos = torch.zeros(1, length, dtype=torch.long, device=device), torch.arange(length, device=device)
            step = lambda ids=ids, pos=pos: head.argmax(model.forward_hidden(ids, pos)[0, -1:])  # noqa: E731
            prefill.append({"prompt_len": length, **timing.eager(step)})
    if ranks.rank != 0:
        dist.barrier()
        return None
    section = {
        "ranks": ranks.world,
        "target": {k: loaded.info.get(k) for k in ("name", "weights", "dtype", "quantization", "kernel", "kernels")},
        "layers": model.config.n_layers,
        "hidden_size": hidden,
        "dtype_bytes": torch.empty(0, dtype=dtype).element_size(),
        "fixed_width": fixed_width,
        "regime": "graphs" if graphs else "eager",
        "devices": [torch.cuda.get_device_name(device)] if device.type == "cuda" else ["cpu"],
        "backend": dist.get_backend(),
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": command,
        "all_reduce_ms": {"points": all_reduce},
        "forward_ms": {"points": forward},
        "prefill_ms": {"points": prefill},
        "measured_forward_ms": {"points": measured},
    }
    profile = {**base, "tensor_parallel": {**base.get("tensor_parallel", {}), settings.placement: section}}
    write_profile(out, profile)
    dist.barrier()
    return out


def _decode_steps(model, K_max: int, graphs: bool, tokens, contexts, timing: Timing) -> list[dict]:
    """The decoder's target step per (new tokens, context), captured now (inside or outside compute_only)."""
    decoder = Decoder(model, K=K_max + 1, graphs=graphs, phases=False)
    device = model.embed_tokens.weight.device
    points = []
    for context in contexts:
        start = torch.tensor([context], device=device)
        for n in tokens:
            ids = torch.zeros(1, n, dtype=torch.long, device=device)
            cost = timing.eager(lambda ids=ids, start=start: decoder.target_forward(ids, start))
            points.append({"n_tokens": n, "context": context, **cost})
    return points


class Timing:
    """Median and spread of one step's time in ms, every rank timing the same calls after a barrier, and
    the host's time to issue it (the whole call on the CPU)."""

    def __init__(self, device: torch.device, reps: int, warmup: int):
        self.device, self.reps, self.warmup = device, reps, warmup

    def eager(self, step: Callable[[], object]) -> dict:
        """Each call timed alone (a step that replays its own graph, or an eager one)."""
        return self._timed(step, 1)

    def graphed(self, step: Callable[[], object]) -> dict:
        """On GPUs, ALL_REDUCE_CALLS steps captured in one graph, timed per step; eager on the CPU."""
        if self.device.type != "cuda":
            return self._timed(step, 1)
        for _ in range(2):
            step()  # warm-up outside capture (creates what the step needs)
        torch.cuda.synchronize(self.device)
        graph, side = torch.cuda.CUDAGraph(), torch.cuda.Stream()
        with capturing(graph, side):
            for _ in range(ALL_REDUCE_CALLS):
                step()
        return self._timed(graph.replay, ALL_REDUCE_CALLS)

    def _timed(self, call: Callable[[], object], per: int) -> dict:
        times, issue = [], []
        for rep in range(self.warmup + self.reps):
            dist.barrier()
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
            t0 = time.perf_counter()
            call()
            host = (time.perf_counter() - t0) * 1e3
            if self.device.type == "cuda":
                end.record()
                end.synchronize()
                elapsed = start.elapsed_time(end)
            else:
                elapsed = host
            if rep >= self.warmup:
                times.append(elapsed / per)
                issue.append(host / per)
        ordered = sorted(times)
        return {
            "median_ms": statistics.median(times),
            "p10_ms": ordered[len(ordered) // 10],
            "p90_ms": ordered[(9 * len(ordered)) // 10],
            "n": len(times),
            "host_ms": statistics.median(issue),
        }
