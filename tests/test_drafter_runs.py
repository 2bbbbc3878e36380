"""Every drafter's match runs, recorded after a generation, predict the rounds that drafter plays:
for each round of a run with one fixed drafter, accepted = min(run at the round's start, K)."""

import pytest

from contracts.policies import Arm
from model.acceptance_control import AcceptanceControl
from model.drafter_runs import drafter_runs, runs_of_matches
from tests.tiny_pair import drafting_decoder, tiny_early_exit, tiny_pair

PROMPTS = {"short": list(b"Hi there"), "repeats": list(b"abcabcabcabc abc")}
MAX_NEW, ROOM, K = 24, 128, 3
DRAFTERS = ("draft-model", "early-exit", "prompt-lookup")


@pytest.fixture(scope="module")
def models():
    target, draft = tiny_pair(ROOM)
    return target, draft, tiny_early_exit(target, ROOM)


def _decoder(models, drafter, control=None):
    return drafting_decoder(*models, "fixed", (Arm(drafter, K),), K, control)


def _predicted_and_recorded(generation, runs):
    """(min(run at the round's start, K), recorded accepted) for every round that ends inside the output."""
    pairs, emitted = [], 1
    for r in generation.rounds:
        if emitted + r.proposed < len(generation.tokens):
            pairs.append((min(runs[emitted - 1], r.proposed), r.accepted))
        emitted += r.emitted
    return pairs


def test_runs_count_the_leading_matches():
    assert runs_of_matches([True, True, False, True]) == [2, 1, 0, 1]
    assert runs_of_matches([True] * 5, cap=3) == [3, 3, 3, 2, 1]


@pytest.mark.parametrize("drafter", DRAFTERS)
def test_each_drafters_runs_predict_the_rounds_it_plays(models, drafter):
    dec = _decoder(models, drafter)
    pairs = []
    for ids in PROMPTS.values():
        generation = dec.generate(ids, MAX_NEW, "deferred")
        runs = drafter_runs(dec, DRAFTERS, ids, generation.tokens, {})
        assert all(len(v) == len(generation.tokens) - 1 for v in runs.values())
        pairs += _predicted_and_recorded(generation, runs[drafter])
    assert len(pairs) > 5 and all(p == r for p, r in pairs)
    assert any(r > 0 for _, r in pairs) or drafter == "draft-model"  # not vacuous where the drafter is accepted


def test_another_drafters_runs_do_not_predict_them(models):
    """Negative control: the same comparison with another drafter's runs fails."""
    dec = _decoder(models, "prompt-lookup")
    generation = dec.generate(PROMPTS["repeats"], MAX_NEW, "deferred")
    runs = drafter_runs(dec, DRAFTERS, PROMPTS["repeats"], generation.tokens, {})
    pairs = _predicted_and_recorded(generation, runs["early-exit"])
    assert any(p != r for p, r in pairs)


def test_controlled_runs_are_the_controls_bits(models):
    target = models[0]
    control = AcceptanceControl("a=0.6", target.config.vocab_size, ROOM, target.head_weight.device, seed=3)
    dec = _decoder(models, "draft-model", control)
    ids = PROMPTS["short"]
    reference = dec.reference(ids, MAX_NEW + 2 * K + 2)
    control.bind(reference, len(ids), "short")
    generation = dec.generate(ids, MAX_NEW, "deferred")
    runs = drafter_runs(dec, ("draft-model",), ids, generation.tokens, {"draft-model": control})
    pairs = _predicted_and_recorded(generation, runs["draft-model"])
    assert len(pairs) > 5 and all(p == r for p, r in pairs) and any(r > 0 for _, r in pairs)
