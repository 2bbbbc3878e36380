"""python -m measure.step_kernels: where a decode step's time goes, kernel by kernel, on a CUDA GPU.

Why: a step that reaches a third of the bandwidth floor is a chain of a few hundred short kernels, and a
change to one kernel shows in the step only as much as that kernel's share of it. This command replays
the Qwen3-0.6B draft step (the drafts' default routes, so its body is one persistent kernel, whose
phases `python -m measure.routes --routes draft-persistent` times; dense head, one graph) at contexts
300 and 4,000 and the AWQ
Qwen3-32B target step (the decoder's width) at context 300 under torch's profiler, and gives per kernel
name its calls a step, its median duration and its total, and per step the span from the first kernel's
start to the last one's end, the kernels' summed durations (busy) and the count:

    python -m measure.step_kernels --out step_kernels.json
    SPECLOOP_OVERLAP=0 python -m measure.step_kernels --out step_kernels_apart.json

With programmatic dependent launch on (the default on Hopper, model/triton_support.py), a kernel starts
while the one before it drains and waits inside, so durations overlap and busy can exceed the span;
SPECLOOP_OVERLAP=0 launches each kernel after the last, so each duration is the kernel's own and the
span minus busy is the time between kernels. Weights are SYNTHETIC (the presets' exact shapes, seeded
random values): timings are real. Needs a CUDA GPU with room for the AWQ Qwen3-32B (about 40 GB) and
triton. Writes --out (JSON): `env`, `steps` (one row a step and context) and `kernels` (one row a kernel
name in each).
"""

from __future__ import annotations

import statistics
import sys

import torch

from model import triton_support
from model.cli import run_torch_command
from model.decoder import Decoder
from model.graphs import GraphedCall
from model.heads import DenseHead
from model.loading import load_model

from .benchmarks import copy_bandwidth_gbs
from .speed import CACHE_SLOTS, DRAFT, STEP_TOKENS, TARGET_AWQ, TARGET_K, TARGET_SEED, draft_step
from .speed_file import CONTEXT, LONG_CONTEXT, load_draft_long
from .timing import (
    environment_header,
    gpu_command_parser,
    gpu_environment,
    release_gpu_memory,
    start_gpu_command,
    write_result,
)

COMMAND = "python -m measure.step_kernels"
WARMUP = 5
NAME_WIDTH = 48  # kernel names are cut to this many characters (cuBLAS's run to hundreds)


def step_breakdown(replays: list[list[tuple[str, float, float]]]) -> tuple[dict, list[dict]]:
    """Kernels (name, start us, end us) of each replay of one step, in launch order -> the step's row
    (median span, busy and kernel count over the replays) and one row per kernel name (calls a step,
    median duration of a call, median total a step), the largest total first."""
    spans, busies, counts = [], [], []
    durations: dict[str, list[float]] = {}
    totals: dict[str, list[float]] = {}
    for kernels in replays:
        spans.append(max(end for _, _, end in kernels) - min(start for _, start, _ in kernels))
        busies.append(sum(end - start for _, start, end in kernels))
        counts.append(len(kernels))
        replay_totals: dict[str, float] = {}
        for name, start, end in kernels:
            short = name[:NAME_WIDTH]
            durations.setdefault(short, []).append(end - start)
            replay_totals[short] = replay_totals.get(short, 0.0) + end - start
        for short, total in replay_totals.items():
            totals.setdefault(short, []).append(total)
    step = {
        "span_us": statistics.median(spans),
        "busy_us": statistics.median(busies),
        "kernels": statistics.median(counts),
    }
    rows = [
        {
            "kernel": name,
            "calls": len(durations[name]) / len(replays),
            "median_us": statistics.median(durations[name]),
            "total_us": statistics.median(totals[name]),
        }
        for name in durations
    ]
    return step, sorted(rows, key=lambda row: -row["total_us"])


def profiled_replays(fn, inputs: tuple, reps: int) -> list[list[tuple[str, float, float]]]:
    """`reps` calls of fn(*inputs), after WARMUP, each as its GPU kernels (and copies) in start order.
    One profiler session runs reps + 2 calls and the first and last are dropped: a call at a session's
    edge waits on the profiler starting or stopping. Every call must run the same kernels (a graph replay)."""
    for _ in range(WARMUP):
        fn(*inputs)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profile:
        for _ in range(reps + 2):
            fn(*inputs)
        torch.cuda.synchronize()
    events = [e for e in profile.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    kernels = sorted(((e.name, e.time_range.start, e.time_range.end) for e in events), key=lambda k: k[1])
    return split_calls(kernels, reps + 2)[1:-1]


def split_calls(kernels: list[tuple[str, float, float]], calls: int) -> list[list[tuple[str, float, float]]]:
    """The kernels of `calls` identical calls, in start order, cut into one list per call."""
    per_call, left = divmod(len(kernels), calls)
    names = [name for name, _, _ in kernels]
    if left or any(names[i * per_call : (i + 1) * per_call] != names[:per_call] for i in range(calls)):
        raise RuntimeError(f"{len(kernels)} kernels in {calls} calls: the calls did not run the same kernels")
    return [kernels[i * per_call : (i + 1) * per_call] for i in range(calls)]


def measure(device: torch.device, reps: int) -> tuple[list[dict], list[dict]]:
    steps, kernels = [], []

    def record(step_name: str, context: int, replays) -> None:
        step, rows = step_breakdown(replays)
        steps.append({"step": step_name, "context": context, **step})
        kernels.extend({"step": step_name, "context": context, **row} for row in rows)

    model = load_draft_long(device)
    head = DenseHead(model.head_weight)
    for context in (CONTEXT, LONG_CONTEXT):
        inputs = (torch.tensor([[STEP_TOKENS[0]]], device=device), torch.tensor([context], device=device))
        record("draft, dense head", context, profiled_replays(GraphedCall(draft_step(model, head)), inputs, reps))
    del model, head
    release_gpu_memory()
    target = load_model(TARGET_AWQ, device, "bfloat16", TARGET_SEED, CACHE_SLOTS).model
    inputs = (torch.randint(0, target.config.vocab_size, (1, 1), device=device), torch.tensor([CONTEXT], device=device))
    record("target 32B AWQ", CONTEXT, profiled_replays(Decoder(target, K=TARGET_K).target_forward, inputs, reps))
    return steps, kernels


def format_step(step: dict, rows: list[dict], top: int = 8) -> str:
    lines = [
        f"{step['step']}, context {step['context']}: {step['kernels']:.0f} kernels, span {step['span_us']:.1f} us, "
        f"busy {step['busy_us']:.1f} us"
    ]
    for row in rows[:top]:
        lines.append(
            f"    {row['kernel']:{NAME_WIDTH}s} x{row['calls']:5.1f}  {row['median_us']:8.2f} us a call  "
            f"{row['total_us']:9.1f} us a step"
        )
    return "\n".join(lines)


def parser():
    return gpu_command_parser(COMMAND, __doc__, 5, "profiled replays of each step")


def main(argv=None) -> int:
    def body():
        args = parser().parse_args(argv)
        out, device = start_gpu_command(COMMAND, args.out, args.device)
        environment = gpu_environment(
            device,
            copy_bandwidth_gbs(device),
            "seeded random values, real shapes",
            draft=DRAFT,
            overlap=triton_support.OVERLAP,
        )
        print(environment_header(COMMAND, environment))
        steps, kernels = measure(device, args.reps)
        for step in steps:
            rows = [row for row in kernels if (row["step"], row["context"]) == (step["step"], step["context"])]
            print(format_step(step, rows), flush=True)
        write_result(out, {"env": environment, "steps": steps, "kernels": kernels})
        print(f"wrote {out}")

    return run_torch_command(body)


if __name__ == "__main__":
    sys.exit(main())
