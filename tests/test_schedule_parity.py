"""The decoder (`model/schedules.py` on real devices) and the simulator (`sim/schedules.py`) run the
same schedules: for the same rounds they issue the same events, in the same host order, on the same
streams, with the same token counts (docs/contracts.md, "Schedule event order").

How: the real decoder runs on the CPU with tiny models under acceptance control and logs its events
(`Decoder.events`); its trace lines are replayed by the simulator (`TraceReplay` at the recorded K,
which reproduces the recorded rounds exactly), which logs its own (`simulate(..., events=True)`).

Copies. On the CPU the decoder has one device, where `.to()` is a no-op and it logs no copy; the
simulator charges copies on two GPUs only. So every case makes three comparisons:
1. one device on both sides: the decoder's log equals the simulator's one-gpu log (no copies);
2. the simulator's two-gpu log with its copies filtered out equals the decoder's log: two GPUs
   change no other event;
3. the decoder run again with its `copies` switch patched on (`to_target` / `to_draft` then log
   their copy on one device exactly as they do on two: same code, same stream, same token count)
   equals the simulator's two-gpu log, copies included.
Only 3 checks where the copies sit: a copy moved elsewhere (the simulator once sent f to the draft
with the verify, before the read, where the decoder copies it after the read) leaves 1 and 2
unchanged, since they never see copies; `test_the_comparison_can_fail` shows both. 3 patches the
decoder's one decision "is this copy real" rather than wrapping the methods with a second copy of
their logging, so it checks the decoder's own copy events at the decoder's own call sites. On two
GPUs, `test_on_two_gpus_the_decoders_copies_are_the_simulators` compares the unpatched log.
"""

from collections import Counter
from dataclasses import dataclass

import pytest
import torch

from contracts import SCHEDULES
from contracts.names import EVENTS
from contracts.trace import check_trace_line
from contracts.trees import TREE_SCHEDULES, parse_tree
from model import schedules as model_schedules
from model.acceptance_control import AcceptanceControl
from model.decoder import Decoder
from model.flashhead import build_clustering
from model.heads import DenseHead, FlashHead
from model.loading import load_model
from model.sampling import SamplingSettings
from model.trace import trace_lines
from sim import schedules as sim_schedules
from sim.acceptance import Generation, IIDAcceptance, TraceReplay
from sim.profile import Profile
from sim.schedules import Config
from sim.simulate import simulate
from tests.sim_fixtures import timing, tiny_profile

HEADS = ("dense", "flashhead")
KS = (1, 3, 6)
PROBES = 2
SPEC = "a=0.7"  # skipped verifies, partial and full blocks, look-aheads used and wasted
PROMPTS = {"short": list(b"Hi there"), "longer": list(b"Speculative decoding, greedily.")}
MAX_NEW = 24
ROOM = 96
COPY = "copy_tokens"


@dataclass
class Recorded:
    """One configuration's decoder runs over PROMPTS: its trace lines and its two event logs."""

    lines: list[dict]
    events: list[tuple]  # as logged on one device: no copies
    events_with_copies: list[tuple]  # the copies logged where a two-device decoder makes them


@pytest.fixture(scope="module")
def models():
    target = load_model("tiny-qwen3", "cpu", "float32", seed=1, max_seq_len=ROOM).model
    draft = load_model("tiny-qwen3-draft", "cpu", "float32", seed=2, max_seq_len=ROOM).model
    return target, draft


@pytest.fixture(scope="module")
def references(models):
    """Target-only greedy continuations, long enough for acceptance control's look-ahead."""
    dec = Decoder(models[0], K=1, graphs=False, phases=False)
    return {name: dec.reference(ids, MAX_NEW + 2 * max(KS) + 2) for name, ids in PROMPTS.items()}


@pytest.fixture(scope="module")
def decoders(models):
    """One decoder (and its acceptance control) per head and K, built once."""
    target, draft = models
    clustering = build_clustering(draft.head_weight, seed=0)
    built = {}

    def get(head, K):
        if (head, K) not in built:
            w = draft.head_weight
            draft_head = DenseHead(w) if head == "dense" else FlashHead(w, clustering, probes=PROBES)
            control = AcceptanceControl(SPEC, 512, ROOM, torch.device("cpu"))
            built[head, K] = (
                Decoder(target, draft, draft_head, K=K, graphs=False, control=control, phases=False),
                control,
            )
        return built[head, K]

    return get


@pytest.fixture(scope="module")
def recorded(decoders, references):
    """`recorded(schedule, head, K)`: the decoder's runs of one configuration, made once."""
    runs = {}

    def get(schedule, head, K):
        if (schedule, head, K) not in runs:
            runs[schedule, head, K] = _record(*decoders(head, K), references, schedule, head, K)
        return runs[schedule, head, K]

    return get


def _logged(dec, ids, schedule):
    dec.events = []
    try:
        return dec.generate(ids, MAX_NEW, schedule), dec.events
    finally:
        dec.events = None


def _trace(generation, name, schedule, head, K) -> list[dict]:
    """The generation's trace lines as a run of the configuration writes them (the baseline's K is 0)."""
    return trace_lines(
        generation,
        prompt_id=name,
        schedule=schedule,
        head=head,
        K=0 if schedule == "baseline" else K,
        probes=PROBES if head == "flashhead" else None,
    )


def _record(dec, control, references, schedule, head, K) -> Recorded:
    lines, events, with_copies = [], [], []
    for name, ids in PROMPTS.items():
        control.bind(references[name], len(ids), name)
        generation, logged = _logged(dec, ids, schedule)
        assert generation.tokens == references[name][:MAX_NEW]  # the log changes nothing
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(Decoder, "copies", property(lambda self: True))
            again, logged_with_copies = _logged(dec, ids, schedule)
        assert again.tokens == generation.tokens and again.rounds == generation.rounds
        lines += _trace(generation, name, schedule, head, K)
        events += logged
        with_copies += logged_with_copies
    for line in lines:
        check_trace_line(line)
    return Recorded(lines, events, with_copies)


def _simulated(lines, schedule, head, K, placement, tree=None) -> list[tuple]:
    """The simulator's event log of the rounds the decoder recorded (its trace, replayed); `tree`: the
    contracts.trees shape the rounds drafted (None: chains)."""
    by_prompt = {}
    for line in lines:
        by_prompt.setdefault(line["prompt_id"], []).append(line)
    source = TraceReplay(by_prompt, head, PROBES if head == "flashhead" else None)
    costs = Profile(tiny_profile(placement), "parity").costs["eager"]
    result = simulate(
        costs,
        Config(schedule, head, K, PROBES, placement, tree=tree),
        source,
        source.generations,
        seed=0,
        ceiling=False,
        events=True,
    )
    fields = ("accepted", "emitted", "verify_skipped", "context", "lookahead_used")
    assert [[r[f] for f in fields] for r in result["rounds_detail"]] == [[x[f] for f in fields] for x in lines]
    return result["events"]


def _without_copies(events):
    return [e for e in events if e[0] != COPY]


def _check_shape(events):
    for name, stream, tokens in events:
        assert name in EVENTS and stream in ("draft", "target")
        assert (tokens is None) == (name == "sync")


def test_both_implementations_define_the_contract_schedules_in_order():
    assert tuple(model_schedules.RUNNERS) == tuple(sim_schedules.RUNNERS) == SCHEDULES


@pytest.mark.parametrize("K", KS)
@pytest.mark.parametrize("head", HEADS)
@pytest.mark.parametrize("schedule", SCHEDULES)
def test_decoder_and_simulator_log_the_same_events(recorded, schedule, head, K):
    run = recorded(schedule, head, K)
    one_gpu = _simulated(run.lines, schedule, head, K, "one-gpu")
    two_gpu = _simulated(run.lines, schedule, head, K, "two-gpu")
    _check_shape(run.events_with_copies)
    assert not any(e[0] == COPY for e in run.events + one_gpu)
    assert run.events == one_gpu  # 1
    assert _without_copies(two_gpu) == run.events  # 2
    assert run.events_with_copies == two_gpu  # 3
    if schedule != "baseline":
        assert COPY in {e[0] for e in two_gpu}


@pytest.mark.parametrize("tree", ["2x2x1", "dynamic:2,7,3"])
@pytest.mark.parametrize("schedule", TREE_SCHEDULES)
def test_tree_rounds_log_the_simulators_events(models, references, schedule, tree):
    """Tree rounds (exact against target greedy, `_record` checks it): per depth one draft step over its
    frontier, the nodes' copy, the verify of every node, and the cursor's copy with the path's cache moves.
    pipelined-deferred: look-aheads used and wasted, and a used one's next round a chain of depth nodes."""
    target, draft = models
    shape = parse_tree(tree)
    control = AcceptanceControl(SPEC, 512, ROOM, torch.device("cpu"))
    dec = Decoder(target, draft, DenseHead(draft.head_weight), graphs=False, control=control, phases=False, tree=shape)
    run = _record(dec, control, references, schedule, "dense", shape.depth)
    assert run.events == _simulated(run.lines, schedule, "dense", shape.depth, "one-gpu", shape)
    two_gpu = _simulated(run.lines, schedule, "dense", shape.depth, "two-gpu", shape)
    assert run.events_with_copies == two_gpu
    assert (COPY, "target", 3 + 3 * shape.depth) in two_gpu and (COPY, "draft", shape.node_count) in two_gpu
    if schedule == "pipelined-deferred":
        assert {True, False} <= {line["lookahead_used"] for line in run.lines}
        chain_rounds = [i for i, line in enumerate(run.lines) if line["nodes"] == shape.depth]
        assert chain_rounds and all(run.lines[i - 1]["lookahead_used"] for i in chain_rounds)
        assert ("verify", "target", shape.depth + 1) in run.events


def test_the_comparison_can_fail(recorded):
    """Perturbed copies of the simulator's log differ from the decoder's; a moved copy is invisible
    without the copies (comparisons 1 and 2) and caught with them (comparison 3)."""
    run = recorded("pipelined-deferred", "dense", 3)
    two_gpu = _simulated(run.lines, "pipelined-deferred", "dense", 3, "two-gpu")
    assert two_gpu == run.events_with_copies
    one_token = list(two_gpu)  # the first draft step costed as one token
    one_token[one_token.index(("draft_step", "draft", 2))] = ("draft_step", "draft", 1)
    no_read = list(two_gpu)
    no_read.remove(("sync", "target", None))
    K = 3  # the look-ahead as two launches, each copied (the old simulator)
    whole = [("draft_step", "draft", 1)] * (K + 1) + [(COPY, "draft", K + 1)]
    i = next(i for i in range(len(two_gpu)) if two_gpu[i : i + K + 2] == whole)
    split = (
        two_gpu[:i] + whole[:1] + [(COPY, "draft", 1)] + whole[1 : K + 1] + [(COPY, "draft", K)] + two_gpu[i + K + 2 :]
    )
    for changed in (one_token, no_read, split):
        assert changed != run.events_with_copies
    f_copy = two_gpu.index((COPY, "target", 3))  # f to the draft, between the look-ahead's copy and the read
    assert two_gpu[f_copy - 1] == (COPY, "draft", K + 1) and two_gpu[f_copy + 1][0] == "sync"
    late = two_gpu[:f_copy] + [two_gpu[f_copy + 1], two_gpu[f_copy]] + two_gpu[f_copy + 2 :]
    assert late != run.events_with_copies  # 3 catches it (f copied after the read, as before session 27)
    assert _without_copies(late) == run.events  # 1 and 2 cannot


def test_the_runs_cover_every_rule_the_logs_check(recorded):
    """The comparisons see skipped verifies, resolve's extra read at the end of an ordinary
    generation, and look-aheads both used and wasted."""
    for schedule in ("ordinary", "pipelined"):
        runs = [recorded(schedule, head, K) for head in HEADS for K in KS]
        assert any(line["verify_skipped"] for run in runs for line in run.lines)
        # reads: one per round (the skip test) and one per generation at the end, and resolve's
        extra = [Counter(e[0] for e in run.events)["sync"] - len(run.lines) - len(PROMPTS) for run in runs]
        assert min(extra) >= 0 and max(extra) > 0
    used = [
        line["lookahead_used"] for head in HEADS for K in KS for line in recorded("pipelined-deferred", head, K).lines
    ]
    assert True in used and False in used


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_a_generation_of_one_token_logs_nothing(decoders, schedule):
    """max_new_tokens = 1: the first token is all; no round, no append, no read on either side."""
    dec, _ = decoders("dense", 3)
    dec.events = []
    try:
        assert dec.generate(PROMPTS["short"], 1, schedule).rounds == [] and dec.events == []
    finally:
        dec.events = None
    costs = Profile(tiny_profile("two-gpu"), "parity").costs["eager"]
    result = simulate(
        costs,
        Config(schedule, "dense", 3, PROBES, "two-gpu"),
        IIDAcceptance(0.5),
        [Generation("g", 8, 0)],
        ceiling=False,
        events=True,
    )
    assert result["events"] == [] and result["decode_ms"] == 0


def test_the_first_draft_step_feeds_the_tokens_the_drafts_cache_lacks():
    """`Decoder.missed`: ordinary rounds feed [prev, f] (the host has not read the last round's outcome);
    deferred rounds [prev, f] in the first round and after a fully accepted block whose last token no
    look-ahead fed, else f alone. The simulator costs the first step with draft.body_ms at its n_tokens
    where the profile has the axis, and as one token where not."""
    raw = tiny_profile("one-gpu")
    flat = Profile(raw, "flat").costs["eager"]
    raw["regimes"]["eager"]["draft"]["body_ms"] = {
        "points": [dict(timing(1.0 + n), n_tokens=n, context=c) for n in (1, 2) for c in (8, 64)]
    }
    by_tokens = Profile(raw, "n_tokens").costs["eager"]
    generations = [Generation("g", 8, 10)]
    # steps of 2 tokens: nothing accepted, 10 rounds; every block accepted, 3 rounds (pipelined-deferred:
    # one, every look-ahead used)
    wanted = {
        0.0: {"ordinary": 10, "pipelined": 10, "deferred": 1, "pipelined-deferred": 1},
        1.0: {"ordinary": 3, "pipelined": 3, "deferred": 3, "pipelined-deferred": 1},
    }
    for rate, twos in wanted.items():
        for schedule in SCHEDULES:
            config = Config(schedule, "dense", 3, PROBES, "one-gpu")
            a, b = (
                simulate(c, config, IIDAcceptance(rate), generations, ceiling=False, events=True)
                for c in (flat, by_tokens)
            )
            steps = [tokens for name, _, tokens in a["events"] if name == "draft_step"]
            assert steps.count(2) == twos.get(schedule, 0), (rate, schedule)
            # by_tokens charges a step of n tokens 1 + n ms where flat charges 2
            assert b["phase_ms"]["draft_body"] - a["phase_ms"]["draft_body"] == pytest.approx(sum(steps) - len(steps))


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_on_two_gpus_the_decoders_copies_are_the_simulators():
    """Target on cuda:0, draft on cuda:1 (graphs, fixed width): the decoder's own log, real copies
    and all, equals the simulator's two-gpu log."""
    room = 2 * ROOM  # the reference's target-only run of 38 tokens, fixed width: 100 slots
    target = load_model("tiny-qwen3", "cuda:0", seed=1, max_seq_len=room).model
    draft = load_model("tiny-qwen3-draft", "cuda:1", seed=2, max_seq_len=room).model
    reference = Decoder(target, K=1)
    references = {name: reference.reference(ids, MAX_NEW + 2 * max(KS) + 2) for name, ids in PROMPTS.items()}
    clustering = build_clustering(draft.head_weight, seed=0)
    for head in HEADS:
        for K in KS:
            w = draft.head_weight
            draft_head = DenseHead(w) if head == "dense" else FlashHead(w, clustering, probes=PROBES)
            control = AcceptanceControl(SPEC, 512, room, torch.device("cuda:1"))
            dec = Decoder(target, draft, draft_head, K=K, control=control)
            for schedule in SCHEDULES:
                lines, events = [], []
                for name, ids in PROMPTS.items():
                    control.bind(references[name], len(ids), name)
                    generation, logged = _logged(dec, ids, schedule)
                    assert generation.tokens == references[name][:MAX_NEW]
                    lines += _trace(generation, name, schedule, head, K)
                    events += logged
                assert events == _simulated(lines, schedule, head, K, "two-gpu"), (schedule, head, K)


@pytest.mark.parametrize("head", HEADS)
@pytest.mark.parametrize("schedule", SCHEDULES)
def test_sampling_keeps_the_event_order(models, schedule, head):
    """Under sampling every schedule logs the events the simulator logs for its trace: the sampling
    forms of the skip test and the look-ahead change what is decided, not what is issued."""
    target, draft = models
    w = draft.head_weight
    draft_head = DenseHead(w) if head == "dense" else FlashHead(w, build_clustering(w, seed=0), probes=PROBES)
    settings = SamplingSettings(temperature=1.0, top_k=8, seed=4)
    dec = Decoder(target, draft, draft_head, K=3, graphs=False, phases=False, sampling=settings)
    lines, events = [], []
    for name, ids in list(PROMPTS.items())[1:]:  # the longer prompt: many rounds, a few seconds per case
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(Decoder, "copies", property(lambda self: True))
            generation, logged = _logged(dec, ids, schedule)
        lines += trace_lines(
            generation, prompt_id=name, schedule=schedule, head=head, K=0 if schedule == "baseline" else 3
        )
        events += logged
    assert events == _simulated(lines, schedule, head, 3, "two-gpu")
