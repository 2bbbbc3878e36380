"""Sampled head costs per kind (the profile's sampling.costs.regimes.R.head_kinds_ms, from python -m
measure --temperature T --heads SPECS): the checker accepts them and refuses malformed rows; the
simulator charges a sampled run of a head its kind's sampled rows where the profile has them, else falls
back (dense and FlashHead: the regime's sampled heads; other kinds: the heads section's greedy rows, with
a warning), and names the source in its notes; a calibration scales the path that is charged."""

import pytest

from contracts import UsageError
from contracts.profile import check_profile
from sim.profile import load_profile
from sim.sampling_costs import sampled_head_cost_path
from sim.scenario import Scenario, run
from tests.sim_fixtures import SAMPLED_DENSE_HEAD_MS, sampled_costs_profile, timing, tiny_heads_profile, trace_lines
from tests.sim_fixtures import write as write_files

SAMPLED_SHORTLIST_MS = (0.7, 1.5)  # at 100 and 500 tokens (greedy: 0.1 ms at 100, 0.5 ms at 1,000)
GREEDY_ROUTER_MS = 2.0  # router:8 in tiny_heads_profile's heads section


def sampled_heads_profile(kinds: bool = True) -> dict:
    """tiny_heads_profile with sampling costs; `kinds`: dense and shortlist timed sampled per budget too
    (the router is not: it falls back to its greedy rows)."""
    profile = sampled_costs_profile(profile=tiny_heads_profile())
    if kinds:
        profile["sampling"]["costs"]["regimes"]["eager"]["head_kinds_ms"] = {
            "dense": [dict(timing(SAMPLED_DENSE_HEAD_MS), budget=None)],
            "shortlist": [dict(timing(ms), budget=b) for ms, b in zip(SAMPLED_SHORTLIST_MS, (100, 500))],
        }
    return profile


def _simulated(tmp_path, profile: dict, head: str, edits=()) -> tuple[dict, list[str]]:
    """A trace recorded under sampling with `head`, replayed with that head."""
    folder = tmp_path / f"{head.replace(':', '-')}-{len(list(tmp_path.iterdir()))}"
    folder.mkdir()
    lines = [dict(line, head=head, sample=0) for line in trace_lines([2, 0, 1, 2, 0])]
    profile_path, trace_path = write_files(folder, profile, lines)
    scenario = Scenario(
        profile=str(profile_path),
        acceptance=f"trace:{trace_path}",
        schedules=("ordinary",),
        heads=(head,),
        K=2,
        edits=tuple(edits),
    )
    rows, resolved = run(scenario, ceiling=False)
    return rows[-1], resolved.notes


def test_sampled_head_rows_are_checked():
    check_profile(sampled_heads_profile(), "with sampled head kinds")
    check_profile(sampled_heads_profile(kinds=False), "without them (older profiles)")
    for mend, message in (
        (lambda k: k.update(shortlist=[dict(timing(1.0), budget=500), dict(timing(1.0), budget=100)]), "increasing"),
        (lambda k: k.update(sparse=[dict(timing(1.0), budget=5)]), "head_kinds_ms.sparse: unknown head kind"),
        (lambda k: k.update(dense=[dict(timing(1.0), budget=4)]), "the dense head has one row and no budget"),
        (lambda k: k["shortlist"][0].pop("median_ms"), "each with 'median_ms'"),
        (lambda k: k.clear(), "head_kinds_ms: expected a non-empty object of head kinds"),
    ):
        profile = sampled_heads_profile()
        mend(profile["sampling"]["costs"]["regimes"]["eager"]["head_kinds_ms"])
        with pytest.raises(UsageError, match=message):
            check_profile(profile, "p")


def test_a_sampled_run_of_a_head_is_charged_its_kinds_sampled_rows(tmp_path):
    sampled, notes = _simulated(tmp_path, sampled_heads_profile(), "shortlist:100")
    steps = sampled["draft_steps"]
    assert sampled["phase_ms"]["draft_head"] == pytest.approx(SAMPLED_SHORTLIST_MS[0] * steps)
    assert any("sampled draft heads: dense, shortlist per budget" in n and "head_kinds_ms" in n for n in notes)
    assert not any("warning: shortlist" in n for n in notes)
    # the same trace on a profile that did not time shortlists sampled: their greedy rows, with a warning
    fallback, notes = _simulated(tmp_path, sampled_heads_profile(kinds=False), "shortlist:100")
    assert fallback["phase_ms"]["draft_head"] == pytest.approx(0.1 * steps)
    assert any("warning: shortlist, router heads are charged the heads section's greedy costs" in n for n in notes)
    # a kind the profile did not time sampled keeps its greedy rows beside the sampled ones
    router, notes = _simulated(tmp_path, sampled_heads_profile(), "router:8")
    assert router["phase_ms"]["draft_head"] == pytest.approx(GREEDY_ROUTER_MS * router["draft_steps"])
    assert any("warning: router heads are charged the heads section's greedy costs" in n for n in notes)
    # between two sampled budgets: linear, as the greedy rows are
    middle, _ = _simulated(tmp_path, sampled_heads_profile(), "shortlist:300")
    assert middle["phase_ms"]["draft_head"] == pytest.approx(sum(SAMPLED_SHORTLIST_MS) / 2 * middle["draft_steps"])


def test_flashhead_under_sampling_is_charged_the_regimes_sampled_head(tmp_path):
    """The heads section may cost FlashHead greedily; a sampled run pays the regime's sampled FlashHead."""
    profile = sampled_heads_profile()
    profile["heads"]["cost"]["kinds"]["flashhead"] = [dict(timing(0.2), budget=1), dict(timing(0.3), budget=64)]
    sampled, _ = _simulated(tmp_path, profile, "flashhead:4")
    assert sampled["phase_ms"]["draft_head"] == pytest.approx(2.0 * sampled["draft_steps"])


def test_a_budget_outside_the_sampled_rows_is_refused_in_one_line(tmp_path):
    """shortlist:800 is inside the greedy rows (100..1,000) but outside the sampled ones (100..500)."""
    with pytest.raises(UsageError, match=r"outside the 100\.\.500 .* python -m measure --temperature T --heads"):
        _simulated(tmp_path, sampled_heads_profile(), "shortlist:800")


def test_calibration_scales_the_path_that_is_charged(tmp_path):
    (path,) = write_files(tmp_path, sampled_heads_profile())
    raw = load_profile(str(path)).raw
    paths = {head: sampled_head_cost_path(raw, "eager", head) for head in ("shortlist:100", "router:8", "flashhead")}
    assert paths == {
        "shortlist:100": "sampling.costs.regimes.eager.head_kinds_ms",
        "router:8": "heads.cost",
        "flashhead": "sampling.costs.regimes.eager.head_flashhead_ms",
    }
    # no sampled costs in a regime: as a greedy run is charged (the heads section's dense row, else the regime's)
    assert sampled_head_cost_path(raw, "graphs", "dense") == "heads.cost"
    assert sampled_head_cost_path(sampled_costs_profile(), "graphs", "dense") == "draft.head_dense_ms"
    plain, _ = _simulated(tmp_path, sampled_heads_profile(), "shortlist:100")
    scaled, _ = _simulated(tmp_path, sampled_heads_profile(), "shortlist:100", [(paths["shortlist:100"], "*=", 2.0)])
    assert scaled["phase_ms"]["draft_head"] == pytest.approx(2 * plain["phase_ms"]["draft_head"])
