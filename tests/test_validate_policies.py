"""python -m validate --drafter/--policy on the tiny models (CPU): every fixed arm and policy runs per
category, its output is target greedy, every trace carries every drafter's match runs, and the simulator
replays each fixed arm's recorded rounds exactly from those runs (so any error left is the cost model's)."""

import json
import math

import pytest

from contracts.policies import Arm
from contracts.trace import read_trace, write_trace
from tests.sim_fixtures import timing, tiny_profile
from validate import policies
from validate.__main__ import main

DRAFTERS = ("draft-model", "early-exit", "prompt-lookup")


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    folder = tmp_path_factory.mktemp("policies")
    profile = tiny_profile(placement="cpu", read_gap_ms=0.05)
    profile["regimes"]["eager"]["draft"].update(
        lookup_ms=timing(0.3), early_exit_body_ms=timing(1.0), early_exit_head_ms=timing(0.5)
    )
    (folder / "profile.json").write_text(json.dumps(profile))
    argv = ["--target", "tiny-qwen3", "--draft", "tiny-qwen3-draft", "--placement", "cpu"]
    argv += ["--profile", str(folder / "profile.json"), "--drafter", "+".join(DRAFTERS), "--early-exit-layers", "1"]
    argv += ["--policy", "all", "--K", "2", "--heads", "dense", "--acceptance", "a=0.6"]
    argv += ["--lookup-acceptance", "writing=0.9,*=0.0", "--prompts", "81,82,111", "--n-prompts", "3"]
    argv += ["--max-new-tokens", "10", "--warmup", "0", "--out", str(folder / "report")]
    assert main(argv) == 0
    return folder / "report"


def test_every_configuration_of_every_category_is_measured_predicted_and_exact(report):
    results = json.loads((report / "results.json").read_text())["categories"]
    assert set(results) == {"writing", "math"}
    for category in results.values():
        labels = {r["label"] for r in category["rows"]}
        assert labels == {"baseline", *(f"{d}:K2" for d in DRAFTERS), "heuristic", "ucb1", "thompson"}
        for r in category["rows"]:
            assert r["exact"] and r["measured_tok_s"] > 0 and r["predicted_tok_s"] > 0
        assert category["oracle_tok_s"]["predicted"] > 0
        assert sorted(category["policy_order"]["measured"]) == ["heuristic", "thompson", "ucb1"]
    assert (report / "report.md").read_text().count("## ") == 2


def test_traces_carry_every_drafters_runs(report):
    for path in (report / "traces").glob("*/*.trace.jsonl"):
        for line in read_trace(path):
            if line["K"]:
                assert set(line["runs"]) == set(DRAFTERS)


def test_the_lookup_control_shifts_prompt_lookups_acceptance_between_categories(report):
    """writing=0.9, every other category 0: prompt lookup is accepted on writing only."""
    results = json.loads((report / "results.json").read_text())["categories"]
    rates = {
        category: next(r["acceptance"] for r in rows["rows"] if r["label"] == "prompt-lookup:K2")
        for category, rows in results.items()
    }
    assert rates["math"] == 0.0 and rates["writing"] > 0.5


def test_each_category_is_calibrated_on_a_prompt_of_its_own(report):
    """Every category has calibration generations of its own, on a prompt of that category that is no
    validation prompt, and its predictions use that calibration."""
    from model.prompts import select_prompts

    meta = json.loads((report / "results.json").read_text())["meta"]
    validation = {pid for ids in meta["prompts"].values() for pid in ids}
    category_of = {q.id: q.category for q in select_prompts("first:100000")}
    assert set(meta["calibration_prompt"]) == set(meta["prompts"]) == set(meta["calibration"])
    for category, prompt_id in meta["calibration_prompt"].items():
        assert prompt_id not in validation and category_of[prompt_id] == category
        traces = report / "traces" / "calibration" / category
        names = ["baseline", *(f"fixed-{d}-K2" for d in DRAFTERS)]
        assert {path.name for path in traces.glob("*.summary.json")} == {
            f"{name}{'' if n == 1 else f'.repeat-{n}'}.summary.json"
            for name in names
            for n in range(1, policies.REPEATS + 1)
        }
        assert all(line["prompt_id"] == prompt_id for line in read_trace(traces / "baseline.trace.jsonl"))


def test_the_calibration_pools_every_run_of_its_configurations(report):
    """The scales in the report are those of every calibration run pooled, not of the first run's."""
    from contracts.policies import Arm

    meta = json.loads((report / "results.json").read_text())["meta"]
    recorded = json.loads((report / "results.json").read_text())["categories"]
    p = {"K": 2, "head": "dense", "placement": "cpu", "graphs": False, "Ks": (2,), "drafters": DRAFTERS}
    p["choices"] = tuple(Arm(d, 2) for d in DRAFTERS)
    settings = policies.calibration_settings_of(p)
    for category in recorded:
        runs = policies._calibration_runs(report / "traces" / "calibration" / category, settings)
        assert len(runs) == len(settings) * policies.REPEATS
        pooled = policies._calibrate(runs, p, report.parent / "profile.json")["scales"]
        first = policies._calibrate(runs[:: policies.REPEATS], p, report.parent / "profile.json")["scales"]
        assert meta["calibration_scales"][category] == pytest.approx(pooled)
        assert pooled != pytest.approx(first)


def test_a_run_recorded_with_one_calibration_prompt_is_predicted_again_from_it(report, tmp_path):
    """Runs recorded before calibration per category (one calibration folder for all) still predict."""
    import shutil

    old = tmp_path / "old"
    shutil.copytree(report, old)
    first = next(iter(json.loads((report / "results.json").read_text())["meta"]["prompts"]))
    calibration = old / "traces" / "calibration"
    for path in (calibration / first).iterdir():
        path.rename(calibration / path.name)
    for folder in [f for f in calibration.iterdir() if f.is_dir()]:
        shutil.rmtree(folder)
    recorded = json.loads((old / "results.json").read_text())
    recorded["meta"]["calibration_prompt"] = recorded["meta"]["calibration_prompt"][first]
    (old / "results.json").write_text(json.dumps(recorded))
    argv = ["--from-runs", str(old), "--profile", str(report.parent / "profile.json"), "--out", str(tmp_path / "o")]
    assert main(argv) == 0
    meta = json.loads((tmp_path / "o" / "results.json").read_text())["meta"]
    assert len(set(meta["calibration"].values())) == 1
    assert set(meta["calibration_prompt"].values()) == {recorded["meta"]["calibration_prompt"]}


def test_each_configuration_is_measured_as_the_median_of_its_runs(report):
    """Every configuration runs REPEATS times per category; its measurement is the median run's tok/s,
    with the runs' range."""
    from contracts.trace import read_summary

    results = json.loads((report / "results.json").read_text())["categories"]
    for category, c in results.items():
        for r in c["rows"]:
            stems = [r["configuration"]] + [f"{r['configuration']}.repeat-{n}" for n in range(2, policies.REPEATS + 1)]
            speeds = sorted(
                read_summary(report / "traces" / category / f"{x}.summary.json")["decode_tok_s"] for x in stems
            )
            assert r["measured_tok_s"] == speeds[len(speeds) // 2]
            assert r["measured_range"] == [speeds[0], speeds[-1]]
            assert not (
                report / "traces" / category / f"{r['configuration']}.repeat-{len(stems) + 1}.summary.json"
            ).exists()


def test_the_median_run_is_one_run_exact_only_if_every_run_is():
    def run(tok_s, exact=True, ms=(1.0, 2.0)):
        return policies.Measured({"decode_tok_s": tok_s}, exact, list(ms), {"a": tok_s})

    middle = policies.median_run([run(3.0, ms=(5.0, 1.0)), run(1.0, ms=(1.0, 3.0)), run(2.0, False, ms=(2.0, 2.0))])
    assert middle.summary["decode_tok_s"] == 2.0 and middle.pulls == {"a": 2.0}
    assert middle.runs_range == (1.0, 3.0) and not middle.exact
    assert middle.generation_ms == [2.0, 2.0]
    alone = policies.median_run([run(4.0)])
    assert alone.runs_range is None and alone.exact


def test_the_simulator_replays_each_fixed_arms_rounds_exactly(report):
    results = json.loads((report / "results.json").read_text())["categories"]
    for category in results.values():
        for r in category["rows"]:
            if ":K" in r["label"]:
                assert r["measured_rounds"] == r["predicted_rounds"], r["label"]


def test_from_runs_predicts_the_recorded_runs_again_as_the_run_did(report, tmp_path):
    """--from-runs on the report's folder runs no model and reproduces every measured and predicted
    number with the same profile (a profile twice as slow moves every prediction)."""
    again = tmp_path / "again"
    assert (
        main(["--from-runs", str(report), "--profile", str(report.parent / "profile.json"), "--out", str(again)]) == 0
    )
    before = json.loads((report / "results.json").read_text())["categories"]
    after = json.loads((again / "results.json").read_text())["categories"]
    for key in ("measured_tok_s", "predicted_tok_s", "profile_only_tok_s", "exact", "measured_pulls"):
        assert [[r[key] for r in c["rows"]] for c in after.values()] == [
            [pytest.approx(r[key]) if isinstance(r[key], float) else r[key] for r in c["rows"]] for c in before.values()
        ]
    slow = json.loads((report.parent / "profile.json").read_text())
    slow["regimes"]["eager"]["target"]["forward_ms"]["points"] = [
        dict(point, median_ms=2 * point["median_ms"], p10_ms=2 * point["median_ms"], p90_ms=2 * point["median_ms"])
        for point in slow["regimes"]["eager"]["target"]["forward_ms"]["points"]
    ]
    (tmp_path / "slow.json").write_text(json.dumps(slow))
    assert (
        main(["--from-runs", str(report), "--profile", str(tmp_path / "slow.json"), "--out", str(tmp_path / "s")]) == 0
    )
    slower = json.loads((tmp_path / "s" / "results.json").read_text())["categories"]
    for c_before, c_slow in zip(before.values(), slower.values()):
        for r, s in zip(c_before["rows"], c_slow["rows"]):
            assert s["profile_only_tok_s"] < r["profile_only_tok_s"]


def test_timing_noise_is_how_the_same_calibration_rounds_varied_between_runs(report, tmp_path):
    """Two runs of a calibration generation: every round of the second slower by its own factor, both 30%
    slower than recorded (a cost the simulator would misprice in every run alike). The noise is each round's
    log time less the mean of its runs, scaled to one run's spread, after a generation's first round: the
    30% drops out. With one run there is none to take."""

    def scaled(lines, factor_of):
        return [
            {**line, "phases_ms": {k: v * factor_of(i) for k, v in line["phases_ms"].items()}}
            for i, line in enumerate(lines)
        ]

    lines = read_trace(report / "traces" / "calibration" / "math" / "fixed-draft-model-K2.trace.jsonl")
    logs = [0.01 * (i % 5 - 2) for i in range(len(lines))]
    write_trace(tmp_path / "a.trace.jsonl", scaled(lines, lambda i: 1.3))
    write_trace(tmp_path / "b.trace.jsonl", scaled(lines, lambda i: 1.3 * math.exp(logs[i])))
    setting = policies.Setting("fixed", Arm("draft-model", 2))
    runs = [(setting, tmp_path / "a.trace.jsonl", {}), (setting, tmp_path / "b.trace.jsonl", {})]
    firsts = {line["prompt_id"]: i for i, line in reversed(list(enumerate(lines)))}
    want = [sign * logs[i] / math.sqrt(2) for i in range(len(lines)) if i not in firsts.values() for sign in (-1, 1)]
    assert len(want) > 4 and any(want)
    assert sorted(policies._round_jitter(runs)) == pytest.approx(sorted(want), abs=1e-9)
    assert policies._round_jitter(runs[:1]) == ()


def test_online_policies_are_the_median_of_their_noisy_replays(report, tmp_path, monkeypatch):
    """ucb1 and thompson read round times, so under timing noise each is the median of its replays and
    carries their range; the heuristic reads accepted counts only, so its replays agree and it has none.
    The run's own noise is whatever its CPU's rounds showed, so the replays here draw from a fixed +-20%; with
    --noise-seeds 0 every policy is one replay without noise."""
    meta = json.loads((report / "results.json").read_text())["meta"]
    for category, noise in meta["timing_noise"].items():  # one ratio per drafter calibration round after the first
        traces = [path for path in (report / "traces" / "calibration" / category).glob("fixed-*.trace.jsonl")]
        lines = [line for path in traces for line in read_trace(path)]
        assert noise["rounds"] == sum(line["round"] > 0 for line in lines) and noise["sd"] >= 0
    monkeypatch.setattr(policies, "_round_residuals", lambda *args: (0.2, -0.2))
    argv = ["--from-runs", str(report), "--profile", str(report.parent / "profile.json")]
    assert main([*argv, "--out", str(tmp_path / "noisy")]) == 0
    rows = [
        r
        for c in json.loads((tmp_path / "noisy" / "results.json").read_text())["categories"].values()
        for r in c["rows"]
    ]
    ranged = [r for r in rows if r["predicted_range"]]
    assert ranged and {r["label"] for r in ranged} <= {"ucb1", "thompson"}
    assert all(low <= r["predicted_tok_s"] <= high for r in ranged for low, high in [r["predicted_range"]])
    assert all(r["predicted_range"] is None for r in rows if r["label"] not in ("ucb1", "thompson"))
    assert main([*argv, "--out", str(tmp_path / "quiet"), "--noise-seeds", "0"]) == 0
    quiet = json.loads((tmp_path / "quiet" / "results.json").read_text())["categories"]
    assert all(r["predicted_range"] is None for c in quiet.values() for r in c["rows"])


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--noise-seeds", "4"], "--noise-seeds must be 0 (one replay without noise) or odd from 1 to 1001"),
        (["--noise-seeds", "-1"], "--noise-seeds must be 0"),
        (["--noise-seeds", "1003"], "got 1003"),
    ],
)
def test_bad_noise_seeds_are_one_line_and_exit_2(report, tmp_path, capsys, extra, message):
    argv = ["--from-runs", str(report), "--profile", str(report.parent / "profile.json"), "--out", str(tmp_path / "o")]
    assert main([*argv, *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("count", ["2", "0", "17"])
def test_bad_repeats_are_one_line_and_exit_2(report, tmp_path, capsys, count):
    argv = ["--target", "tiny-qwen3", "--draft", "tiny-qwen3-draft", "--placement", "cpu", "--drafter", "draft-model"]
    argv += ["--profile", str(report.parent / "profile.json"), "--repeats", count, "--out", str(tmp_path / "o")]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"--repeats must be odd from 1 to 15 (the median is one run), got {count}" in err[0]
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("extra", [["--peers"], ["--from-runs", "runs", "--profile", "p.json"]])
def test_repeats_with_peers_or_recorded_runs_is_refused(tmp_path, capsys, extra):
    argv = ["--target", "tiny-qwen3", "--draft", "tiny-qwen3-draft", "--placement", "cpu", "--repeats", "3"]
    assert main([*argv, *extra, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--repeats: runs of each configuration, made by a validation" in err[0]
    assert not (tmp_path / "o").exists()


def test_noise_seeds_without_a_policy_validation_is_refused(tmp_path, capsys):
    argv = ["--target", "tiny-qwen3", "--draft", "tiny-qwen3-draft", "--placement", "cpu", "--noise-seeds", "3"]
    assert main([*argv, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--noise-seeds: online policies' replays" in err[0]
    assert not (tmp_path / "o").exists()


def test_drafters_without_the_draft_model_are_validated(tmp_path):
    """Early exit and prompt lookup alone (the real Gemma run's arms): no draft model, so no draft prefill
    to calibrate, and the simulator is never asked about a drafter the traces did not record."""
    profile = tiny_profile(placement="cpu", read_gap_ms=0.05)
    profile["regimes"]["eager"]["draft"].update(
        lookup_ms=timing(0.3), early_exit_body_ms=timing(1.0), early_exit_head_ms=timing(0.5)
    )
    (tmp_path / "profile.json").write_text(json.dumps(profile))
    argv = ["--target", "tiny-qwen3", "--draft", "tiny-qwen3-draft", "--placement", "cpu"]
    argv += ["--profile", str(tmp_path / "profile.json"), "--drafter", "early-exit+prompt-lookup"]
    argv += ["--early-exit-layers", "1", "--policy", "heuristic", "--K", "2", "--heads", "dense"]
    argv += ["--prompts", "81", "--n-prompts", "1", "--max-new-tokens", "6", "--warmup", "0"]
    assert main([*argv, "--out", str(tmp_path / "report")]) == 0
    rows = json.loads((tmp_path / "report" / "results.json").read_text())["categories"]["writing"]["rows"]
    assert {r["label"] for r in rows} == {"baseline", "early-exit:K2", "prompt-lookup:K2", "heuristic"}
