"""Profile a target/draft pair: every cost of the speculative loop, measured and written as a cost
profile (contracts.profile) with a Markdown summary beside it. `python -m measure` and
`python -m validate --measure` both call `measure_profile`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from contracts import UsageError
from contracts.files import check_output_file
from contracts.heads import check_assets, parse_heads
from contracts.names import tensor_parallel_size
from contracts.policies import CATCH_UP_WIDTHS
from contracts.progress import Progress
from contracts.trees import MAX_K, MAX_NODES
from model.cli import sampling_settings
from model.decoder import cache_room, width
from model.heads import DenseHead, FlashHead
from model.pair import load_pair, resolve_placement
from model.prompts import select_prompts
from model.sampling import SamplingSettings

from . import profile as profile_io
from . import sampling_costs
from .agreement import agreement_curve, draft_hidden_states
from .benchmarks import (
    BOOKKEEPING_NEW_TOKENS,
    CHAIN_BODY_WIDTHS,
    Bench,
    copy_bandwidth_gbs,
    decode_K,
    draft_body_widths,
    draft_costs,
    drafter_costs,
    host_costs,
    round_host_costs,
    split_step_contexts,
    target_costs,
    target_widths,
    tree_body_widths,
    tree_costs,
    verify_widths,
)
from .head_profile import budget_heads, head_cost_section, head_points
from .timing import merged_passes

# Passes over the grid at most (`MeasureSettings.passes`): each is a whole timing of every point.
MAX_PASSES = 9
# Timed and warm-up runs per point at most: 50 and 33 times the defaults (20 and 3; the reports use at most 50
# and 3), so that a mistyped count is refused before it starts a run of days.
MAX_REPS = 1000
MAX_WARMUP = 100


@dataclass(frozen=True)
class MeasureSettings:
    """What to measure, and how carefully. None picks the machine's default."""

    target: str = "qwen3-32b-awq"
    draft: str = "qwen3-0.6b"
    placement: str | None = None  # two-gpu with 2 GPUs, one-gpu with 1, else cpu
    dtype: str | None = None  # bfloat16 on GPU, float32 on CPU
    contexts: tuple[int, ...] = (256, 1024)  # context lengths of the target forward and draft body
    prompt_lengths: tuple[int, ...] = (128, 512)  # prefill costs
    K_max: int = 8  # target forwards are timed for n = 1 .. K_max + 2 new tokens
    probes: tuple[int, ...] | None = None  # FlashHead probe counts; None: 1, 2, 4, ... up to c/4, and c/16
    clustering: str | None = None  # FlashHead assets to load; None: build them from the draft's head
    graphs: tuple[str, ...] | None = None  # "on", "off" or both; None: both on GPU, off on CPU
    kernels: str | None = None  # layer kernels: fused or torch; None: fused for Qwen3 on GPU
    prompts: str = "per-category:2"  # Spec-Bench prompts for the agreement r(p)
    prompts_file: str | None = None
    agreement_max_len: int = 256  # tokens per prompt for r(p)
    reps: int = 20  # timed repetitions per point
    passes: int = 1  # times the target and draft grid is timed in turn; each point the median of its passes
    warmup: int = 3  # warm-up runs per point
    seed: int = 0  # seed of synthetic weights and the clustering
    early_exit_layers: int | None = None  # the early-exit drafter's L (its costs are measured when given)
    lookup_ngram: int = 2  # prompt lookup's max_matching_ngram_size (its search is always measured)
    tree_widths: tuple[int, ...] = ()  # token trees: more target forward and draft body widths (up to MAX_NODES + 1)
    heads: str | None = None  # head specs whose costs go into the heads section (measure/head_profile.py)
    head_assets: str | None = None  # the shortlist/router assets those heads load
    temperature: float = 0.0  # > 0: also time what sampling adds (the profile's sampling.costs)
    top_k: int = 0
    top_p: float = 1.0


def check_settings(settings: MeasureSettings) -> None:
    """Bad settings are refused before any model is loaded."""
    positive = {
        "--K-max": [settings.K_max],
        "--lookup-ngram": [settings.lookup_ngram],
        "--early-exit-layers": [settings.early_exit_layers or 1],
        "--reps": [settings.reps],
        "--passes": [settings.passes],
        "--agreement-max-len": [settings.agreement_max_len],
        "--contexts": list(settings.contexts),
        "--prompt-lengths": list(settings.prompt_lengths),
        "--probes": list(settings.probes or [1]),
    }
    for option, values in positive.items():
        if not values or min(values) < 1:
            raise UsageError(f"{option} must be at least 1, got {','.join(map(str, values)) or 'nothing'}")
    if settings.K_max > MAX_K:
        raise UsageError(f"--K-max must be in 1..{MAX_K} (the largest K a round drafts), got {settings.K_max}")
    if any(not 1 <= n <= MAX_NODES + 1 for n in settings.tree_widths):
        raise UsageError(
            f"--tree-widths must be token counts in 1..{MAX_NODES + 1}, got {','.join(map(str, settings.tree_widths))}"
        )
    if settings.warmup < 0:
        raise UsageError(f"--warmup must be >= 0, got {settings.warmup}")
    for option, value, lowest, highest in (
        ("--reps", settings.reps, 1, MAX_REPS),
        ("--warmup", settings.warmup, 0, MAX_WARMUP),
        ("--passes", settings.passes, 1, MAX_PASSES),
    ):
        if value > highest:
            raise UsageError(f"{option} must be {lowest} to {highest}, got {value}")
    for spec in parse_heads(settings.heads, "--heads") if settings.heads else ():
        check_assets(spec, settings.head_assets)
    if settings.graphs is not None and (not settings.graphs or set(settings.graphs) - {"on", "off"}):
        raise UsageError(f"--graphs takes on, off or on,off, got {','.join(settings.graphs)!r}")
    sampling_of(settings)


def sampling_of(settings: MeasureSettings) -> SamplingSettings:
    """The sampling settings the sampling costs are timed at (checked; greedy: none are timed)."""
    return sampling_settings(settings.temperature, settings.top_k, settings.top_p, settings.seed)


def default_probes(clusters: int) -> list[int]:
    probes, p = [], 1
    while p <= clusters // 4:
        probes.append(p)
        p *= 2
    return sorted(set(probes + [max(1, clusters // 16), max(1, clusters // 4)]))


def measure_profile(settings: MeasureSettings, out: Path, command: str) -> tuple[Path, Path]:
    """Measure every cost on this machine and write the profile `out` and its summary `out`.md."""
    check_settings(settings)
    if tensor_parallel_size(settings.placement or "") is not None:
        raise UsageError(
            f"placement {settings.placement}: run torchrun --nproc-per-node N -m measure --placement "
            f"{settings.placement} --add-to PROFILE (it adds the tensor-parallel target to a profile)"
        )
    check_output_file(Path(out), "--out")
    placement, target_device, _ = resolve_placement(settings.placement)
    regimes = settings.graphs or (("on", "off") if target_device.type == "cuda" else ("off",))
    if "on" in regimes and target_device.type != "cuda":
        raise UsageError("--graphs on needs a GPU placement (CUDA graphs)")
    contexts, prompt_lengths = list(settings.contexts), list(settings.prompt_lengths)
    longest = max(
        max(contexts) + max(width(decode_K(settings.K_max, settings.tree_widths)), CATCH_UP_WIDTHS[-1]),
        max(prompt_lengths),
        settings.agreement_max_len,
        cache_room(min(prompt_lengths), BOOKKEEPING_NEW_TOKENS, min(6, settings.K_max)),
    )
    cache_slots = -(-longest // 16) * 16
    prompts = select_prompts(settings.prompts, settings.prompts_file)
    pair = load_pair(
        settings.target,
        settings.draft,
        placement,
        settings.dtype,
        settings.seed,
        settings.kernels,
        settings.clustering,
        max_seq_len=cache_slots,
        head_assets=settings.head_assets,
    )
    draft_device = pair.draft_device
    clustering = pair.clustering
    probes = list(settings.probes) if settings.probes else default_probes(clustering.clusters)
    sampling = sampling_of(settings)
    if max(probes) > clustering.clusters:
        raise UsageError(
            f"probes {max(probes)} exceed the {clustering.clusters} clusters (valid: 1..{clustering.clusters})"
        )
    fixed_width = width(decode_K(settings.K_max, settings.tree_widths)) if target_device.type == "cuda" else None
    target_contexts = split_step_contexts(contexts, pair.target.model, fixed_width or 0)
    points = progress_points(settings, len(regimes), len(target_contexts), len(probes), sampling.greedy)
    with Progress(points, "measure", "point") as progress:
        bench = Bench(
            pair.target,
            pair.draft,
            target_device,
            draft_device,
            contexts,
            prompt_lengths,
            settings.K_max,
            probes,
            clustering,
            settings.reps,
            settings.warmup,
            lambda what: (progress.note(what), progress.update()),
            settings.tree_widths,
            target_contexts,
        )
        host = host_costs(bench)
        costs, sampled = {}, {}
        heads = budget_heads(pair, settings.heads) if settings.heads else None
        for regime in regimes:
            graphs = regime == "on"
            passes = [_regime_costs(bench, graphs, settings) for _ in range(settings.passes)]
            costs["graphs" if graphs else "eager"] = merged_passes(passes)
            if not sampling.greedy:
                sampled["graphs" if graphs else "eager"] = sampling_costs.sampling_costs(bench, graphs, sampling, heads)
        if settings.heads:  # in the profile's first regime: graphs where it has them
            weights = pair.draft.info["weights"]
            heads_section = {"cost": head_cost_section(bench, heads, "on" in regimes, weights)}
        host["round_bookkeeping_ms"], host["read_gap_ms"] = round_host_costs(bench, prompts[0])
        progress.update()
        states = draft_hidden_states(pair.draft, prompts, draft_device, settings.agreement_max_len)
        agreement = agreement_curve(pair.draft.model.head_weight, clustering, probes, states)
        agreement["source"] = f"{settings.draft} draft hidden states, Spec-Bench {settings.prompts}"
        progress.update()
    bandwidth = copy_bandwidth_gbs(target_device)
    floors = bandwidth_floors(pair, probes, bandwidth)
    backend = FlashHead(pair.draft.model.head_weight, clustering).backend
    notes = notes_for(pair.target.info, pair.draft.info, placement, bandwidth, backend)
    if settings.passes > 1:
        notes.append(
            f"Every target and draft cost is the median of {settings.passes} passes over the grid, each timing "
            f"every point with {settings.reps} repetitions (measure.timing.merged_passes)."
        )
    if target_contexts != sorted(set(contexts)):
        notes.append(
            "target.forward_ms is timed at the profile's contexts and either side of each step its split "
            f"attention takes (contexts {', '.join(map(str, target_contexts))}; measure/benchmarks.py, "
            "split_step_contexts)."
        )
    profile = profile_io.assemble(
        target_info=pair.target.info,
        draft_info=pair.draft.info,
        placement=placement,
        contexts=contexts,
        prompt_lengths=prompt_lengths,
        K_max=settings.K_max,
        cache_slots=cache_slots,
        regimes=costs,
        fixed_width=fixed_width,
        host=host,
        clustering=clustering,
        agreement=agreement,
        devices=[target_device, draft_device],
        notes=notes,
    )
    if settings.heads:
        profile["heads"] = heads_section
    if sampled:
        profile["sampling"] = {"costs": sampling_costs.section(sampled, sampling)}
    return profile_io.write(profile, Path(out), floors, command)


def progress_points(settings: MeasureSettings, regimes: int, target_contexts: int, probes: int, greedy: bool) -> int:
    """The points `measure_profile` times, for its progress line: per regime, each pass over the grid
    (`_regime_costs`), the heads and the sampling costs; then the host costs and the agreement curve."""
    contexts, prompt_lengths = len(settings.contexts), len(settings.prompt_lengths)
    forwards = len(target_widths(settings.K_max, settings.tree_widths))
    # with tree widths, the target forwards and draft frontiers again under the tree rule
    tree_points = forwards + len(tree_body_widths(settings.tree_widths)) if settings.tree_widths else 0
    grid_points = (
        forwards * target_contexts
        + tree_points * contexts
        + 2 * prompt_lengths
        + contexts * len(draft_body_widths(settings.tree_widths))  # the draft body
        + 1  # its dense head
        + probes
        + contexts  # prompt lookup
        + (contexts * len(CHAIN_BODY_WIDTHS) + 1 if settings.early_exit_layers is not None else 0)
    )
    verifies = 2 * len(verify_widths(settings.K_max, settings.tree_widths))  # greedy and sampled at each width
    sampled = 0 if greedy else verifies + 1 + probes
    per_regime = settings.passes * grid_points + head_points(settings.heads) * (1 if greedy else 2) + sampled
    return regimes * per_regime + 3  # host costs, the round's host costs, the agreement curve


def bandwidth_floors(pair, probes, bandwidth_gbs) -> dict:
    """ms a cost cannot beat: the bytes it must read once, at the measured copy bandwidth."""
    if not bandwidth_gbs:
        return {}

    def ms(nbytes):
        return round(nbytes / (bandwidth_gbs * 1e9) * 1e3, 4)

    target, draft = pair.target.model, pair.draft.model
    flash = FlashHead(draft.head_weight, pair.clustering, probes=pair.clustering.default_probes)
    return {
        "target.forward_ms": ms(target.body_parameters_bytes() + target.head_bytes()),
        "draft.body_ms": ms(draft.body_parameters_bytes()),
        "draft.head_dense_ms": ms(DenseHead(draft.head_weight).bytes_per_call()),
        "draft.head_flashhead_ms": f"{ms(flash.bytes_per_call())} at p={flash.probes}",
    }


def _regime_costs(bench: Bench, graphs: bool, settings: MeasureSettings) -> dict:
    """One pass over a regime's grid: every target and draft cost timed once."""
    target_tree, draft_tree = tree_costs(bench, graphs) if settings.tree_widths else ({}, {})
    return {
        "target": {**target_costs(bench, graphs), **target_tree},
        "draft": {**draft_costs(bench, graphs), **drafter_costs(bench, graphs, settings), **draft_tree},
    }


def notes_for(target_info, draft_info, placement, bandwidth, backend) -> list[str]:
    notes = [
        f"Measured by python -m measure on {placement}: every cost timed as the decoder runs it "
        "(GraphedCall per shape, static caches, device-side positions), CUDA events on GPU, "
        "perf_counter on CPU; each repetition starts from an idle device.",
        "target.forward_ms is the decoder's own target step (dense argmax head included; fixed width on GPU, "
        "see model/decoder.py); the target's prefill is eager and the draft's replays graphs of a few chunk widths "
        "on a GPU (model/prefill.py), as in the decoder; draft.body_ms is one draft step "
        "without its head; draft.append_ms is the same operation as one body step. With tree widths, "
        "target.tree_forward_ms and draft.tree_body_ms time them under the tree rule, as a tree decoder "
        "runs them (model/tree_rounds.py).",
        f"FlashHead head backend: {backend}.",
        "host.round_bookkeeping_ms: median per-round host time outside device phases and the read, "
        "from a short real deferred run (Python bookkeeping, launch gaps, token copies); host.read_gap_ms: "
        "median host time from a read's end to the next launch in the same run (on the critical path).",
        "kv_crop_ms: our caches are cropped by moving a device-side cursor (one small copy).",
        f"Layer kernels: target {target_info['kernels']}, draft {draft_info['kernels']}. "
        + (
            "Fused attention (and the torch path on the CPU) reads cache slots up to the last position only, "
            "so costs follow the context."
            if "torch" not in (target_info["kernels"], draft_info["kernels"]) or placement == "cpu"
            else "The torch path on a GPU attends over all static-cache slots (setup.cache_slots), so its costs "
            "depend on the cache size more than on the context: measure with the cache size your runs use."
        ),
    ]
    if "synthetic" in (target_info["weights"], draft_info["weights"]):
        notes.insert(
            0,
            "SYNTHETIC weights (real architectures, seeded random values): costs are real, "
            "the agreement r(p) is not real-language agreement.",
        )
    if bandwidth:
        notes.append(f"Bandwidth floors use the measured device copy rate {bandwidth:.0f} GB/s (read + write).")
    return notes
