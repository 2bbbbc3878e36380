"""Token trees in validate (CPU, tiny presets): the simulator's acceptance under the control's rule
matches the tree decoder's realized acceptance under acceptance control (a wrong rule does not); a
validation with --trees runs, replays and rules every tree, exactly; the profile it measures covers the
trees, and one that does not is refused; tree and chain decoders on one target keep their own attention.
Timings are never asserted."""

import csv
import json
import math
import re
import statistics

import pytest
import torch

from contracts import UsageError
from contracts.profile import TREE_ATTENTION_COSTS
from contracts.trace import read_summary
from contracts.trees import parse_tree
from model.acceptance_control import AcceptanceControl
from model.decoder import Decoder
from model.heads import DenseHead
from model.loading import load_model
from sim.acceptance import Generation
from sim.profile import Profile
from sim.scenario import Scenario, run
from sim.schedules import Config as SimConfig
from sim.simulate import simulate
from sim.trees import TreeAcceptance, control_source
from tests.sim_fixtures import timing, tiny_profile
from validate.__main__ import main, parse_args
from validate.pipeline import measure_settings
from validate.trees import decoder_rows, tree_widths

RATE, TREE, MAX_NEW, STREAMS = 0.5, "2x2x1", 96, 6
PROMPT = list(b"Speculative decoding drafts a tree.")


def decoder_accepted_lengths() -> list[int]:
    """Every round's accepted path length of the tree decoder under control a=RATE, over STREAMS
    independent acceptance streams (the control's bits are keyed by the stream's name)."""
    room = len(PROMPT) + MAX_NEW + 64
    target = load_model("tiny-qwen3", "cpu", seed=1, max_seq_len=room).model
    draft = load_model("tiny-qwen3-draft", "cpu", seed=2, max_seq_len=room).model
    reference = Decoder(target, K=1, graphs=False).reference(PROMPT, MAX_NEW + 16)
    control = AcceptanceControl(f"a={RATE}", target.head_weight.shape[0], room, torch.device("cpu"), seed=5)
    dec = Decoder(
        target, draft, DenseHead(draft.head_weight), graphs=False, control=control, tree=parse_tree(TREE), phases=False
    )
    lengths = []
    for stream in range(STREAMS):
        control.bind(reference, len(PROMPT), f"stream{stream}")
        generation = dec.generate(PROMPT, MAX_NEW, "deferred")
        assert generation.tokens == reference[:MAX_NEW]  # exact, whatever the control accepts
        lengths += [r.accepted for r in generation.rounds]
    return lengths


def simulated_mean(source, generations: int) -> tuple[float, float]:
    """(mean accepted per round, its standard error) the simulator predicts for generations like the decoder's."""
    shape = parse_tree(TREE)
    costs = Profile(profile_for(12), "test").costs["eager"]
    config = SimConfig("deferred", "dense", shape.depth, 4, "cpu", tree=shape)
    runs = [Generation(str(i), len(PROMPT), MAX_NEW - 1) for i in range(generations)]
    accepted = [r["accepted"] for r in simulate(costs, config, source, runs, ceiling=False)["rounds_detail"]]
    return statistics.fmean(accepted), statistics.stdev(accepted) / math.sqrt(len(accepted))


def test_the_simulators_tree_acceptance_under_control_is_the_decoders():
    """The decoder's mean accepted path length under a=RATE lies within 4 standard errors of the simulator's
    from the control's rule 1-(1-a)^k; read as a chain's rule (top-k holds the token at a, whatever k: the
    path accepts depth d at a^d) it does not (the control of the test)."""
    lengths = decoder_accepted_lengths()
    measured = statistics.fmean(lengths)
    measured_error = statistics.stdev(lengths) / math.sqrt(len(lengths))
    shape = parse_tree(TREE)
    rule, rule_error = simulated_mean(control_source(shape, RATE), 400)
    chain_rule = TreeAcceptance(shape, [[RATE] * 2] * shape.depth, "the chain's a^d, wrongly")
    wrong, wrong_error = simulated_mean(chain_rule, 400)
    tolerance = 4 * math.hypot(measured_error, rule_error)
    assert len(lengths) >= 180
    assert abs(measured - rule) < tolerance, (measured, rule, tolerance)
    assert abs(measured - wrong) > 4 * math.hypot(measured_error, wrong_error), (measured, wrong)


def profile_for(widest: int, placement: str = "cpu") -> dict:
    """The tiny profile (tests/sim_fixtures) with the target forward measured up to `widest` tokens."""
    profile = tiny_profile(placement, read_gap_ms=0.05)
    points = [dict(timing(10.0 + n), n_tokens=n, context=8) for n in range(1, widest + 1)]
    profile["regimes"]["eager"]["target"]["forward_ms"] = {"points": points}
    return profile


TINY = ["--target", "tiny-qwen3", "--draft", "tiny-qwen3-draft", "--placement", "cpu", "--prompts", "81,111"]
TINY += ["--n-prompts", "1", "--max-new-tokens", "8", "--schedules", "deferred", "--heads", "dense", "--K", "2"]


@pytest.fixture(scope="module")
def validated(tmp_path_factory):
    folder = tmp_path_factory.mktemp("trees")
    profile = profile_for(12)
    regime = profile["regimes"]["eager"]
    regime["target"]["tree_forward_ms"] = {
        "points": [dict(timing(12.0 + n), n_tokens=n, context=8) for n in range(1, 13)]
    }
    regime["draft"]["tree_body_ms"] = {"points": [dict(timing(2.0 + n), n_tokens=n, context=8) for n in range(1, 13)]}
    (folder / "profile.json").write_text(json.dumps(profile))
    out = folder / "report"
    args = ["--profile", str(folder / "profile.json"), "--trees", "chain,2x1,dynamic:2,4,2", "--acceptance", "a=0.6"]
    assert main(TINY + args + ["--out", str(out)]) == 0
    return folder


def test_every_tree_is_run_replayed_and_ruled(validated):
    rows = {r["configuration"]: r for r in csv.DictReader((validated / "report" / "results.csv").open())}
    assert list(rows) == ["deferred-dense-K2", "deferred-dense-tree2x1", "deferred-dense-treedynamic2.4.2"]
    for name, row in rows.items():
        summary = read_summary(validated / "report" / "traces" / f"{name}.summary.json")
        assert summary["config"].get("tree", "chain") == row["tree"]
        # the trace replays exactly: the same target calls and the same accepted lengths
        assert row["measured_verify_calls"] == row["predicted_verify_calls"]
        assert float(row["measured_mean_accepted"]) == pytest.approx(float(row["predicted_mean_accepted"]))
        ruled = row["tree"] != "chain"
        assert (row["control_rule_tok_s"] != "") == ruled
        if ruled:
            assert float(row["control_rule_tok_s"]) > 0 and 0 <= float(row["control_rule_mean_accepted"]) <= 2
    report = (validated / "report" / "report.md").read_text()
    assert "## Token trees: acceptance predicted from the control's rule" in report
    # a calibration's scale of a causal cost scales its tree-rule pair too
    calibrations = [line for line in report.splitlines() if line.startswith("- Calibration:")]
    assert len(calibrations) == 1 and "target.tree_forward_ms x" in calibrations[0]
    for group in calibrations[0].split("; "):
        scales = dict(re.findall(r"(\S+_ms) x([0-9.]+)", group))
        for causal, tree in TREE_ATTENTION_COSTS.items():
            assert scales.get(tree) == scales.get(causal), group
    assert "every recorded generation equals the target's greedy reference token for token" in report


def test_recorded_tree_runs_predict_again_to_the_same_numbers(validated, capsys):
    again = validated / "again"
    profile = str(validated / "profile.json")
    assert main(["--from-runs", str(validated / "report"), "--profile", profile, "--out", str(again)]) == 0
    before = {r["configuration"]: r for r in csv.DictReader((validated / "report" / "results.csv").open())}
    after = {r["configuration"]: r for r in csv.DictReader((again / "results.csv").open())}
    for name in before:
        for key in ("predicted_tok_s", "control_rule_tok_s", "control_rule_mean_accepted"):
            assert before[name][key] == after[name][key], (name, key)


def test_measure_covers_every_trees_verify_and_frontier_at_the_decoders_width():
    labels = ("chain", "2x2x1", "dynamic:4,16,4", "4x3x4")
    assert tree_widths(labels) == (1, 2, 4, 10, 11, 12, 16, 17, 64, 65)
    args = parse_args(TINY + ["--measure", "--trees", "+".join(labels)])
    settings = measure_settings(args, "cpu", False, 2, [8], [8], labels)
    assert settings.tree_widths == tree_widths(labels)
    assert decoder_rows(2, labels) == 65 and decoder_rows(6, ("chain",)) == 8


def test_a_profile_that_cannot_cost_a_trees_verify_is_refused_before_any_run(tmp_path, capsys):
    (tmp_path / "narrow.json").write_text(json.dumps(profile_for(4)))
    out = tmp_path / "report"
    args = ["--profile", str(tmp_path / "narrow.json"), "--trees", "2x2x1", "--out", str(out)]
    assert main(TINY + args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "measured up to 4 tokens, tree 2x2x1 verifies 11" in err
    assert "--tree-widths 1,2,4,10,11" in err and not out.exists()


@pytest.mark.parametrize(
    "trees, schedules, message",
    [
        ("dynamic:9,64,9", "deferred", "--trees dynamic:9,64,9: a dynamic tree feeds (D - 1) x M nodes to the draft"),
        ("2x2x1+2x1", "ordinary,deferred", None),
    ],
)
def test_a_tree_no_decoder_can_run_is_refused_before_the_profile_is_measured(
    tmp_path, capsys, monkeypatch, trees, schedules, message
):
    """With --measure a tree the decoders refuse would cost a whole profile first: refused before it, in one
    line (a tree that runs reaches the measurement, which this test stops)."""

    def measured(*args, **kwargs):
        raise RuntimeError("the profile's measurement started")

    monkeypatch.setattr("validate.pipeline.measure_profile", measured)
    out = tmp_path / "report"
    argv = [*TINY, "--measure", "--trees", trees, "--schedules", schedules, "--out", str(out)]
    if message is None:
        with pytest.raises(RuntimeError, match="measurement started"):
            main(argv)
        return
    assert main(argv) == 2
    assert capsys.readouterr().err.strip().splitlines() == [f"error: {message}, at most 64"] and not out.exists()


def test_the_simulator_answers_a_tree_under_control_without_a_trees_section(tmp_path):
    """`--acceptance a=A` with a tree: the control's rule sets its acceptance (2x1 at a = 0.5 accepts depth 1
    at 0.75 and depth 2 at 0.75 x 0.5, 1.125 a round before the generations' ends cut it), no trees section."""
    (tmp_path / "p.json").write_text(json.dumps(profile_for(12)))
    common = dict(profile=str(tmp_path / "p.json"), schedules=("deferred",), heads=("dense",), placement="cpu")
    rows, resolved = run(Scenario(**common, acceptance="a=0.5", tree="2x1", prompts=300), ceiling=False)
    assert rows[-1]["mean_accepted"] == pytest.approx(1.125, abs=0.05) and rows[-1]["tree"] == "2x1"
    assert any("acceptance control a=0.5: 1-(1-a)^k" in note for note in resolved.notes)
    with pytest.raises(UsageError, match="no 'trees' section"):
        run(Scenario(**common, acceptance="0.5", tree="2x1"), ceiling=False)


def test_decoders_on_one_target_keep_their_own_attention_choice():
    """A tree decoder attends in one pass per forward; it leaves the target's split-KV setting to the
    chain decoders built after it."""
    target = load_model("tiny-qwen3", "cpu", seed=1, max_seq_len=64).model
    draft = load_model("tiny-qwen3-draft", "cpu", seed=2, max_seq_len=64).model
    setting = target.attention_split_slots
    tree = Decoder(target, draft, DenseHead(draft.head_weight), graphs=False, tree=parse_tree("2x1"))
    chain = Decoder(target, draft, DenseHead(draft.head_weight), K=2, graphs=False)
    assert (tree.split_kv, chain.split_kv) == (False, True) and target.attention_split_slots == setting is not None
