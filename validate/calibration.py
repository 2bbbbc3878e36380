"""In-process calibration: the same graph costs several percent more or less from one process (and one
decoder instance) to the next, while each instance is stable to about 2%. A profile measured in its own
process from an idle device therefore misses a run by that drift. Before its runs, each decoder
instance decodes a calibration prompt (never one of the validation prompts) under `baseline` and
`deferred`; the simulator replays those generations on the profile, pooled over the instances of one
head (`pooled`), and each device cost is scaled by measured / predicted for its phase (target
forwards, draft body, draft head), keeping the profile's shape over context and token count; the read
gap is then fitted to the pool's generations of the kind predicted (`fitted_read_gap`). Without CUDA
graphs (the CPU) no instance has graphs of its own to drift, and one prompt's two generations vary
more than instances do (real Gemma 3 270M on this 2-core VM: 5-10% between prompts): there the target's
and the draft body's scales pool every instance's generations (`SHARED_MODEL_COSTS`), and only the
head's stays its instance's. Re-predicting session 12-13's real Gemma runs so moved the heads run from
median 3.3% / max 7.9% to 2.1% / 5.1% and the trees run from 1.3% / 5.8% to 0.5% / 4.0%. On one device
the draft's prefill is scaled the same way (`draft_prefill_ms`): it is paid once a generation, so a
read gap fitted with it unscaled would charge its error to every round. The runs that are predicted
never enter their own calibration."""

from __future__ import annotations

from dataclasses import dataclass

from contracts.names import REGIME_OF_GRAPHS_FLAG
from contracts.profile import TREE_ATTENTION_COSTS
from sim.profile import load_profile
from sim.sampling_costs import sampled_head_cost_path

from .heads import head_cost_path
from .plan import Config, tree_slug
from .predict import draft_prefill_ms, predict

SCHEDULES = ("baseline", "deferred")
# The phases whose measured / predicted ratio scales each profile cost; target forwards are verifies
# and standalone appends alike.
PHASES_OF_COST = {"target.forward_ms": ("verify", "finalize"), "draft.body_ms": ("draft_body",)}
HEAD_COSTS = {"dense": "draft.head_dense_ms", "flashhead": "draft.head_flashhead_ms"}
# the costs of the models every decoder instance shares (its head is its own)
SHARED_MODEL_COSTS = (*PHASES_OF_COST, *TREE_ATTENTION_COSTS.values())


@dataclass
class Calibration:
    """One decoder instance's calibration: its recorded generations and the scale of each cost."""

    group: str  # the decoder instance, e.g. "K4-flashhead"
    prompt_id: str
    records: list  # (Config, probes, trace lines, run summary, trace path) per calibration generation pooled
    scales: dict[str, float]  # profile cost path -> measured / predicted
    read_gap_ms: float | None = None  # the host's mean time from a read to its next launch, as measured
    prefill: tuple = ()  # the draft prefill's edit (draft_prefill_edit)

    def edits(self) -> tuple[tuple[str, str, float], ...]:
        """The scales, the draft prefill's edit and the read gap as the simulator's what-if edits."""
        edits = tuple((path, "*=", factor) for path, factor in sorted(self.scales.items())) + self.prefill
        return edits + ((("host.read_gap_ms", "=", self.read_gap_ms),) if self.read_gap_ms is not None else ())

    def describe(self) -> str:
        scales = ", ".join(f"{path} x{factor:.4f}" for path, factor in sorted(self.scales.items()))
        scales += "".join(f", {described(edit)}" for edit in self.prefill)
        if self.read_gap_ms is not None:
            scales += f", host.read_gap_ms = {self.read_gap_ms:.4f}"
        names = " + ".join(sorted({c.name for c, *_ in self.records}))
        return f"{self.group}: {len(self.records)} generations ({names}) on prompt {self.prompt_id}: {scales}"


def scales_from(records, head: str, profile_path, placement: str, graphs: bool) -> dict[str, float]:
    """measured / predicted device time per cost, over the calibration generations."""
    measured, predicted = {}, {}
    for config, probes, lines, summary, trace in records:
        row, _ = predict(profile_path, trace, lines, config, probes, placement, graphs)
        for phase, ms in (summary.get("phases_ms") or {}).items():
            measured[phase] = measured.get(phase, 0.0) + ms
        for phase, ms in row["phase_ms"].items():
            predicted[phase] = predicted.get(phase, 0.0) + ms
    regime, profile = REGIME_OF_GRAPHS_FLAG["on" if graphs else "off"], load_profile(str(profile_path))
    sampled = any("sample" in line for _, _, lines, _, _ in records for line in lines)
    if sampled:  # a tree's draft ranks its children: it pays the greedy head (sim/sampled_trees.py)
        chains = all(config.tree == "chain" for config, *_ in records)
        head_path = sampled_head_cost_path(profile.raw, regime, head, chains)
    else:
        head_path = head_cost_path(profile_path, head, HEAD_COSTS)
    phases = {**PHASES_OF_COST, head_path: ("draft_head",)}
    scales = {}
    for path, names in phases.items():
        m, p = sum(measured.get(n, 0.0) for n in names), sum(predicted.get(n, 0.0) for n in names)
        if m > 0 and p > 0:
            scales[path] = m / p
    for path, tree_path in TREE_ATTENTION_COSTS.items():  # the same forwards under the tree rule share the phase
        if path in scales and tree_path in profile.costs[regime].named:
            scales[tree_path] = scales[path]
    return scales


def described(edit: tuple) -> str:
    """A calibration's edit as the report shows it: `path xF` for a scale, `path@X=V ms` for a point."""
    path, op, value = edit
    return f"{path} x{value:.4f}" if op == "*=" else f"{path}{op}{value:.4g} ms"


def draft_prefill_edit(records, profile_path, placement: str, graphs: bool) -> tuple:
    """The draft prefill's calibration, as what-if edits (none on two devices, where it runs within TTFT,
    or where nothing was measured). It is paid once a generation, so a read gap fitted without it would
    charge its error to every round. Where the calibration prompt's length lies within the prompt lengths
    the profile measured, measured / predicted scales the cost (its shape there was measured; its level
    drifts as every cost's does). Past them the measurement becomes one more point of the cost: the
    profile's shape there is only an extrapolation, and no ratio holds across it (on an H200 the draft's
    prefill is launch-bound, about 10 ms, up to 1024 tokens and device-bound, 16 ms, at 2662)."""
    if placement == "two-gpu":
        return ()
    drafted = [r for r in records if r[0].schedule != "baseline"]
    measured = sum(draft_prefill_ms(lines) for _, _, lines, _, _ in drafted)
    predicted = sum(
        predict(profile_path, trace, lines, config, probes, placement, graphs)[0]["phase_ms"].get("initial", 0.0)
        for config, probes, lines, _, trace in drafted
    )
    if measured <= 0 or predicted <= 0:
        return ()
    regime = REGIME_OF_GRAPHS_FLAG["on" if graphs else "off"]
    lengths = load_profile(str(profile_path)).costs[regime].draft_prefill.values
    prompt_lens = {max(0, lines[0]["context"] - 1) for _, _, lines, _, _ in drafted}
    if len(lengths) == 1 and len(prompt_lens) == 1 and not lengths[0][0] <= min(prompt_lens) <= lengths[0][-1]:
        generations = sum(1 for _, _, lines, _, _ in drafted for line in lines if line["round"] == 0)
        return (("draft.prefill_ms", f"@{min(prompt_lens)}=", measured / generations),)
    return (("draft.prefill_ms", "*=", measured / predicted),)


def round_ms(line: dict) -> float:
    """A traced round's own time: its phases (they sum to its wall time, the host gap inside `other`),
    less the standalone append that closes a generation (paid once, not by the round)."""
    phases = line["phases_ms"]
    return sum(phases.values()) - phases.get("finalize", 0.0)


def read_gap_from(summaries) -> float | None:
    """The mean host gap after a read over the calibration generations' run summaries (None where not
    recorded)."""
    summaries = list(summaries)
    total = sum(summary.get("host_gap_ms") or 0.0 for summary in summaries)
    count = sum(summary.get("host_gaps") or 0 for summary in summaries)
    return total / count if count else None


def pooled(records: dict, group: str) -> list:
    """The calibration generations that calibrate `group`: the baseline's of every instance for the
    baseline, else those of every instance drafting with the same head. One instance's generation (one
    prompt, about 20 rounds) moved its scales by up to 2x on the head and its gap by 1 ms with a single
    slow round; the instances of one run drift apart far less than that. Tree instances pool apart from
    chain ones: a tree round does more host work around its reads (its tables, its path's moves)."""
    if group == "baseline":
        return [r for group_records in records.values() for r in group_records if r[0].schedule == "baseline"]
    head, tree = group.split("-", 1)[1], group.startswith("tree")
    return [
        r
        for g, group_records in records.items()
        if g.endswith(f"-{head}") and g.startswith("tree") == tree
        for r in group_records
    ]


def host_kind(group: str) -> str:
    """What a decoder instance's rounds do on the host around their reads, to which its read gap is fitted:
    the baseline's, a chain's, a static tree's (its tables, its path's moves) or a dynamic tree's (which also
    rebuilds its tables each round). A dynamic tree's gap fitted with the static trees' pool left its deferred
    rounds about 1.4 ms short each (120 ms over 84 rounds, session 34): they were predicted 4.2% and 4.3% fast
    on one H200 (sessions 33 and 34), and 0.7-1.0% with its own (`reports/trees/README.md`)."""
    if group == "baseline":
        return "baseline"
    if group.startswith("treedynamic"):
        return "dynamic tree"
    return "tree" if group.startswith("tree") else "chain"


def fitted_read_gap(
    records, scales: dict, read_gap_ms: float, profile_path, placement: str, graphs: bool, prefill: tuple = ()
) -> float:
    """The read gap that makes `records` (calibration generations of one kind: baselines, or speculative
    ones) come out at their measured decode time in total, the device costs already scaled. What the
    host does around a read costs more in the loop than the measured gap alone (waking from the wait,
    round bookkeeping that the queue cannot hide): that residual is spread over the generations' reads."""
    edits = tuple((path, "*=", factor) for path, factor in sorted(scales.items())) + prefill
    edits += (("host.read_gap_ms", "=", read_gap_ms),)
    residual, reads = 0.0, 0
    for config, probes, lines, summary, trace in records:
        row, _ = predict(profile_path, trace, lines, config, probes, placement, graphs, edits)
        residual += summary["decode_ms"] - row["decode_ms"]
        reads += summary.get("host_gaps") or 0
    return max(0.0, read_gap_ms + residual / reads) if reads else read_gap_ms


def group_name(config: Config) -> str:
    """The decoder instance a configuration runs on: one per (K, head) of a chain and per (tree, head),
    and one for the baseline."""
    if config.schedule == "baseline":
        return "baseline"
    return f"tree{tree_slug(config.tree)}-{config.head}" if config.tree != "chain" else f"K{config.K}-{config.head}"


def trace_name(group: str, config: Config) -> str:
    """File stem of a calibration generation's trace and summary under the report's traces/."""
    return f"calibration-{group}-{config.name}"
