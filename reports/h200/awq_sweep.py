"""Launch-configuration sweep of the Triton w4a16 GEMM (model/awq_triton.py) on Qwen3-32B's AWQ shapes.

    python reports/h200/awq_sweep.py --out awq_sweep.json      # on the GPU machine, ~3 minutes

For each merged projection of a Qwen3-32B layer (K x N: qkv 5120 x 10240, o_proj 8192 x 5120,
gate_up 5120 x 51200, down 25600 x 5120; group 128; random AWQ buffers) at M = 8 bf16 rows (the
session-3 record used 16), times
torch's int4pack kernel and w4a16_matmul over configurations, each per call inside a CUDA graph with
L2 evicted before each call (measure.timing.time_in_graph: as a decode step pays it). After the
default configuration (TUNED's entry where the shape has one), stages, each starting from the best
so far: B block_n x split_k (4 warps, 1 stage, block_k 128, prefetch on); C prefetch (the next K
step's loads issued before this step's math, or after it) x maxnreg (a register cap, for more
programs per SM), then num_warps x num_stages; D block_k 64; E the weights as column_blocks, then
stages and register cap again. (The session-3 record
reports/h200/session3/sweeps/awq_sweep.txt also has a stage A, the tile-building variants since
removed from the kernel; model/awq_triton.py's docstring cites them.) A configuration that fails to
compile or disagrees with the dequantized reference (max error > 1% of the largest output) is
printed and skipped. Floor: the bytes read once (codes, scales, zeros, x, y) / the measured copy
rate. Prints per shape the floor, int4pack, the default and the best configuration (with its max
relative error), a step estimate (64 layers x the four GEMMs), TUNED entries for
model/awq_triton.py, and a final JSON summary line; writes everything to --out.
"""
import argparse
import json
import time

import torch
import torch.nn.functional as F

from measure.benchmarks import copy_bandwidth_gbs
from measure.timing import time_in_graph
from model import awq_triton
from model.awq import AWQLinear

SHAPES = {"qkv": (5120, 10240), "o_proj": (8192, 5120), "gate_up": (5120, 51200), "down": (25600, 5120)}
GROUP, ROWS, LAYERS, DTYPE = 128, 8, 64, torch.bfloat16  # 8 rows: a verify of K + 2 tokens at K = 6
BASE = {"num_warps": 4, "num_stages": 1, "block_k": 128, "prefetch": True, "maxnreg": None}


def weight_bytes(K, N):
    groups = K // GROUP
    return K * N // 2 + groups * N * 2 + groups * N // 2 + ROWS * (K + N) * 2


class Sweep:
    def __init__(self, device, reps, budget_s):
        self.device, self.reps, self.deadline = device, reps, time.monotonic() + budget_s
        self.compiled = set()

    def out_of_time(self):
        return time.monotonic() > self.deadline

    def time_fn(self, fn, x):
        return time_in_graph(fn, [(x,)], self.device, reps=self.reps, calls=10)["median_ms"]

    def run(self, layer, x, want, config):
        """(ms, max relative error) of one configuration, or None (printed) if it fails or is wrong."""
        key = json.dumps(config, sort_keys=True)
        t0 = time.monotonic()
        try:
            launch = {k: v for k, v in config.items() if k != "column_blocks"}
            blocks = (awq_triton.column_blocks(layer.qweight, layer.qzeros, layer.scales, config["block_n"])
                      if config.get("column_blocks") else None)

            # split-K tickets kept across calls, as a layer keeps them
            tickets = torch.zeros(layer.out_features // 16, dtype=torch.int32, device=self.device)

            def fn(inp):
                return awq_triton.w4a16_matmul(inp, layer.qweight, layer.qzeros, layer.scales, GROUP, blocks=blocks,
                                               tickets=tickets, **launch)
            got = fn(x).float()
            torch.cuda.synchronize(self.device)
            error = ((got - want).abs().max() / want.abs().max()).item()
            if not error <= 1e-2:
                print(f"    WRONG {key}: max relative error {error:.3g}", flush=True)
                return None
            ms = self.time_fn(fn, x)
        except Exception as why:  # compile failures (out of resources, unsupported layouts) included
            print(f"    FAILED {key}: {type(why).__name__}: {str(why).splitlines()[0][:160] if str(why) else ''}",
                  flush=True)
            return None
        print(f"    {ms * 1e3:8.1f} us  err {error:.1e}  {key}  ({time.monotonic() - t0:.1f} s)", flush=True)
        return ms, error


def split_choices(K):
    groups = K // GROUP
    return [s for s in (1, 2, 4, 8, 16) if groups % s == 0]


def sweep_shape(sweep, name, K, N, bandwidth_gbs):
    device = sweep.device
    layer = AWQLinear(K, N, GROUP).to(device)
    layer.randomize_(torch.Generator(device=device).manual_seed(0))
    x = torch.randn(ROWS, K, generator=torch.Generator(device=device).manual_seed(1), device=device, dtype=DTYPE)
    want = F.linear(x.float(), layer.dequantize())
    floor_ms = weight_bytes(K, N) / (bandwidth_gbs * 1e9) * 1e3
    print(f"== {name}: K {K} N {N}, floor {floor_ms * 1e3:.1f} us", flush=True)

    layer.select_kernel("int4pack_cuda", dtype=DTYPE)
    int4pack_ms = sweep.time_fn(layer._run, x)
    print(f"    int4pack_cuda {int4pack_ms * 1e3:.1f} us ({int4pack_ms / floor_ms:.2f}x floor)", flush=True)
    layer.select_kernel("dequant")  # drops the repacked copy
    torch.cuda.empty_cache()

    default = awq_triton.default_config(ROWS, K, N, GROUP, DTYPE, device)
    results = []  # (ms, error, config)

    def run(config):
        if sweep.out_of_time():
            return None
        result = sweep.run(layer, x, want, config)
        if result:
            results.append((*result, config))
        return result

    default_result = run(dict(default))

    def best():
        return dict(min(results, key=lambda r: r[0])[2]) if results else dict(default)

    print("  B: block_n x split_k", flush=True)
    for block_n in (32, 64, 128, 256):
        for split_k in split_choices(K):
            tiles = (N // block_n) * split_k
            if tiles < 66 or tiles > 8192:  # under half the SMs busy, or tiny programs: not worth the compile
                continue
            run({**BASE, "block_n": block_n, "split_k": split_k})
    print("  C: prefetch x maxnreg, then num_warps x num_stages", flush=True)
    tile = best()
    for prefetch in (True, False):
        for maxnreg in (None, 88, 96, 104):
            run({**tile, "prefetch": prefetch, "maxnreg": maxnreg})
    tile = best()
    for num_warps, num_stages in ((4, 2), (4, 3), (8, 1), (8, 2)):
        run({**tile, "num_warps": num_warps, "num_stages": num_stages})
    print("  D: block_k 64", flush=True)
    run({**best(), "block_k": 64})
    print("  E: column blocks (the weights regrouped per block_n columns, contiguous per K step)", flush=True)
    tile = best()
    for block_n in (64, 128):
        for split_k in split_choices(K):
            if split_k <= 8:
                run({**tile, "block_n": block_n, "split_k": split_k, "column_blocks": True})
    tile = best()
    for num_stages, maxnreg in ((1, None), (3, None), (3, 96)):
        run({**tile, "num_stages": num_stages, "maxnreg": maxnreg})

    layer_summary = {"K": K, "N": N, "floor_ms": floor_ms, "int4pack_ms": int4pack_ms,
                     "default": {"config": default, "ms": default_result[0] if default_result else None},
                     "configs": [{"ms": ms, "max_rel_err": err, "config": c} for ms, err, c in results]}
    if results:
        ms, err, config = min(results, key=lambda r: r[0])
        layer_summary["best"] = {"config": config, "ms": ms, "max_rel_err": err}
        print(f"  best {ms * 1e3:.1f} us ({ms / floor_ms:.2f}x floor, {weight_bytes(K, N) / ms / 1e6:.0f} GB/s, "
              f"int4pack {int4pack_ms / ms:.2f}x slower), max rel err {err:.1e}: {json.dumps(config)}", flush=True)
    return layer_summary


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--device", default="cuda:0")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--budget-s", type=float, default=170.0, help="stop starting new configurations after this")
    args = p.parse_args()
    device = torch.device(args.device)
    torch.cuda.set_device(device)
    bandwidth = copy_bandwidth_gbs(device)
    print(f"copy bandwidth {bandwidth:.0f} GB/s on {torch.cuda.get_device_name(device)}", flush=True)
    sweep = Sweep(device, args.reps, args.budget_s)
    started = time.monotonic()
    shapes = {}
    for name, (K, N) in SHAPES.items():
        shapes[name] = sweep_shape(sweep, name, K, N, bandwidth)
        torch.cuda.empty_cache()  # the layer's buffers, once the shape's closures are gone

    def step(key):
        values = [s[key]["ms"] if isinstance(s.get(key), dict) else s.get(key) for s in shapes.values()]
        return None if any(v is None for v in values) else LAYERS * sum(values)

    estimate = {"floor_ms": step("floor_ms"), "int4pack_ms": step("int4pack_ms"), "default_ms": step("default"),
                "best_ms": step("best")}
    print(f"step estimate, {LAYERS} layers x 4 GEMMs: " + ", ".join(
        f"{k} {v:.3f}" + (f" ({v / estimate['floor_ms']:.2f}x floor)" if k != "floor_ms" else "")
        for k, v in estimate.items() if v is not None), flush=True)
    tuned = {f"({s['K']}, {s['N']}, {GROUP})": s["best"]["config"] for s in shapes.values() if "best" in s}
    print("TUNED entries for model/awq_triton.py:")
    for key, config in tuned.items():
        print(f"    {key}: {config},")
    summary = {"device": torch.cuda.get_device_name(device), "bandwidth_gbs": bandwidth, "rows": ROWS,
               "group": GROUP, "sweep_s": time.monotonic() - started, "step_estimate": estimate,
               "best": {name: {"ms": s["best"]["ms"], "x_floor": s["best"]["ms"] / s["floor_ms"],
                               "int4pack_ms": s["int4pack_ms"], "max_rel_err": s["best"]["max_rel_err"],
                               "config": s["best"]["config"]}
                        for name, s in shapes.items() if "best" in s}}
    print(json.dumps(summary), flush=True)
    env = {"gpu": torch.cuda.get_device_name(device), "torch": torch.__version__,
           "triton": __import__("triton").__version__, "weights": "SYNTHETIC (random AWQ buffers)"}
    with open(args.out, "w") as f:
        json.dump({"env": env, "summary": summary, "shapes": shapes}, f, indent=1)


if __name__ == "__main__":
    main()
