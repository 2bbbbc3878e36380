"""Token trees under sampling in the simulator (sim/sampled_trees.py): the mean accepted path length it
predicts under acceptance control is the sampled tree decoder's (a statistical check over many rounds,
whose negative control, a wrong rule, fails it); a sampled tree pays the sampled verify and the greedy
heads; sources that cannot answer a sampled tree are refused in one line. Timings are never asserted."""

import csv
import json
import math
import statistics

import pytest
import torch

from contracts.trees import TREE_SCHEDULES, parse_tree
from model.acceptance_control import AcceptanceControl
from model.decoder import Decoder
from model.heads import DenseHead
from model.loading import load_model
from model.sampling import SamplingSettings
from sim.__main__ import main
from sim.acceptance import Generation
from sim.scenario import Scenario, run
from sim.schedules import Config
from sim.simulate import simulate
from sim.trees import TreeAcceptance
from tests.sim_fixtures import timing, trace_lines, write
from tests.test_sampling_pipeline import VERIFY_EXTRA_MS, sampled_costs_profile

RATE, TREE, MAX_NEW, STREAMS, TEMPERATURE = 0.5, "2x2x1", 64, 12, 0.7
PROMPT = list(b"Sampled trees accept paths.")
SIMULATED_GENERATIONS = 400


def decoder_accepted_lengths() -> tuple[list[int], bool]:
    """Every round's accepted path length of the sampled tree decoder under control a=RATE over STREAMS
    independent acceptance streams (each stream's bits keyed by its name; the tree schedules take turns,
    as one stream gives every schedule the same paths), and whether any generation left the target's
    greedy reference (it samples: only the control's rule is shared)."""
    room = len(PROMPT) + MAX_NEW + 64
    target = load_model("tiny-qwen3", "cpu", seed=1, max_seq_len=room).model
    draft = load_model("tiny-qwen3-draft", "cpu", seed=2, max_seq_len=room).model
    reference = Decoder(target, K=1, graphs=False).reference(PROMPT, MAX_NEW + 16)
    control = AcceptanceControl(f"a={RATE}", target.head_weight.shape[0], room, torch.device("cpu"), seed=5)
    settings = SamplingSettings(temperature=TEMPERATURE, seed=3)
    dec = Decoder(
        target,
        draft,
        DenseHead(draft.head_weight),
        graphs=False,
        control=control,
        tree=parse_tree(TREE),
        sampling=settings,
        phases=False,
    )
    lengths, sampled = [], False
    for stream in range(STREAMS):
        control.bind(reference, len(PROMPT), f"stream{stream}")
        generation = dec.generate(PROMPT, MAX_NEW, TREE_SCHEDULES[stream % len(TREE_SCHEDULES)], sample=stream)
        sampled |= generation.tokens != reference[:MAX_NEW]
        lengths += [r.accepted for r in generation.rounds]
    return lengths, sampled


def tree_costs_profile() -> dict:
    """sampled_costs_profile (tests/test_sampling_pipeline.py) with the target forward and the draft body
    measured up to the trees' widths, and greedy per-depth top-k rates (they answer greedy trees only)."""
    profile = sampled_costs_profile()
    regime = profile["regimes"]["eager"]
    regime["target"]["forward_ms"] = {"points": [dict(timing(10.0 + n), n_tokens=n, context=8) for n in range(1, 13)]}
    regime["draft"]["body_ms"] = {"points": [dict(timing(2.0), n_tokens=n, context=8) for n in range(1, 13)]}
    rates = [[0.6, 0.8]] * 3
    counts = [[100, 100]] * 3
    profile["trees"] = {
        "weights": "real",
        "source": "test",
        "top_k": 2,
        "depths": 3,
        "rates": {"all": {"rate": rates, "n": counts}},
    }
    return profile


def mean_and_error(accepted: list[int]) -> tuple[float, float]:
    return statistics.fmean(accepted), statistics.stdev(accepted) / math.sqrt(len(accepted))


@pytest.fixture(scope="module")
def profile_path(tmp_path_factory):
    (path,) = write(tmp_path_factory.mktemp("sampled-trees"), tree_costs_profile())
    return path


def sampled_tree_scenario(profile_path, **changes) -> Scenario:
    common = dict(profile=str(profile_path), schedules=("deferred",), heads=("dense",), tree=TREE)
    common.update(prompts=SIMULATED_GENERATIONS, max_new_tokens=MAX_NEW, prompt_len=len(PROMPT), seed=1)
    return Scenario(**{**common, "acceptance": f"a={RATE}", "temperature": TEMPERATURE, **changes})


def test_the_simulators_sampled_tree_acceptance_under_control_is_the_decoders(profile_path):
    """The sampled decoder's mean accepted path length under a=RATE lies within 4 standard errors (of both
    means) of what `python -m sim` predicts for the same tree at the same temperature and control; the
    simulator given a wrong rule (a sampled chain's: each depth accepted at a whatever its width, a^d for
    depth d) misses it by more than 4 standard errors (the control of the test)."""
    lengths, sampled = decoder_accepted_lengths()
    assert sampled and len(lengths) >= 240
    measured, measured_error = mean_and_error(lengths)
    rows, resolved = run(sampled_tree_scenario(profile_path), ceiling=False)
    assert any(
        "under sampling: acceptance control accepts the child at each position's hit rank" in n for n in resolved.notes
    )
    predicted, predicted_error = mean_and_error([r["accepted"] for r in rows[-1]["rounds_detail"]])
    assert abs(measured - predicted) < 4 * math.hypot(measured_error, predicted_error), (measured, predicted)

    shape = parse_tree(TREE)
    chain_rule = TreeAcceptance(shape, [[RATE] * 2] * shape.depth, "a sampled chain's a^d, wrongly")
    costs = resolved.profile.costs[resolved.regime]
    config = Config("deferred", "dense", shape.depth, 4, "one-gpu", tree=shape)
    generations = [Generation(str(i), len(PROMPT), MAX_NEW - 1) for i in range(SIMULATED_GENERATIONS)]
    wrong_rows = simulate(costs, config, chain_rule, generations, ceiling=False)["rounds_detail"]
    wrong, wrong_error = mean_and_error([r["accepted"] for r in wrong_rows])
    assert abs(measured - wrong) > 4 * math.hypot(measured_error, wrong_error), (measured, wrong)


def test_a_sampled_tree_pays_the_sampled_verify_and_the_greedy_heads(profile_path):
    """The same control draws the same paths at temperature 0 and 0.7; sampling adds its verify extra to
    every target forward and leaves the draft heads, which rank a tree's children, at their greedy cost
    (a chain's draft pays its sampled head)."""
    greedy = run(sampled_tree_scenario(profile_path, temperature=0.0, prompts=20), ceiling=False)[0][-1]
    sampled = run(sampled_tree_scenario(profile_path, prompts=20), ceiling=False)[0][-1]
    assert sampled["mean_accepted"] == greedy["mean_accepted"] and sampled["verify_calls"] == greedy["verify_calls"]
    extra = sampled["phase_ms"]["verify"] - greedy["phase_ms"]["verify"]
    assert extra == pytest.approx(VERIFY_EXTRA_MS * greedy["verify_calls"])
    assert sampled["phase_ms"]["draft_head"] == pytest.approx(greedy["phase_ms"]["draft_head"])
    chain = run(sampled_tree_scenario(profile_path, tree="chain", prompts=20, K=3), ceiling=False)[0][-1]
    chain_greedy = run(
        sampled_tree_scenario(profile_path, tree="chain", prompts=20, K=3, temperature=0.0), ceiling=False
    )[0][-1]
    assert chain["phase_ms"]["draft_head"] > chain_greedy["phase_ms"]["draft_head"]


def tree_trace(tmp_path, sampled: bool) -> str:
    lines = [
        dict(line, tree="2x1", nodes=3, **({"sample": 0} if sampled else {})) for line in trace_lines([1, 2, 0, 2], K=2)
    ]
    (path,) = write(tmp_path, lines=lines)
    return str(path)


def test_a_trace_recorded_under_sampling_with_the_tree_replays_as_recorded(profile_path, tmp_path):
    trace = tree_trace(tmp_path, sampled=True)
    rows, resolved = run(
        Scenario(
            profile=str(profile_path),
            acceptance=f"trace:{trace}",
            schedules=("ordinary",),
            heads=("dense",),
            tree="2x1",
        ),
        ceiling=False,
    )
    assert [r["accepted"] for r in rows[-1]["rounds_detail"]] == [1, 2, 0, 2]
    assert any("the tree's draft heads as greedy" in note for note in resolved.notes)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--acceptance", "0.6"], "tree 2x1: under sampling a tree's acceptance comes from acceptance control"),
        (["--acceptance", "{greedy}"], "tree 2x1: temperature=0.7 with a trace recorded greedy"),
        (["--acceptance", "{sampled}", "--tree", "2x2"], "tree 2x2: under sampling a tree's acceptance comes from"),
        (
            ["--acceptance", "a=0.5", "--tree", "chain", "--schedule", "pipelined-deferred"],
            "(asked: pipelined-deferred)",
        ),
    ],
)
def test_sources_that_cannot_answer_a_sampled_tree_are_refused_in_one_line(
    profile_path, tmp_path, capsys, argv, message
):
    (tmp_path / "greedy").mkdir()
    (tmp_path / "sampled").mkdir()
    traces = {"{greedy}": tree_trace(tmp_path / "greedy", False), "{sampled}": tree_trace(tmp_path / "sampled", True)}
    argv = [traces.get(arg, arg) for arg in argv]
    common = ["--profile", str(profile_path), "--tree", "2x1", "--schedule", "ordinary", "--head", "dense", "--K", "2"]
    out = tmp_path / "out"
    assert main([*common, "--what-if", "temperature=0.7", *argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert not out.exists()


def test_validate_runs_sampled_trees_and_predicts_them_with_the_trees_costs(tmp_path):
    """Tiny models on the CPU at T = 0.7 under control: the tree's run samples, its trace replays to the
    same accepted paths, it is predicted from the control's rule too, and its calibration scales the
    greedy head (the one a tree's draft pays) while the chain's scales the sampled one."""
    from validate.__main__ import main as validate

    profile = sampled_costs_profile("cpu")
    profile["regimes"]["eager"]["target"]["forward_ms"] = {
        "points": [dict(timing(10.0 + n), n_tokens=n, context=8) for n in range(1, 13)]
    }
    (profile_path,) = write(tmp_path, profile)
    out = tmp_path / "report"
    argv = [
        *("--target", "tiny-qwen3", "--draft", "tiny-qwen3-draft", "--placement", "cpu", "--prompts", "81,111"),
        *("--profile", str(profile_path), "--schedules", "deferred", "--heads", "dense", "--K", "2"),
        *("--n-prompts", "1", "--max-new-tokens", "8", "--trees", "chain,2x1", "--acceptance", "a=0.6"),
        *("--temperature", "0.7", "--out", str(out)),
    ]
    assert validate(argv) == 0
    rows = {r["configuration"]: r for r in csv.DictReader((out / "results.csv").open())}
    tree = rows["deferred-dense-tree2x1"]
    lines = [json.loads(x) for x in (out / "traces" / "deferred-dense-tree2x1.trace.jsonl").read_text().splitlines()]
    assert lines and all(line["sample"] == 0 and line["tree"] == "2x1" for line in lines)
    assert float(tree["measured_mean_accepted"]) == pytest.approx(float(tree["predicted_mean_accepted"]))
    assert 0 <= float(tree["control_rule_mean_accepted"]) <= 2 and float(tree["control_rule_tok_s"]) > 0
    report = (out / "report.md").read_text()
    calibrations = next(line for line in report.splitlines() if line.startswith("- Calibration:"))
    chain_part, tree_part = calibrations.split("tree2x1-dense:")
    assert "sampling.costs.regimes.eager.head_dense_ms" in chain_part and "draft.head_dense_ms" in tree_part
    assert "the tree's draft heads as greedy" in report
    assert "The runs sample: the control then sets each node's accept number" in report
