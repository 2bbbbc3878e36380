"""python -m measure.routes: each speed route of the decoder on and off, in one GPU call (about 2 minutes a route).

Why: a kernel change is worth keeping when it is measured against the route it replaces on the same GPU
in the same run. Each route here is a setting of the decoder, so "before" and "after" are the same code:

    python -m measure.routes --out reports/speed/h200_routes.json
    python -m measure.routes --out routes.json --routes awq-gemm,draft-attention --reps 10

Weights are SYNTHETIC (the presets' exact shapes, seeded random values): timings are real. Every time is
CUDA events, median [p10, p90] of --reps repetitions after 3 warm-ups (measure/timing.py). Routes (--routes,
default all, in this order):
- `awq-dequant`: the dequantization alone into the buffer, for Qwen3-32B's merged gate/up weight, at each
  launch shape of DEQUANT_LAUNCHES, in GB/s (half a byte read and two written per weight); the fastest
  becomes model.awq_prefill.DEQUANT_LAUNCH for the routes after it in the same run.
- `awq-gemm`: one AWQ linear of each of Qwen3-32B's shapes (merged q/k/v, o, merged gate/up, down) over
  16 to 2,048 rows, through our Triton w4a16 GEMM and through dequantization into a buffer and
  torch.matmul (model/awq_prefill.py): the rows from which the second wins is where PREFILL_ROWS belongs.
- `awq-fixed-cost`: the int4 GEMM at FIXED_COST_ROWS rows and 320 programs of 128 columns, with split-K
  (10,240 columns, 4 splits) and without (40,960 columns, 1 split), at FIXED_COST_STEPS 128-row steps a
  program, each timed over copies of its weights that overflow L2; a least-squares line through (bytes,
  time) parts the GEMM's fixed cost (us) from its streaming rate (GB/s). Then an empty kernel's time in a
  graph (`empty kernel`): what any launch costs.
- `awq-prefill`: the AWQ Qwen3-32B's forward over a PREFILL_TOKENS-token prompt as the decoder prefills
  it, with the dequantized route at PREFILL_ROWS (on) and without it (off: the Triton GEMM), in TFLOPS
  and as a share of a PEAK_GEMM_SIZE^3 bf16 GEMM timed in the same run.
- `target-attention`: the AWQ Qwen3-32B target step (the decoder's width, one graph replay) at contexts 300
  and 4,000 with each of TARGET_ATTENTION_CHOICES: split-KV off or the slots a split (fused_ops.split_slots_for
  gives the target WIDE_GROUP_SPLIT_SLOTS) and below it (fused_ops.SHORT_SPLIT_SLOTS), the query rows a
  program (fused_ops.ATTENTION_BLOCK_M) and the slots a loop step (ATTENTION_BLOCK_N), against its floor,
  each with `max_abs_diff` from the first (the default).
- `target-kernels`: the same target step with the settings of TARGET_KERNEL_SETTINGS all off, then turned
  on one after another: the int4 GEMM letting the next kernel launch after its main loop
  (awq_triton.SIGNAL_NEXT), then SwiGLU formed in the gate/up GEMM's last split (AWQLinear.gate_up, the
  planes repacked), then the int4 GEMMs that follow a norm (q/k/v, gate/up) launched early, each program
  waiting for the norm before it reads anything (AWQLinear.launch_early), then down after the gate/up GEMM,
  then each layer's RMSNorms folded into its GEMMs (Transformer.norms_in_gemms), then o after the attention;
  each row with its hidden states' largest difference from all off (`max_abs_diff`: 0 where the bits are the
  same).
- `target-width`: the same step with every target decode forward at 16 rows and 16-row int4 programs (the
  decoder of sessions 17-25), at 8 rows with 16-row programs, and at 8 rows with 8-row programs (the
  default since session 26), each with `max_abs_diff` from the first.
- `target-ablation`: the same step with kernel classes taken out of its graph (TARGET_ABLATIONS: the
  RMSNorms, the attention, the int4 GEMMs, or the GEMMs left as one-element launches), the norms as kernels
  of their own. Its values are then wrong; what it measures is each class's share of the step's critical
  path, its kernels' starts and drains included: a bound on what fusing the class away could buy.
- `draft-attention`: the Qwen3-0.6B draft step (fused kernels, dense head, one graph replay) at contexts
  300 and 4,000 with split-KV attention off and at each of SPLIT_CHOICES slots per program, against
  the step's floor (weights, head and the key-value cache read at a copy rate measured in the same run).
- `draft-layer`: the same draft step with the q/k norms, RoPE and cache write in their own kernel (`qkv off`)
  and inside the split attention (`qkv_attention`) with COMBINE_CHOICES splits merged per step of its
  combine (`qkv on, combine C`; fused_ops.COMBINE_CHUNK is the default).
- `draft-gemv`: each dense linear of the Qwen3-0.6B and Llama-3.2-1B drafts (merged q/k/v, o, merged
  gate/up, down with SwiGLU) at 1, 4 and 16 rows, through cuBLAS (F.linear; silu_mul then F.linear for
  down) and through model/dense_gemv.py at each launch of GEMV_LAUNCHES and each split that divides the
  steps, in GB/s of weights and as a share of the copy bandwidth. Each timing is one graph replay over
  enough copies of the weight to overflow L2 (as the layers of a step do), divided by the copies. The
  launch fastest over the three row counts becomes dense_gemv.LAUNCHES[shape] for the rest of the run (and
  is printed, to be kept there); then the Qwen3-0.6B draft step (dense head, graphed, context 300) with
  the route off and on, against its floor, with the kernels one eager step launches.
- `draft-persistent`: the Qwen3-0.6B draft step (dense head, one graph replay) at contexts 300 and 4,000
  through the fused kernels (7 launches a layer) and through model/persistent_body.py (one launch for
  the body), against the floor, each with the largest difference of its hidden state from the fused
  kernels' at the same step (`max_abs_diff`, bfloat16 rounding apart) and, for the persistent kernel,
  its phases' times from one traced step (`phases_us`).
- `draft-chain`: a round's CHAIN_STEPS draft steps (the decoder's draft: persistent body, dense head), each
  fed the token the last one proposed, at contexts 300 and 4,000, replayed as a graph per body and per head
  (as the decoder's proposals run), as a graph per step, and as one graph for the round: the whole and a
  step's time (`step_ms`) against a step's floor.
- `draft-prefill`: the Qwen3-0.6B draft's prefill (the decoder's draft: fused kernels, the GEMV routes) at
  PREFILL_PROMPTS prompt lengths, eager (one forward of the prompt, the decoder before session 34), in
  chunks of each one of PREFILL_CHUNKS tokens, and in chunks of the decoder's widths (model/prefill.py,
  CHUNK_WIDTHS), each chunk a graph replay, with its TFLOPS. Eager, the spread is the host's launch speed.
Needs a CUDA GPU with room for the AWQ Qwen3-32B with its repacked planes (about 40 GB) and triton.
Writes --out (JSON): `env`, `routes` and `rows`, each with route, setting, shape or context, the timing, and
`tflops` or `floor_ms` where they apply.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

import torch
import torch.nn.functional as F

from model import awq_prefill, awq_triton, dense_gemv, fused_ops, persistent_body
from model import decoder as decoder_module
from model.awq import AWQLinear
from model.cli import run_torch_command
from model.decoder import Decoder
from model.graphs import GraphedCall
from model.heads import DenseHead
from model.loading import load_model
from model.pair import draft_routes
from model.prefill import CHUNK_WIDTHS, GraphedPrefill
from model.presets import PRESETS

from .benchmarks import copy_bandwidth_gbs
from .speed import DRAFT, DRAFT_SEED, STEP_TOKENS, TARGET_AWQ, TARGET_K, TARGET_SEED, draft_step
from .speed_file import (
    CONTEXT,
    LONG_CONTEXT,
    PEAK_GEMM_SIZE,
    PREFILL_TOKENS,
    kv_cache_bytes,
    load_draft_long,
    peak_measurement,
    prefill_flops,
)
from .timing import (
    environment_header,
    floor_ms,
    gpu_command_parser,
    gpu_environment,
    release_gpu_memory,
    start_gpu_command,
    time_op,
    write_result,
)

COMMAND = "python -m measure.routes"
ROUTES = (
    "awq-dequant",
    "awq-gemm",
    "awq-fixed-cost",
    "awq-prefill",
    "target-attention",
    "target-kernels",
    "target-width",
    "target-ablation",
    "draft-attention",
    "draft-layer",
    "draft-gemv",
    "draft-persistent",
    "draft-chain",
    "draft-prefill",
)
DEQUANT_LAUNCHES = [
    {"BLOCK_IN": block_in, "BLOCK_OUT": block_out, "num_warps": warps}
    for block_in in (8, 16, 32, 64)
    for block_out in (128, 256, 512, 1024)
    for warps in (4, 8)
]
GEMM_ROWS = (16, 65, 128, 256, 2048)  # 65: the widest tree verify
FIXED_COST_LAYOUTS = (("split-K", 10240, 4), ("one split", 40960, 1))  # (setting, columns, splits): 320 programs
FIXED_COST_STEPS = (2, 4, 8, 16, 32)  # 128-row steps a program
FIXED_COST_ROWS = 8
SPLIT_CHOICES = (None, 64, 128, 256)  # None: split-KV off (one program per KV head walks the cache)
COMBINE_CHOICES = (1, 4, 8)  # splits merged per step of the split attention's combine
# target-attention's settings: (slots a split, slots a split below that, query rows a program, slots a loop
# step), the default first, then the uniform splits of sessions 15-26; None slots: split-KV off (one program
# per KV head and row block walks the cache)
TARGET_ATTENTION_CHOICES = (
    (512, 128, 16, 64),
    (512, 512, 16, 64),
    (None, 128, 16, 64),
    (1024, 128, 16, 64),
    (256, 128, 16, 64),
    (128, 128, 16, 64),
    (512, 64, 16, 64),
    (512, 128, 8, 64),
    (512, 128, 32, 64),
    (512, 128, 16, 32),
    (128, 128, 16, 32),
    (512, 128, 16, 128),
)
# target-kernels' steps, in order: the int4 GEMM lets the next kernel launch after its main loop, forms SwiGLU in
# its last split, then is launched early itself where a norm is before it (q/k/v, gate/up), then also after the
# gate/up GEMM (down), then takes the RMSNorms in (Transformer.norms_in_gemms), then is also launched early after
# the attention (o)
TARGET_KERNEL_SETTINGS = (
    "signal next",
    "swiglu in gemm",
    "early after norms",
    "early after gemms",
    "norms in gemms",
    "early after attention",
)
# target-width's settings: (decoder.EXACT_WIDTH, awq_triton.BLOCK_M), the sessions 17-25 decoder's first
TARGET_WIDTHS = {
    "width 16, 16-row programs": (16, 16),
    "width 8, 16-row programs": (8, 16),
    "width 8, 8-row programs": (8, 8),
}
# target-ablation's settings: the kernel classes taken out of the step's graph (the values are then wrong:
# the timings bound what fusing a class away could buy, each kernel's start and drain included)
TARGET_ABLATIONS = {
    "full": (),
    "no norms": ("norms",),
    "no attention": ("attention",),
    "no norms, no attention": ("norms", "attention"),
    "no GEMMs": ("gemms",),
    "GEMMs as 1-element kernels": ("gemms", "gemm launches"),
}
GEMV_DRAFTS = ("qwen3-0.6b", "llama-3.2-1b")
GEMV_ROWS = (1, 4, 16)
GEMV_LAUNCHES = [  # each with every split of 1, 2, 4, 8 that divides the steps and gives 64 to 1,024 programs
    {"BLOCK_N": block_n, "BLOCK_K": block_k, "num_warps": warps, "num_stages": stages}
    for block_n, block_k, warps, stages in (
        (32, 128, 4, 3),
        (32, 256, 4, 3),
        (64, 128, 4, 3),
        (64, 128, 4, 4),
        (64, 256, 4, 3),
        (128, 128, 4, 3),
        (128, 128, 8, 4),
        (128, 256, 8, 3),
    )
]
GEMV_SPLITS = (1, 2, 4, 8)
CHAIN_STEPS = 6  # draft-chain: the draft steps of a round (the validations' K)
# draft-chain's settings: the graphs a round's draft steps replay
CHAIN_GRAPHS = ("a graph per body and per head", "a graph per step", "one graph for the round")
PREFILL_PROMPTS = (128, 300, 1024, 3000)  # draft-prefill's prompt lengths
PREFILL_CHUNKS = (64, 128, 256, 512, 1024)  # draft-prefill's chunk widths
L2_OVERFLOW_BYTES = 256 * 2**20  # a timing reads this much weight (distinct copies), several times an H200's L2


def parse_routes(text: str) -> tuple[str, ...]:
    """--routes: names from ROUTES joined by commas ("all": every one), in ROUTES' order."""
    if text == "all":
        return ROUTES
    names = [name.strip() for name in text.split(",")]
    unknown = [name for name in names if name not in ROUTES]
    if unknown or not names:
        named = ", ".join(unknown) or repr(text)
        raise argparse.ArgumentTypeError(f"unknown route {named} (choices: {', '.join(ROUTES)} or all)")
    return tuple(route for route in ROUTES if route in names)


def awq_shapes(config) -> dict[str, tuple[int, int]]:
    """(in, out) of each AWQ linear the fused kernels run, merged where they merge."""
    hidden, attention = config.hidden_size, config.n_heads * config.head_dim
    return {
        "qkv": (hidden, attention + 2 * config.n_kv_heads * config.head_dim),
        "o": (attention, hidden),
        "gate_up": (hidden, 2 * config.intermediate_size),
        "down": (config.intermediate_size, hidden),
    }


def awq_dequant_rows(device: torch.device, reps: int) -> list[dict]:
    """The gate/up weight's dequantization at each launch shape, fastest kept for the rest of the run."""
    config = PRESETS[TARGET_AWQ]
    in_features, out_features = awq_shapes(config)["gate_up"]
    layer = AWQLinear(in_features, out_features, config.awq_group_size).to(device)
    layer.randomize_(torch.Generator(device=device).manual_seed(TARGET_SEED))
    out = torch.empty(in_features, out_features, dtype=torch.bfloat16, device=device)
    moved = in_features * out_features * 2.5  # bytes: half a byte read, two written
    rows = []
    for launch in DEQUANT_LAUNCHES:
        awq_prefill.DEQUANT_LAUNCH = launch
        args = (layer.qweight, layer.qzeros, layer.scales, layer.group_size, out)
        try:
            timing = time_op(awq_prefill.dequantize_into, [args], device, reps=reps)
        except Exception as error:  # a shape that does not compile or launch is skipped, as head_speed does
            print(f"awq-dequant      {launch} skipped: {type(error).__name__}", flush=True)
            continue
        gbs = moved / (timing["median_ms"] * 1e-3) / 1e9
        setting = f"{launch['BLOCK_IN']}x{launch['BLOCK_OUT']} w{launch['num_warps']}"
        rows.append(
            {"route": "awq-dequant", "setting": setting, "launch": launch, "shape": "gate_up", **timing, "gbs": gbs}
        )
    awq_prefill.DEQUANT_LAUNCH = min(rows, key=lambda row: row["median_ms"])["launch"]
    print(f"awq-dequant      chosen {awq_prefill.DEQUANT_LAUNCH}", flush=True)
    release_gpu_memory()
    return rows


def awq_gemm_rows(device: torch.device, reps: int) -> list[dict]:
    """Both routes of one AWQ linear per Qwen3-32B shape and row count."""
    config = PRESETS[TARGET_AWQ]
    generator = torch.Generator(device=device).manual_seed(TARGET_SEED)
    rows = []
    for name, (in_features, out_features) in awq_shapes(config).items():
        layer = AWQLinear(in_features, out_features, config.awq_group_size).to(device)
        layer.randomize_(generator)
        layer.select_kernel("triton", dtype=torch.bfloat16)
        holder = torch.nn.Sequential(layer)
        awq_prefill.attach(holder, torch.bfloat16)
        for m in GEMM_ROWS:
            x = torch.randn(m, in_features, device=device, dtype=torch.bfloat16)
            flops = 2 * m * in_features * out_features
            for setting, threshold in (("triton", None), ("dequant+cublas", 1)):
                awq_prefill.set_rows(holder, threshold)
                timing = time_op(layer, [(x,)], device, reps=reps)
                tflops = flops / (timing["median_ms"] * 1e-3) / 1e12
                rows.append(
                    {"route": "awq-gemm", "setting": setting, "shape": name, "rows": m, **timing, "tflops": tflops}
                )
    release_gpu_memory()
    return rows


def awq_fixed_cost_rows(device: torch.device, reps: int, bandwidth_gbs: float) -> list[dict]:
    """The int4 GEMM's time at each of FIXED_COST_STEPS per layout of FIXED_COST_LAYOUTS, the line through
    them (a `fit` row per layout), and an empty kernel's time in a graph."""
    generator = torch.Generator(device=device).manual_seed(TARGET_SEED)
    rows = []
    for setting, out_features, splits in FIXED_COST_LAYOUTS:
        points = []
        for steps in FIXED_COST_STEPS:
            in_features = steps * splits * awq_triton.STEP_IN
            planes = random_planes(in_features, out_features, generator)
            nbytes = planes.codes.numel() * 4 + planes.groups.numel() * 4
            copies = [
                planes._replace(codes=planes.codes.clone(), groups=planes.groups.clone())
                for _ in range(max(2, L2_OVERFLOW_BYTES // nbytes))
            ]
            x = torch.randn(FIXED_COST_ROWS, in_features, device=device, dtype=torch.bfloat16, generator=generator)
            tickets = torch.zeros(out_features // planes.block_n, dtype=torch.int32, device=device)

            def gemm(x, weights, splits=splits, tickets=tickets):
                return awq_triton.w4a16_matmul(x, weights, splits=splits, tickets=tickets)

            timing = time_over_copies(gemm, copies, x, device, reps)
            gbs = nbytes / timing["median_ms"] / 1e6
            shape = f"{in_features}x{out_features}"
            row = {"route": "awq-fixed-cost", "setting": setting, "shape": shape, "rows": FIXED_COST_ROWS, **timing}
            rows.append({**row, "gbs": gbs, "share_of_bandwidth": gbs / bandwidth_gbs})
            points.append((nbytes, timing["median_ms"]))
            del planes, copies
            release_gpu_memory()
        fixed_us, streaming_gbs = fixed_cost_line(points)
        rows.append(
            {
                "route": "awq-fixed-cost",
                "setting": setting,
                "fixed_us": fixed_us,
                "streaming_gbs": streaming_gbs,
                "share_of_bandwidth": streaming_gbs / bandwidth_gbs,
            }
        )
    flag = torch.zeros(1, device=device)
    timing = time_over_copies(lambda x, _: x.add_(1), [None] * 16, flag, device, reps)
    rows.append({"route": "awq-fixed-cost", "setting": "empty kernel", "shape": "1 element", **timing})
    return rows


def random_planes(in_features: int, out_features: int, generator: torch.Generator) -> awq_triton.Planes:
    """The planes of a synthetic AWQ layer (AWQLinear.randomize_) in Qwen3-32B-AWQ's groups."""
    layer = AWQLinear(in_features, out_features, PRESETS[TARGET_AWQ].awq_group_size).to(generator.device)
    layer.randomize_(generator)
    return layer.planes()


def fixed_cost_line(points: list[tuple[int, float]]) -> tuple[float, float]:
    """The least-squares line through (bytes, ms) points: (its time at zero bytes in us, the bytes' rate in
    GB/s)."""
    if len({b for b, _ in points}) < 2:
        raise ValueError(f"a line needs two or more distinct byte counts, got {[b for b, _ in points]}")
    mean_bytes = sum(b for b, _ in points) / len(points)
    mean_ms = sum(ms for _, ms in points) / len(points)
    spread = sum((b - mean_bytes) ** 2 for b, _ in points)
    slope = sum((b - mean_bytes) * (ms - mean_ms) for b, ms in points) / spread  # ms a byte
    return (mean_ms - slope * mean_bytes) * 1e3, 1 / slope / 1e6


def awq_prefill_rows(device: torch.device, reps: int) -> list[dict]:
    """The AWQ 32B prefill with the dequantized route on and off, and the GEMM peak it is compared with."""
    rows = prefill_timings(device, reps)
    release_gpu_memory()  # the 32B model, before the GEMM's operands
    peak = peak_measurement(device, reps)
    for row in rows:
        row["share_of_peak"] = row["tflops"] / peak["peak_tflops"]
    gemm = {"route": "awq-prefill", "setting": f"bf16 GEMM {PEAK_GEMM_SIZE}^3", **peak["peak_gemm"]}
    return [*rows, {**gemm, "tflops": peak["peak_tflops"]}]


def prefill_timings(device: torch.device, reps: int) -> list[dict]:
    """The AWQ 32B forward over a PREFILL_TOKENS-token prompt and its last token's argmax, route off and on."""
    model = load_model(TARGET_AWQ, device, "bfloat16", TARGET_SEED, PREFILL_TOKENS + 64).model
    head = DenseHead(model.head_weight)
    vocab = model.config.vocab_size
    prompts = [
        (torch.randint(0, vocab, (1, PREFILL_TOKENS), device=device), torch.arange(PREFILL_TOKENS, device=device))
        for _ in range(2)
    ]
    flops = prefill_flops(model.config, PREFILL_TOKENS)
    rows = []
    for setting, threshold in (("off", None), ("on", awq_prefill.PREFILL_ROWS)):
        awq_prefill.set_rows(model, threshold)
        timing = time_op(
            lambda t, p: head.argmax(model.forward_hidden(t, p)[0, -1:]), prompts, device, reps=max(3, reps // 4)
        )
        tflops = flops / (timing["median_ms"] * 1e-3) / 1e12
        rows.append({"route": "awq-prefill", "setting": setting, "tokens": PREFILL_TOKENS, **timing, "tflops": tflops})
    return rows


def draft_attention_rows(device: torch.device, reps: int, bandwidth_gbs: float) -> list[dict]:
    """The draft step (dense head, graphed) at both contexts with each split-KV setting."""

    def split(slots):
        return lambda model: setattr(model, "attention_split_slots", slots)

    settings = {"off" if slots is None else f"split {slots}": split(slots) for slots in SPLIT_CHOICES}
    return draft_step_rows("draft-attention", settings, device, reps, bandwidth_gbs)


def set_target_attention(model, slots: int | None, short: int, rows_per_program: int, slots_per_step: int) -> None:
    """One of TARGET_ATTENTION_CHOICES on a model, with tickets for its row blocks (none memset in the step)."""
    model.attention_split_slots = slots
    fused_ops.SHORT_SPLIT_SLOTS = short
    fused_ops.ATTENTION_BLOCK_M, fused_ops.ATTENTION_BLOCK_N = rows_per_program, slots_per_step
    config = model.config
    model.attention_tickets = fused_ops.attention_tickets(config.n_heads, config.n_kv_heads, model.head_weight.device)


def attention_setting_name(slots: int | None, short: int, rows_per_program: int, slots_per_step: int) -> str:
    split = "off" if slots is None else f"split {slots}" + (f" ({short} below)" if short < slots else "")
    return f"{split}, {rows_per_program} rows, {slots_per_step} slots"


def target_attention_rows(device: torch.device, reps: int, bandwidth_gbs: float) -> list[dict]:
    """The target step at each of TARGET_ATTENTION_CHOICES; fused_ops' defaults are put back after."""
    defaults = (fused_ops.SHORT_SPLIT_SLOTS, fused_ops.ATTENTION_BLOCK_M, fused_ops.ATTENTION_BLOCK_N)
    settings = {
        attention_setting_name(*choice): lambda model, choice=choice: set_target_attention(model, *choice)
        for choice in TARGET_ATTENTION_CHOICES
    }
    try:
        return target_step_rows("target-attention", settings, device, reps, bandwidth_gbs, compare=True)
    finally:
        fused_ops.SHORT_SPLIT_SLOTS, fused_ops.ATTENTION_BLOCK_M, fused_ops.ATTENTION_BLOCK_N = defaults


def target_kernel_choices() -> dict[str, tuple[bool, ...]]:
    """target-kernels' settings: all off, then each of TARGET_KERNEL_SETTINGS turned on after the ones before."""
    count = len(TARGET_KERNEL_SETTINGS)
    names = ("all off", *TARGET_KERNEL_SETTINGS)
    return {name: tuple(index < on for index in range(count)) for on, name in enumerate(names)}


def set_target_kernels(
    model,
    signal_next: bool,
    swiglu_in_gemm: bool,
    early_after_norms: bool = False,
    early_after_gemms: bool = False,
    norms_in_gemms: bool = False,
    early_after_attention: bool = False,
) -> None:
    """One of target_kernel_choices on an AWQ model on the fused kernels."""
    awq_triton.SIGNAL_NEXT = signal_next
    model.norms_in_gemms = norms_in_gemms
    for layer in model.layers:
        gate_up = layer.mlp.gate_up_proj
        if gate_up.gate_up != swiglu_in_gemm:  # its planes repacked in the other column order
            gate_up.gate_up = swiglu_in_gemm
            gate_up.select_kernel("triton", dtype=torch.bfloat16)
        layer.self_attn.qkv_proj.launch_early = gate_up.launch_early = early_after_norms
        layer.self_attn.o_proj.launch_early = early_after_attention
        layer.mlp.down_proj.launch_early = early_after_gemms


def target_kernel_state(model) -> tuple[bool, ...]:
    """The model's settings of TARGET_KERNEL_SETTINGS, as set_target_kernels takes them (its first layer's)."""
    attention, mlp = model.layers[0].self_attn, model.layers[0].mlp
    after_norms = attention.qkv_proj.launch_early and mlp.gate_up_proj.launch_early
    return (
        awq_triton.SIGNAL_NEXT,
        mlp.gate_up_proj.gate_up,
        after_norms,
        mlp.down_proj.launch_early,
        model.norms_in_gemms,
        attention.o_proj.launch_early,
    )


def target_kernel_rows(device: torch.device, reps: int, bandwidth_gbs: float) -> list[dict]:
    """The target step under each of target_kernel_choices."""
    settings = {
        name: lambda model, choice=choice: set_target_kernels(model, *choice)
        for name, choice in target_kernel_choices().items()
    }
    return target_step_rows("target-kernels", settings, device, reps, bandwidth_gbs, compare=True)


def set_target_width(width: int, rows_per_program: int) -> None:
    """One of TARGET_WIDTHS: the rows of every target decode forward a Decoder made after it runs, and the
    int4 GEMM's rows per program up to that many rows."""
    decoder_module.EXACT_WIDTH = width
    awq_triton.BLOCK_M = rows_per_program


def target_width_rows(device: torch.device, reps: int, bandwidth_gbs: float) -> list[dict]:
    """The target step at each of TARGET_WIDTHS; the defaults are put back after."""
    defaults = (decoder_module.EXACT_WIDTH, awq_triton.BLOCK_M)
    settings = {name: lambda model, choice=choice: set_target_width(*choice) for name, choice in TARGET_WIDTHS.items()}
    try:
        return target_step_rows("target-width", settings, device, reps, bandwidth_gbs, compare=True)
    finally:
        set_target_width(*defaults)


def set_target_ablation(model, taken_out: tuple[str, ...]) -> None:
    """Take TARGET_ABLATIONS' kernel classes out of the fused forward of `model` (an AWQ Qwen3 target at
    decode widths), putting back every other: the RMSNorms (each returns its input), the attention (its
    output is the q slice of q/k/v), the GEMMs (an empty output; with "gemm launches" a one-element fill in
    its place, so that only the launches remain). The norms stay kernels of their own (norms_in_gemms off),
    so that each class is one kernel a place."""
    route, config = model.gemv_route, model.config
    model.norms_in_gemms = False
    fused_ops.rms_norm, fused_ops.qkv_attention = _FUSED_DEFAULTS
    for name in ("project", "mlp"):
        vars(route).pop(name, None)
    if "norms" in taken_out:
        fused_ops.rms_norm = lambda h, weight, eps, delta=None: (h, h)
    if "attention" in taken_out:
        fused_ops.qkv_attention = lambda qkv, *args: qkv[:, : config.n_heads * config.head_dim]
    if "gemms" in taken_out:
        launches = "gemm launches" in taken_out

        def empty(x, columns, gemms=1):
            out = torch.empty(x.shape[0], columns, dtype=x.dtype, device=x.device)
            for column in range(gemms if launches else 0):
                out[:1, column : column + 1].fill_(1.0)  # one-element kernel
            return out

        route.project = lambda layer, x: empty(x, layer.out_features)
        route.mlp = lambda mlp, x: empty(x, config.hidden_size, gemms=2)  # gate/up, then down


_FUSED_DEFAULTS = (fused_ops.rms_norm, fused_ops.qkv_attention)


def target_ablation_rows(device: torch.device, reps: int, bandwidth_gbs: float) -> list[dict]:
    """The target step under each of TARGET_ABLATIONS; every kernel put back after."""
    settings = {
        name: lambda model, taken_out=taken_out: set_target_ablation(model, taken_out)
        for name, taken_out in TARGET_ABLATIONS.items()
    }
    try:
        return target_step_rows("target-ablation", settings, device, reps, bandwidth_gbs)
    finally:
        fused_ops.rms_norm, fused_ops.qkv_attention = _FUSED_DEFAULTS


def target_step_rows(
    route: str, settings: dict, device: torch.device, reps: int, bandwidth_gbs: float, compare: bool = False
) -> list[dict]:
    """The AWQ Qwen3-32B target step (the decoder's fixed width, one graph replay) at contexts CONTEXT
    and LONG_CONTEXT under each setting (name -> a function that sets it on the model), against its floor
    (weights, head and the key-value cache read); the model and the kernels' settings are left at their
    defaults. `compare`: each row also gives the largest difference of a one-token forward's hidden state
    from the first setting's (`max_abs_diff`), at the context, caches alike."""
    model = load_model(TARGET_AWQ, device, "bfloat16", TARGET_SEED, LONG_CONTEXT + 200).model
    defaults = (model.attention_split_slots, *target_kernel_state(model))
    rows = []
    for context in (CONTEXT, LONG_CONTEXT):
        kv_bytes = kv_cache_bytes(model.config, context, model.head_weight.element_size())
        floor = floor_ms(model.body_parameters_bytes() + model.head_bytes() + kv_bytes, bandwidth_gbs)
        vocab = model.config.vocab_size
        steps = [(torch.randint(0, vocab, (1, 1), device=device), torch.tensor([context], device=device))] * 3
        first = None
        for setting, apply in settings.items():
            apply(model)
            decoder = Decoder(model, K=TARGET_K)
            row = {"route": route, "setting": setting, "context": context}
            if compare:
                hidden = model.forward_hidden(*steps[0]).float()
                first = hidden if first is None else first
                row["max_abs_diff"] = (hidden - first).abs().max().item()
            timing = time_op(decoder.target_forward, steps, device, reps=reps)
            rows.append({**row, **timing, "floor_ms": floor})
    model.attention_split_slots = defaults[0]
    set_target_kernels(model, *defaults[1:])
    return rows


def draft_layer_rows(device: torch.device, reps: int, bandwidth_gbs: float) -> list[dict]:
    """The draft step (dense head, graphed) at both contexts with the q/k preparation in its own kernel
    (`qkv off`), and inside the split attention with each combine chunk (`qkv on, combine C`)."""

    def chosen(inside: bool, chunk: int):
        def apply(model):
            model.qkv_in_attention = inside
            fused_ops.COMBINE_CHUNK = chunk

        return apply

    settings = {"qkv off": chosen(False, fused_ops.COMBINE_CHUNK)}
    settings.update({f"qkv on, combine {chunk}": chosen(True, chunk) for chunk in COMBINE_CHOICES})
    return draft_step_rows("draft-layer", settings, device, reps, bandwidth_gbs)


def load_fused_draft(device: torch.device):
    """The speed file's draft with its one-token steps on the fused kernels (the persistent step
    detached): what the draft routes' settings change."""
    model = load_draft_long(device)
    persistent_body.attach(model, False)
    return model


def draft_persistent_rows(device: torch.device, reps: int, bandwidth_gbs: float) -> list[dict]:
    """The draft step (dense head, graphed) through the fused kernels and through the persistent kernel."""
    settings = {
        "fused kernels": lambda model: persistent_body.attach(model, False),
        "persistent": lambda model: persistent_body.attach(model, True),
    }

    def phases(model, step) -> dict:
        return {} if model.persistent_body is None else {"phases_us": model.persistent_body.trace(*step)}

    return draft_step_rows("draft-persistent", settings, device, reps, bandwidth_gbs, compare=True, details=phases)


def chained_steps(setting: str, model, head: DenseHead, steps: int) -> Callable:
    """`steps` draft steps from (token [1, 1], position [1]), each fed the token the last one proposed, in the
    graphs of `setting` (one of CHAIN_GRAPHS; the decoder's proposal replays the first): the proposals [steps]."""

    def body(tokens, position):
        return model.forward_hidden(tokens, position)[0, -1:], position + 1

    def step(tokens, position):
        hidden, position = body(tokens, position)
        return head.argmax(hidden).view(1, 1), position

    def steps_of(one_step):
        def chain(tokens, position):
            proposals = []
            for _ in range(steps):
                tokens, position = one_step(tokens, position)
                proposals.append(tokens)
            return torch.cat(proposals).view(-1)

        return chain

    if setting == CHAIN_GRAPHS[0]:
        body_graph, head_graph = GraphedCall(body), GraphedCall(head.argmax)

        def graphed_step(tokens, position):
            hidden, position = body_graph(tokens, position)
            return head_graph(hidden).view(1, 1), position

        return steps_of(graphed_step)
    if setting == CHAIN_GRAPHS[1]:
        return steps_of(GraphedCall(step))
    return GraphedCall(steps_of(step))


def draft_chain_rows(device: torch.device, reps: int, bandwidth_gbs: float) -> list[dict]:
    """A round's CHAIN_STEPS draft steps (the decoder's draft: persistent body, dense head) at contexts CONTEXT
    and LONG_CONTEXT in each of CHAIN_GRAPHS, the time a step against its floor: what replaying a round's steps
    as fewer graphs would buy (issue 23's third route for the draft step)."""
    model = load_draft_long(device)
    head = DenseHead(model.head_weight)
    rows = []
    for context in (CONTEXT, LONG_CONTEXT):
        inputs = [(torch.tensor([[t]], device=device), torch.tensor([context], device=device)) for t in STEP_TOKENS]
        kv_bytes = kv_cache_bytes(model.config, context + CHAIN_STEPS // 2, model.head_weight.element_size())
        floor = floor_ms(model.body_parameters_bytes() + head.bytes_per_call() + kv_bytes, bandwidth_gbs)
        for setting in CHAIN_GRAPHS:
            timing = time_op(chained_steps(setting, model, head, CHAIN_STEPS), inputs, device, reps=reps)
            step_ms = {key: timing[key] / CHAIN_STEPS for key in ("median_ms", "p10_ms", "p90_ms")}
            row = {"route": "draft-chain", "setting": setting, "context": context, "steps": CHAIN_STEPS}
            rows.append({**row, **timing, "step_ms": step_ms, "floor_ms": floor})
    return rows


def draft_prefill_rows(device: torch.device, reps: int) -> list[dict]:
    """The draft's prefill at each of PREFILL_PROMPTS: eager, in graphed chunks of each one of PREFILL_CHUNKS,
    and in chunks of the decoder's widths (which widths model.prefill.CHUNK_WIDTHS should hold)."""
    model = load_model(DRAFT, device, "bfloat16", DRAFT_SEED, max(PREFILL_PROMPTS) + 64, kernels="fused").model
    draft_routes(model)
    settings = {"eager": GraphedPrefill(model, device, ())}
    settings |= {f"chunks of {width}": GraphedPrefill(model, device, (width,)) for width in PREFILL_CHUNKS}
    settings["decoder's widths"] = GraphedPrefill(model, device, CHUNK_WIDTHS)
    generator = torch.Generator().manual_seed(DRAFT_SEED)
    rows = []
    for length in PREFILL_PROMPTS:
        prompts = [(torch.randint(0, model.config.vocab_size, (1, length), generator=generator).to(device),)]
        flops = prefill_flops(model.config, length)
        for setting, prefill in settings.items():
            timing = time_op(prefill, prompts, device, reps=reps)
            row = {"route": "draft-prefill", "setting": setting, "prompt_len": length, **timing}
            rows.append({**row, "tflops": flops / timing["median_ms"] / 1e9})
    return rows


def draft_step_rows(
    route: str,
    settings: dict,
    device: torch.device,
    reps: int,
    bandwidth_gbs: float,
    compare: bool = False,
    details: Callable | None = None,
) -> list[dict]:
    """The Qwen3-0.6B draft step (dense head, one graph replay) at contexts CONTEXT and LONG_CONTEXT under
    each setting (name -> a function that sets it on the model), against the step's floor; the model and
    fused_ops are left at their defaults. `compare`: each row also gives the largest difference of the
    step's hidden state from the first setting's (`max_abs_diff`), one step at the context, caches alike;
    `details(model, step)`: more fields for the row, after the timing."""
    model = load_fused_draft(device)  # draft-persistent's settings attach the persistent step again
    head = DenseHead(model.head_weight)
    defaults = (model.attention_split_slots, model.qkv_in_attention, fused_ops.COMBINE_CHUNK)
    rows = []
    for context in (CONTEXT, LONG_CONTEXT):
        steps = [(torch.tensor([[t]], device=device), torch.tensor([context], device=device)) for t in STEP_TOKENS]
        weights = model.body_parameters_bytes() + head.bytes_per_call()
        floor = floor_ms(
            weights + kv_cache_bytes(model.config, context, model.head_weight.element_size()), bandwidth_gbs
        )
        first = None
        for setting, apply in settings.items():
            apply(model)
            row = {"route": route, "setting": setting, "context": context}
            if compare:
                hidden = model.forward_hidden(*steps[0]).float()
                first = hidden if first is None else first
                row["max_abs_diff"] = (hidden - first).abs().max().item()
            timing = time_op(GraphedCall(draft_step(model, head)), steps, device, reps=reps)
            rows.append({**row, **timing, "floor_ms": floor, **(details(model, steps[0]) if details else {})})
    model.attention_split_slots, model.qkv_in_attention, fused_ops.COMBINE_CHUNK = defaults
    return rows


def gemv_launches(in_features: int, out_features: int) -> list[dict]:
    """GEMV_LAUNCHES with each split of GEMV_SPLITS that divides the steps and keeps 64..1,024 programs."""
    launches = []
    for launch in GEMV_LAUNCHES:
        tiles, steps = -(-out_features // launch["BLOCK_N"]), -(-in_features // launch["BLOCK_K"])
        for splits in GEMV_SPLITS:
            if steps % splits == 0 and 64 <= tiles * splits <= 1024:
                launches.append({**launch, "splits": splits})
    return launches


def gemv_setting(launch: dict) -> str:
    return f"{launch['BLOCK_N']}x{launch['BLOCK_K']} s{launch['splits']} w{launch['num_warps']} p{launch['num_stages']}"


def time_over_copies(fn, weights: list[torch.Tensor], x: torch.Tensor, device: torch.device, reps: int) -> dict:
    """fn(x, weight) per copy of the weight in one graph replay, per call (ms)."""

    def sweep(x):
        for weight in weights:
            y = fn(x, weight)
        return y

    timing = time_op(GraphedCall(sweep), [(x,)], device, reps=reps)
    return {key: value / len(weights) if key.endswith("_ms") else value for key, value in timing.items()}


def draft_gemv_shape_rows(device: torch.device, reps: int, bandwidth_gbs: float) -> list[dict]:
    """cuBLAS and each GEMV launch per draft shape and row count; the fastest launch kept per shape."""
    rows, generator = [], torch.Generator(device=device).manual_seed(TARGET_SEED)
    for draft in GEMV_DRAFTS:
        for name, (in_features, out_features) in awq_shapes(PRESETS[draft]).items():
            shape_rows = gemv_shape_rows(draft, name, in_features, out_features, generator, reps, bandwidth_gbs)
            best = fastest_gemv_launch(shape_rows)
            dense_gemv.LAUNCHES[(in_features, out_features)] = best
            print(f"draft-gemv       {draft} {name} chosen {best}", flush=True)
            rows += shape_rows
            release_gpu_memory()
    print(f"dense_gemv.LAUNCHES = {dense_gemv.LAUNCHES!r}", flush=True)
    return rows


def gemv_shape_rows(draft: str, name: str, in_features: int, out_features: int, generator, reps: int, bandwidth_gbs):
    """One shape (`down`: SwiGLU fused) through cuBLAS and each GEMV launch at each of GEMV_ROWS rows."""
    device = generator.device
    silu = name == "down"
    weight_bytes = in_features * out_features * 2
    weights = [
        torch.randn(out_features, in_features, device=device, generator=generator, dtype=torch.bfloat16)
        / in_features**0.5
        for _ in range(max(2, L2_OVERFLOW_BYTES // weight_bytes))
    ]
    width = 2 * in_features if silu else in_features
    inputs = {m: torch.randn(m, width, device=device, generator=generator, dtype=torch.bfloat16) for m in GEMV_ROWS}
    settings = {"cublas": lambda x, w: F.linear(fused_ops.silu_mul(x) if silu else x, w)}
    for launch in gemv_launches(in_features, out_features):
        settings[gemv_setting(launch)] = lambda x, w, launch=launch: dense_gemv.gemv(x, w, silu, launch)
    rows = []
    for setting, fn in settings.items():
        try:
            timings = {m: time_over_copies(fn, weights, x, device, reps) for m, x in inputs.items()}
        except Exception as error:  # a launch that does not compile or fit is skipped, as awq-dequant does
            print(f"draft-gemv       {draft} {name} {setting} skipped: {type(error).__name__}", flush=True)
            continue
        for m, timing in timings.items():
            gbs = weight_bytes / (timing["median_ms"] * 1e-3) / 1e9
            rows.append(
                {
                    "route": "draft-gemv",
                    "setting": setting,
                    "draft": draft,
                    "shape": f"{name} {in_features}x{out_features}",
                    "rows": m,
                    **timing,
                    "gbs": gbs,
                    "share_of_bandwidth": gbs / bandwidth_gbs,
                }
            )
    return rows


def fastest_gemv_launch(shape_rows: list[dict]) -> dict:
    """The GEMV launch with the least time summed over the row counts (one launch per shape, whatever M)."""
    totals: dict[str, float] = {}
    for row in shape_rows:
        if row["setting"] != "cublas":
            totals[row["setting"]] = totals.get(row["setting"], 0.0) + row["median_ms"]
    setting = min(totals, key=totals.get)
    block, splits, warps, stages = setting.split()
    block_n, block_k = block.split("x")
    return {
        "BLOCK_N": int(block_n),
        "BLOCK_K": int(block_k),
        "splits": int(splits[1:]),
        "num_warps": int(warps[1:]),
        "num_stages": int(stages[1:]),
    }


def draft_gemv_step_rows(device: torch.device, reps: int, bandwidth_gbs: float) -> list[dict]:
    """The Qwen3-0.6B draft step (dense head, graphed, CONTEXT) on the fused kernels with the GEMV route off
    and on."""
    model = load_fused_draft(device)
    head = DenseHead(model.head_weight)
    steps = [(torch.tensor([[t]], device=device), torch.tensor([CONTEXT], device=device)) for t in STEP_TOKENS]
    weights = model.body_parameters_bytes() + head.bytes_per_call()
    floor = floor_ms(weights + kv_cache_bytes(model.config, CONTEXT, model.head_weight.element_size()), bandwidth_gbs)
    rows = []
    for setting, route_rows in (("off", None), ("on", dense_gemv.MAX_ROWS)):
        dense_gemv.attach(model, route_rows)
        timing = time_op(GraphedCall(draft_step(model, head)), steps, device, reps=reps)
        kernels = device_operations(draft_step(model, head), steps[0])
        rows.append(
            {
                "route": "draft-gemv",
                "setting": f"step {setting}",
                "context": CONTEXT,
                **timing,
                "floor_ms": floor,
                "kernels_per_step": kernels,
                "layers": model.config.n_layers,
            }
        )
    return rows


def device_operations(fn, inputs: tuple) -> int:
    """Kernels (and device copies and memsets) one eager call of `fn` runs, as torch's profiler sees them."""
    fn(*inputs)  # compiled and warm
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profile:
        fn(*inputs)
        torch.cuda.synchronize()
    return sum(1 for event in profile.events() if event.device_type == torch.autograd.DeviceType.CUDA)


def format_row(row: dict) -> str:
    if "fixed_us" in row:
        return (
            f"{row['route']:16s} {row['setting']:16s} {'fit':24s} {row['fixed_us']:.1f} us fixed + the bytes at "
            f"{row['streaming_gbs']:.0f} GB/s ({row['share_of_bandwidth']:.0%} of copy)"
        )
    keys = ("shape", "context", "tokens", "prompt_len", "setting")
    where = next(f"{key} {row[key]}" for key in keys if key in row)
    if "draft" in row:
        where = f"{row['draft']} {row['shape']}"
    if "rows" in row:
        where += f" x {row['rows']} rows"
    extra = f", {row['tflops']:.0f} TFLOPS" if "tflops" in row else ""
    if "gbs" in row:
        extra += f", {row['gbs']:.0f} GB/s"
    if "share_of_bandwidth" in row:
        extra += f" ({row['share_of_bandwidth']:.0%} of copy)"
    if "share_of_peak" in row:
        extra += f" ({row['share_of_peak']:.0%} of peak)"
    if "step_ms" in row:  # a round of draft steps: a step's time against a step's floor
        step = row["step_ms"]["median_ms"]
        extra += f", a step {step:.3f} ms, floor {row['floor_ms']:.3f} ms ({row['floor_ms'] / step:.0%} of bandwidth)"
    elif "floor_ms" in row:
        extra += f", floor {row['floor_ms']:.3f} ms ({row['floor_ms'] / row['median_ms']:.0%} of bandwidth)"
    if "kernels_per_step" in row:
        extra += f", {row['kernels_per_step']} kernels a step ({row['layers']} layers)"
    if "max_abs_diff" in row:
        extra += f", hidden max |diff| {row['max_abs_diff']:.3g}"
    if "phases_us" in row:
        phases = "; ".join(f"{name} {t['work_us']:.1f} + {t['wait_us']:.1f}" for name, t in row["phases_us"].items())
        extra += f"\n    a layer's phases, work + barrier (us, medians over layers): {phases}"
    return (
        f"{row['route']:16s} {row['setting']:16s} {where:24s} {row['median_ms']:9.3f} ms "
        f"[p10 {row['p10_ms']:.3f}, p90 {row['p90_ms']:.3f}]{extra}"
    )


def parser():
    p = gpu_command_parser(COMMAND, __doc__, 20, "timed repetitions per timing")
    p.add_argument("--routes", type=parse_routes, default=ROUTES, help=f"{', '.join(ROUTES)} or all (default all)")
    return p


def main(argv=None) -> int:
    def body():
        args = parser().parse_args(argv)
        out, device = start_gpu_command(COMMAND, args.out, args.device)
        bandwidth_gbs = copy_bandwidth_gbs(device)
        environment = gpu_environment(device, bandwidth_gbs, "seeded random values, real shapes", draft=DRAFT)
        print(environment_header(COMMAND, environment))
        measures = {
            "awq-dequant": lambda: awq_dequant_rows(device, args.reps),
            "awq-gemm": lambda: awq_gemm_rows(device, args.reps),
            "awq-fixed-cost": lambda: awq_fixed_cost_rows(device, args.reps, bandwidth_gbs),
            "awq-prefill": lambda: awq_prefill_rows(device, args.reps),
            "target-attention": lambda: target_attention_rows(device, args.reps, bandwidth_gbs),
            "target-kernels": lambda: target_kernel_rows(device, args.reps, bandwidth_gbs),
            "target-width": lambda: target_width_rows(device, args.reps, bandwidth_gbs),
            "target-ablation": lambda: target_ablation_rows(device, args.reps, bandwidth_gbs),
            "draft-attention": lambda: draft_attention_rows(device, args.reps, bandwidth_gbs),
            "draft-layer": lambda: draft_layer_rows(device, args.reps, bandwidth_gbs),
            "draft-persistent": lambda: draft_persistent_rows(device, args.reps, bandwidth_gbs),
            "draft-chain": lambda: draft_chain_rows(device, args.reps, bandwidth_gbs),
            "draft-prefill": lambda: draft_prefill_rows(device, args.reps),
            "draft-gemv": lambda: [
                *draft_gemv_shape_rows(device, args.reps, bandwidth_gbs),
                *draft_gemv_step_rows(device, args.reps, bandwidth_gbs),
            ],
        }
        rows = []
        for route in args.routes:
            for row in measures[route]():
                print(format_row(row), flush=True)
                rows.append(row)
            release_gpu_memory()
        write_result(out, {"env": environment, "routes": list(args.routes), "rows": rows})
        print(f"wrote {out}")

    return run_torch_command(body)


if __name__ == "__main__":
    sys.exit(main())
