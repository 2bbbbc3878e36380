"""Level 2 for token trees: sampled tree rounds (multi-branch rejection, docs/design.md "Token trees")
give the target's own distribution of the first tokens, for static and dynamic trees, every tree
schedule (pipelined-deferred's look-ahead included, whose used rounds verify a sampled chain), and
heads whose children are often outside the target's support; the classic wrong rule (the final token
drawn from p instead of the residual) is rejected by the same test.

The decoder, the exact distribution and the G-test are level 2's (tests/test_sampling_decoder.py):
the early-exit pair of tiny-qwen3 at top_k = 2, eight cells for three tokens."""

import pytest
import torch

from contracts.trees import TREE_SCHEDULES, parse_tree
from model import sampling, sampling_noise, tree_rounds, triton_support
from model.acceptance_control import AcceptanceControl
from model.decoder import Decoder
from model.flashhead import build_clustering
from model.heads import DenseHead, FlashHead, ShortlistHead
from model.loading import load_model
from model.sampling import SamplingSettings
from tests import test_sampling_decoder as level2
from tests.sampling_stats import ALPHA, g_test
from tests.test_sampling_decoder import PROMPT, SETTINGS, _counts, _exact

pair, exact = level2.pair, level2.exact  # level 2's tiny early-exit pair and its exact distribution (fixtures)

PER_SCHEDULE = 100  # each schedule's own samples, 400 pooled (the other tests: level 2's 150)
# the schedules whose rounds are all tree rounds: the same tokens for the same sample (pipelined-deferred's
# rounds after a used look-ahead verify a chain drafted by sampling, which decides positions otherwise)
SAME_ROUNDS = tuple(s for s in TREE_SCHEDULES if s != "pipelined-deferred")


def _decoder(target, draft, tree: str, head=None, settings=SETTINGS, **kw) -> Decoder:
    head = head or DenseHead(draft.head_weight)
    return Decoder(target, draft, head, graphs=False, phases=False, sampling=settings, tree=parse_tree(tree), **kw)


@pytest.mark.parametrize("tree", ["2x2x1", "dynamic:2,5,3"])
def test_sampled_trees_sample_the_target(pair, exact, tree):
    """Each tree schedule alone and pooled (own samples each); keyed by position and sibling rank, the
    numbers make every schedule of tree rounds only emit the same tokens for the same sample."""
    dec = _decoder(*pair, tree)
    pooled = 0
    for index, schedule in enumerate(TREE_SCHEDULES):
        counts, probs = _counts(dec, schedule, exact, first=index * PER_SCHEDULE, samples=PER_SCHEDULE)
        assert g_test(counts, probs) > ALPHA, f"{tree} under {schedule}"
        pooled = pooled + counts
    assert g_test(pooled, probs) > ALPHA
    for sample in range(3):
        assert len({tuple(dec.generate(PROMPT, 12, s, sample).tokens) for s in SAME_ROUNDS}) == 1


def _sharp_draft():
    """The target's first two layers with a sharper head: it often proposes the target's own path."""
    sharp = load_model("tiny-qwen3#layers=2", "cpu", seed=1, max_seq_len=48).model
    sharp.head_weight.mul_(1.5)
    return sharp


def test_a_tree_lookahead_samples_the_target(pair):
    """pipelined-deferred with the one-depth tree 2, where the look-ahead is used often: a draft that is
    the target with a sharper head accepts the guessed path (the rank-0 node), and its guess e1 often
    equals the sampled bonus; four tokens, so the fourth comes from a round that may verify the
    look-ahead's sampled chain."""
    target = pair[0]
    sharp = _sharp_draft()
    dec = _decoder(target, sharp, "2")
    counts, probs = _counts(dec, "pipelined-deferred", _exact(target, 4))
    assert g_test(counts, probs) > ALPHA
    used = [r.lookahead_used for s in range(10) for r in dec.generate(PROMPT, 4, "pipelined-deferred", s).rounds]
    assert 0 < sum(used) < len(used)


def test_deep_acceptance_samples_the_target(pair):
    """A draft that is the target with a sharper head accepts whole paths of 2x2x1 (depth 3): four
    tokens, the last three from one round's path, are the target's."""
    target = pair[0]
    sharp = _sharp_draft()
    dec = _decoder(target, sharp, "2x2x1")
    counts, probs = _counts(dec, "deferred", _exact(target, 4))
    assert g_test(counts, probs) > ALPHA
    assert 3 in {r.accepted for s in range(10) for r in dec.generate(PROMPT, 4, "deferred", s).rounds}


@pytest.mark.parametrize("kind", ["shortlist", "flashhead"])
def test_children_outside_the_support_sample_the_target(pair, exact, kind):
    """Heads whose top children are often outside the target's top-2: rejected children with zero mass,
    the residual drawn after them, rounds that accept and rounds that do not."""
    target, draft = pair
    w = draft.head_weight
    if kind == "shortlist":
        head = ShortlistHead(w, torch.randperm(512, generator=torch.Generator().manual_seed(0))[:256])
    else:
        head = FlashHead(w, build_clustering(w, seed=0), probes=2)
    dec = _decoder(target, draft, "2x2x1", head)
    counts, probs = _counts(dec, "ordinary", exact, first=1000)
    assert g_test(counts, probs) > ALPHA
    accepted = [r.accepted for s in range(20) for r in dec.generate(PROMPT, 3, "ordinary", s).rounds]
    assert 0 in accepted and max(accepted) > 0


def _bonus_from_p(self, preds, nodes, a, last, p):
    """A wrong rule: after its children are rejected, the final token drawn from p, not the residual."""
    row = torch.where(a > 0, last + 1, 0)
    return sampling.race(preds.index_select(0, row)[0], self.dec._race_noise(p)).view(1)


def test_wrong_rule_is_rejected(pair, exact, monkeypatch):
    """Negative control: the same test through the same decoder rejects the final token drawn from p."""
    monkeypatch.setattr(tree_rounds.TreeRounds, "_bonus", _bonus_from_p)
    counts, probs = _counts(_decoder(*pair, "2x2x1"), "deferred", exact, samples=200)
    assert g_test(counts, probs) < ALPHA


def test_acceptance_control_sets_the_accepted_paths_under_sampling(pair):
    """Synthetic weights: the control's hit rank decides each position (0 for the child at it, +inf
    for the others; without top-k every token has p > 0, so that child passes), the same in every
    schedule; every real cost stays."""
    target, draft = pair
    accepted = {}
    for spec in ("a=1", "a=0", "a=0.5"):
        control = AcceptanceControl(spec, 512, 48, torch.device("cpu"), seed=1)
        control.bind([0] * 24, len(PROMPT), "p")
        dec = _decoder(target, draft, "2x2x1", settings=SamplingSettings(temperature=1.0, seed=2), control=control)
        for schedule in TREE_SCHEDULES:
            accepted[spec, schedule] = [r.accepted for r in dec.generate(PROMPT, 16, schedule).rounds]
    for schedule in TREE_SCHEDULES:
        assert set(accepted["a=1", schedule][:-1]) == {3} and set(accepted["a=0", schedule]) == {0}
    for schedule in SAME_ROUNDS:
        assert accepted["a=0.5", schedule] == accepted["a=0.5", "deferred"]
    assert len(set(accepted["a=0.5", "deferred"])) > 1


@pytest.mark.skipif(not triton_support.runs_on(torch.device("cpu")), reason="needs triton's interpreter")
def test_the_noise_kernels_give_the_torch_path_tokens(pair):
    """The accept numbers and the race noise through model/sampling_noise.py's kernels (interpreted here,
    as the decoder runs them on a GPU) give the torch path's tokens for every tree schedule."""
    dec = _decoder(*pair, "2x2x1", settings=SamplingSettings(temperature=0.7, seed=5))
    want = {schedule: dec.generate([7, 9], 8, schedule, sample=1).tokens for schedule in TREE_SCHEDULES}
    dec.noise_on_target = sampling_noise.SamplingNoise("cpu", dec.vocab_size, backend="triton")
    for schedule in TREE_SCHEDULES:
        assert dec.generate([7, 9], 8, schedule, sample=1).tokens == want[schedule], schedule
