"""Level 1: the verification rule of model/sampling.py draws exactly the target's distribution, for
random (p, q) pairs including drafts that put no mass on part of p's support (a FlashHead
shortlist), at >= 100,000 draws each (G-test, alpha 0.001); a wrong rule is rejected. Also the
transform and the random numbers."""

import pytest
import torch

from contracts import UsageError
from model import sampling
from model.sampling import SamplingSettings, verify_block_reference
from tests.sampling_stats import ALPHA, g_test

DRAWS = 100_000
V = 12


def _pair(generator, K: int, shortlist: bool, sharp: float):
    """p_1..p_{K+1} and q_1..q_K over V tokens; a shortlist q is zero outside V // 3 random tokens."""
    p = torch.softmax(sharp * torch.randn(K + 1, V, generator=generator), -1)
    logits = sharp * torch.randn(K, V, generator=generator)
    if shortlist:
        keep = torch.rand(K, V, generator=generator).argsort(-1) < V // 3
        logits = logits.masked_fill(~keep, float("-inf"))
    return p, torch.softmax(logits, -1)


def _wrong_rule(target_probs, draft_probs, draft_tokens, accept_uniforms, race_noise):
    """The classic mistake: the correction is drawn from p instead of the residual max(0, p - q)."""
    accepted, _ = verify_block_reference(target_probs, draft_probs, draft_tokens, accept_uniforms, race_noise)
    return accepted, sampling.race(target_probs.index_select(0, accepted)[0], race_noise).view(1)


def _first_two(rule, p, q, seed: int) -> torch.Tensor:
    """The first two emitted tokens of DRAWS generations whose positions 1, 2 have the fixed target
    distributions p[0], p[1] and draft distributions q[0], q[1]: a round from position 1 (drafts
    from q, K = q rows), and when it emits only one token, a second round from position 2. The
    random numbers come from a torch generator here (fast); the decoder's keyed numbers are tested
    below and end to end in tests/test_sampling_decoder.py."""
    K = q.shape[0]
    generator = torch.Generator().manual_seed(seed)
    run = torch.vmap(rule, in_dims=(None, None, 0, 0, 0))

    def round_from(p_rows, q_rows):
        drafts = sampling.race(q_rows, torch.empty(DRAWS, K, V).exponential_(generator=generator))
        accept = torch.rand(DRAWS, K, generator=generator)
        accepted, final = run(p_rows, q_rows, drafts, accept, torch.empty(DRAWS, V).exponential_(generator=generator))
        return drafts, accepted[:, 0], final[:, 0]

    drafts, accepted, final = round_from(p, q)
    first = torch.where(accepted > 0, drafts[:, 0], final)
    # the second round starts at position 2: its p and q are those of positions 2.., padded past the pair
    drafts2, accepted2, final2 = round_from(torch.cat([p[1:], p[-1:]]), torch.cat([q[1:], q[-1:]]))
    second_round = torch.where(accepted2 > 0, drafts2[:, 0], final2)
    in_block = torch.where(accepted > 1, drafts[:, min(1, K - 1)], final)
    second = torch.where(accepted >= 1, in_block, second_round)
    return first * V + second


CASES = [(K, shortlist, sharp) for K in (1, 3) for shortlist in (False, True) for sharp in (1.0, 3.0)]


@pytest.mark.parametrize("K,shortlist,sharp", CASES)
def test_rule_draws_the_target_distribution(K, shortlist, sharp):
    generator = torch.Generator().manual_seed(100 * K + 10 * shortlist + int(sharp))
    for pair in range(2):
        p, q = _pair(generator, K, shortlist, sharp)
        joint = torch.outer(p[0], p[1])
        counts = torch.bincount(_first_two(verify_block_reference, p, q, seed=pair), minlength=V * V)
        assert g_test(counts, joint) > ALPHA, f"pair {pair}: the first two tokens are not p_1 x p_2"


@pytest.mark.parametrize("shortlist", [False, True])
def test_wrong_rule_is_rejected(shortlist):
    """Negative control: the same test rejects a correction drawn from p instead of the residual."""
    generator = torch.Generator().manual_seed(7)
    p, q = _pair(generator, 1, shortlist, 1.0)
    counts = torch.bincount(_first_two(_wrong_rule, p, q, seed=0), minlength=V * V)
    assert g_test(counts, torch.outer(p[0], p[1])) < ALPHA


def test_rule_cases_by_hand():
    """Accepts are leading; a zero residual falls back to p; a full block races on p_{K+1}."""
    p = torch.tensor([[0.5, 0.5, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    q = torch.tensor([[0.5, 0.5, 0.0], [0.0, 1.0, 0.0]])
    noise = torch.ones(3)
    accepted, final = verify_block_reference(p, q, torch.tensor([1, 1]), torch.tensor([0.9, 0.9]), noise)
    assert (accepted.item(), final.item()) == (2, 2)  # all accepted: the bonus from p_3
    q_off = torch.tensor([[0.0, 1.0, 0.0], [0.0, 1.0, 0.0]])  # q_1 puts 1.0 on token 1, p_1 only 0.5
    accepted, final = verify_block_reference(p, q_off, torch.tensor([1, 1]), torch.tensor([0.6, 0.0]), noise)
    assert (accepted.item(), final.item()) == (0, 0)  # 0.6 * 1.0 >= 0.5 rejects; residual is token 0 only
    same = torch.tensor([[0.0, 1.0, 0.0], [0.0, 1.0, 0.0], [0.0, 1.0, 0.0]])
    # an identical p and q never reject; with u = 1 - eps still accepted; a K = 0 block races on p_1
    accepted, final = verify_block_reference(same, same[:2], torch.tensor([1, 1]), torch.tensor([0.999, 0.999]), noise)
    assert accepted.item() == 2
    accepted, final = verify_block_reference(p[:1], q[:0], torch.tensor([], dtype=torch.long), torch.zeros(0), noise)
    assert accepted.item() == 0 and final.item() == 0  # tie between tokens 0 and 1: the lowest index


def test_race_ties_and_zero_mass():
    probs = torch.tensor([0.0, 0.25, 0.25, 0.5])
    assert sampling.race(probs, torch.tensor([1.0, 1.0, 0.5, 1.0])).item() == 2
    assert sampling.race(probs, torch.tensor([1.0, 1.0, 1.0, 2.0])).item() == 1  # ties: lowest index
    assert sampling.race(torch.tensor([0.0, 1.0]), torch.tensor([1e-9, 5.0])).item() == 1  # no mass, never drawn


def test_random_numbers_are_keyed_and_uniform():
    seed = torch.tensor([sampling.generation_seed(3, 0)])
    keys = sampling.keys(seed, torch.arange(20_000), sampling.ACCEPT)
    u = sampling.uniforms(keys, torch.arange(4))
    assert u.min() >= 0 and u.max() < 1
    counts = torch.bincount((u * 10).long().flatten(), minlength=10)
    assert g_test(counts, torch.full((10,), 0.1)) > ALPHA
    again = sampling.uniforms(sampling.keys(seed, torch.arange(20_000), sampling.ACCEPT), torch.arange(4))
    assert torch.equal(u, again)  # reproducible
    other = sampling.uniforms(sampling.keys(seed, torch.arange(20_000), sampling.RACE), torch.arange(4))
    assert not torch.equal(u, other)  # purposes are separate streams
    assert sampling.generation_seed(3, 0) != sampling.generation_seed(3, 1) != sampling.generation_seed(4, 1)
    noise = sampling.exponentials(keys, torch.arange(4))
    assert noise.min() > 0 and abs(noise.mean().item() - 1) < 0.02


def test_transform_temperature_top_k_top_p():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0, float("-inf")]])
    plain = sampling.probabilities(logits, SamplingSettings(temperature=1.0))
    assert torch.allclose(plain, torch.softmax(logits, -1)) and plain[0, 4] == 0
    hot = sampling.probabilities(logits, SamplingSettings(temperature=2.0))
    assert torch.allclose(hot, torch.softmax(logits / 2, -1))
    top2 = sampling.probabilities(logits, SamplingSettings(temperature=1.0, top_k=2))
    assert torch.allclose(top2[0, :2], torch.softmax(logits[0, :2], -1)) and top2[0, 2:].sum() == 0
    # top-p: the smallest set of the highest whose mass reaches 0.7 (0.644 + 0.237)
    nucleus = sampling.probabilities(logits, SamplingSettings(temperature=1.0, top_p=0.7))
    assert (nucleus[0] > 0).tolist() == [True, True, False, False, False]
    assert torch.allclose(nucleus.sum(-1), torch.ones(1))


@pytest.mark.parametrize(
    "settings",
    [dict(temperature=-0.5), dict(temperature=float("nan")), dict(top_k=-1), dict(top_p=0.0), dict(top_p=1.5)],
)
def test_bad_settings(settings):
    with pytest.raises(UsageError):
        SamplingSettings(**settings)


def test_exponential_noise_is_positive_at_the_top_draw():
    """Noise stays > 0 where a draw hits the top of the hash's range (a found bug: it rounded to a
    uniform of 1.0 in float32, noise 0, and a token of probability 0 won the race)."""
    seed = torch.tensor([sampling.generation_seed(11, 638)])
    noise = sampling.exponentials(sampling.keys(seed, torch.tensor([0]), sampling.RACE), torch.arange(512))
    assert noise.min() > 0 and torch.isfinite(noise).all()
