"""One way to time an operation, everywhere: warm-up, rotated inputs, device events, medians with spread.

Each repetition starts from an idle device (synchronized), so `host_ms` is what the host spends
issuing the operation and `median_ms` is when its work is done: CUDA events on a GPU, the wall clock
on the CPU. An operation whose host_ms is close to median_ms is launch-bound.

The end of the module holds what the GPU benchmark commands (`python -m measure.speed`,
`measure.head_speed`, `measure.awq_sweep`; docs/benchmarks.md) share: the checks they make before
any work (a writable --out, a CUDA GPU, the modules they need), bandwidth floors, the environment
they record, and their JSON output.
"""

from __future__ import annotations

import argparse
import gc
import importlib.metadata
import importlib.util
import json
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from contracts import UsageError
from contracts.cli import OneLineParser
from contracts.files import check_output_file, write_atomic
from model.graphs import capturing
from model.loading import parse_device


def _sync(devices: Sequence[torch.device]) -> None:
    for device in devices:
        if device.type == "cuda":
            torch.cuda.synchronize(device)


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


TIMING_KEYS = ("median_ms", "p10_ms", "p90_ms", "host_ms")  # a timing's values that passes merge


def spread(times_ms: list[float]) -> dict:
    """A timing's median, p10 and p90 (ms) and its count."""
    return {
        "median_ms": statistics.median(times_ms),
        "p10_ms": _quantile(times_ms, 0.1),
        "p90_ms": _quantile(times_ms, 0.9),
        "n": len(times_ms),
    }


def summarize(device_ms: list[float], host_ms: list[float]) -> dict:
    return {**spread(device_ms), "host_ms": statistics.median(host_ms)}


def merged_passes(passes: list):
    """One cost structure from passes over the same grid: each timing's median, spread and host time the
    median of its passes', its repetitions counted together; every other value as the first pass has
    it. A slow spell of the machine lasts seconds and slows every repetition of the points timed
    during it (on one H100 a draft step timed at 1.53 ms, p10 1.41, between 1.05 and 1.11 at the
    contexts either side; session 16), so repetitions back to back cannot outvote it and passes can."""
    first = passes[0]
    if isinstance(first, dict) and "median_ms" in first:
        medians = {key: statistics.median(p[key] for p in passes) for key in TIMING_KEYS if key in first}
        return {**first, **medians, "n": sum(p["n"] for p in passes)}
    if isinstance(first, dict):
        return {key: merged_passes([p[key] for p in passes]) for key in first}
    if isinstance(first, list):
        return [merged_passes(list(items)) for items in zip(*passes, strict=True)]
    return first


def time_op(
    fn: Callable,
    inputs: Sequence[tuple],
    device: torch.device,
    reps: int = 20,
    warmup: int = 3,
    also_sync: Sequence[torch.device] = (),
) -> dict:
    """Time `fn(*inputs[i % len(inputs)])`; `also_sync` names other devices the operation touches
    (their work is then timed by the host clock after synchronizing them all)."""
    return time_interleaved([(fn, inputs)], device, reps, warmup, also_sync)[0]


def time_interleaved(
    operations: Sequence[tuple[Callable, Sequence[tuple]]],
    device: torch.device,
    reps: int = 20,
    warmup: int = 3,
    also_sync: Sequence[torch.device] = (),
) -> list[dict]:
    """Time each (fn, inputs) of `operations` as time_op does, one repetition of each in turn: a
    grid's points timed one after another share every slow spell of the machine, which timing each
    point's repetitions back to back gave to whichever points it fell on. On a 2-core VM a Gemma 3
    270M verify of 4 and 5 tokens was timed 25-28% faster than one of 3 point by point, 5-7% faster
    interleaved (docs/design.md, "Measuring costs as the loop pays them")."""
    devices = [device, *also_sync]
    if device.type == "cuda":
        with torch.cuda.device(device):  # events record on the current device's stream: make it this one
            return _time_interleaved(operations, devices, reps, warmup, use_events=not also_sync)
    return _time_interleaved(operations, devices, reps, warmup, use_events=False)


def _time_interleaved(operations, devices, reps: int, warmup: int, use_events: bool) -> list[dict]:
    for fn, inputs in operations:
        for i in range(warmup):
            fn(*inputs[i % len(inputs)])
    _sync(devices)
    device_ms = [[] for _ in operations]
    host_ms = [[] for _ in operations]
    for i in range(reps):
        for (fn, inputs), device_times, host_times in zip(operations, device_ms, host_ms):
            args = inputs[(i + warmup) % len(inputs)]
            _sync(devices)
            if use_events:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
            t0 = time.perf_counter()
            fn(*args)
            t1 = time.perf_counter()
            if use_events:
                end.record()
                end.synchronize()
                device_times.append(start.elapsed_time(end))
            else:
                _sync(devices)
                device_times.append((time.perf_counter() - t0) * 1000)
            host_times.append((t1 - t0) * 1000)
    return [summarize(d, h) for d, h in zip(device_ms, host_ms)]


def time_in_graph(fn: Callable, inputs: Sequence[tuple], device: torch.device, reps: int = 20, calls: int = 16) -> dict:
    """Device time per call of `fn` inside a CUDA graph, as a step that contains it pays it: no
    launch or input-copy overhead, and weights read from memory rather than from L2.

    One graph runs `calls` calls (inputs rotated), each after reading a buffer twice the L2 size;
    a second graph does the reads alone. Per call: (first - second) / calls, per repetition; the
    median and spread of those are returned (`host_ms` is not measured here: 0)."""
    if device.type != "cuda":
        raise ValueError("time_in_graph needs a CUDA device")
    with torch.cuda.device(device):
        evict = torch.empty(2 * torch.cuda.get_device_properties(device).L2_cache_size // 4, device=device)
        evict.fill_(1.0)
        for args in inputs:  # compiles and warms up outside capture
            fn(*args)
        torch.cuda.synchronize(device)
        with_fn, reads_only = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
        side = torch.cuda.Stream()
        with capturing(with_fn, side):
            for i in range(calls):
                evict.sum()
                fn(*inputs[i % len(inputs)])
        with capturing(reads_only, side):
            for _ in range(calls):
                evict.sum()
        per_call = []
        for i in range(reps + 2):  # the first two replays warm up
            times = []
            for graph in (with_fn, reads_only):
                torch.cuda.synchronize(device)
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                graph.replay()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end))
            if i >= 2:
                per_call.append((times[0] - times[1]) / calls)
    return summarize(per_call, [0.0] * len(per_call))


# --- What the GPU benchmark commands share -------------------------------------------------------

SYNTHETIC = "synthetic"  # the weights label of every benchmark output: real shapes, seeded random values


def at_least_one(text: str) -> int:
    """argparse type of counts such as --reps: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def check_out(out: str | Path) -> Path:
    """--out names a file that can be written: not an existing folder, under a folder that exists or
    can be made (its nearest existing ancestor is a writable folder). Creates nothing."""
    check_output_file(Path(out), "--out", "JSON file")
    return Path(out)


def require_cuda(command: str, device: str = "cuda:0", modules: Sequence[str] = ()) -> torch.device:
    """The CUDA device `command` measures on; no GPU, a device that is not a CUDA GPU here, or a
    missing module (e.g. triton) is bad input, found before any work."""
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count == 0:
        raise UsageError(f"{command} needs a CUDA GPU (found none)")
    parsed = parse_device(device)
    if parsed.type != "cuda":
        raise UsageError(f"{command} measures on a CUDA GPU, not --device {device}")
    missing = [name for name in modules if importlib.util.find_spec(name) is None]
    if missing:
        raise UsageError(f"{command} needs {', '.join(missing)}, which is not installed")
    return parsed


def gpu_command_parser(
    command: str, description: str, reps: int, reps_help: str, device_option: bool = True
) -> OneLineParser:
    """The options every GPU benchmark command takes: --out, --reps (at least 1) and, unless the command
    measures on cuda:0 only (`device_option` false), --device."""
    p = OneLineParser(prog=command, description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="the JSON file to write (its folder is made if needed)")
    p.add_argument("--reps", type=at_least_one, default=reps, help=f"{reps_help} (default {reps})")
    if device_option:
        p.add_argument("--device", default="cuda:0", help="the CUDA GPU to measure on (default cuda:0)")
    return p


def start_gpu_command(command: str, out: str, device: str = "cuda:0", modules: Sequence[str] = ("triton",)):
    """(--out checked, the CUDA device), the device made current: every check a GPU benchmark command
    makes before any work."""
    out_path = check_out(out)
    cuda_device = require_cuda(command, device, modules=modules)
    torch.cuda.set_device(cuda_device)
    return out_path, cuda_device


def floor_ms(nbytes: float, bandwidth_gbs: float) -> float:
    """What a cost cannot beat, in ms: `nbytes` read once at the measured copy rate (GB/s)."""
    return nbytes / (bandwidth_gbs * 1e9) * 1e3


def gpu_environment(device: torch.device, bandwidth_gbs: float, weights_detail: str, **more) -> dict:
    """The `env` of a benchmark output: the GPU, versions, the copy rate its floors use, and the
    weights (always synthetic: real shapes, seeded random values)."""
    try:
        triton_version = importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:
        triton_version = None
    return {
        "gpu": torch.cuda.get_device_name(device),
        "torch": torch.__version__,
        "triton": triton_version,
        "bandwidth_gbs": bandwidth_gbs,
        "weights": SYNTHETIC,
        "weights_detail": weights_detail,
        **more,
    }


def environment_header(command: str, environment: dict) -> str:
    """The first line a benchmark prints: where it runs and that its weights are synthetic."""
    return (
        f"{command} on {environment['gpu']} (torch {environment['torch']}, triton {environment['triton']}), "
        f"copy rate {environment['bandwidth_gbs']:.0f} GB/s; weights: SYNTHETIC "
        f"({environment['weights_detail']})"
    )


def release_gpu_memory() -> None:
    """Frees what the models and graphs measured so far held, before the next (large) model loads:
    a decoder and its graphed steps refer to each other, so only the garbage collector frees them."""
    gc.collect()
    torch.cuda.empty_cache()


def write_result(out: Path, result: dict) -> None:
    """A benchmark's JSON output, written whole or not at all (its folder made if needed)."""
    write_atomic(out, json.dumps(result, indent=1) + "\n")
