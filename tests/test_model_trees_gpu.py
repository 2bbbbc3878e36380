"""Token trees on CUDA (skipped without a GPU): graphs on and off, fused kernels, dense and FlashHead
drafts: every tree emits exactly target greedy under ordinary, pipelined, deferred and pipelined-deferred
(its look-ahead used and wasted), in float32 and in bfloat16 (where only the path-ordered attention makes
that hold); sampled trees emit the same tokens in every schedule of tree rounds only, and pipelined-deferred
its own, with graphs and without, and follow acceptance control; every tree graph is captured up front, and
a dynamic tree's bookkeeping in graphs proposes what it proposes eager;
the decoder's fixed width covers the largest node budget; on two GPUs every tree is exact too (a dynamic
tree's tables then travel to the target's device with its nodes)."""

import pytest
import torch

from contracts.trees import TREE_SCHEDULES, parse_tree
from model.sampling import SamplingSettings
from tests.test_model_trees import tree_rows_equal_chain_rows
from tests.test_sampling_trees import SAME_ROUNDS
from tests.tiny_pair import gpu_decoder

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (run on the GPU machine)")

PLACEMENTS = ["one-gpu"] + (["two-gpu"] if torch.cuda.is_available() and torch.cuda.device_count() >= 2 else [])
PROMPT = list(b"Speculative decoding on the GPU.")
MAX_NEW, ROOM = 40, 256


def _decoder(placement, tree, head="dense", graphs=True, spec="a=0.5", dtype="float32", **kw):
    """Tiny models; in bfloat16 their random logits are often near-tied, so a tree row that differed from
    a chain row in the last bit would show."""
    return gpu_decoder(placement, PROMPT, MAX_NEW, ROOM, head, spec, dtype, graphs=graphs, tree=parse_tree(tree), **kw)


@pytest.mark.parametrize("placement", PLACEMENTS)
@pytest.mark.parametrize("graphs", [True, False])
@pytest.mark.parametrize("head", ["dense", "flashhead"])
@pytest.mark.parametrize("spec", [None, "a=0.5", "a=1"])
@pytest.mark.parametrize(
    "tree", ["2x2x1", "3x1x1", "paths:0;1;0.0;1.0;0.0.0", "1x1x1", "4x2x2x1", "dynamic:2,7,3", "dynamic:4,24,5"]
)
def test_every_tree_equals_target_greedy(placement, graphs, head, spec, tree):
    dec, want = _decoder(placement, tree, head, graphs, spec)
    depth = parse_tree(tree).depth
    for schedule in ("baseline", *TREE_SCHEDULES):
        g = dec.generate(PROMPT, MAX_NEW, schedule)
        assert g.tokens == want, schedule
        assert sum(r.emitted for r in g.rounds) == MAX_NEW - 1
        if spec == "a=1" and schedule != "baseline" and "x" in tree:  # a dynamic tree may leave the path out
            assert all(r.accepted == depth for r in g.rounds[:-1]), schedule


@pytest.mark.parametrize("head", ["dense", "flashhead"])
@pytest.mark.parametrize("tree", ["2x2x1", "4x2x1x1", "8x1x1x1", "4x3x4", "dynamic:4,16,4"])
def test_every_tree_equals_target_greedy_in_bfloat16(head, tree):
    dec, want = _decoder("one-gpu", tree, head, True, "a=0.5", "bfloat16")
    for schedule in TREE_SCHEDULES:
        assert dec.generate(PROMPT, MAX_NEW, schedule).tokens == want, schedule


@pytest.mark.parametrize("placement", PLACEMENTS)
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("tree", ["2x1x1", "2x2x1", "4x2x1x1", "8x1x1x1", "dynamic:2,7,3"])
def test_pipelined_deferred_trees_use_their_lookahead_and_stay_exact(placement, dtype, tree):
    """The look-ahead past the guessed path, used (the next round verifies its chain through the causal
    rows of the one attention kernel) and wasted, with graphs, against target greedy."""
    dec, want = _decoder(placement, tree, "dense", True, "a=0.8", dtype)
    g = dec.generate(PROMPT, MAX_NEW, "pipelined-deferred")
    assert g.tokens == want
    assert {True, False} <= {r.lookahead_used for r in g.rounds[:-1]}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("base", [7, 62, 300])
def test_a_tree_row_is_bit_for_bit_the_chain_row_of_its_path_on_the_gpu(dtype, base):
    assert tree_rows_equal_chain_rows("cuda", dtype, base)
    assert not tree_rows_equal_chain_rows("cuda", dtype, base, wrong_key=True)


def test_the_largest_node_budget_widens_the_fixed_width_and_stays_exact():
    dec, want = _decoder("one-gpu", "4x3x4", "dense", True, "a=0.5")  # 4 + 12 + 48 = 64 nodes
    assert dec.rows == 65
    assert dec.generate(PROMPT, MAX_NEW, "deferred").tokens == want


def test_tree_graphs_are_captured_up_front():
    dec, _ = _decoder("one-gpu", "2x2x1")
    trees = dec.trees
    counts = (trees._verify.captured, trees._tree_body.captured, sum(c.captured for c in trees._children))
    # verify of N and N + 1 rows; draft frontiers of 2 and 4 nodes and the look-ahead's 1; one per depth
    assert counts == (2, 3, 3)
    for schedule in ("deferred", "pipelined-deferred"):
        dec.generate(PROMPT, MAX_NEW, schedule)
    assert (trees._verify.captured, trees._tree_body.captured) == (2, 3)


@pytest.mark.parametrize("tree", ["dynamic:2,7,3", "dynamic:4,16,4"])
def test_a_dynamic_trees_bookkeeping_replays_as_graphs_and_drafts_what_it_drafts_eager(tree):
    """The work between a dynamic tree's draft forwards (DynamicTreeRounds._grow, _finish) is captured up
    front and none later, and proposes round for round what the eager bookkeeping proposes: target greedy
    alone would not show a wrong choice of nodes, which changes only what is accepted."""
    rounds, tables = {}, {}
    for graphs in (True, False):
        dec, want = _decoder("one-gpu", tree, graphs=graphs)
        trees = dec.trees
        bookkeeping = (*trees._grow, trees._finish)
        captured = [call.captured for call in bookkeeping]
        for schedule in TREE_SCHEDULES:
            g = dec.generate(PROMPT, MAX_NEW, schedule)
            assert g.tokens == want, (graphs, schedule)
            rounds[graphs, schedule] = [(r.proposed, r.accepted, r.emitted, r.lookahead_used) for r in g.rounds]
        tables[graphs] = [t.tolist() for t in (trees.parents, trees.depths, trees.verify_bits, trees.draft_slot)]
        assert captured == [int(graphs)] * len(bookkeeping) == [call.captured for call in bookkeeping]
    for schedule in TREE_SCHEDULES:
        assert rounds[True, schedule] == rounds[False, schedule], schedule
        assert len({accepted for _, accepted, _, _ in rounds[True, schedule]}) > 1, schedule
    assert tables[True] == tables[False]


@pytest.mark.parametrize("placement", PLACEMENTS)
@pytest.mark.parametrize("tree", ["2x2x1", "4x2x2x1", "dynamic:2,7,3"])
def test_sampled_trees_agree_across_schedules_and_graphs(placement, tree):
    """Sampling (multi-branch rejection; its distribution is tested on the CPU, tests/test_sampling_trees.py):
    keyed numbers make every schedule of tree rounds only emit the same tokens per sample, and
    pipelined-deferred its own (its used look-aheads verify sampled chains), graphs or not; the control
    at a=1 accepts every whole path and at a=0 nothing."""
    settings = SamplingSettings(temperature=0.8, seed=3)
    outputs = set()
    for graphs in (True, False):
        dec, _ = _decoder(placement, tree, graphs=graphs, spec=None, sampling=settings)
        for sample in range(3):
            tokens = {tuple(dec.generate(PROMPT, MAX_NEW, s, sample).tokens) for s in SAME_ROUNDS}
            assert len(tokens) == 1, (graphs, sample)
            looked_ahead = dec.generate(PROMPT, MAX_NEW, "pipelined-deferred", sample).tokens
            outputs.add((sample, tokens.pop(), tuple(looked_ahead)))
    assert len(outputs) == 3  # graphs on and off agree sample by sample
    depth = parse_tree(tree).depth
    controls = [("a=0", {0})] + ([] if tree.startswith("dynamic") else [("a=1", {depth})])  # dynamic: its own nodes
    for spec, accepted in controls:
        dec, _ = _decoder(placement, tree, spec=spec, sampling=settings)
        for schedule in TREE_SCHEDULES:
            rounds = dec.generate(PROMPT, MAX_NEW, schedule).rounds
            assert {r.accepted for r in (rounds[:-1] if spec == "a=1" else rounds)} == accepted, (spec, schedule)
