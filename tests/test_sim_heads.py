"""The simulator's head specs (sim/heads.py): costs per draft position, acceptance from agreement per
position, the head sweep's ranking, and the profile's heads section merged by measure.profile_heads."""

import json

import pytest

from contracts import UsageError
from contracts.profile import check_profile
from sim.__main__ import main as sim_main
from sim.acceptance import Generation, IIDAcceptance
from sim.heads import AgreementPerPosition, agreement_per_position
from sim.profile import Profile
from sim.scenario import Scenario, run
from tests.sim_fixtures import tiny_heads_profile, tiny_profile


def _write(tmp_path, raw) -> str:
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(raw))
    return str(path)


def _head_ms_per_step(profile: str, head: str, K: int = 3) -> float:
    """The ordinary schedule's mean head cost per draft step (every proposal rejected: K steps a round)."""
    scenario = Scenario(
        profile=profile, schedules=("ordinary",), heads=(head,), K=K, acceptance="0", prompts=1, max_new_tokens=8
    )
    rows, _ = run(scenario, ceiling=False, rounds=False)
    row = rows[1]
    return row["phase_ms"]["draft_head"] / row["draft_steps"]


def test_a_positional_head_is_costed_per_draft_position(tmp_path):
    profile = _write(tmp_path, tiny_heads_profile())
    # shortlist 0.1 ms at 100 tokens, 0.5 ms at 1,000: a round of K = 3 pays positions 1, 2, 3
    assert _head_ms_per_step(profile, "shortlist:1000,100") == pytest.approx((0.5 + 0.1 + 0.1) / 3)
    assert _head_ms_per_step(profile, "shortlist:100,1000") == pytest.approx((0.1 + 0.5 + 0.5) / 3)
    assert _head_ms_per_step(profile, "shortlist:550") == pytest.approx(0.3)  # linear between budgets
    assert _head_ms_per_step(profile, "dense") == pytest.approx(1.0)
    # FlashHead without a section row: the regime's table over probes (0.25 + p / 100) at each position
    assert _head_ms_per_step(profile, "flashhead:64,4") == pytest.approx((0.89 + 0.29 + 0.29) / 3)


def test_agreement_per_position_from_the_curve_then_the_pooled_budgets(tmp_path):
    profile = Profile(tiny_heads_profile(), "test")
    rates, how = agreement_per_position(profile, "shortlist:1000,100", 4, K=3)
    assert rates == pytest.approx([0.9, 0.5, 0.5, 0.5]) and "pooled" in how
    rates, how = agreement_per_position(profile, "shortlist:1000,300", 4, K=2)
    middle = 0.5 + 0.4 * 0.4771213  # log2(300) is 0.477 of the way from log2(100) to log2(1000)
    assert rates == pytest.approx([0.9, middle, middle], abs=1e-4) and "pooled" in how
    del profile.raw["heads"]["agreement"]["pooled"]["shortlist"]  # the spec's own curve: prefix 0.8, 0.2
    rates, how = agreement_per_position(profile, "shortlist:1000,100", 4, K=3)
    assert rates == pytest.approx([0.8, 0.25, 0.25, 0.25]) and "per-position curve" in how
    with pytest.raises(UsageError, match="measured at budgets 8..32 only"):
        agreement_per_position(profile, "router:64", 4, K=2)


def test_acceptance_is_the_dense_acceptance_times_agreement():
    generation = Generation("g", 8, 4000)
    dense = IIDAcceptance(0.8)
    head = AgreementPerPosition(dense, [0.5, 1.0], "test")
    for source, expected in ((head, 0.4), (dense, 0.8)):  # the dense source is the control: 0.8, not 0.4
        block = source.stream(generation, seed=1)
        firsts = [block(pos, 2)[0] for pos in range(0, 8000, 2)]
        assert sum(firsts) / len(firsts) == pytest.approx(expected, abs=0.03)
    # a position with agreement 0 is never accepted, one with agreement 1 keeps the dense draw
    never = AgreementPerPosition(IIDAcceptance(1.0), [1.0, 0.0], "test").stream(generation, seed=1)
    assert all(never(pos, 2)[:2] == [True, False] for pos in range(50))


def _ranked(capsys, profile: str, heads: str) -> list[str]:
    args = ["--profile", profile, "--schedule", "ordinary", "--acceptance", "0.8", "--prompts", "2"]
    assert sim_main([*args, "--max-new-tokens", "48", "--no-ceiling", "--sweep", f"head={heads}"]) == 0
    text = capsys.readouterr().out.split("heads ranked by predicted tok/s")[1]
    return [line.split()[2] for line in text.splitlines() if line.strip().startswith("ordinary")]


def test_the_head_sweep_ranks_cheap_agreeing_heads_first_and_disagreeing_ones_last(tmp_path, capsys):
    heads = "dense+shortlist:100+shortlist:1000+router:8"
    full = {
        kind: [{"budget": b, "n": 9, "agree": 1.0} for b in budgets]
        for kind, budgets in (("shortlist", (100, 1000)), ("router", (8, 32)))
    }
    agreeing = _write(tmp_path, tiny_heads_profile(pooled=full))
    # with full agreement only the head's cost differs: 0.1 < 0.5 < 1 (dense) < 2 ms (router)
    assert _ranked(capsys, agreeing, heads) == ["shortlist:100", "shortlist:1000", "dense", "router:8"]
    full["shortlist"][0]["agree"] = 0.0  # control: the cheapest head now never agrees
    (tmp_path / "disagreeing").mkdir()
    disagreeing = _write(tmp_path / "disagreeing", tiny_heads_profile(pooled=full))
    assert _ranked(capsys, disagreeing, heads)[-1] == "shortlist:100"


def test_heads_section_is_optional_and_checked():
    check_profile(tiny_profile(), "old")  # profiles without it stay valid
    check_profile(tiny_heads_profile(), "new")
    bad = tiny_heads_profile()
    bad["heads"]["agreement"]["curves"]["shortlist:1000,100"][1]["prefix"] = 0.95
    with pytest.raises(UsageError, match="cannot grow"):
        check_profile(bad, "bad")
    bad = tiny_heads_profile()
    bad["heads"]["cost"]["kinds"]["shortlist"].reverse()
    with pytest.raises(UsageError, match="increasing positive integers"):
        check_profile(bad, "bad")


def test_profile_heads_merges_cost_and_agreement_records(tmp_path):
    from measure.profile_heads import main

    profile = _write(tmp_path, tiny_profile())
    timing = {"median_ms": 0.01, "p10_ms": 0.01, "p90_ms": 0.01, "n": 3, "host_ms": 0.0}
    rows = [
        {"head": "dense", "budget": None, "rows_scored": 512, "in_graph": timing, "draft_step": timing},
        {"head": "shortlist:64 torch", "budget": 64, "rows_scored": 64, "in_graph": timing, "draft_step": timing},
        {
            "head": "shortlist:64 triton",
            "budget": 64,
            "rows_scored": 64,
            "in_graph": dict(timing, median_ms=0.002),
            "draft_step": timing,
        },
    ]
    (tmp_path / "cost.json").write_text(json.dumps({"env": {"weights": "synthetic"}, "rows": rows}))
    positions = [{"position": 1, "n": 4, "agree": 0.5, "prefix": 0.5, "agree_ci": [0, 1], "prefix_ci": [0, 1]}]
    pooled = [{"budget": 64, "rows_scored": 64, "n": 40, "agree": 0.7, "agree_ci": [0.5, 0.8]}]
    record = {
        "schema": "specloop.head_agreement/1",
        "weights": "synthetic",
        "commit": "x",
        "draft": "d",
        "heads": {"shortlist:64": {"per_position": {"all": positions}, "pooled": pooled}},
    }
    (tmp_path / "agreement.json").write_text(json.dumps(record))
    out = tmp_path / "merged.json"
    argv = [
        "--profile",
        profile,
        "--cost",
        str(tmp_path / "cost.json"),
        "--agreement",
        str(tmp_path / "agreement.json"),
    ]
    assert main([*argv, "--out", str(out)]) == 0
    heads = json.loads(out.read_text())["heads"]
    assert heads["cost"]["kinds"]["shortlist"][0]["median_ms"] == 0.002  # the fused kernel's row
    assert heads["agreement"]["pooled"]["shortlist"][0]["agree"] == 0.7
    assert main(["--profile", profile, "--out", str(tmp_path / "x.json")]) == 2  # nothing to add
    assert not (tmp_path / "x.json").exists()


def test_heads_report_marks_the_pareto_front_and_refuses_a_profile_without_heads(tmp_path):
    from sim.heads_report import main

    profile = _write(tmp_path, tiny_heads_profile())
    out = tmp_path / "report"
    heads = "dense+shortlist:100+shortlist:1000+router:8"
    assert main(["--profile", profile, "--heads", heads, "--acceptance", "0.8", "--K", "3", "--out", str(out)]) == 0
    points = {p["head"]: p for p in json.loads((out / "heads.json").read_text())["points"]}
    # costs 1, 0.1, 0.5, 2 ms; agreement 1, 0.5, 0.9, 0.6: router:8 is dearer than dense and agrees less
    assert {h for h, p in points.items() if p["pareto"]} == {"dense", "shortlist:100", "shortlist:1000"}
    assert points["shortlist:1000"]["cost_us"] == pytest.approx(500.0)
    assert {f.name for f in out.iterdir()} == {"heads.md", "heads.json", "pareto.png", "tok_s.png"}
    bare = tmp_path / "bare"
    bare.mkdir()
    assert main(["--profile", _write(bare, tiny_profile()), "--out", str(tmp_path / "none")]) == 2
    assert not (tmp_path / "none").exists()
