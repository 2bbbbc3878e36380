"""The simulator's prediction for a recorded run, and where prediction and measurement part.

The prediction uses the same profile and replays the run's own trace (exact at the recorded K) with
the same schedule, head, probes, placement and regime, so any error is the cost model's, not the
acceptance's.
"""

from __future__ import annotations

import statistics

from contracts.names import REGIME_OF_GRAPHS_FLAG, SIMULATED_PHASES, tensor_parallel_size
from sim import tensor_parallel
from sim.acceptance import TraceReplay
from sim.profile import load_profile
from sim.sampling_costs import sampled_profile
from sim.scenario import Scenario, run, timeline
from sim.schedules import Config as SimConfig
from sim.simulate import simulate

from .plan import Config


def predict(
    profile_path,
    trace_path,
    lines: list[dict],
    config: Config,
    probes: int | None,
    placement: str,
    graphs: bool,
    edits: tuple = (),
) -> tuple[dict, list[str]]:
    """(the simulator's row for this configuration, its notes); `edits` scale profile costs (calibration)."""
    regime_flag = "on" if graphs else "off"
    if config.schedule == "baseline":  # a baseline trace carries no acceptance; only its generations matter
        profile = load_profile(str(profile_path))
        if edits:
            profile = profile.edited(list(edits), REGIME_OF_GRAPHS_FLAG[regime_flag])
        if tensor_parallel_size(placement) is not None:
            profile = tensor_parallel.placed(profile, placement, REGIME_OF_GRAPHS_FLAG[regime_flag], 1.0, (), [])
        by_prompt: dict[str, list[dict]] = {}
        for line in lines:
            by_prompt.setdefault(line["prompt_id"], []).append(line)
        source = TraceReplay(by_prompt, "dense", None)
        sim_config = SimConfig("baseline", "dense", 1, profile.default_probes, placement)
        regime = REGIME_OF_GRAPHS_FLAG[regime_flag]
        notes = [f"profile: {profile.label()} [{profile.source}], regime: {regime}"]
        if source.sampled:
            profile = sampled_profile(profile, regime, notes)
        row = simulate(profile.costs[regime], sim_config, source, source.generations, ceiling=False)
        return row, notes
    rows, resolved = run(
        scenario_for(profile_path, trace_path, config, probes, placement, graphs, edits), ceiling=False
    )
    return rows[-1], resolved.notes


def scenario_for(profile_path, trace_path, config: Config, probes, placement: str, graphs: bool, edits) -> Scenario:
    """The simulator's scenario for a recorded speculative configuration: its own trace, replayed (a
    tree's too: the simulator replays a trace recorded with the very tree, sim/trees.py)."""
    return Scenario(
        profile=str(profile_path),
        acceptance=f"trace:{trace_path}",
        schedules=(config.schedule,),
        heads=(config.head,),
        K=config.K,
        probes=probes,
        placement=placement,
        graphs="on" if graphs else "off",
        edits=tuple(edits),
        tree=None if config.tree == "chain" else config.tree,
    )


def predict_timeline(
    profile_path, trace_path, config: Config, probes: int | None, placement: str, graphs: bool, edits: tuple = ()
) -> tuple[list[tuple], dict]:
    """The simulator's timeline (contracts.timeline intervals, otherData) of a recorded speculative
    configuration's first generation, from the same scenario as `predict`'s."""
    return timeline(scenario_for(profile_path, trace_path, config, probes, placement, graphs, edits))


def phase_rows(summary: dict, predicted: dict, lines: list[dict]) -> list[dict]:
    """Measured (trace phases_ms totals) against predicted (phase_ms) per phase, in ms and as shares of
    each one's decode time. `initial` (the draft's prefill) is measured where it is decode time (one
    device: `draft_prefill_ms`, taken out of `other`); on two devices the decoder finishes it within
    TTFT."""
    measured = dict(summary.get("phases_ms") or {})
    if summary["config"]["schedule"] != "baseline" and summary["config"]["placement"] != "two-gpu":
        measured["initial"] = draft_prefill_ms(lines)
        measured["other"] = measured.get("other", 0.0) - measured["initial"]
    rows = []
    for phase in SIMULATED_PHASES:
        m, p = measured.get(phase, 0.0), predicted["phase_ms"].get(phase, 0.0)
        rows.append(
            {
                "phase": phase,
                "measured_ms": m,
                "predicted_ms": p,
                "measured_share": m / summary["decode_ms"] if summary["decode_ms"] else 0.0,
                "predicted_share": predicted["phase_share"].get(phase, 0.0),
            }
        )
    return rows


def error_carrier(phases: list[dict]) -> dict:
    """The phase whose predicted total is furthest from its measured total."""
    return max(phases, key=lambda r: abs(r["predicted_ms"] - r["measured_ms"]))


def draft_prefill_ms(lines: list[dict]) -> float:
    """The draft's prefill in a trace's generations on one device, in total: the decoder issues it after
    the first token, so it lies in the first round's `other` (its wall time beyond its device phases),
    beyond what `other` usually holds (the median over the generation's later rounds)."""
    others: list[list[float]] = []
    for line in lines:
        if line["round"] == 0:
            others.append([])
        others[-1].append((line.get("phases_ms") or {}).get("other", 0.0))
    return sum(max(0.0, first - (statistics.median(later) if later else 0.0)) for first, *later in others)
