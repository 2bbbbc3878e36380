"""Acceptance control per draft position (contracts.acceptance): one spec that the decoder and the
simulator read as the same numbers, a curve resolved per head from the profile's agreement, and the
decoder's realized acceptance per draft position following the given rates (with a negative control)."""

import json
import math

import pytest

from contracts import UsageError
from contracts.acceptance import ControlSpec, parse_control
from contracts.trees import parse_tree
from model.acceptance_control import AcceptanceControl
from model.decoder import Decoder
from model.heads import DenseHead
from model.sampling import SamplingSettings
from sim.heads import agreement_per_position
from sim.profile import Profile
from sim.scenario import Scenario, parse_acceptance, resolve
from tests.sim_fixtures import tiny_heads_profile
from tests.tiny_pair import tiny_pair

ROOM = 1200


def test_specs_parse_to_rates_and_back():
    assert parse_control("a=0.43") == ControlSpec(rates=(0.43,))
    assert parse_control("a=0.9,0.5,0.2").rate(7) == 0.2  # the last rate repeats
    assert parse_control("pattern=1,0,1") == ControlSpec(pattern=(1, 0, 1))
    curve = parse_control("curve:a=0.8,0.6")
    assert curve.curve and curve.label == "curve:a=0.8,0.6"
    assert curve.for_head([0.5, 0.5, 1.0]) == ControlSpec(rates=(0.4, 0.3, 0.6))
    assert curve.for_head([1.0, 0.75, 0.75]) == ControlSpec(rates=(0.8, 0.45))  # a repeated last rate once
    for text in ("a=0.9,0.5", "pattern=1,1,0", "curve:a=0.77"):
        assert parse_control(parse_control(text).label) == parse_control(text)
    for bad in ("0.5", "a=", "a=0.5,", "a=0.5,1.5", "a=nan", "pattern=1,2", "curve:pattern=1", "b=1"):
        with pytest.raises(UsageError, match="bad acceptance control"):
            parse_control(bad)


def test_simulator_and_decoder_read_the_same_rates():
    for text in ("a=0.43", "a=0.9,0.5,0.2"):
        control = AcceptanceControl(text, vocab_size=10, capacity=20, device="cpu")
        source = parse_acceptance(text)
        assert tuple(getattr(source, "rates", None) or [source.a]) == control.rates == parse_control(text).rates
    with pytest.raises(UsageError, match="a curve is scaled per head"):
        AcceptanceControl("curve:a=0.5", vocab_size=10, capacity=20, device="cpu")


def test_a_curve_gives_each_head_its_agreement_per_position(tmp_path):
    """The simulator's source for each head under curve:a=... draws at the rates the validation's
    decoders are controlled with (validate/acceptance_curves.py), which are the base rate times the
    head's agreement per position, as the simulator models a head under a plain a=... (sim/heads.py)."""
    from validate.acceptance_curves import base_control, head_controls

    path = tmp_path / "profile.json"
    path.write_text(json.dumps(tiny_heads_profile()))
    heads, K = ("dense", "shortlist:1000,100", "router:8"), 3
    controls = head_controls("curve:a=0.8", str(path), heads, (K,), None)
    resolved = resolve(Scenario(profile=str(path), acceptance="curve:a=0.8", heads=heads, K=K))
    profile = Profile(tiny_heads_profile(), "test")
    for head in heads:
        rates = parse_control(controls[(K, head)]).rates
        source = resolved.sources[head]
        assert tuple(getattr(source, "rates", None) or [source.a]) == rates
        agreement = [1.0] * (K + 1) if head == "dense" else agreement_per_position(profile, head, 16, K)[0]
        want = ControlSpec(rates=(0.8,)).for_head(agreement).rates
        assert rates == want
    assert parse_control(controls[(K, "dense")]).rates == (0.8,)
    lift = (4 + 10 * 0.8 * 0.5 / 0.9) / (26 * 0.8 * 0.5 / 0.9)  # the curve's lift at position 2 (sim/heads.py)
    assert parse_control(controls[(K, "shortlist:1000,100")]).rates == pytest.approx((0.72, 0.8 * 0.5 * lift), abs=1e-6)
    assert base_control("curve:a=0.8") == "a=0.8" and base_control("a=0.8") == "a=0.8"
    # sampled rounds take one rate: a head whose agreement varies per position is refused, the dense one runs
    assert head_controls("curve:a=0.8", str(path), ("dense",), (K,), None, greedy=False)
    with pytest.raises(UsageError, match="shortlist:1000,100's agreement differs per draft position"):
        head_controls("curve:a=0.8", str(path), heads, (K,), None, greedy=False)


@pytest.fixture(scope="module")
def models():
    return tiny_pair(ROOM)


def _per_position(models, spec: str, generations: int, K: int = 2, new: int = 120):
    """(accepted, tested) per draft slot 0..K under pipelined-deferred (slot K: the look-ahead's guess
    of the token after a full block), over every round but each generation's last (the end may cut it)."""
    target, draft = models
    control = AcceptanceControl(spec, target.config.vocab_size, ROOM, "cpu", seed=5)
    dec = Decoder(target, draft, DenseHead(draft.head_weight), K=K, graphs=False, control=control)
    counts = [[0, 0] for _ in range(K + 1)]
    for index in range(generations):
        prompt = [3 + index, 17, 250, 9 * index + 1]
        control.bind(dec.reference(prompt, new + 2 * K + 2), len(prompt), f"prompt{index}")
        for r in dec.generate(prompt, new, "pipelined-deferred").rounds[:-1]:
            for j in range(min(r.accepted + 1, K)):
                counts[j][0] += j < r.accepted
                counts[j][1] += 1
            if r.accepted == K:
                counts[K][0] += bool(r.lookahead_used)
                counts[K][1] += 1
    return counts


def _z_scores(counts, rates):
    return [
        (accepted - tested * rate) / math.sqrt(tested * rate * (1 - rate))
        for (accepted, tested), rate in zip(counts, rates)
    ]


def test_decoder_acceptance_follows_the_rate_of_each_draft_position(models):
    """A round's j-th proposal, and the look-ahead's guess after a full block (slot K), are accepted at
    their own rates: every slot's count is within 4 binomial standard deviations of its rate. Negative
    control: an i.i.d. control at about the same mean rate fails the same test."""
    rates = (0.95, 0.4, 0.8)
    counts = _per_position(models, "a=0.95,0.4,0.8", generations=3)
    assert all(tested >= 30 for _, tested in counts), counts
    assert all(abs(z) < 4 for z in _z_scores(counts, rates)), counts
    flat = _per_position(models, "a=0.7", generations=1)
    assert max(abs(z) for z in _z_scores(flat, rates)) > 4, flat


def test_per_position_rates_are_refused_where_they_do_not_apply(models):
    target, draft = models
    control = AcceptanceControl("a=0.9,0.5", target.config.vocab_size, ROOM, "cpu")
    head = DenseHead(draft.head_weight)
    with pytest.raises(UsageError, match="greedy chain rounds only"):
        Decoder(target, draft, head, K=2, graphs=False, control=control, tree=parse_tree("2x1"))
    with pytest.raises(UsageError, match="greedy chain rounds only"):
        Decoder(target, draft, head, K=2, graphs=False, control=control, sampling=SamplingSettings(temperature=0.7))
