"""python -m measure.awq_sweep: launch configurations of our Triton w4a16 GEMM on Qwen3-32B's AWQ shapes.

Why: the 32B AWQ target step is almost all int4 GEMMs at a few rows, and our kernel
(model/awq_triton.py) reaches its bandwidth floor only with the right split and pipeline depth. This
command finds the best launch per shape and checks it against the dequantized reference; the
defaults in model/awq_triton.py (LAUNCH, default_splits) and the AWQ tables of
reports/h200/decoder_speed.md come from its output.

    python -m measure.awq_sweep --out awq_sweep.json --budget-s 150     # one GPU, about 3 minutes
    python -m measure.awq_sweep --out awq_sweep.json --device cuda:1 --reps 20

For each merged projection of a Qwen3-32B layer (input x output features: qkv 5120 x 10240, o_proj
8192 x 5120, gate_up 5120 x 51200, down 25600 x 5120; group 128; SYNTHETIC random AWQ buffers) at the
decoder's rows at K = 6 (8 bf16 rows: every target decode forward runs 8 up to K = 7), times torch's
int4pack kernel and w4a16_matmul over configurations, each per call inside a CUDA graph with L2
evicted before each call (measure.timing.time_in_graph: as a decode step pays it), median of --reps
repetitions: the default (default_splits, LAUNCH), then block_n (64, 128, 256) x splits (split-K
factors that divide the 128-row steps and give 66..8192 programs) x num_stages (2, 3, 4) at 4 warps,
then 8 warps at the best. A
configuration that fails to compile or disagrees with the dequantized reference (max error > 1% of
the largest output) is printed and skipped. After --budget-s seconds no new configuration starts.
Floor: the bytes read once (codes, scales, zeros, x, y) / the measured copy rate.

Prints per shape the floor, int4pack, every configuration and the best (with its max relative
error), then a step estimate (64 layers x the four GEMMs) and a one-line JSON summary. Writes --out
(JSON): `env` (GPU, versions, copy rate, weights "synthetic"); `summary` (device, bandwidth_gbs,
rows, group, sweep_s, step_estimate with floor_ms, int4pack_ms, default_ms and best_ms, and per
shape the best: ms, x_floor, int4pack_ms, max_rel_err, config); `shapes` (per shape: K and N, the
input and output features, floor_ms, int4pack_ms, default, configs, best). A config is block_n and
w4a16_matmul's keyword arguments splits, num_warps, num_stages (records made before `splits` was
renamed call it split_k). Needs a CUDA GPU and triton. docs/benchmarks.md describes it.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch
import torch.nn.functional as F

from contracts import UsageError
from contracts.cli import OneLineParser
from model import awq_triton
from model.awq import AWQLinear
from model.cli import run_torch_command
from model.decoder import width

from .benchmarks import copy_bandwidth_gbs
from .timing import (
    at_least_one,
    environment_header,
    floor_ms,
    gpu_environment,
    release_gpu_memory,
    start_gpu_command,
    time_in_graph,
    write_result,
)

COMMAND = "python -m measure.awq_sweep"
SHAPES = {"qkv": (5120, 10240), "o_proj": (8192, 5120), "gate_up": (5120, 51200), "down": (25600, 5120)}
GROUP, LAYERS, DTYPE = 128, 64, torch.bfloat16
ROWS = width(6)  # the rows of the decoder's target forwards at the study's K = 6 (8: model/decoder.EXACT_WIDTH)
BLOCK_NS = (64, 128, 256)
SPLIT_CHOICES = (1, 2, 4, 8, 16)
PROGRAMS = (66, 8192)  # the fewest and most programs (column blocks x splits) a configuration may launch
STAGES = (2, 3, 4)
MAX_RELATIVE_ERROR = 1e-2
CALLS_PER_GRAPH = 10


def gemm_bytes(in_features: int, out_features: int, group: int = GROUP, rows: int = ROWS) -> int:
    """Bytes one GEMM must read or write once: int4 codes, fp16 scales, int4 zero points, x and y (bf16)."""
    groups = in_features // group
    return (
        in_features * out_features // 2
        + groups * out_features * 2
        + groups * out_features // 2
        + rows * (in_features + out_features) * 2
    )


def split_choices(in_features: int, out_features: int, block_n: int) -> list[int]:
    """The split-K factors swept at `block_n`: they divide the 128-row steps and launch PROGRAMS programs."""
    steps = in_features // awq_triton.STEP_IN
    return [
        splits
        for splits in SPLIT_CHOICES
        if steps % splits == 0 and PROGRAMS[0] <= (out_features // block_n) * splits <= PROGRAMS[1]
    ]


class Sweep:
    """Times configurations on one device until the budget is spent."""

    def __init__(self, device: torch.device, reps: int, budget_s: float):
        self.device, self.reps, self.deadline = device, reps, time.monotonic() + budget_s

    def out_of_time(self) -> bool:
        return time.monotonic() > self.deadline

    def time_fn(self, fn, x: torch.Tensor) -> float:
        return time_in_graph(fn, [(x,)], self.device, reps=self.reps, calls=CALLS_PER_GRAPH)["median_ms"]

    def run(self, planes, x: torch.Tensor, want: torch.Tensor, config: dict) -> tuple[float, float] | None:
        """(ms, max relative error) of one configuration, or None (printed) if it fails or is wrong."""
        key = json.dumps({"block_n": planes.block_n, **config}, sort_keys=True)
        started = time.monotonic()
        try:
            # split-K tickets kept across calls, as a layer keeps them
            tickets = torch.zeros(planes.codes.shape[0], dtype=torch.int32, device=self.device)

            def fn(inputs):
                return awq_triton.w4a16_matmul(inputs, planes, tickets=tickets, **config)

            got = fn(x).float()
            torch.cuda.synchronize(self.device)
            error = ((got - want).abs().max() / want.abs().max()).item()
            if not error <= MAX_RELATIVE_ERROR:
                print(f"    WRONG {key}: max relative error {error:.3g}", flush=True)
                return None
            ms = self.time_fn(fn, x)
        except Exception as why:  # compile failures (out of resources, unsupported layouts) included
            first_line = str(why).splitlines()[0][:160] if str(why) else ""
            print(f"    FAILED {key}: {type(why).__name__}: {first_line}", flush=True)
            return None
        print(f"    {ms * 1e3:8.1f} us  err {error:.1e}  {key}  ({time.monotonic() - started:.1f} s)", flush=True)
        return ms, error


def sweep_shape(sweep: Sweep, name: str, in_features: int, out_features: int, bandwidth_gbs: float) -> dict:
    device = sweep.device
    layer = AWQLinear(in_features, out_features, GROUP).to(device)
    layer.randomize_(torch.Generator(device=device).manual_seed(0))
    x = torch.randn(
        ROWS, in_features, generator=torch.Generator(device=device).manual_seed(1), device=device, dtype=DTYPE
    )
    want = F.linear(x.float(), layer.dequantize())
    shape_floor = floor_ms(gemm_bytes(in_features, out_features), bandwidth_gbs)
    print(f"== {name}: {in_features} x {out_features}, floor {shape_floor * 1e3:.1f} us", flush=True)

    layer.select_kernel("int4pack_cuda", dtype=DTYPE)
    int4pack_ms = sweep.time_fn(layer, x)
    print(f"    int4pack_cuda {int4pack_ms * 1e3:.1f} us ({int4pack_ms / shape_floor:.2f}x floor)", flush=True)
    layer.select_kernel("dequant")  # drops the repacked copy
    torch.cuda.empty_cache()

    planes = {block_n: layer.planes(block_n) for block_n in BLOCK_NS}
    default = {"splits": awq_triton.default_splits(ROWS, planes[awq_triton.BLOCK_N], device), **awq_triton.LAUNCH}
    results = []  # (ms, error, block_n, config)

    def run(block_n: int, config: dict):
        if sweep.out_of_time():
            return None
        result = sweep.run(planes[block_n], x, want, config)
        if result:
            results.append((*result, block_n, config))
        return result

    default_result = run(awq_triton.BLOCK_N, dict(default))
    for block_n in BLOCK_NS:
        for splits in split_choices(in_features, out_features, block_n):
            for num_stages in STAGES:
                run(block_n, {"splits": splits, "num_warps": 4, "num_stages": num_stages})
    if results:
        _, _, block_n, config = min(results, key=lambda result: result[0])
        run(block_n, {**config, "num_warps": 8})

    summary = {
        "K": in_features,
        "N": out_features,
        "floor_ms": shape_floor,  # K x N: input x output features
        "int4pack_ms": int4pack_ms,
        "default": {
            "config": {"block_n": awq_triton.BLOCK_N, **default},
            "ms": default_result[0] if default_result else None,
        },
        "configs": [
            {"ms": ms, "max_rel_err": error, "config": {"block_n": block_n, **config}}
            for ms, error, block_n, config in results
        ],
    }
    if results:
        ms, error, block_n, config = min(results, key=lambda result: result[0])
        summary["best"] = {"config": {"block_n": block_n, **config}, "ms": ms, "max_rel_err": error}
        print(
            f"  best {ms * 1e3:.1f} us ({ms / shape_floor:.2f}x floor, "
            f"{gemm_bytes(in_features, out_features) / ms / 1e6:.0f} GB/s, int4pack {int4pack_ms / ms:.2f}x slower), "
            f"max rel err {error:.1e}: {json.dumps(summary['best']['config'])}",
            flush=True,
        )
    return summary


def step_estimate(shapes: dict[str, dict]) -> dict[str, float | None]:
    """A 32B step's GEMM time, LAYERS x the four shapes: floor, int4pack, our default and our best
    configuration (None where a shape lacks it)."""

    def step(key):
        values = [shape[key]["ms"] if isinstance(shape.get(key), dict) else shape.get(key) for shape in shapes.values()]
        return None if any(value is None for value in values) else LAYERS * sum(values)

    return {
        "floor_ms": step("floor_ms"),
        "int4pack_ms": step("int4pack_ms"),
        "default_ms": step("default"),
        "best_ms": step("best"),
    }


def format_estimate(estimate: dict[str, float | None]) -> str:
    return f"step estimate, {LAYERS} layers x 4 GEMMs: " + ", ".join(
        f"{key} {value:.3f}" + (f" ({value / estimate['floor_ms']:.2f}x floor)" if key != "floor_ms" else "")
        for key, value in estimate.items()
        if value is not None
    )


def best_per_shape(shapes: dict[str, dict]) -> dict[str, dict]:
    return {
        name: {
            "ms": shape["best"]["ms"],
            "x_floor": shape["best"]["ms"] / shape["floor_ms"],
            "int4pack_ms": shape["int4pack_ms"],
            "max_rel_err": shape["best"]["max_rel_err"],
            "config": shape["best"]["config"],
        }
        for name, shape in shapes.items()
        if "best" in shape
    }


def sweep_all(device: torch.device, reps: int, budget_s: float) -> dict:
    bandwidth_gbs = copy_bandwidth_gbs(device)
    environment = gpu_environment(device, bandwidth_gbs, "random AWQ buffers, Qwen3-32B's shapes")
    print(environment_header(COMMAND, environment), flush=True)
    sweep = Sweep(device, reps, budget_s)
    started = time.monotonic()
    shapes = {}
    for name, (in_features, out_features) in SHAPES.items():
        shapes[name] = sweep_shape(sweep, name, in_features, out_features, bandwidth_gbs)
        release_gpu_memory()  # the layer's buffers, once the shape's closures are gone
    estimate = step_estimate(shapes)
    print(format_estimate(estimate), flush=True)
    summary = {
        "device": environment["gpu"],
        "bandwidth_gbs": bandwidth_gbs,
        "rows": ROWS,
        "group": GROUP,
        "sweep_s": time.monotonic() - started,
        "step_estimate": estimate,
        "best": best_per_shape(shapes),
    }
    print(json.dumps(summary), flush=True)
    return {"env": environment, "summary": summary, "shapes": shapes}


def parser() -> OneLineParser:
    p = OneLineParser(prog=COMMAND, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="the JSON file to write (its folder is made if needed)")
    p.add_argument("--device", default="cuda:0", help="the CUDA GPU to measure on (default cuda:0)")
    p.add_argument("--reps", type=at_least_one, default=20, help="timed repetitions per configuration (default 20)")
    p.add_argument(
        "--budget-s",
        type=float,
        default=170.0,
        help="stop starting new configurations after this many seconds (default 170)",
    )
    return p


def main(argv=None) -> int:
    def body():
        args = parser().parse_args(argv)
        if not args.budget_s > 0:
            raise UsageError(f"--budget-s must be positive, got {args.budget_s}")
        out, device = start_gpu_command(COMMAND, args.out, args.device)
        write_result(out, sweep_all(device, args.reps, args.budget_s))
        print(f"wrote {out}")

    return run_torch_command(body)


if __name__ == "__main__":
    sys.exit(main())
