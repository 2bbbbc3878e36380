"""One way to time an operation, everywhere: warm-up, rotated inputs, device events, medians with spread.

Each repetition starts from an idle device (synchronized), so `host_ms` is what the host spends
issuing the operation and `median_ms` is when its work is done: CUDA events on a GPU, the wall clock
on the CPU. An operation whose host_ms is close to median_ms is launch-bound.
"""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence

import torch


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


def summarize(device_ms: list[float], host_ms: list[float]) -> dict:
    return {"median_ms": statistics.median(device_ms), "p10_ms": _quantile(device_ms, 0.1),
            "p90_ms": _quantile(device_ms, 0.9), "n": len(device_ms), "host_ms": statistics.median(host_ms)}


def time_op(fn: Callable, inputs: Sequence[tuple], device: torch.device, reps: int = 20, warmup: int = 3,
            also_sync: Sequence[torch.device] = ()) -> dict:
    """Time `fn(*inputs[i % len(inputs)])`; `also_sync` names other devices the operation touches
    (their work is then timed by the host clock after synchronizing them all)."""
    devices = [device, *also_sync]
    if device.type == "cuda":
        with torch.cuda.device(device):  # events record on the current device's stream: make it this one
            return _time_op(fn, inputs, devices, reps, warmup, use_events=not also_sync)
    return _time_op(fn, inputs, devices, reps, warmup, use_events=False)


def _time_op(fn, inputs, devices, reps: int, warmup: int, use_events: bool) -> dict:
    for i in range(warmup):
        fn(*inputs[i % len(inputs)])
    _sync(devices)
    device_ms, host_ms = [], []
    for i in range(reps):
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
            device_ms.append(start.elapsed_time(end))
        else:
            _sync(devices)
            device_ms.append((time.perf_counter() - t0) * 1000)
        host_ms.append((t1 - t0) * 1000)
    return summarize(device_ms, host_ms)


def time_in_graph(fn: Callable, inputs: Sequence[tuple], device: torch.device, reps: int = 20,
                  calls: int = 16) -> dict:
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
        with torch.cuda.graph(with_fn, stream=side):
            for i in range(calls):
                evict.sum()
                fn(*inputs[i % len(inputs)])
        with torch.cuda.graph(reads_only, stream=side):
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
