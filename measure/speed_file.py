"""python -m measure.speed_file: one GPU's speed record of the decoder, against its floors, as a file.

Why: "how near the memory floor is our decoder on this GPU" needs one small record per GPU kind that
anyone can regenerate and compare across commits, rather than figures scattered over reports. This
command measures the steps the speed goals name and writes `reports/speed/<gpu>.json` with a
Markdown table beside it (`<gpu>.md`: medians with p10/p90, and the Hugging Face eager figures of the
same run):

    python -m measure.speed_file --out reports/speed/h200.json            # cuda:0
    python -m measure.speed_file --out reports/speed/h100.json --reps 30 --device cuda:1

Weights are SYNTHETIC (the presets' exact shapes, seeded random values): timings are real, outputs are
not language. Every time is CUDA events, median [p10, p90] of --reps repetitions after 3 warm-ups
(measure/timing.py). What is measured, in order (each model loaded alone, then released, so an
80 GB GPU holds every step):
- `draft_step_ms`, `draft_step_long_ms`: one Qwen3-0.6B draft step (body and dense head, fused
  kernels, one CUDA-graph replay) at contexts 300 and 4,000; `draft_step_flashhead_ms` (and `_long`)
  the same with FlashHead at p = c/16. Floors: the body's and the head's weights plus the key-value
  cache the step reads at that context, at the measured copy rate.
- `target_awq_step_ms`, `target_bf16_step_ms`: the decoder's Qwen3-32B target step over one new token
  (fixed width, graphs) at context 300, AWQ int4 (the kernel load_model picks) and bf16. Floors: the
  weights read once.
- `prefill_tflops` (bf16) and `prefill_awq_tflops`: a PREFILL_TOKENS-token prompt's forward as the
  decoder runs prefill, in model FLOPs per second; `peak_tflops`: a PEAK_GEMM_SIZE^3 bf16 GEMM, the
  practical tensor-core peak, in the same run.
- `bandwidth_gbs`: a 2 GiB device-to-device copy (bytes read + written per second).
- Hugging Face eager forward of both architectures (n = 1, context 300), for the table only.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import torch

from contracts.cli import OneLineParser
from contracts.files import write_atomic
from model.cli import run_torch_command
from model.decoder import Decoder
from model.flashhead import build_clustering
from model.graphs import GraphedCall
from model.heads import DenseHead, FlashHead
from model.loading import load_model
from model.pair import draft_routes

from .benchmarks import copy_bandwidth_gbs
from .hf_eager import time_hf_forward
from .speed import DRAFT, DRAFT_SEED, STEP_TOKENS, TARGET, TARGET_AWQ, TARGET_K, TARGET_SEED, draft_step
from .timing import (
    at_least_one,
    check_out,
    floor_ms,
    gpu_environment,
    release_gpu_memory,
    require_cuda,
    time_op,
)

COMMAND = "python -m measure.speed_file"
CONTEXT, LONG_CONTEXT = 300, 4000
CACHE_SLOTS = LONG_CONTEXT + 128
PREFILL_TOKENS = 2048
PEAK_GEMM_SIZE = 8192
FIELDS = (
    "draft_step_ms",
    "draft_floor_ms",
    "draft_step_long_ms",
    "draft_floor_long_ms",
    "target_awq_step_ms",
    "target_awq_floor_ms",
    "target_bf16_step_ms",
    "target_bf16_floor_ms",
    "prefill_tflops",
    "peak_tflops",
    "bandwidth_gbs",
    "gpu",
    "commit",
)


def kv_cache_bytes(config, context: int, element_size: int) -> int:
    """Key and value bytes a decode step reads at `context`, over every layer (full attention)."""
    return 2 * config.n_layers * config.n_kv_heads * config.head_dim * context * element_size


def prefill_flops(config, tokens: int) -> float:
    """Model FLOPs of a `tokens`-token prefill: 2 per weight per token in every layer's projections
    (logical weights: an int4 weight counts as one), causal attention (QK^T and PV over half the
    square), and the head over the last token only."""
    attention_width = config.n_heads * config.head_dim
    per_layer = (
        config.hidden_size * (attention_width + 2 * config.n_kv_heads * config.head_dim)  # q, k, v
        + attention_width * config.hidden_size  # o
        + 3 * config.hidden_size * config.intermediate_size  # gate, up, down
    )
    projections = 2 * config.n_layers * per_layer * tokens
    attention = 2 * 2 * config.n_layers * attention_width * tokens * tokens / 2
    return projections + attention + 2 * config.vocab_size * config.hidden_size


def draft_measurements(device: torch.device, reps: int, bandwidth_gbs: float) -> dict:
    """The draft step with the dense head and with FlashHead p = c/16 at both contexts, and its floors:
    the body's and the head's bytes plus the key-value cache read at that context."""
    model = load_draft_long(device)
    heads = {
        "": DenseHead(model.head_weight),
        "_flashhead": FlashHead(model.head_weight, build_clustering(model.head_weight, seed=0)),
    }
    out = {}
    for suffix, context in (("", CONTEXT), ("_long", LONG_CONTEXT)):
        steps = [(torch.tensor([[t]], device=device), torch.tensor([context], device=device)) for t in STEP_TOKENS]
        kv = kv_cache_bytes(model.config, context, model.head_weight.element_size())
        for head_name, head in heads.items():
            step = GraphedCall(draft_step(model, head), enabled=True)
            out[f"draft_step{head_name}{suffix}"] = time_op(step, steps, device, reps=reps)
            weights = model.body_parameters_bytes() + head.bytes_per_call()
            out[f"draft_floor{head_name}{suffix}_ms"] = floor_ms(weights + kv, bandwidth_gbs)
    return out


def load_draft_long(device: torch.device):
    """The synthetic Qwen3-0.6B draft, bf16, fused kernels, with room for the long context, on the
    drafts' default speed routes (model.pair.draft_routes)."""
    model = load_model(DRAFT, device, "bfloat16", DRAFT_SEED, CACHE_SLOTS, kernels="fused").model
    draft_routes(model)
    return model


def target_measurements(name: str, key: str, device: torch.device, reps: int, bandwidth_gbs: float) -> dict:
    """The decoder's target step over one new token at CONTEXT, its floor, and a prefill's TFLOPS."""
    model = load_model(name, device, "bfloat16", TARGET_SEED, max(CACHE_SLOTS, PREFILL_TOKENS + 64)).model
    step = Decoder(model, K=TARGET_K).target_forward
    vocab = model.config.vocab_size
    inputs = [
        (torch.randint(0, vocab, (1, 1), device=device), torch.tensor([CONTEXT], device=device)) for _ in range(3)
    ]
    out = {
        f"target_{key}_step": time_op(step, inputs, device, reps=reps),
        f"target_{key}_floor_ms": floor_ms(model.body_parameters_bytes() + model.head_bytes(), bandwidth_gbs),
    }
    head = DenseHead(model.head_weight)
    prompts = [
        (torch.randint(0, vocab, (1, PREFILL_TOKENS), device=device), torch.arange(PREFILL_TOKENS, device=device))
        for _ in range(2)
    ]
    prefill = time_op(
        lambda t, p: head.argmax(model.forward_hidden(t, p)[0, -1:]), prompts, device, reps=max(3, reps // 4)
    )
    out[f"prefill_{key}"] = prefill
    out[f"prefill_{key}_tflops"] = prefill_flops(model.config, PREFILL_TOKENS) / (prefill["median_ms"] * 1e-3) / 1e12
    return out


def peak_measurement(device: torch.device, reps: int) -> dict:
    """A large bf16 GEMM: the practical tensor-core peak the prefill is compared with."""
    n = PEAK_GEMM_SIZE
    a, b = (torch.randn(n, n, device=device, dtype=torch.bfloat16) for _ in range(2))
    gemm = time_op(torch.mm, [(a, b)], device, reps=reps)
    return {"peak_gemm": gemm, "peak_tflops": 2 * n**3 / (gemm["median_ms"] * 1e-3) / 1e12}


def hugging_face_measurements(device: torch.device, reps: int) -> dict:
    out = {}
    for name, key in ((DRAFT, "hf_eager_draft"), (TARGET, "hf_eager_target")):
        out[key] = time_hf_forward(name, device, [1], CONTEXT, reps)["forward_ms"][1]
        release_gpu_memory()
    return out


def speed_record(measured: dict, gpu: str, commit: str, bandwidth_gbs: float) -> dict:
    """The speed file: FIELDS first (medians in ms, floors, TFLOPS), then `timings`, every timing
    with its spread, and the ratios to the floors the goals are stated in."""
    record = {
        "draft_step_ms": measured["draft_step"]["median_ms"],
        "draft_floor_ms": measured["draft_floor_ms"],
        "draft_step_long_ms": measured["draft_step_long"]["median_ms"],
        "draft_floor_long_ms": measured["draft_floor_long_ms"],
        "target_awq_step_ms": measured["target_awq_step"]["median_ms"],
        "target_awq_floor_ms": measured["target_awq_floor_ms"],
        "target_bf16_step_ms": measured["target_bf16_step"]["median_ms"],
        "target_bf16_floor_ms": measured["target_bf16_floor_ms"],
        "prefill_tflops": measured["prefill_bf16_tflops"],
        "peak_tflops": measured["peak_tflops"],
        "bandwidth_gbs": bandwidth_gbs,
        "gpu": gpu,
        "commit": commit,
    }
    record["prefill_awq_tflops"] = measured["prefill_awq_tflops"]
    record["draft_step_flashhead_ms"] = measured["draft_step_flashhead"]["median_ms"]
    record["draft_step_flashhead_long_ms"] = measured["draft_step_flashhead_long"]["median_ms"]
    record["share_of_bandwidth"] = {
        "draft_step": record["draft_floor_ms"] / record["draft_step_ms"],
        "draft_step_long": record["draft_floor_long_ms"] / record["draft_step_long_ms"],
        "target_awq_step": record["target_awq_floor_ms"] / record["target_awq_step_ms"],
        "target_bf16_step": record["target_bf16_floor_ms"] / record["target_bf16_step_ms"],
    }
    record["prefill_share_of_peak"] = {
        "bf16": record["prefill_tflops"] / record["peak_tflops"],
        "awq": record["prefill_awq_tflops"] / record["peak_tflops"],
    }
    record["timings"] = {k: v for k, v in measured.items() if isinstance(v, dict)}
    record["floors"] = {k: v for k, v in measured.items() if k.endswith("_ms") and "_floor" in k}
    record["weights"] = "synthetic"
    return record


MARKDOWN_ROWS = (  # label, timing, floor (a key of the measurements, or None)
    ("draft step, dense head, context 300", "draft_step", "draft_floor_ms"),
    ("draft step, FlashHead, context 300", "draft_step_flashhead", "draft_floor_flashhead_ms"),
    ("draft step, dense head, context 4,000", "draft_step_long", "draft_floor_long_ms"),
    ("draft step, FlashHead, context 4,000", "draft_step_flashhead_long", "draft_floor_flashhead_long_ms"),
    ("target 32B AWQ step, 1 token", "target_awq_step", "target_awq_floor_ms"),
    ("target 32B bf16 step, 1 token", "target_bf16_step", "target_bf16_floor_ms"),
    (f"prefill bf16, {PREFILL_TOKENS} tokens", "prefill_bf16", None),
    (f"prefill AWQ, {PREFILL_TOKENS} tokens", "prefill_awq", None),
    (f"bf16 GEMM {PEAK_GEMM_SIZE}^3", "peak_gemm", None),
    ("Hugging Face eager 0.6B, 1 token, context 300", "hf_eager_draft", None),
    ("Hugging Face eager 32B bf16, 1 token, context 300", "hf_eager_target", None),
)


def markdown(record: dict, command: str) -> str:
    """The table beside the JSON: each timing with p10/p90, its floor and share of bandwidth."""
    timings, floors = record["timings"], record["floors"]
    lines = [
        f"# Speed on {record['gpu']} (commit {record['commit']})",
        "",
        "**Weights: SYNTHETIC** (exact shapes, seeded random values: timings are real).",
        f"Command: `{command}`. Copy rate {record['bandwidth_gbs']:.0f} GB/s.",
        "",
        "| step | median ms | p10 | p90 | floor ms | share of bandwidth |",
        "|---|---|---|---|---|---|",
    ]
    for label, key, floor_key in MARKDOWN_ROWS:
        t = timings[key]
        floor = floors.get(floor_key)
        floor_text, share_text = ("-", "-") if floor is None else (f"{floor:.3f}", f"{floor / t['median_ms']:.0%}")
        lines.append(
            f"| {label} | {t['median_ms']:.3f} | {t['p10_ms']:.3f} | {t['p90_ms']:.3f} | {floor_text} | {share_text} |"
        )
    peak = record["prefill_share_of_peak"]
    lines += [
        "",
        f"Prefill: bf16 {record['prefill_tflops']:.0f} TFLOPS ({peak['bf16']:.0%} of the GEMM's "
        f"{record['peak_tflops']:.0f}), AWQ {record['prefill_awq_tflops']:.0f} TFLOPS ({peak['awq']:.0%}).",
        "",
    ]
    return "\n".join(lines)


def current_commit() -> str:
    """The checkout's commit, or "unknown" where there is no git (a copied tree): pass --commit."""
    try:
        done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return done.stdout.strip() if done.returncode == 0 and done.stdout.strip() else "unknown"


def measure_speed_file(device: torch.device, reps: int) -> tuple[dict, str, float]:
    """Every measurement (FIELDS' sources), the GPU's name and its copy rate."""
    bandwidth_gbs = copy_bandwidth_gbs(device)
    measured: dict = {}
    for step in (
        lambda: draft_measurements(device, reps, bandwidth_gbs),
        lambda: target_measurements(TARGET_AWQ, "awq", device, reps, bandwidth_gbs),
        lambda: target_measurements(TARGET, "bf16", device, reps, bandwidth_gbs),
        lambda: peak_measurement(device, reps),
        lambda: hugging_face_measurements(device, reps),
    ):
        measured.update(step())
        release_gpu_memory()  # this step's models, before the next one loads
    environment = gpu_environment(device, bandwidth_gbs, "seeded random values, real shapes", context=CONTEXT)
    return measured, environment["gpu"], bandwidth_gbs


def parser() -> OneLineParser:
    p = OneLineParser(prog=COMMAND, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="the JSON file to write; the Markdown table goes beside it (.md)")
    p.add_argument("--reps", type=at_least_one, default=20, help="timed repetitions per step (default 20)")
    p.add_argument("--device", default="cuda:0", help="the CUDA GPU to measure on (default cuda:0)")
    p.add_argument("--commit", help="the commit measured (default: git rev-parse of this checkout)")
    return p


def main(argv=None) -> int:
    def body():
        args = parser().parse_args(argv)
        out = check_out(args.out)
        device = require_cuda(COMMAND, args.device, modules=("triton", "transformers"))
        torch.cuda.set_device(device)
        measured, gpu, bandwidth_gbs = measure_speed_file(device, args.reps)
        record = speed_record(measured, gpu, args.commit or current_commit(), bandwidth_gbs)
        command = " ".join([COMMAND, *(argv if argv is not None else sys.argv[1:])])
        write_atomic(out, json.dumps(record, indent=1) + "\n")
        write_atomic(Path(out).with_suffix(".md"), markdown(record, command))
        print(markdown(record, command))
        print(f"wrote {out} and {Path(out).with_suffix('.md')}")

    return run_torch_command(body)


if __name__ == "__main__":
    sys.exit(main())
