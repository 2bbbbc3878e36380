"""Per-operation speed of our decoder against bandwidth floors (issue: decoder at the speed of the hardware).

    python reports/h200/speed_bench.py --out speed.json      # on the GPU machine, synthetic weights

Times, with CUDA events (median, p10, p90 of --reps after warm-up), each operation the way the
decoder runs it: the 0.6B draft step (body; dense and FlashHead heads) with the fused and the torch
layer kernels, graphs on and off; the heads alone, per call inside a CUDA graph with L2 evicted
before each call (`time_in_graph`, as the draft step pays them) and as one graph replay per call;
the 32B target step (fixed width 16, n = 1..8 new tokens) in bf16 and in AWQ int4 with each int4
kernel; and, in the same run, the Hugging Face eager forward of the same architectures
(measure/hf_eager.py). Floors: bytes read once / the measured copy rate.
"""
import argparse
import json

import torch

from measure.benchmarks import copy_bandwidth_gbs
from measure.hf_eager import time_hf_forward
from measure.timing import time_in_graph, time_op
from model.awq import AWQLinear
from model.decoder import Decoder
from model.flashhead import build_clustering
from model.graphs import GraphedCall
from model.heads import DenseHead, FlashHead
from model.loading import load_model

ROOM, CONTEXT = 1104, 300


def timed(fn, inputs, device, reps):
    return time_op(fn, inputs, device, reps=reps, warmup=3)


def draft_rows(device, reps, bandwidth):
    rows = []
    for kernels in ("fused", "torch"):
        loaded = load_model("qwen3-0.6b", device, "bfloat16", 1, ROOM, kernels=kernels)
        model = loaded.model
        body_floor = model.body_parameters_bytes() / bandwidth * 1e3
        steps = [(torch.tensor([[t]], device=device), torch.tensor([CONTEXT], device=device)) for t in (5, 9, 77, 300)]
        for graphs in (True, False):
            body = GraphedCall(model.forward_hidden, enabled=graphs)
            rows.append({"op": "draft body step", "kernels": kernels, "graphs": graphs,
                         "floor_ms": body_floor, **timed(body, steps, device, reps)})
        if kernels == "fused":
            w = model.head_weight
            clustering = build_clustering(w, seed=0)
            states = [(torch.randn(1, w.shape[1], device=device, dtype=w.dtype),) for _ in range(4)]
            heads = {"dense": DenseHead(w)}
            for p in (clustering.clusters // 16, 2):
                for backend in ("triton", "torch"):
                    heads[f"flashhead p={p} {backend}"] = FlashHead(w, clustering, probes=p, backend=backend)
            for name, head in heads.items():
                floor = head.bytes_per_call() / bandwidth * 1e3
                rows.append({"op": f"head {name}", "graphs": "in graph", "floor_ms": floor,
                             **time_in_graph(head.argmax, states, device, reps=reps)})
                for graphs in (True, False):
                    rows.append({"op": f"head {name}", "graphs": graphs, "floor_ms": floor,
                                 **timed(GraphedCall(head.argmax, enabled=graphs), states, device, reps)})
            for name, head in (("dense", heads["dense"]), ("flashhead", heads[f"flashhead p={clustering.clusters // 16} triton"])):
                def step(tok, pos, head=head, model=model):
                    hidden = model.forward_hidden(tok, pos)
                    return head.argmax(hidden[0, -1:])
                for graphs in (True, False):
                    rows.append({"op": f"draft step + {name} head", "kernels": kernels, "graphs": graphs,
                                 "floor_ms": body_floor + head.bytes_per_call() / bandwidth * 1e3,
                                 **timed(GraphedCall(step, enabled=graphs), steps, device, reps)})
        del model, loaded
        torch.cuda.empty_cache()
    return rows


def target_rows(name, device, reps, bandwidth, awq_kernels):
    rows = []
    loaded = load_model(name, device, "bfloat16", 0, ROOM)
    model = loaded.model
    floor = (model.body_parameters_bytes() + model.head_bytes()) / bandwidth * 1e3
    for kernel in awq_kernels:
        if kernel:
            for module in model.modules():
                if isinstance(module, AWQLinear):
                    module.select_kernel(kernel, dtype=torch.bfloat16)
        step = Decoder(model, K=7).target_forward
        for n in range(1, 9):
            inputs = [(torch.randint(0, model.config.vocab_size, (1, n), device=device), torch.tensor([CONTEXT], device=device))
                      for _ in range(3)]
            rows.append({"op": f"target {name} n={n}", "kernels": loaded.info["kernels"],
                         "awq_kernel": kernel or loaded.info["kernel"], "graphs": True, "floor_ms": floor,
                         **timed(step, inputs, device, reps)})
    del model, loaded
    torch.cuda.empty_cache()
    return rows


def hf_rows(device, reps):
    """The Hugging Face eager decode forward (DynamicCache, argmax of the last logits), this run."""
    rows = []
    for name, n_tokens in (("qwen3-0.6b", [1]), ("qwen3-32b", [1, 4, 8])):
        result = time_hf_forward(name, device, n_tokens, CONTEXT, reps)
        for n, t in result["forward_ms"].items():  # floors: those of our rows for the same model
            rows.append({"op": f"HF eager {name} n={n}", "kernels": "transformers", "graphs": False,
                         "floor_ms": None, **t})
        torch.cuda.empty_cache()
    return rows


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--device", default="cuda:0")
    args = p.parse_args()
    device = torch.device(args.device)
    bandwidth = copy_bandwidth_gbs(device) * 1e9
    rows = draft_rows(device, args.reps, bandwidth)
    rows += target_rows("qwen3-32b", device, args.reps, bandwidth, [None])
    rows += target_rows("qwen3-32b-awq", device, args.reps, bandwidth, ["triton", "int4pack_cuda"])
    rows += hf_rows(device, args.reps)
    for r in rows:
        graphs = {True: "on", False: "off"}.get(r["graphs"], r["graphs"])
        floor = f"floor {r['floor_ms']:.3f} ({r['median_ms'] / r['floor_ms']:.2f}x)" if r["floor_ms"] else ""
        print(f"{r['op']:<34} {r.get('kernels', ''):<12} {r.get('awq_kernel', ''):<14} graphs={graphs:<8} "
              f"{r['median_ms']:8.3f} ms [{r['p10_ms']:.3f}, {r['p90_ms']:.3f}]  {floor}", flush=True)
    env = {"gpu": torch.cuda.get_device_name(device), "torch": torch.__version__, "bandwidth_gbs": bandwidth / 1e9,
           "weights": "SYNTHETIC (seeded random values, real shapes)", "context": CONTEXT, "cache_slots": ROOM}
    with open(args.out, "w") as f:
        json.dump({"env": env, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
