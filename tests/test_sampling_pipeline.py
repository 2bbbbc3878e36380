"""Sampling through the rest of the pipeline: the profile's `sampling.costs` (its checker), the
simulator charging them whenever it simulates sampling (a what-if temperature, a trace recorded under
sampling), and python -m validate running under sampling on tiny models (CPU). Timings of the real
runs are never asserted; the simulator's arithmetic is."""

import copy
import json

import pytest

from contracts import UsageError
from contracts.profile import check_profile
from sim.scenario import Scenario, run
from tests.sim_fixtures import (
    SAMPLED_DENSE_HEAD_MS,
    VERIFY_EXTRA_MS,
    sampled_costs_profile,
    tiny_profile,
    trace_lines,
    write,
)


def test_sampling_costs_are_checked_and_old_sections_stay_valid():
    check_profile(sampled_costs_profile(), "costs only")
    both = sampled_costs_profile()
    both["sampling"].update(weights="real", beta={"0.7": {"dense": {"beta": 0.5, "n": 10}}})
    check_profile(both, "beta and costs")
    beta_only = tiny_profile()
    beta_only["sampling"] = {"weights": "real", "beta": {"0.7": {"dense": {"beta": 0.5, "n": 10}}}}
    check_profile(beta_only, "beta only (written before the costs)")
    missing = sampled_costs_profile()
    del missing["sampling"]["costs"]["regimes"]["eager"]["head_dense_ms"]
    with pytest.raises(UsageError, match=r"sampling.costs.regimes.eager.head_dense_ms: missing cost"):
        check_profile(missing, "p")
    greedy = sampled_costs_profile()
    greedy["sampling"]["costs"]["temperature"] = 0
    with pytest.raises(UsageError, match=r"sampling.costs.temperature"):
        check_profile(greedy, "p")
    with pytest.raises(UsageError, match="needs 'beta' .* and/or 'costs'"):
        check_profile({**tiny_profile(), "sampling": {"weights": "real"}}, "p")


def _simulated(tmp_path, profile: dict, lines: list[dict], name: str) -> tuple[dict, list[str]]:
    folder = tmp_path / name
    folder.mkdir()
    profile_path, trace_path = write(folder, profile, lines)
    scenario = Scenario(
        profile=str(profile_path), acceptance=f"trace:{trace_path}", schedules=("ordinary",), heads=("dense",), K=2
    )
    rows, resolved = run(scenario, ceiling=False)
    return rows[-1], resolved.notes


def test_a_trace_recorded_under_sampling_is_charged_the_sampling_costs(tmp_path):
    greedy_lines = trace_lines([2, 0, 1, 2, 0])
    sampled_lines = [dict(line, sample=0) for line in greedy_lines]
    greedy, _ = _simulated(tmp_path, sampled_costs_profile(), greedy_lines, "greedy")
    sampled, notes = _simulated(tmp_path, sampled_costs_profile(), sampled_lines, "sampled")
    assert any("sampling costs: the verify and the draft heads as timed at temperature 0.7" in n for n in notes)
    assert sampled["verify_calls"] == greedy["verify_calls"] and sampled["append_calls"] == greedy["append_calls"]
    # every verify pays the extra in the verify phase, every standalone append in finalize
    extra_verify = sampled["phase_ms"]["verify"] - greedy["phase_ms"]["verify"]
    assert extra_verify == pytest.approx(VERIFY_EXTRA_MS * greedy["verify_calls"])
    extra_finalize = sampled["phase_ms"]["finalize"] - greedy["phase_ms"]["finalize"]
    assert extra_finalize == pytest.approx(VERIFY_EXTRA_MS * greedy["append_calls"])
    assert sampled["phase_ms"]["draft_head"] == pytest.approx(SAMPLED_DENSE_HEAD_MS * greedy["draft_steps"])
    assert greedy["phase_ms"]["draft_head"] == pytest.approx(1.0 * greedy["draft_steps"])
    assert sampled["decode_tok_s"] < greedy["decode_tok_s"]
    # a profile without sampling costs: charged as greedy, and said so
    bare, notes = _simulated(tmp_path, tiny_profile(), sampled_lines, "bare")
    assert bare["phase_ms"] == pytest.approx(greedy["phase_ms"])
    assert any("no sampling costs for the eager regime" in n for n in notes)


def test_the_temperature_what_if_charges_the_sampling_costs(tmp_path):
    profile = sampled_costs_profile()
    profile["sampling"].update(weights="real", beta={"0.7": {"dense": {"beta": 0.5, "n": 10}}})
    (path,) = write(tmp_path, profile)
    common = dict(profile=str(path), schedules=("deferred",), heads=("dense",), K=2, prompts=4, acceptance="0.5")
    greedy_costs = copy.deepcopy(profile)
    greedy_costs["sampling"].pop("costs")
    bare_path = tmp_path / "bare.json"
    bare_path.write_text(json.dumps(greedy_costs))
    sampled, _ = run(Scenario(**common, temperature=0.7), ceiling=False)
    charged_as_greedy, _ = run(Scenario(**{**common, "profile": str(bare_path)}, temperature=0.7), ceiling=False)
    s, g = sampled[-1], charged_as_greedy[-1]
    assert s["verify_calls"] == g["verify_calls"]  # the same acceptance draws
    assert s["phase_ms"]["verify"] - g["phase_ms"]["verify"] == pytest.approx(VERIFY_EXTRA_MS * g["verify_calls"])


def test_validate_runs_under_sampling_and_predicts_with_the_sampling_costs(tmp_path):
    """Tiny models on the CPU at T = 0.7 with the control accepting every position: the runs sample
    (summaries and traces say so), the control decides acceptance, and the prediction of every
    recorded run charges the profile's sampling costs."""
    from validate.__main__ import main
    from validate.plan import Config
    from validate.predict import predict

    (profile_path,) = write(tmp_path, sampled_costs_profile("cpu"))
    out = tmp_path / "report"
    argv = [
        *("--target", "tiny-qwen3", "--draft", "tiny-qwen3-draft", "--placement", "cpu"),
        *("--profile", str(profile_path), "--schedules", "baseline,deferred", "--heads", "dense", "--K", "2"),
        *("--prompts", "81", "--n-prompts", "1", "--max-new-tokens", "8", "--warmup", "0"),
        *("--temperature", "0.7", "--acceptance", "pattern=1", "--out", str(out)),
    ]
    assert main(argv) == 0
    report = (out / "report.md").read_text()
    assert "sampling costs: the verify and the draft heads as timed at temperature 0.7" in report
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps(tiny_profile("cpu")))
    for name, config in (
        ("deferred-dense-K2", Config("deferred", "dense", 2)),
        ("baseline", Config("baseline", "dense", 0)),
    ):
        summary = json.loads((out / "traces" / f"{name}.summary.json").read_text())
        assert summary["config"]["sampling"] == {"temperature": 0.7, "top_k": 0, "top_p": 1.0, "seed": 0, "samples": 1}
        trace = out / "traces" / f"{name}.trace.jsonl"
        lines = [json.loads(x) for x in trace.read_text().splitlines()]
        assert lines and all(line["sample"] == 0 for line in lines)
        if config.K:  # the control accepts every drafted position; the bonus ends each round
            assert all(line["accepted"] == line["proposed"] for line in lines[:-1])
        charged, _ = predict(profile_path, trace, lines, config, None, "cpu", False)
        as_greedy, _ = predict(bare, trace, lines, config, None, "cpu", False)
        forwards = charged["verify_calls"] + charged["append_calls"]
        assert charged["decode_ms"] - as_greedy["decode_ms"] >= VERIFY_EXTRA_MS * forwards - 1e-9


def test_measure_times_each_head_kind_sampled_per_budget_and_the_simulator_charges_it(tmp_path):
    """python -m measure --temperature T --heads SPECS on tiny models (CPU): the verify tables have a row per
    width, every kind of --heads and the dense head get sampled rows per budget, and a sampled trace of the
    head is charged from them."""
    import torch

    from measure.__main__ import main as measure_main
    from model.head_assets import Shortlist, save_shortlist

    assets = tmp_path / "assets"  # a shortlist of the tiny presets' 512 tokens
    save_shortlist(Shortlist(torch.arange(512), torch.zeros(512, dtype=torch.long)), assets)
    profile_path = tmp_path / "profile.json"
    argv = [
        *("--target", "tiny-qwen3", "--draft", "tiny-qwen3-draft", "--placement", "cpu", "--contexts", "16"),
        *("--prompt-lengths", "8", "--K-max", "2", "--reps", "2", "--warmup", "0", "--probes", "1,4"),
        *("--prompts", "per-category:1", "--agreement-max-len", "16", "--temperature", "0.7"),
        *("--heads", "shortlist:64,32", "--head-assets", str(assets), "--out", str(profile_path)),
    ]
    assert measure_main(argv) == 0
    costs = json.loads(profile_path.read_text())["sampling"]["costs"]["regimes"]["eager"]
    for table in ("verify_greedy_ms", "verify_sampled_ms"):  # K + 1 for K = 0..2, timed interleaved
        assert [point["n_tokens"] for point in costs[table]["points"]] == [1, 2, 3]
    kinds = costs["head_kinds_ms"]
    assert [row["budget"] for row in kinds["shortlist"]] == [32, 64] and [r["budget"] for r in kinds["dense"]] == [None]
    assert all(row["median_ms"] > 0 for rows in kinds.values() for row in rows)
    lines = [dict(line, head="shortlist:64", sample=0) for line in trace_lines([2, 0, 1])]
    (trace_path,) = write(tmp_path, lines=lines)
    scenario = Scenario(
        profile=str(profile_path), acceptance=f"trace:{trace_path}", schedules=("ordinary",), heads=("shortlist:64",)
    )
    rows, resolved = run(scenario, ceiling=False)
    assert any("sampled draft heads: dense, shortlist per budget" in note for note in resolved.notes)
    steps = rows[-1]["draft_steps"]
    assert rows[-1]["phase_ms"]["draft_head"] == pytest.approx(kinds["shortlist"][1]["median_ms"] * steps)
