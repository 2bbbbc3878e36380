"""python -m measure.speed: each operation of our decoder against its bandwidth floor, on one CUDA GPU.

Why: the decoder is meant to run at the speed of the hardware. This command times every operation
of a speculative round the way the decoder runs it and sets it beside the time the bytes it must
read take at the measured copy rate, so what is far from its floor, and why, can be seen. The
tables of reports/h200/decoder_speed.md come from its output.

    python -m measure.speed --out speed_bench.json                  # one GPU, cuda:0
    python -m measure.speed --out speed_bench.json --reps 20 --device cuda:1

Weights are SYNTHETIC (the presets' exact shapes, seeded random values): the timings are real, the
outputs are not language. Context 300 in a 1,104-slot cache. Each time is CUDA events, median [p10,
p90] of --reps repetitions after 3 warm-ups (measure/timing.py), of:
- the Qwen3-0.6B draft body step, with the fused and the torch layer kernels, graphs on and off;
- the draft heads alone (dense; FlashHead p = c/16 and p = 2, each with the Triton and the torch
  backend): per call inside a CUDA graph with L2 evicted before each call ("in graph", what the
  draft step pays) and as one graph replay (graphs on) or eager call (graphs off) per call;
- the draft step with the dense head and with FlashHead p = c/16 (fused kernels), graphs on and off;
- the Qwen3-32B target step (fixed width 16, n = 1..8 new tokens, graphs on) in bf16, and in AWQ
  int4 with each int4 kernel (our Triton GEMM, torch's int4pack);
- in the same run, the Hugging Face eager forward of the same architectures (measure/hf_eager.py:
  0.6B at n = 1, 32B at n = 1, 4, 8), for comparison.
Floors: the bytes an operation reads once (weights, head rows) / the measured copy rate.

Prints one line per row and writes --out (JSON): `env` (GPU, versions, copy rate, weights
"synthetic", context, cache slots) and `rows`, each with op, kernels, awq_kernel (target rows),
graphs (true, false or "in graph"), floor_ms (null for Hugging Face) and the timing (median_ms,
p10_ms, p90_ms, n, host_ms). Needs a CUDA GPU with room for Qwen3-32B in bf16 (about 66 GB; the
committed results ran on one H200), triton and transformers. docs/benchmarks.md describes it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import torch

from model.awq import AWQLinear
from model.cli import run_torch_command
from model.decoder import Decoder
from model.flashhead import Clustering, build_clustering
from model.graphs import GraphedCall
from model.heads import DenseHead, FlashHead
from model.loading import load_model
from model.pair import draft_routes

from .benchmarks import copy_bandwidth_gbs
from .hf_eager import time_hf_forward
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

COMMAND = "python -m measure.speed"
DRAFT, TARGET, TARGET_AWQ = "qwen3-0.6b", "qwen3-32b", "qwen3-32b-awq"
CONTEXT, CACHE_SLOTS = 300, 1104
TARGET_K = 7  # the target step's width is its decoder's, K + 1 = 8 tokens
DRAFT_SEED, TARGET_SEED = 1, 0
STEP_TOKENS = (5, 9, 77, 300)  # the draft step's inputs, rotated
HEAD_BACKENDS = ("triton", "torch")
AWQ_KERNELS = ("triton", "int4pack_cuda")
HF_NEW_TOKENS = {DRAFT: [1], TARGET: [1, 4, 8]}


# --- shared with python -m measure.head_speed ----------------------------------------------------


def load_draft(device: torch.device, kernels: str | None = None):
    """The synthetic Qwen3-0.6B draft in bf16 with a CACHE_SLOTS cache (its `Loaded`), on the drafts'
    default speed routes (model.pair.draft_routes)."""
    loaded = load_model(DRAFT, device, "bfloat16", DRAFT_SEED, CACHE_SLOTS, kernels=kernels)
    draft_routes(loaded.model)
    return loaded


def draft_step_inputs(device: torch.device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(token [1, 1], position [1]) pairs at the context: the inputs every draft step is timed on."""
    return [(torch.tensor([[token]], device=device), torch.tensor([CONTEXT], device=device)) for token in STEP_TOKENS]


def draft_step(model, head=None) -> Callable:
    """One draft step as the decoder's proposal runs it: the body, then (given a head) its greedy token."""

    def step(tokens: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        hidden = model.forward_hidden(tokens, position)
        return hidden if head is None else head.argmax(hidden[0, -1:])

    return step


def compared_probes(clustering: Clustering) -> tuple[int, int]:
    """FlashHead's probe counts in the comparison: the default c/16 (593 for Qwen3-0.6B), and 2."""
    return clustering.default_probes, 2


def flashhead_name(probes: int, backend: str) -> str:
    return f"flashhead p={probes} {backend}"


def compared_heads(weight: torch.Tensor, clustering: Clustering) -> dict[str, DenseHead | FlashHead]:
    """The dense head, then FlashHead at each compared probe count with each backend, by name."""
    heads: dict[str, DenseHead | FlashHead] = {"dense": DenseHead(weight)}
    for probes in compared_probes(clustering):
        for backend in HEAD_BACKENDS:
            heads[flashhead_name(probes, backend)] = FlashHead(weight, clustering, probes=probes, backend=backend)
    return heads


# --- the rows ----------------------------------------------------------------------------------------


def draft_rows(device: torch.device, reps: int, bandwidth_gbs: float) -> list[dict]:
    """The draft body step per layer-kernel path and graph regime; with the fused kernels also the
    heads alone and the draft step with the dense and the default FlashHead head."""
    rows = []
    steps = draft_step_inputs(device)
    for kernels in ("fused", "torch"):
        model = load_draft(device, kernels).model
        body_floor = floor_ms(model.body_parameters_bytes(), bandwidth_gbs)
        for graphs in (True, False):
            body = GraphedCall(model.forward_hidden, enabled=graphs)
            rows.append(
                {
                    "op": "draft body step",
                    "kernels": kernels,
                    "graphs": graphs,
                    "floor_ms": body_floor,
                    **time_op(body, steps, device, reps=reps),
                }
            )
        if kernels == "fused":
            rows += head_rows(model, steps, device, reps, bandwidth_gbs, body_floor)
    return rows


def head_rows(model, steps, device: torch.device, reps: int, bandwidth_gbs: float, body_floor: float) -> list[dict]:
    """The draft's heads alone (in a graph, one replay, eager), then the draft step with each of the
    dense head and FlashHead p = c/16 (Triton)."""
    weight = model.head_weight
    clustering = build_clustering(weight, seed=0)
    states = [(torch.randn(1, weight.shape[1], device=device, dtype=weight.dtype),) for _ in range(4)]
    heads = compared_heads(weight, clustering)
    rows = []
    for name, head in heads.items():
        head_floor = floor_ms(head.bytes_per_call(), bandwidth_gbs)
        rows.append(
            {
                "op": f"head {name}",
                "graphs": "in graph",
                "floor_ms": head_floor,
                **time_in_graph(head.argmax, states, device, reps=reps),
            }
        )
        for graphs in (True, False):
            rows.append(
                {
                    "op": f"head {name}",
                    "graphs": graphs,
                    "floor_ms": head_floor,
                    **time_op(GraphedCall(head.argmax, enabled=graphs), states, device, reps=reps),
                }
            )
    default_flashhead = heads[flashhead_name(clustering.default_probes, "triton")]
    for name, head in (("dense", heads["dense"]), ("flashhead", default_flashhead)):
        for graphs in (True, False):
            rows.append(
                {
                    "op": f"draft step + {name} head",
                    "kernels": "fused",
                    "graphs": graphs,
                    "floor_ms": body_floor + floor_ms(head.bytes_per_call(), bandwidth_gbs),
                    **time_op(GraphedCall(draft_step(model, head), enabled=graphs), steps, device, reps=reps),
                }
            )
    return rows


def target_rows(
    name: str, device: torch.device, reps: int, bandwidth_gbs: float, awq_kernels: tuple[str, ...] = ()
) -> list[dict]:
    """The decoder's target step (graphs, fixed width) for n = 1..8 new tokens; for an AWQ model, once
    per int4 kernel in `awq_kernels` (none: the kernel load_model picks)."""
    loaded = load_model(name, device, "bfloat16", TARGET_SEED, CACHE_SLOTS)
    model = loaded.model
    target_floor = floor_ms(model.body_parameters_bytes() + model.head_bytes(), bandwidth_gbs)
    rows = []
    for kernel in awq_kernels or (None,):
        if kernel:
            for module in model.modules():
                if isinstance(module, AWQLinear):
                    module.select_kernel(kernel, dtype=torch.bfloat16)
        step = Decoder(model, K=TARGET_K).target_forward
        for new_tokens in range(1, 9):
            inputs = [
                (
                    torch.randint(0, model.config.vocab_size, (1, new_tokens), device=device),
                    torch.tensor([CONTEXT], device=device),
                )
                for _ in range(3)
            ]
            rows.append(
                {
                    "op": f"target {name} n={new_tokens}",
                    "kernels": loaded.info["kernels"],
                    "awq_kernel": kernel or loaded.info["kernel"],
                    "graphs": True,
                    "floor_ms": target_floor,
                    **time_op(step, inputs, device, reps=reps),
                }
            )
    return rows


def hugging_face_rows(device: torch.device, reps: int) -> list[dict]:
    """The Hugging Face eager decode forward (DynamicCache, argmax of the last logits), in this run.
    No floors: those of our rows for the same model apply."""
    rows = []
    for name, new_tokens in HF_NEW_TOKENS.items():
        result = time_hf_forward(name, device, new_tokens, CONTEXT, reps)
        for n, timing in result["forward_ms"].items():
            rows.append(
                {"op": f"HF eager {name} n={n}", "kernels": "transformers", "graphs": False, "floor_ms": None, **timing}
            )
        release_gpu_memory()  # this model, before the next one loads
    return rows


def format_row(row: dict) -> str:
    """One printed line: op, kernels, AWQ kernel, graphs, median [p10, p90] and the floor with the ratio."""
    graphs = {True: "on", False: "off"}.get(row["graphs"], row["graphs"])
    floor = f"floor {row['floor_ms']:.3f} ({row['median_ms'] / row['floor_ms']:.2f}x)" if row["floor_ms"] else ""
    return (
        f"{row['op']:<34} {row.get('kernels', ''):<12} {row.get('awq_kernel', ''):<14} graphs={graphs:<8} "
        f"{row['median_ms']:8.3f} ms [{row['p10_ms']:.3f}, {row['p90_ms']:.3f}]  {floor}"
    )


def measure_speed(device: torch.device, reps: int) -> dict:
    bandwidth_gbs = copy_bandwidth_gbs(device)
    environment = gpu_environment(
        device, bandwidth_gbs, "seeded random values, real shapes", context=CONTEXT, cache_slots=CACHE_SLOTS
    )
    print(environment_header(COMMAND, environment), flush=True)
    rows = []
    for measure in (
        lambda: draft_rows(device, reps, bandwidth_gbs),
        lambda: target_rows(TARGET, device, reps, bandwidth_gbs),
        lambda: target_rows(TARGET_AWQ, device, reps, bandwidth_gbs, AWQ_KERNELS),
        lambda: hugging_face_rows(device, reps),
    ):
        group = measure()
        release_gpu_memory()  # the group's models, before the next one loads
        for row in group:
            print(format_row(row), flush=True)
        rows += group
    return {"env": environment, "rows": rows}


def parser():
    return gpu_command_parser(COMMAND, __doc__, 20, "timed repetitions per row")


def main(argv=None) -> int:
    def body():
        args = parser().parse_args(argv)
        out, device = start_gpu_command(COMMAND, args.out, args.device, modules=("triton", "transformers"))
        write_result(out, measure_speed(device, args.reps))
        print(f"wrote {out}")

    return run_torch_command(body)


if __name__ == "__main__":
    sys.exit(main())
