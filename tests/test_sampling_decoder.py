"""Level 2: speculative sampling through the decoder (CPU, tiny models) gives the target's own
distribution of the first three tokens, for every schedule and every head (dense, FlashHead, shortlist,
router); a wrong rule is rejected.

Target: the first 2 layers of tiny-qwen3; draft: its first layer (an early-exit pair, so draft and
target agree often enough that accepts and rejections both happen). top_k = 2 keeps 8 cells for
three tokens; the exact target distribution is computed by enumeration."""

import itertools

import pytest
import torch

from contracts import UsageError
from contracts.trace import check_summary, check_trace_line, write_trace
from model import sampling
from model.acceptance_control import AcceptanceControl
from model.decoder import Decoder
from model.flashhead import build_clustering
from model.heads import DenseHead, FlashHead, RouterHead, ShortlistHead
from model.loading import load_model
from model.router import build_router
from model.sampling import SamplingSettings
from model.trace import summarize, trace_lines
from sim.trace import rounds_by_prompt
from tests.sampling_fixtures import tiny_pair
from tests.sampling_stats import ALPHA, g_test

SETTINGS = SamplingSettings(temperature=1.0, top_k=2, seed=11)
PROMPT = [7]
TOKENS = 3
SAMPLES = 150  # per schedule and head: 2 to 4 s each on one CPU thread
SPECULATIVE = ("ordinary", "pipelined", "deferred", "pipelined-deferred")


@pytest.fixture(scope="module")
def pair():
    return tiny_pair()


@pytest.fixture(scope="module")
def exact(pair):
    return _exact(pair[0], TOKENS)


def _exact(target, tokens: int) -> dict:
    """{token sequence: probability} of the target's first `tokens` tokens after PROMPT."""
    out = {(): 1.0}
    for _ in range(tokens):
        grown = {}
        for prefix, mass in out.items():
            ids = torch.tensor([PROMPT + list(prefix)])
            hidden = target.forward_hidden(ids, torch.arange(ids.shape[1]))[0, -1:]
            probs = sampling.probabilities(DenseHead(target.head_weight).logits(hidden), SETTINGS)[0]
            for token in probs.nonzero()[:, 0].tolist():
                grown[prefix + (token,)] = mass * probs[token].item()
        out = grown
    return out


def _decoder(pair, head: str, K: int = 2) -> Decoder:
    target, draft = pair
    weight = draft.head_weight
    if head == "dense":
        draft_head = DenseHead(weight)
    elif head == "shortlist":  # half the vocabulary: the target's top tokens are often outside it
        draft_head = ShortlistHead(weight, torch.randperm(512, generator=torch.Generator().manual_seed(0))[:256])
    elif head == "router":  # half of an unbalanced clustering's clusters, routed by a briefly trained MLP
        router = _router(draft)
        draft_head = RouterHead(weight, draft.embed_tokens.weight, router, router.clusters // 2)
    else:
        draft_head = FlashHead(weight, build_clustering(weight, seed=0), probes=2)
    return Decoder(target, draft, draft_head, K=K, graphs=False, phases=False, sampling=SETTINGS)


def _router(draft):
    g = torch.Generator().manual_seed(0)
    weight, n = draft.head_weight, 64
    samples = {"tokens": torch.randint(0, weight.shape[0], (n,), generator=g)}
    samples["previous"] = torch.randn(n, weight.shape[1], generator=g)
    samples["hidden"] = torch.randn(n, weight.shape[1], generator=g)
    return build_router(weight, draft.embed_tokens.weight, samples, 12, cap=80, iters=3, width=16, epochs=2)


def _counts(dec, schedule: str, exact: dict, first: int = 0, samples: int = SAMPLES):
    """Observed counts of samples first.. and exact probabilities, over the exact support plus one
    cell for anything else."""
    cells = {seq: i for i, seq in enumerate(exact)}
    counts = torch.zeros(len(cells) + 1)
    length = len(next(iter(exact)))
    for sample in range(first, first + samples):
        counts[cells.get(tuple(dec.generate(PROMPT, length, schedule, sample).tokens), len(cells))] += 1
    return counts, torch.tensor([*exact.values(), 0.0])


def test_baseline_samples_the_target(pair, exact):
    counts, probs = _counts(_decoder(pair, "dense"), "baseline", exact)
    assert g_test(counts, probs) > ALPHA


@pytest.mark.parametrize("head", ["dense", "flashhead", "shortlist", "router"])
def test_every_schedule_samples_the_target(pair, exact, head):
    """Each schedule alone, and all four pooled (each schedule draws its own samples, so the pool
    holds 4 x SAMPLES independent ones). Since the random numbers are keyed by position, the
    schedules also emit identical tokens for the same sample, except with a router: its input (the
    previous draft hidden state) follows the draft steps each schedule runs, so its q differs by
    schedule (each schedule is still exact: the G-tests above)."""
    dec = _decoder(pair, head)
    pooled = 0
    for index, schedule in enumerate(SPECULATIVE):
        counts, probs = _counts(dec, schedule, exact, first=index * SAMPLES)
        assert g_test(counts, probs) > ALPHA, f"{schedule} with {head}"
        pooled = pooled + counts
    assert g_test(pooled, probs) > ALPHA
    for sample in range(3):
        outputs = {tuple(dec.generate(PROMPT, 12, s, sample).tokens) for s in SPECULATIVE}
        assert len(outputs) == 1 or head == "router"


def test_lookahead_samples_the_target(pair):
    """The look-ahead in its sampling form, where it is used often: a draft that is the target with a
    sharper head (scaled by 1.5) accepts most blocks, and its guess e1 often equals the sampled bonus.
    K = 1 and four tokens, so the fourth comes from a round that may start from the look-ahead."""
    target = pair[0]
    draft = load_model("tiny-qwen3#layers=2", "cpu", seed=1, max_seq_len=48).model
    draft.head_weight.mul_(1.5)
    dec = _decoder((target, draft), "dense", K=1)
    exact = _exact(target, 4)
    counts, probs = _counts(dec, "pipelined-deferred", exact)
    assert g_test(counts, probs) > ALPHA
    used = [r.lookahead_used for s in range(10) for r in dec.generate(PROMPT, 4, "pipelined-deferred", s).rounds]
    assert 0 < sum(used) < len(used)
    for sample in range(3):
        assert (
            dec.generate(PROMPT, 12, "pipelined-deferred", sample).tokens
            == dec.generate(PROMPT, 12, "deferred", sample).tokens
        )


def _correct_from_p(target_probs, draft_probs, draft_tokens, accept_uniforms, race_noise):
    """A wrong rule: the correction after a rejection is drawn from p instead of the residual."""
    accepted, _ = sampling.verify_block_reference(target_probs, draft_probs, draft_tokens, accept_uniforms, race_noise)
    return accepted, sampling.race(target_probs.index_select(0, accepted)[0], race_noise).view(1)


@pytest.mark.parametrize("head", ["dense", "router"])
def test_wrong_rule_is_rejected(pair, exact, head):
    """Negative control: the same test, through the same decoder, rejects the wrong rule (put where
    the decoder verifies every round that has draft tokens)."""
    dec = _decoder(pair, head)
    dec.verifier = _correct_from_p
    counts, probs = _counts(dec, "deferred", exact, samples=3 * SAMPLES)
    assert g_test(counts, probs) < ALPHA


def test_all_tokens_covered(exact):
    assert len(exact) == 2**TOKENS and abs(sum(exact.values()) - 1) < 1e-5
    assert all(len(seq) == TOKENS for seq in itertools.islice(exact, 3))


def test_sampled_outputs_follow_the_contracts(pair, tmp_path):
    """Sampled traces and summaries carry the sample and its tokens; the simulator replays each sample
    as its own generation; a greedy trace line (no `sample`) still reads."""
    dec = _decoder(pair, "dense")
    runs = [("q1", dec.generate(PROMPT, 6, "deferred", sample)) for sample in range(2)]
    lines = [line for pid, g in runs for line in trace_lines(g, prompt_id=pid, schedule="deferred", head="dense", K=2)]
    for line in lines:
        check_trace_line(line)
    config = {k: None for k in ("target", "draft", "weights", "head", "probes", "placement", "graphs", "prompts")}
    config.update(schedule="deferred", K=2, max_new_tokens=6, sampling={**SETTINGS.describe(), "samples": 2})
    summary = summarize(config, runs)
    check_summary(summary)
    assert [(e["sample"], e["tokens"]) for e in summary["per_prompt"]] == [(g.sample, g.tokens) for _, g in runs]
    write_trace(tmp_path / "t.jsonl", lines)
    grouped, _ = rounds_by_prompt(tmp_path / "t.jsonl")
    assert list(grouped) == ["q1", "q1#1"]
    greedy = {k: v for k, v in lines[0].items() if k != "sample"}
    check_trace_line(greedy)
    with pytest.raises(UsageError):
        check_summary({**summary, "config": {**config, "sampling": {**config["sampling"], "top_p": 2.0}}})


@pytest.mark.parametrize("head", ["dense", "flashhead"])
def test_acceptance_control_sets_the_accepts_under_sampling(pair, head):
    """Synthetic-weight validation under sampling: the pattern decides every position's test (all
    accepted, none, or 1,1,0,0 identically in every schedule), while the draft still samples its own
    proposals and the final token is still drawn."""
    target, draft = pair
    w = draft.head_weight
    draft_head = DenseHead(w) if head == "dense" else FlashHead(w, build_clustering(w, seed=0), probes=2)
    settings = SamplingSettings(temperature=1.0, seed=2)
    accepted = {}
    for spec in ("a=1", "a=0", "pattern=1,1,0,0"):
        control = AcceptanceControl(spec, 512, 48, torch.device("cpu"))
        control.bind([0] * 20, len(PROMPT), "p")
        dec = Decoder(target, draft, draft_head, K=2, graphs=False, phases=False, control=control, sampling=settings)
        for schedule in SPECULATIVE:
            g = dec.generate(PROMPT, 16, schedule)
            accepted[spec, schedule] = [r.accepted for r in g.rounds]
    for schedule in SPECULATIVE:
        assert set(accepted["a=1", schedule][:-1]) == {2} and set(accepted["a=0", schedule]) == {0}
        assert accepted["pattern=1,1,0,0", schedule] == accepted["pattern=1,1,0,0", "deferred"]
    assert {0, 2} <= set(accepted["pattern=1,1,0,0", "deferred"])
