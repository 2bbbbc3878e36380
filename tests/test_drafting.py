"""Drafters and policies in the real decoder (CPU, tiny presets): the output is exactly target-only
greedy under every drafter and policy on the schedules that take them, each round records its arm,
and the policy's bookkeeping matches the rounds."""

import pytest

from contracts import UsageError
from contracts.policies import Arm, arms, make_policy
from contracts.trace import check_trace_line
from model.decoder import Decoder
from model.drafting import Drafting
from model.early_exit import early_exit
from model.heads import DenseHead
from model.loading import load_model
from model.trace import trace_lines

PROMPTS = {"short": list(b"Hi there"), "repeats": list(b"abcabcabcabc abc")}
MAX_NEW, ROOM, K = 20, 96, 3
DRAFTERS = ("draft-model", "prompt-lookup", "early-exit")


@pytest.fixture(scope="module")
def models():
    target = load_model("tiny-qwen3", "cpu", seed=1, max_seq_len=ROOM).model
    draft = load_model("tiny-qwen3-draft", "cpu", seed=2, max_seq_len=ROOM).model
    early = early_exit(target, 1)
    early.setup_cache(ROOM, "cpu")
    reference = Decoder(target, K=1, graphs=False, phases=False)
    references = {name: reference.reference(ids, MAX_NEW) for name, ids in PROMPTS.items()}
    return target, draft, early, references


def _decoder(models, policy, drafters=DRAFTERS, Ks=(1, 2, 3)):
    target, draft, early, _ = models
    choices = (Arm(drafters[0], K), *(a for a in arms(drafters, Ks) if a != Arm(drafters[0], K)))
    drafting = Drafting(make_policy(policy, choices, seed=0), early=early, lookup_ngram=2)
    return Decoder(target, draft, DenseHead(draft.head_weight), K=K, graphs=False, drafting=drafting)


CASES = [("fixed", (d,)) for d in DRAFTERS] + [(p, DRAFTERS) for p in ("heuristic", "ucb1", "thompson")]


@pytest.mark.parametrize("schedule", ["deferred", "pipelined-deferred"])
@pytest.mark.parametrize("policy,drafters", CASES, ids=[f"{p}-{'+'.join(d)}" for p, d in CASES])
def test_output_is_target_greedy_under_every_drafter_and_policy(models, schedule, policy, drafters):
    dec = _decoder(models, policy, drafters)
    played = []
    for name, ids in PROMPTS.items():
        generation = dec.generate(ids, MAX_NEW, schedule)
        assert generation.tokens == models[3][name], (name, policy, drafters)
        for line in trace_lines(generation, prompt_id=name, schedule=schedule, head="dense", K=K):
            check_trace_line(line)
        played += [(r.drafter, r.proposed) for r in generation.rounds]
        assert sum(r.emitted for r in generation.rounds) == MAX_NEW - 1
    policy_state = dec.drafting.policy
    # a look-ahead round reuses the previous round's block but is still a round the policy observes
    assert sum(policy_state.pulls.values()) == len(played)
    assert sorted((a.drafter, a.K) for a, _, _ in policy_state.history) == sorted(played)
    if policy == "fixed":
        assert {d for d, _ in played} == {drafters[0]}
    if policy in ("ucb1", "thompson"):  # every arm is tried once before any is repeated
        assert {d for d, _ in played} == set(DRAFTERS)


def test_prompt_lookup_proposes_what_followed_and_is_accepted_on_repeating_output(models):
    """Not vacuous: on the tiny target (which loops), prompt lookup's blocks are accepted."""
    dec = _decoder(models, "fixed", ("prompt-lookup",))
    generation = dec.generate(PROMPTS["repeats"], MAX_NEW, "deferred")
    assert generation.tokens == models[3]["repeats"]
    assert sum(r.accepted for r in generation.rounds) > 0


def test_policies_are_refused_on_the_ordinary_schedules_and_arms_past_K(models):
    dec = _decoder(models, "ucb1")
    with pytest.raises(UsageError, match="run on deferred and pipelined-deferred only"):
        dec.generate(PROMPTS["short"], 4, "ordinary")
    with pytest.raises(UsageError, match="K must be in 1..3"):
        _decoder(models, "ucb1", Ks=(1, 5))
