"""python -m measure.head_speed: FlashHead's kernels on one CUDA GPU, against the dense head.

Why: FlashHead replaces the draft's dense LM head by centroid scores, a top-p selection and a
gather of the probed clusters' rows; it only pays where its few Triton launches
(model/flashhead_triton.py) run near the bytes they read. This command chooses their launch shapes,
shows where a call's time goes, and times the head as the draft step pays it. The launch shapes in
model/flashhead_triton.py and the head rows of reports/h200/decoder_speed.md come from its output.

    python -m measure.head_speed --out flashhead_bench.json          # one GPU, cuda:0
    python -m measure.head_speed --out flashhead_bench.json --reps 10

Head: Qwen3-0.6B's shape (151,936 x 1,024, bf16), SYNTHETIC weights (seeded random values), its
balanced clustering (c = 9,496 clusters of 16). Every time is device time per call inside a CUDA
graph with L2 evicted before each call (`measure.timing.time_in_graph`: what a draft step that
contains the head pays), median [p10, p90] of --reps repetitions (twice --reps for whole heads):
1. launch-shape sweeps, each keeping the best for what follows: the centroid kernel (BLOCK_C x
   BLOCK_D x num_warps), the select kernel (SLICE x num_warps), both timed on stage 1 (centroid
   scores and selection, p = c/16), then stage 2 (BLOCK_D x num_warps) on the whole head;
2. the whole heads (dense; FlashHead p = c/16 and p = 2 with the Triton and the torch backend), in
   a graph and as one graph replay per call (`time_op`: launch and input copy included), with their
   bandwidth floors (bytes read once / the measured copy rate) and the dense head's time over each;
3. a per-kernel profile (torch.profiler, eager calls) of the dense head and FlashHead p = c/16;
4. the draft step (Qwen3-0.6B, synthetic, fused kernels, context 300, one graph replay per step,
   as python -m measure.speed times it) alone and with each head;
5. checks: FlashHead probing every cluster equals the dense head; the Triton and the torch backend
   agree on 256 hidden states.

Prints each result as it comes and writes --out (JSON): `env` (GPU, versions, copy rate, weights
"synthetic", clusters), `rows` (sweep rows: sweep, launch, timing; head rows: sweep "head", head,
floor_ms, in_graph, graph_replay; draft step rows: sweep "draft step", head, timing), `chosen` (the
launch shapes kept), `profile` (head, kernel, us_per_call, count), `all_clusters_equal_dense` and
`triton_equal_torch_backend` (the share of states that agree). Needs a CUDA GPU and triton.
docs/benchmarks.md describes it.
"""

from __future__ import annotations

import itertools
import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import ModuleType

import torch

from contracts.cli import OneLineParser
from model import flashhead_triton
from model.cli import run_torch_command
from model.flashhead import build_clustering
from model.graphs import GraphedCall
from model.heads import DenseHead, FlashHead
from model.presets import PRESETS

from .benchmarks import copy_bandwidth_gbs
from .speed import DRAFT, compared_heads, compared_probes, draft_step, draft_step_inputs, flashhead_name, load_draft
from .timing import (
    environment_header,
    floor_ms,
    gpu_command_parser,
    gpu_environment,
    release_gpu_memory,
    start_gpu_command,
    time_in_graph,
    time_op,
    write_result,
)

COMMAND = "python -m measure.head_speed"
DEVICE = "cuda:0"
VOCAB, HIDDEN = PRESETS[DRAFT].vocab_size, PRESETS[DRAFT].hidden_size  # 151,936 x 1,024
PROFILED_CALLS = 20
AGREEMENT_STATES = 256


def every_combination(**axes: list) -> list[dict]:
    """Every launch shape of a grid: one dict per combination of the axes' values, the last axis fastest."""
    return [dict(zip(axes, values)) for values in itertools.product(*axes.values())]


# (sweep name in the output, the flashhead_triton setting swept, its shapes, what is timed)
SWEEPS = (
    (
        "centroids",
        "CENTROID_LAUNCH",
        every_combination(BLOCK_C=[4, 8, 16, 32], BLOCK_D=[256, 512, 1024], num_warps=[2, 4, 8]),
        "stage 1",
    ),
    (
        "SELECT_LAUNCH",
        "SELECT_LAUNCH",
        every_combination(SLICE=[256, 512, 1024, 2048], EARLIER=[16384], num_warps=[2, 4, 8]),
        "stage 1",
    ),
    ("stage2", "STAGE2_LAUNCH", every_combination(BLOCK_D=[128, 256, 512, 1024], num_warps=[2, 4, 8]), "head"),
)


@contextmanager
def launch_shape(setting: str, shape: dict, kernels: ModuleType = flashhead_triton) -> Iterator[None]:
    """kernels.<setting> (e.g. flashhead_triton.CENTROID_LAUNCH) is `shape` inside the block, as before after it."""
    before = getattr(kernels, setting)
    setattr(kernels, setting, shape)
    try:
        yield
    finally:
        setattr(kernels, setting, before)


def best_shape(rows: list[dict], current: dict) -> dict:
    """The fastest launch shape of a sweep's rows (best first), or `current` when none ran."""
    return json.loads(rows[0]["launch"]) if rows else current


def sweep(
    name: str,
    setting: str,
    shapes: list[dict],
    fn: Callable,
    states,
    device: torch.device,
    reps: int,
    kernels: ModuleType = flashhead_triton,
) -> list[dict]:
    """Times `fn` under each launch shape; returns the rows, best first. A shape that does not compile
    or fit is printed and skipped."""
    rows = []
    for shape in shapes:
        label = json.dumps(shape)
        try:
            with launch_shape(setting, shape, kernels):
                timing = time_in_graph(fn, states, device, reps=reps)
        except Exception as error:  # any failure of one shape is reported; the sweep goes on
            print(f"{name} {label}: failed ({type(error).__name__}: {str(error)[:120]})", flush=True)
            continue
        rows.append({"sweep": name, "launch": label, **timing})
        print(
            f"{name:<9} {label:<40} {timing['median_ms'] * 1e3:8.2f} us [{timing['p10_ms'] * 1e3:.2f}, "
            f"{timing['p90_ms'] * 1e3:.2f}]",
            flush=True,
        )
    return sorted(rows, key=lambda row: row["median_ms"])


def dense_over_each(head_rows: list[dict]) -> dict[str, float]:
    """The dense head's in-graph time over each head's: how many times faster than dense it is."""
    dense_ms = next(row["in_graph"]["median_ms"] for row in head_rows if row["head"] == "dense")
    return {row["head"]: dense_ms / row["in_graph"]["median_ms"] for row in head_rows}


def kernel_profile(head, states, label: str) -> list[dict]:
    """Kernel names and device time per call, from torch.profiler over eager calls."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profiler:
        for call in range(PROFILED_CALLS):
            head.argmax(*states[call % len(states)])
        torch.cuda.synchronize()
    rows = []
    for event in profiler.key_averages():
        us = getattr(event, "device_time_total", getattr(event, "cuda_time_total", 0)) / PROFILED_CALLS
        if us > 0:
            rows.append(
                {"head": label, "kernel": event.key[:90], "us_per_call": us, "count": event.count / PROFILED_CALLS}
            )
    for row in sorted(rows, key=lambda row: -row["us_per_call"]):
        print(f"  {label:<22} {row['us_per_call']:8.2f} us  x{row['count']:.0f}  {row['kernel']}", flush=True)
    return rows


def draft_step_rows(device: torch.device, reps: int) -> list[dict]:
    """The draft step (fused kernels, graphs on, context 300) alone and with each head, with the
    launch shapes chosen above: one graph replay per step."""
    model = load_draft(device).model
    weight = model.head_weight
    steps = draft_step_inputs(device)
    rows = []
    for name, head in (
        ("body only", None),
        ("dense", DenseHead(weight)),
        ("flashhead", FlashHead(weight, build_clustering(weight, seed=0), backend="triton")),
    ):
        timing = time_op(GraphedCall(draft_step(model, head)), steps, device, reps=reps * 2)
        rows.append({"sweep": "draft step", "head": name, **timing})
        print(
            f"draft step, {name:<10} {timing['median_ms']:.3f} ms [{timing['p10_ms']:.3f}, {timing['p90_ms']:.3f}]",
            flush=True,
        )
    del model
    release_gpu_memory()
    return rows


def measure_heads(device: torch.device, reps: int) -> dict:
    bandwidth_gbs = copy_bandwidth_gbs(device)
    generator = torch.Generator(device=device).manual_seed(0)
    weight = (torch.randn(VOCAB, HIDDEN, device=device, generator=generator) * 0.02).to(torch.bfloat16)
    clustering = build_clustering(weight, seed=0)
    states = [(torch.randn(1, HIDDEN, device=device, generator=generator).to(torch.bfloat16),) for _ in range(4)]
    probes = compared_probes(clustering)[0]
    environment = gpu_environment(
        device, bandwidth_gbs, "seeded random values, real shapes", clusters=clustering.clusters
    )
    print(environment_header(COMMAND, environment), flush=True)
    result = {"env": environment, "rows": []}

    head = FlashHead(weight, clustering, probes=probes, backend="triton")
    timed = {
        "stage 1": lambda hidden: flashhead_triton.select_clusters(hidden, head.centroids, head.probes),
        "head": head.argmax,
    }
    for name, setting, shapes, what in SWEEPS:
        rows = sweep(name, setting, shapes, timed[what], states, device, reps)
        result["rows"] += rows
        setattr(flashhead_triton, setting, best_shape(rows, getattr(flashhead_triton, setting)))
    result["chosen"] = {setting: getattr(flashhead_triton, setting) for _, setting, _, _ in SWEEPS}
    print("chosen:", json.dumps(result["chosen"]), flush=True)

    heads = compared_heads(weight, clustering)
    head_rows = []
    for name, compared in heads.items():
        in_graph = time_in_graph(compared.argmax, states, device, reps=reps * 2)
        replay = time_op(GraphedCall(compared.argmax), states, device, reps=reps * 2)
        head_floor = floor_ms(compared.bytes_per_call(), bandwidth_gbs)
        head_rows.append(
            {"sweep": "head", "head": name, "floor_ms": head_floor, "in_graph": in_graph, "graph_replay": replay}
        )
        print(
            f"head {name:<24} in graph {in_graph['median_ms'] * 1e3:7.2f} us [{in_graph['p10_ms'] * 1e3:.2f}, "
            f"{in_graph['p90_ms'] * 1e3:.2f}]   one replay {replay['median_ms'] * 1e3:7.2f} us   floor "
            f"{head_floor * 1e3:.2f} us",
            flush=True,
        )
    result["rows"] += head_rows
    for name, ratio in dense_over_each(head_rows).items():
        print(f"  {name:<24} dense / this = {ratio:.2f}x", flush=True)

    profiled = ("dense", flashhead_name(probes, "triton"), flashhead_name(probes, "torch"))
    result["profile"] = [row for name in profiled for row in kernel_profile(heads[name], states, name)]
    result["rows"] += draft_step_rows(device, reps)

    together = torch.cat([state[0] for state in states])
    every_cluster = FlashHead(weight, clustering, probes=clustering.clusters, backend="triton")
    result["all_clusters_equal_dense"] = bool(
        torch.equal(heads["dense"].argmax(together), every_cluster.argmax(together))
    )
    print("FlashHead probing every cluster == dense head:", result["all_clusters_equal_dense"], flush=True)
    many = torch.randn(AGREEMENT_STATES, HIDDEN, device=device, generator=generator).to(torch.bfloat16)
    same = heads[flashhead_name(probes, "triton")].argmax(many) == heads[flashhead_name(probes, "torch")].argmax(many)
    result["triton_equal_torch_backend"] = same.float().mean().item()
    print(
        f"FlashHead p={probes}, triton == torch backend on {AGREEMENT_STATES} states: "
        f"{result['triton_equal_torch_backend']:.4f}",
        flush=True,
    )
    return result


def parser() -> OneLineParser:
    reps_help = "timed repetitions per sweep point; whole heads and draft steps get twice as many"
    return gpu_command_parser(COMMAND, __doc__, 10, reps_help, device_option=False)


def main(argv=None) -> int:
    def body():
        args = parser().parse_args(argv)
        out, device = start_gpu_command(COMMAND, args.out, DEVICE)
        write_result(out, measure_heads(device, args.reps))
        print(f"wrote {out}")

    return run_torch_command(body)


if __name__ == "__main__":
    sys.exit(main())
