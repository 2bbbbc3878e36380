"""FlashHead's kernels on one GPU: launch-shape sweep, per-kernel profile, the head against the dense head.

    python reports/h200/flashhead_bench.py --out flashhead.json    # on the GPU machine

Head: Qwen3-0.6B shapes (151,936 x 1,024, bf16), SYNTHETIC weights (seeded random values), its
balanced clustering (c = 9,496 clusters of 16). Every time is device time per call inside a CUDA
graph, with L2 evicted before each call (`measure.timing.time_in_graph`: what a draft step that
contains the head pays), median [p10, p90]; the whole heads are also timed as one graph replay per
call (`time_op`, what speed_bench's earlier rows measured: launch and input copy included), and so
is the draft step (qwen3-0.6b, synthetic) alone and with each head.
"""
import argparse
import itertools
import json

import torch

from measure.benchmarks import copy_bandwidth_gbs
from measure.timing import time_in_graph, time_op
from model import flashhead_triton
from model.flashhead import build_clustering
from model.graphs import GraphedCall
from model.heads import DenseHead, FlashHead
from model.loading import load_model

VOCAB, HIDDEN = 151936, 1024


def sweep(name, settings, fn, states, device, reps):
    """Times fn under each launch shape; returns the rows, best first."""
    rows = []
    for setting in settings:
        settings_before = dict(setting["apply"]())
        try:
            t = time_in_graph(fn, states, device, reps=reps)
        except Exception as error:  # a shape that does not compile or fit: reported, skipped
            print(f"{name} {setting['label']}: failed ({type(error).__name__}: {str(error)[:120]})", flush=True)
            continue
        finally:
            setting["restore"](settings_before)
        rows.append({"sweep": name, "launch": setting["label"], **t})
        print(f"{name:<9} {setting['label']:<40} {t['median_ms'] * 1e3:8.2f} us [{t['p10_ms'] * 1e3:.2f}, "
              f"{t['p90_ms'] * 1e3:.2f}]", flush=True)
    return sorted(rows, key=lambda r: r["median_ms"])


def launch_settings(attr, grid):
    """Settings that swap flashhead_triton.<attr> for each dict of `grid`."""
    def make(value):
        def apply():
            before = getattr(flashhead_triton, attr)
            setattr(flashhead_triton, attr, value)
            return {"v": before}
        return {"label": json.dumps(value), "apply": apply, "restore": lambda b: setattr(flashhead_triton, attr, b["v"])}
    return [make(v) for v in grid]


def grid(**axes):
    return [dict(zip(axes, values)) for values in itertools.product(*axes.values())]


def profile(head, states, label):
    """Kernel names and device time per call, from torch.profiler over eager calls."""
    calls = 20
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for i in range(calls):
            head.argmax(*states[i % len(states)])
        torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages():
        us = getattr(e, "device_time_total", getattr(e, "cuda_time_total", 0)) / calls
        if us > 0:
            rows.append({"head": label, "kernel": e.key[:90], "us_per_call": us, "count": e.count / calls})
    for r in sorted(rows, key=lambda r: -r["us_per_call"]):
        print(f"  {label:<22} {r['us_per_call']:8.2f} us  x{r['count']:.0f}  {r['kernel']}", flush=True)
    return rows


def draft_steps(device, reps):
    """The 0.6B draft step (fused kernels, graphs on, context 300) alone and with each head, with the
    launch shapes chosen above: one graph replay per step, as speed_bench.py times it."""
    model = load_model("qwen3-0.6b", device, "bfloat16", 1, 1104).model
    w = model.head_weight
    steps = [(torch.tensor([[t]], device=device), torch.tensor([300], device=device)) for t in (5, 9, 77, 300)]
    rows = []
    for name, head in (("body only", None), ("dense", DenseHead(w)),
                       ("flashhead", FlashHead(w, build_clustering(w, seed=0), backend="triton"))):
        def step(tok, pos, head=head):
            hidden = model.forward_hidden(tok, pos)
            return hidden if head is None else head.argmax(hidden[0, -1:])
        t = time_op(GraphedCall(step), steps, device, reps=reps * 2, warmup=3)
        rows.append({"sweep": "draft step", "head": name, **t})
        print(f"draft step, {name:<10} {t['median_ms']:.3f} ms [{t['p10_ms']:.3f}, {t['p90_ms']:.3f}]", flush=True)
    return rows


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--reps", type=int, default=10)
    args = p.parse_args()
    device = torch.device("cuda:0")
    bandwidth = copy_bandwidth_gbs(device) * 1e9
    g = torch.Generator(device=device).manual_seed(0)
    weight = (torch.randn(VOCAB, HIDDEN, device=device, generator=g) * 0.02).to(torch.bfloat16)
    clustering = build_clustering(weight, seed=0)
    c = clustering.clusters
    states = [(torch.randn(1, HIDDEN, device=device, generator=g).to(torch.bfloat16),) for _ in range(4)]
    probes = [c // 16, 2]
    out = {"env": {"gpu": torch.cuda.get_device_name(device), "torch": torch.__version__,
                   "bandwidth_gbs": bandwidth / 1e9, "clusters": c,
                   "weights": "SYNTHETIC (seeded random values, real shapes)"}, "rows": []}

    head = FlashHead(weight, clustering, probes=probes[0], backend="triton")
    stage1 = lambda h: flashhead_triton.select_clusters(h, head.centroids, head.probes)  # noqa: E731
    out["rows"] += sweep("centroids", launch_settings("CENTROID_LAUNCH", grid(
        BLOCK_C=[4, 8, 16, 32], BLOCK_D=[256, 512, 1024], num_warps=[2, 4, 8])), stage1, states, device, args.reps)
    best = json.loads(out["rows"][0]["launch"])
    flashhead_triton.CENTROID_LAUNCH = best
    rows = sweep("SELECT_LAUNCH", launch_settings("SELECT_LAUNCH", grid(
        SLICE=[256, 512, 1024, 2048], EARLIER=[16384], num_warps=[2, 4, 8])), stage1, states, device, args.reps)
    out["rows"] += rows
    flashhead_triton.SELECT_LAUNCH = json.loads(rows[0]["launch"])
    stage2_rows = sweep("stage2", launch_settings("STAGE2_LAUNCH", grid(
        BLOCK_D=[128, 256, 512, 1024], num_warps=[2, 4, 8])), head.argmax, states, device, args.reps)
    out["rows"] += stage2_rows
    flashhead_triton.STAGE2_LAUNCH = json.loads(stage2_rows[0]["launch"])
    out["chosen"] = {name: getattr(flashhead_triton, name)
                     for name in ("CENTROID_LAUNCH", "SELECT_LAUNCH", "STAGE2_LAUNCH")}
    print("chosen:", json.dumps(out["chosen"]), flush=True)

    heads = {"dense": DenseHead(weight)}
    for p_ in probes:
        for backend in ("triton", "torch"):
            heads[f"flashhead p={p_} {backend}"] = FlashHead(weight, clustering, probes=p_, backend=backend)
    for name, h in heads.items():
        in_graph = time_in_graph(h.argmax, states, device, reps=args.reps * 2)
        replay = time_op(GraphedCall(h.argmax), states, device, reps=args.reps * 2, warmup=3)
        out["rows"].append({"sweep": "head", "head": name, "floor_ms": h.bytes_per_call() / bandwidth * 1e3,
                            "in_graph": in_graph, "graph_replay": replay})
        print(f"head {name:<24} in graph {in_graph['median_ms'] * 1e3:7.2f} us [{in_graph['p10_ms'] * 1e3:.2f}, "
              f"{in_graph['p90_ms'] * 1e3:.2f}]   one replay {replay['median_ms'] * 1e3:7.2f} us   floor "
              f"{h.bytes_per_call() / bandwidth * 1e6:.2f} us", flush=True)
    dense_ms = out["rows"][-len(heads)]["in_graph"]["median_ms"]
    for r in out["rows"][-len(heads):]:
        print(f"  {r['head']:<24} dense / this = {dense_ms / r['in_graph']['median_ms']:.2f}x", flush=True)
    out["profile"] = [row for name in ("dense", f"flashhead p={probes[0]} triton", f"flashhead p={probes[0]} torch")
                      for row in profile(heads[name], states, name)]
    out["rows"] += draft_steps(device, args.reps)
    want = heads["dense"].argmax(torch.cat([s[0] for s in states]))
    full = FlashHead(weight, clustering, probes=c, backend="triton").argmax(torch.cat([s[0] for s in states]))
    out["all_clusters_equal_dense"] = bool(torch.equal(want, full))
    print("FlashHead probing every cluster == dense head:", out["all_clusters_equal_dense"], flush=True)
    many = torch.randn(256, HIDDEN, device=device, generator=g).to(torch.bfloat16)
    fast, slow = heads[f"flashhead p={probes[0]} triton"], heads[f"flashhead p={probes[0]} torch"]
    same = fast.argmax(many) == slow.argmax(many)
    out["triton_equal_torch_backend"] = same.float().mean().item()
    print(f"FlashHead p={probes[0]}, triton == torch backend on 256 states: {same.float().mean().item():.4f}", flush=True)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
