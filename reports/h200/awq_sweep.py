"""Launch-configuration sweep of the Triton w4a16 GEMM (model/awq_triton.py) on Qwen3-32B's AWQ shapes.

    python reports/h200/awq_sweep.py --out awq_sweep.json      # on the GPU machine, ~2 minutes

For each merged projection of a Qwen3-32B layer (K x N: qkv 5120 x 10240, o_proj 8192 x 5120,
gate_up 5120 x 51200, down 25600 x 5120; group 128; random AWQ buffers) at M = 8 bf16 rows (a verify
of K + 2 tokens at K = 6), times torch's int4pack kernel and w4a16_matmul over configurations, each
per call inside a CUDA graph with L2 evicted before each call (measure.timing.time_in_graph: as a
decode step pays it): the default (default_split_k, LAUNCH), then block_n (64, 128) x split_k x
num_stages (2, 3, 4), then 8 warps at the best. A configuration that fails to compile or disagrees
with the dequantized reference (max error > 1% of the largest output) is printed and skipped.
Floor: the bytes read once (codes, scales, zeros, x, y) / the measured copy rate. Prints per shape
the floor, int4pack, the default and the best configuration (with its max relative error), a step
estimate (64 layers x the four GEMMs) and a final JSON summary line; writes everything to --out.
(Records of the earlier kernels' sweeps, whose scripts are in the git history:
reports/h200/session3/sweeps/ and session4/sweeps/.)
"""
import argparse
import json
import time

import torch
import torch.nn.functional as F

from measure.benchmarks import copy_bandwidth_gbs
from measure.timing import time_in_graph
from model import awq_triton
from model.awq import AWQLinear, unpack_int4

SHAPES = {"qkv": (5120, 10240), "o_proj": (8192, 5120), "gate_up": (5120, 51200), "down": (25600, 5120)}
GROUP, ROWS, LAYERS, DTYPE = 128, 8, 64, torch.bfloat16  # 8 rows: a verify of K + 2 tokens at K = 6


def weight_bytes(K, N):
    groups = K // GROUP
    return K * N // 2 + groups * N * 2 + groups * N // 2 + ROWS * (K + N) * 2


class Sweep:
    def __init__(self, device, reps, budget_s):
        self.device, self.reps, self.deadline = device, reps, time.monotonic() + budget_s

    def out_of_time(self):
        return time.monotonic() > self.deadline

    def time_fn(self, fn, x):
        return time_in_graph(fn, [(x,)], self.device, reps=self.reps, calls=10)["median_ms"]

    def run(self, planes, x, want, config):
        """(ms, max relative error) of one configuration, or None (printed) if it fails or is wrong."""
        key = json.dumps({"block_n": planes.block_n, **config}, sort_keys=True)
        t0 = time.monotonic()
        try:
            # split-K tickets kept across calls, as a layer keeps them
            tickets = torch.zeros(planes.codes.shape[0], dtype=torch.int32, device=self.device)

            def fn(inp):
                return awq_triton.w4a16_matmul(inp, planes, tickets=tickets, **config)
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

    codes, zeros = unpack_int4(layer.qweight), unpack_int4(layer.qzeros)
    planes = {block_n: awq_triton.pack_planes(codes, zeros, layer.scales, GROUP, block_n) for block_n in (64, 128)}
    del codes, zeros
    default = {"split_k": awq_triton.default_split_k(ROWS, planes[awq_triton.BLOCK_N], device), **awq_triton.LAUNCH}
    results = []  # (ms, error, block_n, config)

    def run(block_n, config):
        if sweep.out_of_time():
            return None
        result = sweep.run(planes[block_n], x, want, config)
        if result:
            results.append((*result, block_n, config))
        return result

    default_result = run(awq_triton.BLOCK_N, dict(default))
    steps = K // awq_triton.STEP_K
    for block_n in (64, 128):
        for split_k in (s for s in (1, 2, 4, 8, 16) if steps % s == 0 and 66 <= (N // block_n) * s <= 8192):
            for num_stages in (2, 3, 4):
                run(block_n, {"split_k": split_k, "num_warps": 4, "num_stages": num_stages})
    if results:
        _, _, block_n, config = min(results, key=lambda r: r[0])
        run(block_n, {**config, "num_warps": 8})

    layer_summary = {"K": K, "N": N, "floor_ms": floor_ms, "int4pack_ms": int4pack_ms,
                     "default": {"config": {"block_n": awq_triton.BLOCK_N, **default},
                                 "ms": default_result[0] if default_result else None},
                     "configs": [{"ms": ms, "max_rel_err": err, "config": {"block_n": bn, **c}}
                                 for ms, err, bn, c in results]}
    if results:
        ms, err, block_n, config = min(results, key=lambda r: r[0])
        layer_summary["best"] = {"config": {"block_n": block_n, **config}, "ms": ms, "max_rel_err": err}
        print(f"  best {ms * 1e3:.1f} us ({ms / floor_ms:.2f}x floor, {weight_bytes(K, N) / ms / 1e6:.0f} GB/s, "
              f"int4pack {int4pack_ms / ms:.2f}x slower), max rel err {err:.1e}: "
              f"{json.dumps(layer_summary['best']['config'])}", flush=True)
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
