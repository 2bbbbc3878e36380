"""Token-tree rounds in the simulator (sim/trees.py): acceptance from per-depth top-k rates, the
tree's draft and verify widths, and the profile's `trees` section."""

import copy
import itertools
import json
import random
from dataclasses import replace
from pathlib import Path

import pytest

from contracts import UsageError
from contracts.profile import check_profile
from contracts.trees import chain_shape, parse_tree
from sim.__main__ import main
from sim.acceptance import Generation, leading_accepts
from sim.costs import Costs
from sim.schedules import Config
from sim.simulate import simulate
from sim.trees import TreeAcceptance, cumulative, dynamic_as_static
from tests.sim_fixtures import timing, tiny_profile

# P(target token in the draft's top-k at depth d | accepted so far), k = 1..8, depths 1..6
RATES = [[min(1.0, 0.55 - 0.03 * d + 0.06 * k) for k in range(8)] for d in range(6)]


def tree_profile(rates=RATES, widths=(1, 2, 3, 4, 8, 16, 33, 65)) -> dict:
    profile = tiny_profile()
    target = profile["regimes"]["eager"]["target"]
    target["forward_ms"] = {"points": [dict(timing(10.0 + 0.05 * n), n_tokens=n, context=8) for n in widths]}
    profile["regimes"]["eager"]["draft"]["body_ms"] = {
        "points": [dict(timing(2.0 + 0.01 * n), n_tokens=n, context=8) for n in widths]
    }
    profile["trees"] = {
        "weights": "synthetic",
        "source": "test rates",
        "top_k": len(rates[0]),
        "depths": len(rates),
        "rates": {"all": {"rate": rates, "n": [[100] * len(rates[0])] * len(rates)}},
    }
    return profile


@pytest.fixture
def profile_path(tmp_path):
    path = tmp_path / "trees.json"
    path.write_text(json.dumps(tree_profile()))
    return path


def sim_rows(capsys, argv) -> list[dict]:
    """The rows `python -m sim ARGV` writes into its --out folder."""
    assert main(argv) == 0, capsys.readouterr().err
    capsys.readouterr()
    return json.loads((Path(argv[argv.index("--out") + 1]) / "results.json").read_text())["rows"]


def test_a_one_by_one_by_one_tree_predicts_what_a_chain_of_three_predicts_with_the_same_rates(
    profile_path, tmp_path, capsys
):
    common = ["--profile", str(profile_path), "--no-ceiling", "--head", "dense", "--prompts", "6"]
    common += ["--schedule", "ordinary+deferred+pipelined+pipelined-deferred"]
    top1 = ",".join(str(row[0]) for row in RATES[:4])  # the 4th: the look-ahead's guess after a full block
    common += ["--acceptance", top1]  # the tree's acceptance comes from the rates: the source sets the prompts
    tree = sim_rows(capsys, [*common, "--tree", "1x1x1", "--out", str(tmp_path / "tree")])
    chain = sim_rows(capsys, [*common, "--K", "3", "--out", str(tmp_path / "chain")])
    assert [r["schedule"] for r in tree] == [r["schedule"] for r in chain]
    for a, b in zip(tree, chain):
        for key in ("acceptance", "mean_accepted", "rounds", "verify_calls", "draft_steps"):
            assert a[key] == b[key], (a["schedule"], key)
        if a["schedule"] in ("baseline", "ordinary", "pipelined"):  # both feed [prev, f] to each round's first step
            assert (a["decode_tok_s"], a["decode_ms"]) == (b["decode_tok_s"], b["decode_ms"]), a["schedule"]
        else:  # a deferred chain feeds f alone after a rejection (Decoder.missed); a tree's root re-feeds prev
            assert a["decode_ms"] > b["decode_ms"], a["schedule"]


def test_the_chain_tree_is_the_chain_of_K(profile_path, tmp_path, capsys):
    # ordinary: a deferred chain's first step feeds f alone after a rejection, a tree's re-feeds prev (above)
    common = ["--profile", str(profile_path), "--no-ceiling", "--head", "dense", "--schedule", "ordinary"]
    chain = sim_rows(capsys, [*common, "--tree", "chain", "--K", "4", "--out", str(tmp_path / "a")])
    ones = sim_rows(capsys, [*common, "--tree", "1x1x1x1", "--out", str(tmp_path / "b")])
    assert chain[1]["decode_tok_s"] == ones[1]["decode_tok_s"] and chain[1]["K"] == ones[1]["K"] == 4


def contained(small, large) -> bool:
    """Every root-to-node path of `small` is one of `large`."""

    def paths(shape):
        out = set()
        for node in range(len(shape.parents)):
            path, at = [], node
            while at != -1:
                path.append(shape.ranks[at])
                at = shape.parents[at]
            out.add(tuple(reversed(path)))
        return out

    return paths(small) <= paths(large)


def accepted_per_round(shape, cdf, K, rounds=400, seed=3):
    block = TreeAcceptance(shape, cdf, "test").stream(Generation("g", 8, 100), seed)
    return [leading_accepts(block(0, K), K) for _ in range(rounds)]


SPECS = ["1", "2", "1x1", "2x1", "2x2", "1x1x1", "2x1x1", "2x2x1", "3x2x1", "paths:0;1;0.0;1.0", "paths:0;0.1;0.0"]


def test_a_tree_that_contains_another_never_accepts_less_with_the_same_draws():
    rng = random.Random(0)
    tables = [cumulative(RATES)] + [
        cumulative([sorted(rng.random() for _ in range(8)) for _ in range(6)]) for _ in range(3)
    ]
    checked = 0
    for a, b in itertools.permutations(SPECS, 2):
        small, large = parse_tree(a), parse_tree(b)
        if not contained(small, large):
            continue
        for cdf in tables:
            short, wide = accepted_per_round(small, cdf, 3), accepted_per_round(large, cdf, 3)
            assert all(x <= y for x, y in zip(short, wide)), (a, b)
            checked += 1
    assert checked > 20


def test_negative_control_a_tree_that_does_not_contain_the_other_may_accept_less():
    """The containment test can fail: `paths:1` does not contain `1`, and accepts less on some rounds."""
    cdf = cumulative(RATES)
    first, second = accepted_per_round(parse_tree("1"), cdf, 3), accepted_per_round(parse_tree("paths:1"), cdf, 3)
    assert not contained(parse_tree("1"), parse_tree("paths:1"))
    assert any(x > y for x, y in zip(first, second))


def test_containment_holds_in_the_simulator_mean_accepted_length(profile_path, tmp_path, capsys):
    argv = ["--profile", str(profile_path), "--no-ceiling", "--head", "dense", "--schedule", "deferred"]
    argv += ["--prompts", "8", "--max-new-tokens", "200", "--sweep", "tree=1x1x1+2x1x1+2x2x1+3x3x2"]
    rows = [r for r in sim_rows(capsys, [*argv, "--out", str(tmp_path / "s")]) if r["schedule"] == "deferred"]
    lengths = [r["mean_accepted"] for r in rows]
    assert [r["tree"] for r in rows] == ["1x1x1", "2x1x1", "2x2x1", "3x3x2"]
    assert lengths == sorted(lengths) and lengths[0] < lengths[-1]


def expected_accepted(shape, cdf) -> float:
    """Exact mean accepted depth: every node is on the accepted path with the product of its path's
    rank probabilities (ranks independent across depths)."""
    total = 0.0
    for node in range(len(shape.parents)):
        probability, at, depth = 1.0, node, []
        while at != -1:
            depth.append(at)
            at = shape.parents[at]
        for level, index in enumerate(reversed(depth)):
            rank, row = shape.ranks[index], cdf[level]
            probability *= row[rank] - (row[rank - 1] if rank else 0.0)
        total += probability
    return total


@pytest.mark.parametrize("spec", ["2x2x1", "paths:0;2;0.1;2.0;2.0.0"])
def test_the_drawn_accepted_length_has_the_exact_mean_and_a_wrong_tree_is_rejected(spec):
    cdf = cumulative(RATES)
    shape = parse_tree(spec)
    drawn = accepted_per_round(shape, cdf, shape.depth, rounds=20_000, seed=1)
    mean = sum(drawn) / len(drawn)
    spread = (sum((x - mean) ** 2 for x in drawn) / len(drawn)) ** 0.5 / len(drawn) ** 0.5
    assert abs(mean - expected_accepted(shape, cdf)) < 4 * spread
    wrong = parse_tree("2x1x1")  # the negative control: another tree's mean is far off
    assert abs(mean - expected_accepted(wrong, cdf)) > 4 * spread


def test_a_tree_round_drafts_its_frontiers_and_verifies_every_node():
    costs = Costs(tree_profile()["regimes"]["eager"], "test")
    shape = parse_tree("3x2x1")
    source = TreeAcceptance(shape, cumulative(RATES), "test")
    for schedule, extra in (("ordinary", 0), ("deferred", 1)):
        config = Config(schedule, "dense", shape.depth, 4, "one-gpu", tree=shape)
        result = simulate(costs, config, source, [Generation("g", 8, 40)], ceiling=False, events=True)
        draft_tokens = [tokens for name, _, tokens in result["events"] if name == "draft_step"]
        assert draft_tokens[:3] == [2, 3, 6]  # [prev, f], then the 3 depth-1 nodes, then the 6 depth-2 nodes
        verifies = {tokens for name, _, tokens in result["events"] if name == "verify"}
        assert verifies == {shape.node_count + extra}


def tree_rule_costs() -> Costs:
    """A profile with the tree rule's own tables (python -m measure --tree-widths): every tree-rule target
    forward 5 ms and every tree-rule draft step 1 ms dearer than the causal one of the same width."""
    profile = tree_profile()
    regime = profile["regimes"]["eager"]
    widths = (1, 2, 3, 4, 8, 16, 33, 65)
    regime["target"]["tree_forward_ms"] = {
        "points": [dict(timing(15.0 + 0.05 * n), n_tokens=n, context=8) for n in widths]
    }
    regime["draft"]["tree_body_ms"] = {"points": [dict(timing(3.0 + 0.01 * n), n_tokens=n, context=8) for n in widths]}
    check_profile(profile, "test")
    return Costs(regime, "test")


def test_a_tree_round_s_lookahead_runs_under_the_tree_rule_and_a_chain_round_s_does_not():
    """pipelined-deferred: a tree round's look-ahead feeds its D + 1 tokens with tree attention
    (model/tree_lookahead.py), so each costs a tree-rule step; the round after a used look-ahead verifies
    a chain, drafts nothing, and looks ahead as a chain does (causal steps)."""
    shape = parse_tree("3x2x1")
    config = Config("pipelined-deferred", "dense", shape.depth, 4, "one-gpu", tree=shape)
    source = TreeAcceptance(shape, cumulative(RATES), "test")
    generation = [Generation("g", 8, 60)]
    tree = simulate(tree_rule_costs(), config, source, generation, ceiling=False)
    causal = simulate(Costs(tree_profile()["regimes"]["eager"], "test"), config, source, generation, ceiling=False)
    rounds = tree["rounds_detail"]
    assert [r["accepted"] for r in rounds] == [r["accepted"] for r in causal["rounds_detail"]]
    tree_rounds = sum(1 for i in range(len(rounds)) if i == 0 or not rounds[i - 1]["lookahead_used"])
    assert 0 < tree_rounds < len(rounds)  # both kinds of round are there
    extra_body = tree["phase_ms"]["draft_body"] - causal["phase_ms"]["draft_body"]
    # per tree round: its D - 1 frontier steps and its look-ahead's D + 1 steps, 1 ms dearer each
    assert extra_body == pytest.approx(1.0 * 2 * shape.depth * tree_rounds)


def test_a_tree_round_reads_its_verify_and_frontier_steps_from_the_tree_rule_tables():
    """A profile with the tree rule's own tables (python -m measure --tree-widths): a tree decoder's every
    target forward (verifies and appends) and its frontier steps cost what they say; its root step and a
    chain's round what the causal ones say."""
    with_tables, without = tree_rule_costs(), Costs(tree_profile()["regimes"]["eager"], "test")
    shape = parse_tree("3x2x1")
    source = TreeAcceptance(shape, cumulative(RATES), "test")
    generation = [Generation("g", 8, 40)]
    for schedule in ("ordinary", "deferred"):
        config = Config(schedule, "dense", shape.depth, 4, "one-gpu", tree=shape)
        tree = simulate(with_tables, config, source, generation, ceiling=False)
        causal = simulate(without, config, source, generation, ceiling=False)
        assert tree["rounds"] == causal["rounds"] and tree["verify_calls"] == causal["verify_calls"]
        extra_target = sum(tree["phase_ms"][p] - causal["phase_ms"][p] for p in ("verify", "finalize"))
        assert extra_target == pytest.approx(5.0 * (tree["verify_calls"] + tree["append_calls"]))
        extra_body = tree["phase_ms"]["draft_body"] - causal["phase_ms"]["draft_body"]
        assert extra_body == pytest.approx(1.0 * (shape.depth - 1) * tree["rounds"])  # the root step stays causal
    chain = replace(chain_shape(3), label="chain")
    config = Config("deferred", "dense", 3, 4, "one-gpu", tree=chain)
    chain_source = TreeAcceptance(chain, cumulative(RATES), "test")
    assert simulate(with_tables, config, chain_source, generation, ceiling=False)["phase_ms"] == pytest.approx(
        simulate(without, config, chain_source, generation, ceiling=False)["phase_ms"]
    )


def test_dynamic_trees_are_approximated_by_their_best_nodes():
    cdf = cumulative(RATES)
    approximated = dynamic_as_static(parse_tree("dynamic:3,10,4"), cdf)
    assert approximated.node_count == 10 and approximated.depth <= 4 and max(approximated.ranks) < 3
    assert approximated.ranks[0] == 0  # the draft's best token is always a node


def test_tok_s_and_mean_accepted_length_are_printed(profile_path, capsys):
    argv = ["--profile", str(profile_path), "--no-ceiling", "--tree", "dynamic:4,16,5"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "dynamic:4,16,5" in out and "acc/rd" in out and "pipelined-deferred" in out
    assert "schedules pipelined-deferred left out" not in out


# 8 depth-1 nodes, 55 of their children, and a child of the last of those (node 62, fed at slot 62)
WIDEST_FED = "paths:" + ";".join(
    [str(i) for i in range(8)] + [f"{i}.{j}" for i in range(8) for j in range(7)][:55] + ["7.5.0"]
)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--tree", "2x0"], "--tree: tree '2x0': every number must be a positive integer"),
        (
            ["--tree", WIDEST_FED, "--schedule", "pipelined-deferred"],  # its look-ahead needs slots 63..66
            "runs on schedules ordinary, pipelined, deferred only",
        ),
        (["--tree", "2x2", "--head", "flashhead"], "runs on heads dense only"),
        (["--tree", "1x1x1x1x1x1x1"], "the profile's tree rates cover depths 1..6"),
        (["--tree", "9"], "top-1..8"),
        (["--what-if", "tree=2x2", "--policy", "ucb1", "--schedule", "deferred"], "fixed draft model"),
        (["--sweep", "tree=chain+bad"], "sweep tree: tree 'bad': unknown tree kind"),
    ],
)
def test_bad_tree_input_is_one_line_and_exit_2(profile_path, capsys, argv, message):
    assert main(["--profile", str(profile_path), *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


def test_a_profile_without_rates_or_a_wide_enough_verify_refuses_a_tree(tmp_path, capsys):
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps(tiny_profile()))
    assert main(["--profile", str(bare), "--tree", "2x1"]) == 2
    assert "no per-depth top-k rates" in capsys.readouterr().err
    narrow = tmp_path / "narrow.json"
    narrow.write_text(json.dumps(tree_profile(widths=(1, 2, 3, 4))))
    assert main(["--profile", str(narrow), "--tree", "2x1"]) == 2
    assert "its verify covers 4 tokens" not in capsys.readouterr().err  # 3 nodes + 1 = 4 is measured
    assert main(["--profile", str(narrow), "--tree", "2x2"]) == 2
    assert "its verify covers 7 tokens, the profile's target.forward_ms is measured up to 4" in capsys.readouterr().err


def _broken(change) -> dict:
    profile = copy.deepcopy(tree_profile())
    change(profile["trees"])
    return profile


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda t: t.update(weights="guessed"), "trees.weights must be one of"),
        (lambda t: t.update(depths=0), "integers 'depths' and 'top_k'"),
        (lambda t: t["rates"].pop("all"), "with the pooled one, 'all'"),
        (lambda t: t["rates"]["all"]["rate"].pop(), "must be 6 lists (depths) of 8 values"),
        (lambda t: t["rates"]["all"]["rate"][0].__setitem__(2, 1.5), "values must be numbers in [0, 1] or null"),
        (lambda t: t["rates"]["all"]["n"][0].__setitem__(2, -1), "n values must be non-negative integers"),
        (lambda t: t["rates"]["all"]["rate"][0].__setitem__(2, None), "null exactly where n is 0"),
        (lambda t: t["rates"].update(qa=[1, 2]), "trees.rates.qa must be an object"),
    ],
)
def test_the_profile_checker_rejects_a_malformed_trees_section(change, message):
    check_profile(tree_profile(), "good")
    with pytest.raises(UsageError) as error:
        check_profile(_broken(change), "bad")
    assert message in str(error.value)


def test_old_profiles_without_trees_stay_valid():
    check_profile(tiny_profile(), "old")
