"""python -m measure.head_cost: each draft head kind's cost per budget, as the draft step pays it.

    python -m measure.head_cost --out reports/heads/h200_head_cost.json

Draft: Qwen3-0.6B's shapes (151,936 x 1,024 head, bf16), SYNTHETIC weights (seeded random values;
costs do not depend on the values). Heads: dense; FlashHead (balanced clustering, c = 9,496 of 16);
shortlist (N rows of the head: which rows does not change the cost) with the sliced-copy GEMM and
with the fused gather-score-argmax kernel; router (an unbalanced spherical k-means of the head with
clusters capped at twice the mean size; an untrained MLP, which costs what a trained one does).
Each at the budgets of --heads. Per head: device time per call inside a CUDA graph with L2 evicted
(`measure.timing.time_in_graph`), its bandwidth floor (bytes it must read / the measured copy rate)
and the dense head's time over it; then the draft step (body at context 300 and the head, one graph
replay per step, as python -m measure.speed times it). With --temperature T > 0, every head also
gets `sampled` (measure/draft_sampling_cost.py): q laid out over the vocabulary with its draw, against
q over the head's scored tokens alone (formed, and with its draw: the decoder's sampled head step), in
graph, with the share of draws on which the two agree. With --router-side-stream, each router head
also gets `draft_step_side_stream`: the same draft step graph with the router's cluster choice on a
second stream beside the body, forked and joined by events inside the capture
(model/router_stream.py), as the decoder runs it by default. Needs a CUDA GPU and triton.

    python -m measure.head_cost --out router_stream.json --heads router:32+router:128+router:512 \
        --router-side-stream

    python -m measure.head_cost --out sampled.json --temperature 0.7 \
        --heads dense+flashhead:64+flashhead:296+flashhead:593+shortlist:8192+router:128
"""

from __future__ import annotations

import argparse
import sys

import torch

from contracts.cli import OneLineParser
from contracts.heads import parse_heads
from model.cli import run_torch_command
from model.flashhead import build_clustering
from model.graphs import GraphedCall
from model.head_assets import Router
from model.heads import DenseHead, FlashHead, RouterHead, ShortlistHead
from model.router import spherical_kmeans, split_clusters
from model.router_stream import SideStream, routed_step
from model.sampling import SamplingSettings

from .benchmarks import copy_bandwidth_gbs
from .draft_sampling_cost import format_sampled, sampled_rows
from .speed import draft_step_inputs, load_draft
from .timing import (
    at_least_one,
    environment_header,
    floor_ms,
    gpu_environment,
    start_gpu_command,
    time_in_graph,
    time_op,
    write_result,
)

COMMAND = "python -m measure.head_cost"
DEFAULT_HEADS = (
    "dense+flashhead:64+flashhead:296+flashhead:593+shortlist:8192+shortlist:32768+shortlist:65536"
    "+router:32+router:128+router:512"
)
ROUTER_CLUSTERS, ROUTER_WIDTH = 1187, 256  # k-means clusters (vocabulary / 128) and MLP width


def synthetic_router(weight: torch.Tensor, seed: int = 0) -> Router:
    """An unbalanced clustering of the head and a random MLP of the trained router's shapes."""
    vocab, d = weight.shape
    assignments, members = split_clusters(spherical_kmeans(weight, ROUTER_CLUSTERS, iters=5, seed=seed).cpu(), 256)
    g = torch.Generator().manual_seed(seed)
    c = members.shape[0]
    layers = [torch.randn(ROUTER_WIDTH, 2 * d, generator=g) * 0.02, torch.zeros(ROUTER_WIDTH)]
    layers += [torch.randn(c, ROUTER_WIDTH, generator=g) * 0.02, torch.zeros(c)]
    return Router(assignments, members, layers, d, {"weights": "synthetic"})


def heads_to_time(weight: torch.Tensor, embedding: torch.Tensor, specs) -> dict:
    """name -> head, for every spec's budgets (shortlists with both backends)."""
    clustering = router = None
    heads = {}
    for spec in specs:
        for budget in dict.fromkeys(spec.budgets or (None,)):
            if spec.kind == "dense":
                heads["dense"] = DenseHead(weight)
            elif spec.kind == "flashhead":
                clustering = clustering or build_clustering(weight, seed=0)
                heads[f"flashhead:{budget or clustering.default_probes}"] = FlashHead(
                    weight, clustering, budget, backend="triton"
                )
            elif spec.kind == "shortlist":
                ids = torch.randperm(weight.shape[0], generator=torch.Generator().manual_seed(0))[:budget]
                for backend in ("torch", "triton"):
                    heads[f"shortlist:{budget} {backend}"] = ShortlistHead(weight, ids, backend=backend)
            else:
                router = router or synthetic_router(weight)
                heads[f"router:{budget}"] = RouterHead(weight, embedding, router, budget, backend="triton")
    return heads


def measure(
    device: torch.device, specs, reps: int, settings: SamplingSettings, router_side_stream: bool = False
) -> dict:
    bandwidth_gbs = copy_bandwidth_gbs(device)
    model = load_draft(device).model
    weight, embedding = model.head_weight, model.embed_tokens.weight
    heads = heads_to_time(weight, embedding, specs)
    environment = gpu_environment(device, bandwidth_gbs, "seeded random values, Qwen3-0.6B shapes")
    print(environment_header(COMMAND, environment), flush=True)
    g = torch.Generator(device=device).manual_seed(0)
    states = [(torch.randn(1, weight.shape[1], device=device, generator=g).to(weight.dtype),) for _ in range(4)]
    fed = torch.tensor([[5]], device=device)
    steps = draft_step_inputs(device)
    side = SideStream(device) if router_side_stream else None

    def body(tokens, position):
        return model.forward_hidden(tokens, position)[0, -1:]

    rows, dense_ms = [], None
    for name, head in heads.items():

        def call(hidden, head=head):
            return head.argmax(hidden, fed)

        def step(tokens, position, head=head):
            return head.argmax(body(tokens, position), tokens)

        def step_beside(tokens, position, head=head):
            return routed_step(body, head, side, tokens, position)

        in_graph = time_in_graph(call, states, device, reps=reps)
        draft_step = time_op(GraphedCall(step), steps, device, reps=reps)
        floor = floor_ms(head.bytes_per_call(), bandwidth_gbs) if bandwidth_gbs else None
        dense_ms = in_graph["median_ms"] if name == "dense" else dense_ms
        row = {
            "head": name,
            "kind": name.split(":")[0],
            "budget": head.budget,
            "rows_scored": round(head.work_ratio * head.vocab_size),
            "in_graph": in_graph,
            "floor_ms": floor,
            "dense_over_this": dense_ms / in_graph["median_ms"] if dense_ms else None,
            "draft_step": draft_step,
        }
        beside = ""
        if side is not None and isinstance(head, RouterHead):
            row["draft_step_side_stream"] = time_op(GraphedCall(step_beside), steps, device, reps=reps)
            beside = f", router beside the body {row['draft_step_side_stream']['median_ms']:.3f} ms"
        rows.append(row)
        if not settings.greedy:
            row["sampled"] = sampled_rows(head, states, settings, device, reps)
            print(format_sampled(name, row["sampled"]), flush=True)
        print(
            f"{name:<24} head {in_graph['median_ms'] * 1e3:8.2f} us [{in_graph['p10_ms'] * 1e3:.2f}, "
            f"{in_graph['p90_ms'] * 1e3:.2f}]  floor {(floor or 0) * 1e3:7.2f} us  draft step "
            f"{draft_step['median_ms']:.3f} ms{beside}",
            flush=True,
        )
    return {"env": environment, "rows": rows}


def main(argv=None) -> int:
    def body():
        p = OneLineParser(prog=COMMAND, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
        p.add_argument("--out", required=True, help="the JSON file to write")
        p.add_argument("--heads", default=DEFAULT_HEADS, help="head specs joined by + (default: 3 budgets per kind)")
        p.add_argument("--reps", type=at_least_one, default=20, help="timed repetitions per head (default 20)")
        p.add_argument(
            "--temperature", type=float, default=0.0, help="also time the sampled draw at T (default 0: greedy only)"
        )
        p.add_argument(
            "--router-side-stream",
            action="store_true",
            help="router heads: also time the draft step with the cluster choice on a side stream beside the body",
        )
        args = p.parse_args(argv)
        settings = SamplingSettings(temperature=args.temperature)
        specs = parse_heads(args.heads)
        out, device = start_gpu_command(COMMAND, args.out)
        write_result(out, measure(device, specs, args.reps, settings, args.router_side_stream))
        print(f"wrote {out}")

    return run_torch_command(body)


if __name__ == "__main__":
    sys.exit(main())
