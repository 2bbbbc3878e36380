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


def test_agreement_per_position_from_the_pooled_budgets_shaped_by_a_curve(tmp_path):
    profile = Profile(tiny_heads_profile(), "test")
    # the curve shortlist:1000,100 (20 rounds, prefix 0.8 then 0.2) lifts position 2 by
    # (4 + 10 x 0.444) / ((16 + 10) x 0.444), 0.444 = 0.8 x 0.5 / 0.9 the agreement it would have with no lift
    lift = (4 + 10 * 0.8 * 0.5 / 0.9) / (26 * 0.8 * 0.5 / 0.9)
    rates, how = agreement_per_position(profile, "shortlist:1000,100", 4, K=3)
    assert rates == pytest.approx([0.9, 0.5 * lift, 0.5 * lift, 0.5 * lift]) and "pooled" in how
    rates, how = agreement_per_position(profile, "shortlist:1000,300", 4, K=2)
    middle = 0.5 + 0.4 * 0.4771213  # log2(300) is 0.477 of the way from log2(100) to log2(1000)
    assert rates == pytest.approx([0.9, middle * lift, middle * lift], abs=1e-4)
    assert "shortlist:1000,100's measured curve" in how  # the kind's nearest curve shapes a spec without one
    del profile.raw["heads"]["agreement"]["pooled"]["shortlist"]  # the spec's own curve: prefix 0.8, 0.2
    rates, how = agreement_per_position(profile, "shortlist:1000,100", 4, K=3)
    assert rates == pytest.approx([0.8, 0.25, 0.25, 0.25]) and "per-position curve" in how
    with pytest.raises(UsageError, match="measured at budgets 8..32 only"):
        agreement_per_position(profile, "router:64", 4, K=2)


def _rising(rounds: int) -> Profile:
    """shortlist:100 pooled at 0.5, and a curve that agrees 0.5 at position 1 and 0.9 given agreement after."""
    prefixes = (0.5, 0.45, 0.405)
    curve = [{"position": i + 1, "n": rounds, "agree": 0.9, "prefix": p} for i, p in enumerate(prefixes)]
    raw = tiny_heads_profile()
    raw["heads"]["agreement"]["curves"] = {"shortlist:100": curve}
    return Profile(raw, "test")


def test_a_fixed_budget_head_agrees_more_where_its_curve_says_agreement_so_far_selects_easy_states():
    """Pooled agreement is over all states; a later draft position is reached only after agreeing, on
    easier states. A fixed budget no longer gives one flat rate: the pooled level, the curve's shape."""
    rates, _ = agreement_per_position(_rising(200), "shortlist:100", 4, K=3)
    assert rates[0] == pytest.approx(0.5)  # position 1: the pooled rate (hundreds of states)
    assert rates[1] == pytest.approx(0.5 * (90 + 5) / (110 * 0.5))  # 0.864: not the flat 0.5
    assert rates[2] == pytest.approx(0.5 * (81 + 5) / (100 * 0.5)) and rates[3] == rates[2]
    few, _ = agreement_per_position(_rising(2), "shortlist:100", 4, K=3)  # control: 2 rounds barely move it
    assert few[0] == 0.5 and 0.5 < few[1] < 0.55
    falling = _rising(200)
    falling.raw["heads"]["agreement"]["curves"]["shortlist:100"][1]["prefix"] = 0.2  # agreement 0.4 given 1
    assert agreement_per_position(falling, "shortlist:100", 4, K=3)[0][1] < 0.5


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

    def flat(pooled):  # pooled rows only: no curve shapes them per position
        raw = tiny_heads_profile(pooled=pooled)
        raw["heads"]["agreement"]["curves"] = {}
        return raw

    agreeing = _write(tmp_path, flat(full))
    # with full agreement only the head's cost differs: 0.1 < 0.5 < 1 (dense) < 2 ms (router)
    assert _ranked(capsys, agreeing, heads) == ["shortlist:100", "shortlist:1000", "dense", "router:8"]
    full["shortlist"][0]["agree"] = 0.0  # control: the cheapest head now never agrees
    (tmp_path / "disagreeing").mkdir()
    disagreeing = _write(tmp_path / "disagreeing", flat(full))
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


def test_head_positions_scores_the_source_that_matches_a_recorded_head_run_best(tmp_path, capsys):
    """validate.head_positions: dense rounds accept everything; the head's run accepts position 1 in half
    the rounds and every later one (agreement 0.5, then 1 given agreement, like _rising's curve). The
    shaped rule predicts it better than the flat pooled rate, and scores higher."""
    from tests.sim_fixtures import trace_lines
    from validate.head_positions import main

    K = 3
    profile = _rising(200)
    path = _write(tmp_path, profile.raw)
    dense, head = [], []
    for prompt in range(8):
        dense += trace_lines([K] * 20, K=K, prompt_id=f"p{prompt}")
        head += trace_lines([K, 0] * 10, K=K, prompt_id=f"p{prompt}")
    for line in head:
        line["head"], line["probes"] = "shortlist:100", None
    for name, lines in (("dense", dense), ("head", head)):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    argv = ["--profile", path, "--dense", str(tmp_path / "dense.jsonl"), "--head-trace", str(tmp_path / "head.jsonl")]
    assert main([*argv, "--head", "shortlist:100", "--out", str(tmp_path / "out.md")]) == 0
    scores = {}
    for line in (tmp_path / "out.md").read_text().splitlines():
        cells = [c.strip() for c in line.split("|")]
        if len(cells) > 2 and cells[-2].startswith("-") and cells[-2] != "---":
            scores[cells[1]] = float(cells[-2])
    assert scores["simulator's rule"] > scores["pooled rate alone (flat)"]
    assert "| head, measured (accepted / tested) | 0.500 (80/160) | 1.000 (80/80) | 1.000 (80/80) | 1.500 | |" in (
        capsys.readouterr().out
    )
    assert main([*argv, "--head", "router:8"]) == 2  # the head trace ran a shortlist
    assert main([*argv[:2], "--dense", str(tmp_path / "head.jsonl"), *argv[4:], "--head", "shortlist:100"]) == 2
