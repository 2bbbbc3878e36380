"""Drafters and policies in the real decoder (CPU, tiny presets): the output is exactly target-only
greedy under every drafter and policy on the schedules that take them, each round records its arm,
and the policy's bookkeeping matches the rounds."""

import pytest

from contracts import UsageError
from contracts.policies import Arm, arms
from contracts.trace import check_trace_line
from model.decoder import Decoder
from model.drafting import Drafting
from model.heads import DenseHead
from model.trace import trace_lines
from tests.tiny_pair import drafting_decoder, target_references, tiny_early_exit, tiny_pair

PROMPTS = {"short": list(b"Hi there"), "repeats": list(b"abcabcabcabc abc")}
MAX_NEW, ROOM, K = 20, 96, 3
DRAFTERS = ("draft-model", "prompt-lookup", "early-exit")


@pytest.fixture(scope="module")
def models():
    target, draft = tiny_pair(ROOM)
    early = tiny_early_exit(target, ROOM)
    return target, draft, early, target_references(target, PROMPTS, MAX_NEW)


def _decoder(models, policy, drafters=DRAFTERS, Ks=(1, 2, 3)):
    choices = (Arm(drafters[0], K), *(a for a in arms(drafters, Ks) if a != Arm(drafters[0], K)))
    return drafting_decoder(*models[:3], policy, choices, K)


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


class RoundRobin:
    """A time-independent policy for the event comparison: the arms in turn (exercises every
    drafter switch and the catch-up of idle model drafters)."""

    def __new__(cls, choices):
        from contracts.policies import Policy

        class Cycle(Policy):
            name = "round-robin"

            def choose(self):
                return self.arms[len(self.history) % len(self.arms)]

        return Cycle(choices)


def _round_robin_decoder(models, choices, **options) -> Decoder:
    """A decoder on the module's tiny pair whose arms are `choices` in turn."""
    target, draft, early, _ = models
    return Decoder(
        target,
        draft,
        DenseHead(draft.head_weight),
        K=K,
        graphs=options.pop("graphs", False),
        drafting=Drafting(RoundRobin(choices), early=early),
        **options,
    )


def _drafters_profile(placement: str) -> dict:
    """The simulator fixtures' tiny profile with a cost for every drafter."""
    from tests.sim_fixtures import timing, tiny_profile

    profile = tiny_profile(placement)
    profile["regimes"]["eager"]["draft"].update(
        lookup_ms=timing(0.1), early_exit_body_ms=timing(1.0), early_exit_head_ms=timing(0.5)
    )
    return profile


class RecordedRounds:
    """The decoder's rounds as an acceptance source: the round begun at a position accepts what it did."""

    def __init__(self, generations, rounds):
        self.generations, self.rounds = generations, rounds

    def stream(self, generation, seed):
        outcome, pos = {}, 0
        for r in self.rounds[generation.prompt_id]:
            outcome[pos] = (r.accepted, r.lookahead_used)
            pos += r.accepted + 1

        def block(pos, K, drafter=None):
            accepted, used = outcome[pos]
            return [True] * accepted + [False] * (K - accepted) + [bool(used)]

        return block


@pytest.mark.parametrize("schedule", ["deferred", "pipelined-deferred"])
def test_decoder_and_simulator_log_the_same_events_while_switching_drafters(models, schedule):
    from model.decoder import Decoder as Dec
    from sim.acceptance import Generation
    from sim.profile import Profile
    from sim.schedules import Config
    from sim.simulate import simulate

    choices = (Arm("draft-model", 3), Arm("prompt-lookup", 2), Arm("early-exit", 1), Arm("early-exit", 3))
    for placement, copies in (("one-gpu", False), ("two-gpu", True)):
        references = models[3]
        dec = _round_robin_decoder(models, choices)
        dec.events, rounds, generations = [], {}, []
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(Dec, "copies", property(lambda self, copies=copies: copies))
            for name, ids in PROMPTS.items():
                generation = dec.generate(ids, MAX_NEW, schedule)
                assert generation.tokens == references[name]
                rounds[name] = generation.rounds
                generations.append(Generation(name, len(ids), generation.decode_tokens))
        result = simulate(
            Profile(_drafters_profile(placement), "parity").costs["eager"],
            Config(schedule, "dense", K, 4, placement, drafters=DRAFTERS),
            RecordedRounds(generations, rounds),
            generations,
            ceiling=False,
            events=True,
            policy=RoundRobin(choices),
        )
        simulated = [(d["drafter"], d["proposed"], d["accepted"]) for d in result["rounds_detail"]]
        assert simulated == [(r.drafter, r.proposed, r.accepted) for name in PROMPTS for r in rounds[name]]
        assert result["events"] == dec.events, placement
        names = {e[0] for e in dec.events}
        assert {"lookup", "draft_step", "verify"} <= names and (("copy_tokens" in names) == copies)
        # a catch-up step (an idle model drafter feeding the tokens it missed) happened
        assert any(e[0] == "draft_step" and e[2] > 2 for e in dec.events)


def test_catch_up_widths_cover_every_missed_token_in_few_shapes():
    from contracts.policies import CATCH_UP_WIDTHS, catch_up_widths

    assert catch_up_widths(2, 50) == (2,)  # the usual [prev, f]
    assert catch_up_widths(3, 50) == (4,) and catch_up_widths(29, 500) == (32,)
    assert catch_up_widths(200, 500) == (64, 64, 64, 8)
    assert catch_up_widths(6, 6) == (6,)  # never before position 0
    for missed in range(3, 300):
        *leading, last = catch_up_widths(missed, 1000)
        assert set(leading) <= {CATCH_UP_WIDTHS[-1]} and last in CATCH_UP_WIDTHS
        assert sum(leading) < missed <= sum(leading) + last  # the last forward reaches the rest


class Script:
    """A policy for one generation playing `first` in its first round and once more than `after`
    tokens were emitted, `other` in between (a model drafter idle for long, then catching up)."""

    def __new__(cls, first, other, after):
        from contracts.policies import Policy

        class Scripted(Policy):
            name = "scripted"

            def choose(self):
                emitted = sum(e for _, e, _ in self.history)
                return first if not self.history or emitted > after else other

        return Scripted((first, other))


def test_no_graph_is_captured_during_a_generation_while_switching_drafters(models, monkeypatch):
    """Every forward shape a generation uses was captured with the decoder's graphs (`_capture`): a
    capture in the middle of a generation is two eager runs and a capture inside a timed round (on an
    H200 it made ucb1 on summarization 20% slower than predicted). On the CPU no graph is captured, so
    GraphedCall is replaced by one that records each new input signature."""
    import model.decoder
    import model.drafting
    from model.graphs import GraphedCall

    new_shapes = []

    class Recording(GraphedCall):
        def __call__(self, *inputs):
            key = tuple(tuple(t.shape) for t in inputs)
            if key not in self._graphs:
                self._graphs[key] = None
                new_shapes.append((getattr(self.fn, "__name__", "head"), key))
            return self.fn(*inputs)

    monkeypatch.setattr(model.decoder, "GraphedCall", Recording)
    monkeypatch.setattr(model.drafting, "GraphedCall", Recording)
    monkeypatch.setattr(model.decoder.torch.cuda, "synchronize", lambda device=None: None)
    references = models[3]
    choices = (Arm("draft-model", 3), Arm("prompt-lookup", 2), Arm("early-exit", 1), Arm("early-exit", 3))
    dec = _round_robin_decoder(models, choices, graphs=True, fixed_width=True)  # as on a GPU: one target shape
    dec._capture()  # what a CUDA decoder does when it is built
    captured, dec.events = len(new_shapes), []
    for name, ids in PROMPTS.items():
        assert dec.generate(ids, MAX_NEW, "deferred").tokens == references[name]
    assert any(e[0] == "draft_step" and e[2] > 2 for e in dec.events)  # catch-ups happened
    assert new_shapes[captured:] == []


def test_a_long_catch_up_feeds_full_width_forwards_first_and_stays_exact():
    """The draft model sits out more than the largest catch-up width, then feeds what it missed:
    64-token forwards first, then the rest; the output is target greedy and the simulator logs the
    same events."""
    from sim.acceptance import Generation
    from sim.profile import Profile
    from sim.schedules import Config
    from sim.simulate import simulate
    from tests.sim_fixtures import timing, tiny_profile

    room, max_new = 256, 150
    target, draft = tiny_pair(room)
    ids = PROMPTS["repeats"]
    reference = Decoder(target, K=1, graphs=False, phases=False).reference(ids, max_new)
    choices = (Arm("draft-model", 3), Arm("prompt-lookup", 3))
    dec = Decoder(
        target, draft, DenseHead(draft.head_weight), K=K, graphs=False, drafting=Drafting(Script(*choices, 100))
    )
    dec.events = []
    generation = dec.generate(ids, max_new, "deferred")
    assert generation.tokens == reference
    catch_ups = [e[2] for e in dec.events if e[0] == "catch_up"]
    assert catch_ups and set(catch_ups) == {64}
    profile = tiny_profile("one-gpu")
    profile["regimes"]["eager"]["draft"]["lookup_ms"] = timing(0.1)
    g = Generation("repeats", len(ids), generation.decode_tokens)
    result = simulate(
        Profile(profile, "parity").costs["eager"],
        Config("deferred", "dense", K, 4, "one-gpu", drafters=("draft-model", "prompt-lookup")),
        RecordedRounds([g], {"repeats": generation.rounds}),
        [g],
        ceiling=False,
        events=True,
        policy=Script(*choices, 100),
    )
    assert result["events"] == dec.events


@pytest.mark.parametrize("drafters", [("prompt-lookup",), ("early-exit", "prompt-lookup"), DRAFTERS])
def test_the_draft_model_is_prefilled_only_where_an_arm_drafts_with_it(models, drafters, monkeypatch):
    """A generation whose arms never draft with the draft model does not prefill it (that cost the real
    Gemma runs a 12-layer prefill each), and the simulator charges the draft's prefill alike."""
    from sim.acceptance import Generation
    from sim.profile import Profile
    from sim.schedules import Config
    from sim.simulate import simulate

    draft, references = models[1], models[3]
    choices = tuple(Arm(drafter, 2) for drafter in drafters)
    widths = []
    body = draft.forward_hidden

    def counted(tokens, *args, **kwargs):
        widths.append(tokens.shape[1])
        return body(tokens, *args, **kwargs)

    monkeypatch.setattr(draft, "forward_hidden", counted)
    dec = _round_robin_decoder(models, choices)
    ids = PROMPTS["repeats"]
    generation = dec.generate(ids, MAX_NEW, "deferred")
    assert generation.tokens == references["repeats"]
    uses_model = "draft-model" in drafters
    assert (len(ids) in widths) == uses_model and bool(widths) == uses_model

    generations = [Generation("repeats", len(ids), generation.decode_tokens)]
    result = simulate(
        Profile(_drafters_profile("one-gpu"), "prefill").costs["eager"],
        Config("deferred", "dense", K, 4, "one-gpu", drafters=drafters),
        RecordedRounds(generations, {"repeats": generation.rounds}),
        generations,
        ceiling=False,
        policy=RoundRobin(choices),
    )
    assert (result["phase_ms"].get("initial", 0) > 0) == uses_model
