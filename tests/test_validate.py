"""python -m validate on tiny models (CPU): the whole pipeline, its atomic output, the closed form by
hand, and bad input. Timings are never asserted; only that every number exists and agrees in kind."""

import csv
import json
import math
import re

import pytest
import torch

from contracts.trace import check_trace_line, read_summary
from sim.profile import Profile
from tests.sim_fixtures import tiny_profile, trace_lines
from validate import pipeline
from validate.__main__ import main
from validate.closed_form import closed_form

TINY = [
    "--target",
    "tiny-qwen3",
    "--draft",
    "tiny-qwen3-draft",
    "--placement",
    "cpu",
    "--prompts",
    "81,111,141",
    "--n-prompts",
    "2",
    "--max-new-tokens",
    "8",
]
MEASURE = ["--measure", "--measure-args", "--reps 2 --warmup 1 --agreement-max-len 8 --prompts first:1 --probes 1,32"]


@pytest.fixture(scope="module")
def validated(tmp_path_factory):
    out = tmp_path_factory.mktemp("validation") / "report"
    assert main(TINY + MEASURE + ["--K", "2", "--acceptance", "a=0.5", "--out", str(out)]) == 0
    return out


def test_every_configuration_is_measured_predicted_and_compared(validated):
    rows = list(csv.DictReader((validated / "results.csv").open()))
    names = [r["configuration"] for r in rows]
    assert names[0] == "baseline" and len(names) == 9  # baseline + 4 schedules x 2 heads
    assert {r["schedule"] for r in rows} == {"baseline", "ordinary", "pipelined", "deferred", "pipelined-deferred"}
    for r in rows:
        for key in ("measured_tok_s", "predicted_tok_s", "error", "closed_form_tok_s", "closed_form_error"):
            assert math.isfinite(float(r[key])), (r["configuration"], key)
        assert float(r["measured_tok_s"]) > 0 and float(r["predicted_tok_s"]) > 0
        if r["schedule"] != "baseline":  # the trace replays exactly: the same target calls
            assert r["measured_verify_calls"] == r["predicted_verify_calls"]
            assert r["measured_append_calls"] == r["predicted_append_calls"]


def test_report_files_and_traces_meet_the_contract(validated):
    for name in ("report.md", "results.csv", "scatter.png", "phases.png", "profile.json"):
        assert (validated / name).stat().st_size > 0
    report = (validated / "report.md").read_text()
    assert "**Weights: SYNTHETIC**" in report and "python -m validate" in report and "median absolute error" in report
    Profile(json.loads((validated / "profile.json").read_text()), "measured")  # what the simulator read
    traces = sorted((validated / "traces").glob("*.trace.jsonl"))
    calibration = [t for t in traces if t.name.startswith("calibration-")]
    assert len(traces) - len(calibration) == 9
    # one decoder instance for the baseline and one per head (K 2): baseline and deferred on each
    assert sorted(t.name.split(".")[0] for t in calibration) == sorted(
        f"calibration-{group}-{name}"
        for group in ("baseline", "K2-dense", "K2-flashhead")
        for name in (
            "baseline",
            "deferred-" + group.split("-")[-1] + "-K2" if group != "baseline" else "deferred-dense-K2",
        )
    )
    validation_prompts = set(read_summary(validated / "traces" / "baseline.summary.json")["config"]["prompts"])
    for trace in calibration:
        prompts = {json.loads(x)["prompt_id"] for x in trace.read_text().splitlines()}
        assert prompts and not prompts & validation_prompts  # calibrated on a prompt it never predicts
    groups = len(calibration) // 2
    assert f"- Calibration: baseline: {groups} generations (baseline) on prompt" in report
    for trace in sorted(set(traces) - set(calibration)):
        lines = [json.loads(x) for x in trace.read_text().splitlines()]
        for line in lines:
            check_trace_line(line, str(trace))
            assert "phases_ms" in line and "probes" in line
        summary = read_summary(trace.with_name(trace.name.replace(".trace.jsonl", ".summary.json")))
        assert summary["decode_tokens"] == sum(line["emitted"] for line in lines) == 2 * 7
    assert not list(validated.parent.glob(".*"))  # no staging folder left behind


def test_one_configuration_is_drawn_as_measured_and_predicted_timelines(validated):
    from contracts.timeline import read_timeline

    for name in ("timeline-measured.json", "timeline-predicted.json", "timeline.png"):
        assert (validated / name).is_file(), name
    assert (validated / "timeline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    (measured, m_meta), (predicted, p_meta) = (
        read_timeline(validated / f"timeline-{kind}.json") for kind in ("measured", "predicted")
    )
    assert m_meta["source"] == "decoder" and p_meta["source"] == "simulator"
    assert m_meta["configuration"]["name"] == p_meta["configuration"]["name"] == "pipelined-deferred-dense-K2"
    assert m_meta["generation"]["prompt_id"] == p_meta["generation"]["prompt_id"]  # the same generation
    assert m_meta["weights"] == p_meta["weights"] == "synthetic"
    assert {n for _, n, *_ in measured} & {n for _, n, *_ in predicted} >= {"draft_body", "draft_head", "verify"}
    report = (validated / "report.md").read_text()
    assert all(f"`{name}`" in report for name in ("timeline-measured.json", "timeline-predicted.json", "timeline.png"))
    assert "## A verify's turnaround (pipelined-deferred-dense-K2, its timelines)" in report


def test_recorded_runs_predict_again_to_the_same_numbers(validated, tmp_path, capsys):
    out = tmp_path / "again"
    assert main(["--from-runs", str(validated), "--profile", str(validated / "profile.json"), "--out", str(out)]) == 0
    columns = ("configuration", "measured_tok_s", "predicted_tok_s", "closed_form_tok_s")
    first, again = (
        [{k: r[k] for k in columns} for r in csv.DictReader((d / "results.csv").open())] for d in (validated, out)
    )
    assert sorted(first, key=str) == sorted(again, key=str)
    assert sorted(p.name for p in (out / "traces").iterdir()) == sorted(
        p.name for p in (validated / "traces").iterdir()
    )
    # the runs' measured timeline is copied, the predicted one made again, and both drawn
    assert (out / "timeline-measured.json").read_bytes() == (validated / "timeline-measured.json").read_bytes()
    assert (out / "timeline-predicted.json").is_file() and (out / "timeline.png").read_bytes()[:4] == b"\x89PNG"
    assert (
        main(
            [
                "--from-runs",
                str(tmp_path / "nothing"),
                "--profile",
                str(validated / "profile.json"),
                "--out",
                str(tmp_path / "x"),
            ]
        )
        == 2
    )
    assert main(["--from-runs", str(validated), "--out", str(tmp_path / "y")]) == 2
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()
    assert capsys.readouterr().err.count("error:") == 2


def test_repeated_runs_are_measured_as_their_median_and_predicted_again_alike(validated, tmp_path):
    """--repeats 3: each configuration and each calibration generation runs three times, each run of every
    configuration before the next; a configuration is measured as its median run, with the runs' range, and
    --from-runs chooses the same runs again."""
    out = tmp_path / "repeated"
    argv = ["--profile", str(validated / "profile.json"), "--schedules", "baseline,deferred", "--heads", "dense"]
    assert main(TINY + argv + ["--K", "2", "--acceptance", "a=0.5", "--repeats", "3", "--out", str(out)]) == 0
    traces = out / "traces"
    rows = {r["configuration"]: r for r in csv.DictReader((out / "results.csv").open())}
    assert sorted(rows) == ["baseline", "deferred-dense-K2"]
    for name, row in rows.items():
        stems = [name, f"{name}.repeat-2", f"{name}.repeat-3"]
        speeds = sorted(read_summary(traces / f"{stem}.summary.json")["decode_tok_s"] for stem in stems)
        assert float(row["measured_tok_s"]) == pytest.approx(speeds[1])  # the median run, not the first
        assert (float(row["runs_slowest_tok_s"]), float(row["runs_fastest_tok_s"])) == pytest.approx(
            (speeds[0], speeds[2])
        )
        assert row["trace"].removeprefix("traces/").split(".trace")[0] in stems
    calibration = sorted(p.name for p in traces.glob("calibration-K2-dense-*.summary.json"))
    assert calibration == sorted(
        f"calibration-K2-dense-{name}{suffix}.summary.json"
        for name in ("baseline", "deferred-dense-K2")
        for suffix in ("", ".repeat-2", ".repeat-3")
    )
    report = (out / "report.md").read_text()
    assert "the median of 3 runs of each configuration" in report and "runs' range" in report
    assert "K2-dense: 6 generations" in report  # the calibration pools its three runs of both schedules
    again = tmp_path / "again"
    assert main(["--from-runs", str(out), "--profile", str(validated / "profile.json"), "--out", str(again)]) == 0
    columns = ("configuration", "measured_tok_s", "runs_slowest_tok_s", "predicted_tok_s", "trace")
    first, second = (
        [{k: r[k] for k in columns} for r in csv.DictReader((d / "results.csv").open())] for d in (out, again)
    )
    assert first == second


def test_a_failure_midway_leaves_no_output(validated, tmp_path, monkeypatch):
    calls = []

    def fail_on_second(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("injected")
        return predict(*args, **kwargs)

    predict = pipeline.predict
    monkeypatch.setattr(pipeline, "predict", fail_on_second)
    out = tmp_path / "nested" / "report"
    with pytest.raises(RuntimeError, match="injected"):
        main(
            TINY
            + [
                "--profile",
                str(validated / "profile.json"),
                "--schedules",
                "baseline,ordinary",
                "--heads",
                "dense",
                "--K",
                "2",
                "--n-prompts",
                "1",
                "--out",
                str(out),
            ]
        )
    assert len(calls) == 2 and not out.exists() and not (tmp_path / "nested").exists()


def test_closed_form_equals_a_hand_computation():
    costs = Profile(tiny_profile("two-gpu", round_bookkeeping_ms=0.3), "test").costs["eager"]
    lines = trace_lines([2, 0, 1], K=2)  # contexts 9, 12, 13; emitted 3, 1, 2
    # target forward 10 + n ms (one context point), body 2, dense head 1, FlashHead 0.25 + p/100,
    # item 0.1, copy 0.2 (two per round on two GPUs), bookkeeping 0.3
    ordinary = closed_form(costs, "ordinary", "dense", 2, None, "two-gpu", lines)
    assert pytest.approx(2.0) == ordinary.E_R and ordinary.context == pytest.approx(34 / 3)
    assert (ordinary.T_p, ordinary.T_q, ordinary.T_o) == pytest.approx((12.0, 3.0, 11.0 + 0.1 + 0.3 + 0.4))
    assert ordinary.tpot_ms == pytest.approx((12 + 2 * 3 + 11.8) / 2)
    assert ordinary.tok_s == pytest.approx(1000 / 14.9)
    deferred = closed_form(costs, "deferred", "flashhead", 2, 4, "one-gpu", lines)
    assert (deferred.T_p, deferred.T_q, deferred.T_o) == pytest.approx((13.0, 2.29, 0.4))
    assert deferred.tpot_ms == pytest.approx((13 + 2 * 2.29 + 0.4) / 2)
    baseline = closed_form(costs, "baseline", "dense", 0, None, "one-gpu", lines)
    assert baseline.tpot_ms == pytest.approx(11.0)


def _one_line_exit_2(args, capsys, message, out):
    assert main(args + ["--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "\n" not in err and message in err
    assert not out.exists() and not out.parent.exists()


BAD = [
    (["--schedules", "eager", "--measure"], "unknown schedule"),
    (["--heads", "sparse", "--measure"], "unknown head"),
    (["--K", "0", "--measure"], "--K must be in 1..64"),
    (["--K", "4,65", "--measure"], "--K must be in 1..64"),
    (["--K", "two", "--measure"], "comma-separated integers"),
    (["--profile", "/nonexistent/profile.json"], "profile not found"),
    ([], "--profile PATH"),
    (["--measure", "--acceptance", "a=2"], "bad acceptance control"),
    (["--measure", "--prompts", "poetry"], "unknown prompt selection"),
    (["--measure", "--target", "no-such-model"], "checkpoint not found"),
    (["--measure", "--measure-args", "--frobnicate 1"], "unrecognized arguments"),
    (["--measure", "--graphs", "on"], "needs a GPU placement"),
    (["--peers", "--K", "2,4"], "one K"),
    (["--peers", "--schedule", "baseline"], "unknown schedule"),
    (["--peers", "--target", "tiny-qwen3-awq"], "unquantized target"),
]


@pytest.mark.parametrize("extra, message", BAD, ids=[" ".join(a) or "no profile" for a, _ in BAD])
def test_bad_input_is_one_line_exit_2_and_nothing_written(tmp_path, capsys, extra, message):
    _one_line_exit_2(TINY + extra, capsys, message, tmp_path / "new" / "report")


def test_no_gpu_for_a_gpu_placement(tmp_path, capsys):
    if torch.cuda.device_count() >= 2:
        pytest.skip("this machine has two GPUs")
    args = [a if a != "cpu" else "two-gpu" for a in TINY] + ["--measure"]
    _one_line_exit_2(args, capsys, "no GPU", tmp_path / "new" / "report")


def test_profile_from_another_placement_is_refused(tmp_path, capsys):
    profile = tmp_path / "one-gpu.json"
    profile.write_text(json.dumps(tiny_profile("one-gpu")))
    out = tmp_path / "new" / "report"
    _one_line_exit_2(TINY + ["--profile", str(profile)], capsys, "measured on placement one-gpu", out)


def test_calibration_scales_each_cost_by_its_phase_measured_over_predicted(tmp_path):
    """Measured phase times of a calibration run at twice the profile's verify time and half its draft
    body time give scales of exactly 2 and 0.5; the calibrated prediction then predicts those times."""
    from tests.sim_fixtures import tiny_profile, write
    from tests.sim_fixtures import trace_lines as fixture_lines
    from validate.calibration import scales_from
    from validate.plan import Config
    from validate.predict import predict

    profile_path, trace_path = write(tmp_path, tiny_profile("one-gpu"), fixture_lines([1, 2, 0, 2], K=2))
    lines = [dict(line, schedule="deferred") for line in json_lines(trace_path)]
    config = Config("deferred", "dense", 2)
    predicted, _ = predict(profile_path, trace_path, lines, config, None, "one-gpu", False)
    phases = dict(predicted["phase_ms"])
    measured = {
        "verify": 2 * phases["verify"],
        "finalize": 2 * phases["finalize"],
        "draft_body": 0.5 * phases["draft_body"],
        "draft_head": phases["draft_head"],
        "sync": 0.0,
        "other": 0.0,
    }
    summary = {"phases_ms": measured}
    scales = scales_from([(config, None, lines, summary, trace_path)], "dense", profile_path, "one-gpu", False)
    assert scales == pytest.approx({"target.forward_ms": 2.0, "draft.body_ms": 0.5, "draft.head_dense_ms": 1.0})
    edits = tuple((path, "*=", factor) for path, factor in scales.items())
    calibrated, _ = predict(profile_path, trace_path, lines, config, None, "one-gpu", False, edits)
    for phase in ("verify", "finalize", "draft_body", "draft_head"):
        assert calibrated["phase_ms"][phase] == pytest.approx(measured[phase])


def test_the_fitted_read_gap_makes_the_calibration_generations_come_out_as_measured(tmp_path):
    """Speculative calibration generations measured 0.7 ms a read slower in total than the profile
    predicts (read gap 0.1 ms) give a read gap that predicts their decode time exactly."""
    from tests.sim_fixtures import tiny_profile, write
    from tests.sim_fixtures import trace_lines as fixture_lines
    from validate.calibration import fitted_read_gap
    from validate.plan import Config
    from validate.predict import predict

    profile_path, trace_path = write(
        tmp_path, tiny_profile("one-gpu", read_gap_ms=0.1), fixture_lines([1, 2, 0, 2], K=2)
    )
    lines = [dict(line, schedule="deferred") for line in json_lines(trace_path)]
    config = Config("deferred", "dense", 2)
    predicted, _ = predict(
        profile_path, trace_path, lines, config, None, "one-gpu", False, (("host.read_gap_ms", "=", 0.1),)
    )
    reads = len(lines)
    slow = (config, None, lines, {"decode_ms": predicted["decode_ms"] + 1.0 * reads, "host_gaps": reads}, trace_path)
    fast = (config, None, lines, {"decode_ms": predicted["decode_ms"] + 0.4 * reads, "host_gaps": reads}, trace_path)
    fitted = fitted_read_gap([slow, fast], {}, 0.1, profile_path, "one-gpu", False)
    assert fitted == pytest.approx(0.8)
    refit, _ = predict(
        profile_path, trace_path, lines, config, None, "one-gpu", False, (("host.read_gap_ms", "=", fitted),)
    )
    assert 2 * refit["decode_ms"] == pytest.approx(slow[3]["decode_ms"] + fast[3]["decode_ms"])


def test_the_draft_prefill_is_calibrated_per_generation_not_per_read(tmp_path):
    """On one device the decoder runs the draft's prefill in the first round (its `other`, beyond the
    later rounds' usual 0.3 ms). A calibration generation whose prefill took twice the profile's 5 ms
    scales draft.prefill_ms by 2, and the read gap it fits stays the measured 0.1 ms: a once-a-generation
    cost charged to every read would predict a generation of many rounds too slow. Past the prompt
    lengths the profile measured, the measurement becomes a point of the cost instead of a scale."""
    from tests.sim_fixtures import tiny_profile, write
    from tests.sim_fixtures import trace_lines as fixture_lines
    from validate.calibration import draft_prefill_edit, fitted_read_gap, scales_from
    from validate.plan import Config
    from validate.predict import draft_prefill_ms, predict

    profile_path, trace_path = write(
        tmp_path, tiny_profile("one-gpu", read_gap_ms=0.1), fixture_lines([1, 2, 0, 2], K=2)
    )
    lines = [
        dict(line, schedule="deferred", phases_ms={"other": 0.3 + (10.0 if line["round"] == 0 else 0.0)})
        for line in json_lines(trace_path)
    ]
    assert draft_prefill_ms(lines) == pytest.approx(10.0)
    config = Config("deferred", "dense", 2)
    gap = (("host.read_gap_ms", "=", 0.1),)
    predicted, _ = predict(profile_path, trace_path, lines, config, None, "one-gpu", False, gap)
    assert predicted["phase_ms"]["initial"] == pytest.approx(5.0)
    reads = len(lines)
    summary = {
        "phases_ms": {p: predicted["phase_ms"][p] for p in ("verify", "finalize", "draft_body", "draft_head")},
        "decode_ms": predicted["decode_ms"] + 5.0,  # the prefill's extra 5 ms, once
        "host_gaps": reads,
    }
    record = (config, None, lines, summary, trace_path)
    prefill = draft_prefill_edit([record], profile_path, "one-gpu", False)
    assert prefill == (("draft.prefill_ms", "*=", pytest.approx(2.0)),)
    scales = scales_from([record], "dense", profile_path, "one-gpu", False)
    assert fitted_read_gap([record], scales, 0.1, profile_path, "one-gpu", False, prefill) == pytest.approx(0.1)
    assert draft_prefill_edit([record], profile_path, "two-gpu", False) == ()  # within TTFT there

    raw = tiny_profile("one-gpu", read_gap_ms=0.1)  # the prompt (8 tokens) past the measured lengths
    raw["regimes"]["eager"]["draft"]["prefill_ms"] = {
        "points": [{"prompt_len": n, "median_ms": 5.0, "p10_ms": 5.0, "p90_ms": 5.0, "n": 1} for n in (2, 4)]
    }
    (tmp_path / "measured_short.json").write_text(json.dumps(raw))
    short = tmp_path / "measured_short.json"
    prefill = draft_prefill_edit([record], short, "one-gpu", False)
    assert prefill == (("draft.prefill_ms", "@8=", pytest.approx(10.0)),)
    calibrated, _ = predict(short, trace_path, lines, config, None, "one-gpu", False, prefill)
    assert calibrated["phase_ms"]["initial"] == pytest.approx(10.0)


def test_calibration_pools_the_instances_of_one_head_and_the_baselines_of_all():
    from validate.calibration import pooled
    from validate.plan import Config

    def generations(K, head):
        return [(Config("baseline", "dense", 0), K, head), (Config("deferred", head, K), K, head)]

    records = {"baseline": generations(2, "dense")}
    records.update({f"K{K}-{head}": generations(K, head) for K in (2, 4) for head in ("dense", "flashhead")})
    assert {(r[0].name, r[1]) for r in pooled(records, "K4-flashhead")} == {
        ("baseline", 2),
        ("baseline", 4),
        ("deferred-flashhead-K2", 2),
        ("deferred-flashhead-K4", 4),
    }
    assert len(pooled(records, "baseline")) == 5 and {r[0].schedule for r in pooled(records, "baseline")} == {
        "baseline"
    }


def json_lines(path):
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def test_measured_contexts_span_the_runs_evenly_ends_included():
    assert pipeline.context_points(104, 280) == [104, 163, 221, 280]
    assert pipeline.context_points(10, 12) == [10, 11, 12]  # rounding merges points closer than 1
    assert pipeline.context_points(50, 50) == [50]


def test_the_calibration_prompt_is_no_validation_prompt_and_has_the_mean_length():
    """Its contexts sit at the runs' mean: cut to the validation prompts' mean length (5, 9, 40: 18)."""
    from types import SimpleNamespace

    from model.prompts import select_prompts

    questions = select_prompts("first:4")
    tokenizer = SimpleNamespace(encode=lambda text: list(range(len(text.split()))))
    pair = SimpleNamespace(target=SimpleNamespace(tokenizer=tokenizer))
    validation = questions[:3]
    ids = [tokenizer.encode(q.text)[:n] for q, n in zip(validation, (5, 9, 40))]
    work = SimpleNamespace(prompts=validation, ids=ids)
    prompt, calibration_ids = pipeline.calibration_workload(SimpleNamespace(prompts_file=None), pair, work)
    assert prompt.id not in {q.id for q in validation}
    assert len(calibration_ids) == 18


def test_a_categorys_calibration_prompt_is_of_that_category_and_its_mean_length():
    from types import SimpleNamespace

    from model.prompts import select_prompts

    questions = select_prompts("first:100000")
    writing = [q for q in questions if q.category == "writing"][:3]
    math = [q for q in questions if q.category == "math"][:1]
    tokenizer = SimpleNamespace(encode=lambda text: list(range(len(text.split()))))
    pair = SimpleNamespace(target=SimpleNamespace(tokenizer=tokenizer))
    validation = [*writing, *math]
    ids = [tokenizer.encode(q.text)[:n] for q, n in zip(validation, (5, 7, 30, 11))]
    work = SimpleNamespace(prompts=validation, ids=ids)
    args = SimpleNamespace(prompts_file=None)
    for category, length in (("writing", 14), ("math", 11)):
        prompt, calibration_ids = pipeline.calibration_workload(args, pair, work, category)
        assert prompt.category == category and prompt.id not in {q.id for q in validation}
        assert len(calibration_ids) == length


def test_a_shortlist_head_is_run_measured_into_the_profile_and_predicted(tmp_path):
    from model.head_assets import Shortlist, save_shortlist

    assets = tmp_path / "assets"  # a shortlist of the tiny presets' 512 tokens, most frequent first
    save_shortlist(Shortlist(torch.arange(512), torch.zeros(512, dtype=torch.long)), assets)
    out = tmp_path / "report"
    heads = ["--heads", "dense+shortlist:64,32", "--head-assets", str(assets), "--schedules", "ordinary,deferred"]
    assert main(TINY + MEASURE + heads + ["--K", "2", "--acceptance", "a=0.5", "--out", str(out)]) == 0
    costs = json.loads((out / "profile.json").read_text())["heads"]["cost"]["kinds"]
    assert [row["budget"] for row in costs["shortlist"]] == [32, 64] and costs["dense"][0]["median_ms"] > 0
    rows = {r["configuration"]: r for r in csv.DictReader((out / "results.csv").open())}
    for name in ("ordinary-shortlist:64,32-K2", "deferred-shortlist:64,32-K2"):
        assert float(rows[name]["measured_tok_s"]) > 0 and float(rows[name]["predicted_tok_s"]) > 0


@pytest.mark.parametrize("wrong_references", [False, True])
def test_uncontrolled_greedy_runs_are_checked_against_the_targets_reference(
    validated, tmp_path, monkeypatch, wrong_references
):
    """Without acceptance control (real checkpoints run so) every greedy generation is still compared
    with the target's greedy reference; references made wrong (the control) are reported, not passed."""
    from validate import pipeline

    if wrong_references:
        real = pipeline.references
        monkeypatch.setattr(
            pipeline, "references", lambda *a: {pid: [t + 1 for t in ref] for pid, ref in real(*a).items()}
        )
    out = tmp_path / "report"
    argv = ["--profile", str(validated / "profile.json"), "--schedules", "deferred", "--heads", "dense", "--K", "2"]
    assert main(TINY + argv + ["--acceptance", "none", "--out", str(out)]) == 0
    outputs = [line for line in (out / "report.md").read_text().splitlines() if line.startswith("- Outputs:")]
    if wrong_references:
        assert outputs and "**NOT exact**" in outputs[0] and "deferred-dense-K2 81" in outputs[0]
    else:
        assert outputs == ["- Outputs: every recorded generation equals the target's greedy reference token for token"]


def test_without_graphs_the_shared_models_scales_come_from_every_instance(validated):
    """On the CPU (no captured graph per decoder instance to drift) the target's and the draft body's
    scales pool every instance's calibration generations, so every instance has the same ones; each
    head's scale stays its own instance's."""
    line = next(row for row in (validated / "report.md").read_text().splitlines() if row.startswith("- Calibration:"))
    groups = {
        group.split(":", 1)[0].removeprefix("- Calibration: "): dict(
            re.findall(r"(\S+_ms|heads\.cost) x([0-9.]+)", group)
        )
        for group in line.split("; ")
    }
    assert {"K2-dense", "K2-flashhead"} <= set(groups)
    for path in ("target.forward_ms", "draft.body_ms"):
        assert len({scales[path] for name, scales in groups.items() if name != "baseline"}) == 1, (path, groups)
    heads = (groups["K2-dense"]["draft.head_dense_ms"], groups["K2-flashhead"]["draft.head_flashhead_ms"])
    assert heads[0] != heads[1]


def test_a_rounds_time_is_its_phases_less_the_closing_append():
    """A traced round's phases already hold its host gap (in `other`), so the gap is not added again; the
    standalone append that closes a generation belongs to the generation, not to its last round."""
    from validate.calibration import round_ms

    phases = {"verify": 9.0, "draft_body": 1.0, "other": 0.5, "finalize": 3.0}
    assert round_ms({"round": 3, "phases_ms": phases, "host_gap_ms": 0.2}) == pytest.approx(10.5)


def test_each_kind_of_tree_fits_its_read_gap_to_its_own_generations(monkeypatch):
    """The tree instances of one head pool their calibration generations for the cost scales, but a
    static tree's read gap is fitted to the static trees' speculative generations and a dynamic tree's to
    its own (it rebuilds its tables each round); a chain's to the chains', the baseline's to the
    baselines'. Sessions 33-34's dynamic tree, fitted with the static ones, was predicted 4.2-4.3% fast."""
    from validate import pipeline
    from validate.plan import Config

    monkeypatch.setattr(pipeline, "profile_has_read_gap", lambda path, graphs: True)
    monkeypatch.setattr(pipeline, "scales_from", lambda pool, *args: {"pool": len(pool)})
    monkeypatch.setattr(pipeline, "draft_prefill_edit", lambda *args: ())
    monkeypatch.setattr(pipeline, "read_gap_from", lambda summaries: 0.1)
    fitted_to = {}

    def fit(records, scales, gap, *args):
        names = sorted(config.name for config, *_ in records)
        return fitted_to.setdefault(tuple(names), len(fitted_to))

    monkeypatch.setattr(pipeline, "fitted_read_gap", fit)
    instances = {
        "K4-dense": Config("deferred", "dense", 4),
        "tree2x2x1-dense": Config("deferred", "dense", 3, "2x2x1"),
        "tree4x3x4-dense": Config("deferred", "dense", 3, "4x3x4"),
        "treedynamic4.16.4-dense": Config("deferred", "dense", 4, "dynamic:4,16,4"),
    }
    baseline = Config("baseline", "dense", 0)
    summary = {"per_prompt": [{"prompt_id": "82"}]}
    records = {
        group: [(baseline, None, [], summary, None), (c, None, [], summary, None)] for group, c in instances.items()
    }
    records["baseline"] = [(baseline, None, [], summary, None)]
    calibrations = pipeline.calibrate(records, "profile.json", "one-gpu", True)
    gaps = {group: calibration.read_gap_ms for group, calibration in calibrations.items()}
    names = {index: names for names, index in fitted_to.items()}
    assert names[gaps["treedynamic4.16.4-dense"]] == ("deferred-dense-treedynamic4.16.4",)
    assert names[gaps["tree2x2x1-dense"]] == ("deferred-dense-tree2x2x1", "deferred-dense-tree4x3x4")
    assert gaps["tree4x3x4-dense"] == gaps["tree2x2x1-dense"]
    assert names[gaps["K4-dense"]] == ("deferred-dense-K4",)
    assert names[gaps["baseline"]] == ("baseline",) * 5
    # the scales still pool every tree instance's generations, baselines included
    assert calibrations["treedynamic4.16.4-dense"].scales == {"pool": 6}
