"""Speculative decoder: every schedule emits exactly target-only greedy, with the round accounting
of docs/contracts.md, for the real tiny draft and for acceptance-controlled proposals (CPU, tiny presets)."""

import pytest
import torch

from contracts import UsageError
from contracts.trace import check_summary, check_trace_line
from model.acceptance_control import AcceptanceControl
from model.decoder import Decoder
from model.heads import DenseHead
from model.loading import load_model
from model.pair import resolve_placement
from model.trace import summarize, trace_lines
from tests.tiny_pair import target_references, tiny_head, tiny_pair

SPECULATIVE = ("ordinary", "pipelined", "deferred", "pipelined-deferred")
PROMPTS = {"one": [7], "short": list(b"Hi there"), "longer": list(b"Speculative decoding, greedily.")}
MAX_NEW = 16
ROOM = 96


@pytest.fixture(scope="module")
def models():
    return tiny_pair(ROOM)


@pytest.fixture(scope="module")
def references(models):
    """Target-only greedy continuations, long enough for acceptance control's look-ahead."""
    return target_references(models[0], PROMPTS, MAX_NEW + 2 * 6 + 2)


def _decoder(models, head="dense", K=3, control=None, **kw):
    target, draft = models
    return Decoder(target, draft, tiny_head(draft, head), K=K, graphs=False, control=control, **kw)


def _controlled(models, references, spec, K, head="dense"):
    control = AcceptanceControl(spec, 512, ROOM, torch.device("cpu"), seed=3)
    return _decoder(models, head, K, control), control


def _generate(dec, control, references, name, schedule, max_new=MAX_NEW):
    ids = PROMPTS[name]
    if control is not None:
        control.bind(references[name], len(ids), name)
    return dec.generate(ids, max_new, schedule)


def _check_rounds(g, schedule, K, prompt_len):
    """The contract's accounting of one generation."""
    rounds = g.rounds
    assert sum(r.emitted for r in rounds) == g.decode_tokens
    for i, r in enumerate(rounds):
        assert 0 <= r.accepted <= r.proposed == K
        assert r.emitted == r.accepted + 1 or (i == len(rounds) - 1 and 1 <= r.emitted <= r.accepted + 1)
        assert r.context == prompt_len + 1 + sum(x.accepted + 1 for x in rounds[:i])
        assert (r.lookahead_used is None) == (schedule != "pipelined-deferred")
        assert not r.lookahead_used or r.accepted == K
    if schedule in ("ordinary", "pipelined"):
        assert all(r.verify_skipped == (r.accepted == 0) for r in rounds)
        assert g.verify_calls == sum(not r.verify_skipped for r in rounds)
        assert g.append_calls == len(rounds) + 1
    else:
        assert not any(r.verify_skipped for r in rounds)
        assert g.verify_calls == len(rounds)
        assert g.append_calls == 1
    for line in trace_lines(g, prompt_id="p", schedule=schedule, head="dense", K=K):
        check_trace_line(line)


@pytest.mark.parametrize("head", ["dense", "flashhead"])
@pytest.mark.parametrize("K", [1, 3, 6])
def test_real_draft_output_equals_target_greedy(models, references, head, K):
    dec = _decoder(models, head, K)
    for name, ids in PROMPTS.items():
        for schedule in SPECULATIVE:
            g = dec.generate(ids, MAX_NEW, schedule)
            assert g.tokens == references[name][:MAX_NEW], (schedule, name)
            _check_rounds(g, schedule, K, len(ids))


@pytest.fixture(scope="module")
def llama_pair():
    """A Llama 3 target and a Llama 3 draft (tied head, llama3 RoPE scaling), and the target's references."""
    target = load_model("tiny-llama", "cpu", seed=1, max_seq_len=ROOM).model
    draft = load_model("tiny-llama-draft", "cpu", seed=2, max_seq_len=ROOM).model
    dec = Decoder(target, K=1, graphs=False)
    return (target, draft), {name: dec.reference(ids, MAX_NEW + 8) for name, ids in PROMPTS.items()}


@pytest.mark.parametrize("spec, head", [(None, "dense"), ("a=0.5", "flashhead"), ("a=1", "dense")])
def test_llama_pair_output_equals_target_greedy(llama_pair, spec, head):
    llama, references = llama_pair
    control = None if spec is None else AcceptanceControl(spec, 512, ROOM, torch.device("cpu"), seed=3)
    dec = _decoder(llama, head, 3, control)
    for name in PROMPTS:
        for schedule in SPECULATIVE:
            g = _generate(dec, control, references, name, schedule)
            assert g.tokens == references[name][:MAX_NEW], (schedule, name)
            _check_rounds(g, schedule, 3, len(PROMPTS[name]))


@pytest.mark.parametrize("head", ["dense", "flashhead"])
@pytest.mark.parametrize("spec", ["a=0", "a=0.5", "a=1", "pattern=1,1,0,1"])
@pytest.mark.parametrize("K", [1, 3, 6])
def test_controlled_acceptance_output_equals_target_greedy(models, references, spec, K, head):
    dec, control = _controlled(models, references, spec, K, head)
    for name in ("short", "longer"):
        for schedule in SPECULATIVE:
            g = _generate(dec, control, references, name, schedule)
            assert g.tokens == references[name][:MAX_NEW], (schedule, name)
            _check_rounds(g, schedule, K, len(PROMPTS[name]))
            accepted = [r.accepted for r in g.rounds]
            if spec == "a=1":
                assert accepted == [K] * len(accepted)
            if spec == "a=0":
                assert accepted == [0] * len(accepted)


def test_ordinary_skips_the_verify_exactly_when_nothing_is_accepted(models, references):
    dec, control = _controlled(models, references, "a=0.5", 3)
    g = _generate(dec, control, references, "longer", "ordinary", max_new=40)
    skipped = [r.verify_skipped for r in g.rounds]
    assert skipped == [r.accepted == 0 for r in g.rounds] and any(skipped) and not all(skipped)
    dec0, control0 = _controlled(models, references, "a=0", 3)
    g0 = _generate(dec0, control0, references, "short", "ordinary")
    assert all(r.verify_skipped for r in g0.rounds) and g0.verify_calls == 0


def test_deferred_appends_once_per_generation_and_never_skips(models, references):
    for spec in ("a=0", "a=0.5", "a=1"):
        dec, control = _controlled(models, references, spec, 3)
        for schedule in ("deferred", "pipelined-deferred"):
            g = _generate(dec, control, references, "short", schedule)
            assert g.append_calls == 1
            assert g.verify_calls == len(g.rounds) and not any(r.verify_skipped for r in g.rounds)


def test_pipelined_deferred_uses_the_lookahead_when_everything_is_accepted(models, references):
    dec, control = _controlled(models, references, "a=1", 3)
    g = _generate(dec, control, references, "short", "pipelined-deferred", max_new=30)
    assert [r.lookahead_used for r in g.rounds] == [True] * (len(g.rounds) - 1) + [g.rounds[-1].lookahead_used]
    dec0, control0 = _controlled(models, references, "a=0", 3)
    g0 = _generate(dec0, control0, references, "short", "pipelined-deferred")
    assert not any(r.lookahead_used for r in g0.rounds)


def test_baseline_is_one_round_per_token(models, references):
    dec = _decoder(models)
    g = dec.generate(PROMPTS["short"], MAX_NEW, "baseline")
    assert g.tokens == references["short"][:MAX_NEW]
    assert len(g.rounds) == MAX_NEW - 1 and all(r.emitted == 1 and r.proposed == 0 for r in g.rounds)
    assert g.verify_calls == 0 and g.append_calls == MAX_NEW - 1  # as the study (Table 4.9) counts them
    assert [r.context for r in g.rounds] == [len(PROMPTS["short"]) + 1 + i for i in range(MAX_NEW - 1)]


@pytest.mark.parametrize("schedule", ("baseline",) + SPECULATIVE)
def test_output_is_cut_exactly_at_max_new_tokens(models, references, schedule):
    dec, control = _controlled(models, references, "a=1", 6)
    for max_new in (1, 2, 7, 8, 9):
        g = _generate(dec, control, references, "short", schedule, max_new=max_new)
        assert g.tokens == references["short"][:max_new]
        assert sum(r.emitted for r in g.rounds) == max_new - 1
        assert (len(g.rounds) == 0) == (max_new == 1)


def test_stop_at_eos_cuts_after_the_first_eos(models, references):
    ref = references["longer"][:MAX_NEW]
    eos_at = next(i for i in range(3, MAX_NEW) if ref[i] not in ref[:i])
    target, draft = models
    for spec in ("a=0.5", "a=1"):
        control = AcceptanceControl(spec, 512, ROOM, torch.device("cpu"))
        dec = Decoder(
            target,
            draft,
            DenseHead(draft.head_weight),
            K=3,
            graphs=False,
            control=control,
            eos_id=ref[eos_at],
            stop_at_eos=True,
        )
        for schedule in ("baseline",) + SPECULATIVE:
            g = _generate(dec, control, references, "longer", schedule)
            assert g.tokens == ref[: eos_at + 1], schedule
            assert sum(r.emitted for r in g.rounds) == eos_at


def test_phase_times_are_recorded_per_round(models, references):
    dec = _decoder(models, K=3)
    g = dec.generate(PROMPTS["short"], MAX_NEW, "ordinary")
    for r in g.rounds:
        assert set(r.phases_ms) == {"draft_body", "draft_head", "verify", "finalize", "sync", "other"}
        assert min(r.phases_ms.values()) >= 0 and r.phases_ms["draft_body"] > 0
    assert sum(sum(r.phases_ms.values()) for r in g.rounds) == pytest.approx(g.decode_ms, rel=0.05)
    quiet = _decoder(models, K=3, phases=False)
    assert all(r.phases_ms is None for r in quiet.generate(PROMPTS["short"], MAX_NEW, "deferred").rounds)


def _deferred_config(prompts: list[str]) -> dict:
    """A run summary's config: deferred, dense head, K 3, on the CPU."""
    return {
        "target": "t",
        "draft": "d",
        "weights": "synthetic",
        "head": "dense",
        "probes": None,
        "schedule": "deferred",
        "K": 3,
        "placement": "cpu",
        "graphs": False,
        "max_new_tokens": MAX_NEW,
        "prompts": prompts,
    }


def test_summary_metrics(models, references):
    dec, control = _controlled(models, references, "a=0.5", 3)
    runs = [(name, _generate(dec, control, references, name, "deferred")) for name in ("short", "longer")]
    s = summarize(_deferred_config(["short", "longer"]), runs)
    check_summary(s)
    rounds = [r for _, g in runs for r in g.rounds]
    assert s["decode_tokens"] == 2 * (MAX_NEW - 1)
    assert s["acceptance"] == sum(r.accepted for r in rounds) / (3 * len(rounds))
    assert s["mean_emitted"] == s["decode_tokens"] / len(rounds)
    assert s["verify_calls"] == len(rounds) and s["append_calls"] == 2
    assert s["decode_tok_s"] == pytest.approx(s["decode_tokens"] / s["decode_ms"] * 1000)


def test_bad_input(models):
    target, draft = models
    with pytest.raises(UsageError, match="K must be >= 1"):
        Decoder(target, draft, DenseHead(draft.head_weight), K=0, graphs=False)
    dec = _decoder(models)
    with pytest.raises(UsageError, match="unknown schedule"):
        dec.generate([1, 2], 4, "eager")
    with pytest.raises(UsageError, match="needs a draft"):
        Decoder(target, K=2, graphs=False).generate([1, 2], 4, "ordinary")
    with pytest.raises(UsageError, match="cache slots"):
        dec.generate([1] * 80, 16, "deferred")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message when no GPU is present")
def test_gpu_placement_without_gpu_is_a_usage_error():
    for placement in ("two-gpu", "one-gpu"):
        with pytest.raises(UsageError, match="^no GPU: "):
            resolve_placement(placement)
    assert resolve_placement("cpu") == ("cpu", torch.device("cpu"), torch.device("cpu"))
    assert resolve_placement(None)[0] == "cpu"


def test_host_gaps_after_reads_are_recorded(models):
    """Deferred reads once a round and each read is followed by a launch (the next round's, or the
    generation's one append), so every round records exactly one host gap; the final read of the
    tokens has none. The trace and summary carry them."""
    dec = _decoder(models, K=3)
    g = dec.generate(PROMPTS["short"], MAX_NEW, "deferred")
    assert [r.host_gaps for r in g.rounds] == [1] * len(g.rounds)
    assert all(r.host_gap_ms >= 0 for r in g.rounds) and sum(r.host_gap_ms for r in g.rounds) > 0
    line = trace_lines(g, prompt_id="p", schedule="deferred", head="dense", K=3)[0]
    check_trace_line(line)
    assert line["host_gaps"] == 1 and line["host_gap_ms"] > 0
    summary = summarize(_deferred_config(["p"]), [("p", g)])
    check_summary(summary)
    assert summary["host_gaps"] == len(g.rounds)
