"""Head specs and the shortlist, router and per-position heads: each at full coverage returns the dense
argmax, speculative output stays exact under every head and schedule, and assets save and load with
their version (CPU, tiny presets; the fused kernel under triton's interpreter)."""

import pytest
import torch

from contracts import UsageError
from contracts.heads import HeadSpec, parse_head, parse_heads
from model import triton_support
from model.decoder import Decoder
from model.flashhead import build_clustering
from model.head_assets import (
    ROUTER_FILE,
    Shortlist,
    load_router,
    load_shortlist,
    save_router,
    save_shortlist,
)
from model.heads import (
    CPU_TRANSPOSED_MAX_ROWS,
    DenseHead,
    FlashHead,
    PositionalHead,
    RouterHead,
    ShortlistHead,
    dense_logits,
)
from model.loading import load_model
from model.router import build_router, split_clusters

SCHEDULES = ("ordinary", "pipelined", "deferred", "pipelined-deferred")
ROOM = 96
TRITON = triton_support.runs_on(torch.device("cpu"))


# --- specs ---------------------------------------------------------------------------------------


def test_head_specs_parse_with_budgets_per_position():
    assert parse_head("dense") == HeadSpec("dense")
    assert parse_head("flashhead").budget(3) is None
    spec = parse_head("flashhead:64,64,32,16")
    assert [spec.budget(i) for i in range(6)] == [64, 64, 32, 16, 16, 16]
    assert spec.positional and spec.label == "flashhead:64,64,32,16"
    assert not parse_head("shortlist:4096").positional
    assert parse_heads("dense,flashhead:64,32,shortlist:100+router:8") == (
        HeadSpec("dense"),
        HeadSpec("flashhead", (64, 32)),
        HeadSpec("shortlist", (100,)),
        HeadSpec("router", (8,)),
    )


@pytest.mark.parametrize(
    "text, message",
    [
        ("sparse", "unknown head 'sparse'"),
        ("dense:4", "takes no budget"),
        ("shortlist", "needs a budget"),
        ("router:", "budgets must be positive integers"),
        ("flashhead:1.5", "budgets must be positive integers"),
        ("flashhead:0", "budgets must be >= 1"),
        ("shortlist:-3", "budgets must be positive integers"),
    ],
)
def test_bad_head_specs_name_the_valid_forms(text, message):
    with pytest.raises(UsageError, match=message) as error:
        parse_head(text)
    assert "flashhead:P, shortlist:N, router:C" in str(error.value)


# --- heads against the dense argmax --------------------------------------------------------------


def _weight(vocab=600, d=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(vocab, d, generator=g), torch.randn(300, d, generator=g)


def _router(weight, clusters=12, seed=0):
    """A router over an unbalanced clustering, trained briefly on random states (its quality is not
    what these tests check: full coverage must not depend on it)."""
    g = torch.Generator().manual_seed(seed)
    n, d = 64, weight.shape[1]
    samples = {"tokens": torch.randint(0, weight.shape[0], (n,), generator=g)}
    samples["previous"], samples["hidden"] = torch.randn(n, d, generator=g), torch.randn(n, d, generator=g)
    return build_router(weight, weight, samples, clusters, cap=80, iters=3, width=16, epochs=2, seed=seed)


def test_unbalanced_clusters_are_split_at_the_cap_and_cover_every_token():
    assignments = torch.tensor([0] * 10 + [1] * 3 + [2])
    new, members = split_clusters(assignments, cap=4)
    assert members.shape == (5, 4)  # 10 -> 4 + 4 + 2, then 3 and 1
    assert torch.bincount(new).tolist() == [4, 4, 2, 3, 1]
    for cluster, row in enumerate(members):
        assert set(row.tolist()) == set(torch.nonzero(new == cluster).squeeze(1).tolist())


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_every_head_at_full_coverage_is_the_dense_argmax(backend):
    if backend == "triton" and not TRITON:
        pytest.skip("needs triton (its interpreter on the CPU)")
    weight, hidden = _weight()
    dense = DenseHead(weight).argmax(hidden)
    vocab = weight.shape[0]
    shortlist = ShortlistHead(weight, torch.randperm(vocab), backend=backend)
    assert torch.equal(shortlist.argmax(hidden), dense)
    router = _router(weight)
    head = RouterHead(weight, weight, router, router.clusters, backend=backend)
    routed = torch.stack([head.argmax(h[None], torch.tensor([[5]]))[0] for h in hidden[:40]])
    assert torch.equal(routed, dense[:40])
    positional = PositionalHead([FlashHead(weight, build_clustering(weight, seed=0), probes=p) for p in (38, 38)])
    assert torch.equal(positional.at(1).argmax(hidden), dense)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_partial_budgets_lose_tokens_as_they_must(backend):
    """Negative control: a small shortlist proposes only its own tokens, so it disagrees with the dense
    head on states whose argmax lies outside it, and agrees where the argmax lies inside."""
    if backend == "triton" and not TRITON:
        pytest.skip("needs triton (its interpreter on the CPU)")
    weight, hidden = _weight()
    dense = DenseHead(weight).argmax(hidden)
    kept = torch.arange(0, 600, 3)
    got = ShortlistHead(weight, kept, backend=backend).argmax(hidden)
    inside = torch.isin(dense, kept)
    assert torch.isin(got, kept).all()
    assert torch.equal(got[inside], dense[inside]) and (got[~inside] != dense[~inside]).all()
    assert 0 < int(inside.sum()) < hidden.shape[0]
    # the scores among the kept tokens decide: the head equals the dense argmax over the kept rows
    assert torch.equal(got, kept[(hidden @ weight[kept].T).argmax(1)])


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_router_choice_then_score_equals_the_fused_router(backend):
    """The split a side stream runs (choose clusters before the body, score them after) gives the fused
    sequential router's tokens step by step, and both equal a from-scratch reference: the best token of
    the top clusters of the MLP on [embedding(fed), previous hidden]. Control: a router that never sees
    its previous state chooses other clusters, so the previous state really is an input."""
    if backend == "triton" and not TRITON:
        pytest.skip("needs triton (its interpreter on the CPU)")
    weight, hidden = _weight()
    router = _router(weight)
    fused, split, stale = (RouterHead(weight, weight, router, 3, backend=backend) for _ in range(3))
    w1, b1, w2, b2 = router.layers
    previous = torch.zeros(1, weight.shape[1])
    fed = torch.randint(0, weight.shape[0], (30, 1, 1), generator=torch.Generator().manual_seed(1))
    differs = 0
    for h, token in zip(hidden[:30], fed):
        h = h[None]
        mlp = torch.nn.functional.gelu(torch.cat([weight[token[0]], previous], 1) @ w1.T + b1) @ w2.T + b2
        members = router.members[mlp.topk(3).indices[0]].reshape(-1)
        want = members[(weight[members] @ h[0]).argmax()]  # members hold no repeated best: one answer
        split.choose(token)
        stale.previous.zero_()
        differs += not torch.equal(stale.choose(token).sort().values, split.chosen.sort().values)
        assert fused.argmax(h, token).item() == split.argmax_chosen(h).item() == want.item()
        previous = h
    assert differs > 0


def test_router_side_stream_on_or_off_gives_the_same_tokens(same_models):
    """A router head with its cluster choice beside the body (the choice issued before the body) or after
    it: identical tokens and rounds in every schedule, equal to target greedy; with the switch on the
    choice is issued before the body's forward, with it off after."""
    target, draft = same_models
    router = _router(draft.head_weight, clusters=16)
    prompt = list(b"Routers beside the body.")
    want = Decoder(target, K=1, graphs=False).reference(prompt, 24)
    order = []
    forward = draft.forward_hidden
    draft.forward_hidden = lambda *a, **k: order.append("body") or forward(*a, **k)
    runs = {}
    try:
        for beside in (True, False):
            heads = [RouterHead(draft.head_weight, draft.embed_tokens.weight, router, b) for b in (6, 3)]
            for head in heads:
                choose = head.choose
                head.choose = lambda tokens, choose=choose: order.append("choose") or choose(tokens)
            dec = Decoder(target, draft, PositionalHead(heads), K=3, graphs=False, router_side_stream=beside)
            order.clear()
            runs[beside] = [dec.generate(prompt, 24, schedule) for schedule in SCHEDULES if schedule != "baseline"]
            assert order[0] == "body"  # the draft's prefill, then the first draft step:
            assert order[1:3] == (["choose", "body"] if beside else ["body", "choose"])
    finally:
        draft.forward_hidden = forward
    for on, off in zip(runs[True], runs[False]):
        assert on.tokens == off.tokens == want
        assert [(r.proposed, r.accepted) for r in on.rounds] == [(r.proposed, r.accepted) for r in off.rounds]


def test_router_ties_and_budget_checks():
    weight, hidden = _weight()
    router = _router(weight)
    with pytest.raises(UsageError, match=r"router budget must be in \[1, "):
        RouterHead(weight, weight, router, router.clusters + 1)
    tied = weight.clone()
    tied[7] = tied[3]  # an exact tie: the lowest id wins, as torch.argmax over dense logits picks
    head = RouterHead(tied, tied, router, router.clusters)
    h = tied[3:4] * 10
    assert int(head.argmax(h, torch.tensor([[1]]))) == int(DenseHead(tied).argmax(h)) == 3


# --- assets --------------------------------------------------------------------------------------


def test_assets_round_trip_with_version_and_clear_errors(tmp_path):
    weight, _ = _weight()
    router = _router(weight)
    shortlist = Shortlist(torch.arange(600).flip(0), torch.arange(600), {"train_prompts": ["81"]})
    save_shortlist(shortlist, tmp_path)
    save_router(router, tmp_path)
    loaded = load_shortlist(tmp_path, 600)
    assert torch.equal(loaded.ranking, shortlist.ranking) and loaded.info == {"train_prompts": ["81"]}
    back = load_router(tmp_path, 600, 32)
    assert torch.equal(back.members, router.members) and all(
        torch.equal(a, b) for a, b in zip(back.layers, router.layers)
    )
    with pytest.raises(UsageError, match="vocabulary of 600, the draft's is 512"):
        load_shortlist(tmp_path, 512)
    with pytest.raises(UsageError, match="hidden size 32, the draft's is 64"):
        load_router(tmp_path, 600, 64)
    with pytest.raises(UsageError, match="no router asset at .*build it with python -m model.build_head"):
        load_router(tmp_path / "elsewhere")
    from safetensors.torch import save_file

    save_file({"members": router.members}, str(tmp_path / ROUTER_FILE), metadata={"format": "specloop.router/0"})
    with pytest.raises(UsageError, match="is format 'specloop.router/0', this version reads 'specloop.router/1'"):
        load_router(tmp_path)


# --- in the decoder ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def same_models():
    """Target and a draft with the target's weights: the dense draft head is always accepted, so the
    heads' misses are the only rejections."""
    target = load_model("tiny-qwen3", "cpu", seed=1, max_seq_len=ROOM).model
    draft = load_model("tiny-qwen3", "cpu", seed=1, max_seq_len=ROOM).model
    return target, draft


class _Recorder:
    """A head that records which draft position asked for it and answers with the dense head."""

    def __init__(self, weight, position, log):
        self.dense, self.position, self.log = DenseHead(weight), position, log

    def argmax(self, hidden, tokens=None):
        self.log.append(self.position)
        return self.dense.argmax(hidden)


def test_draft_steps_use_the_head_of_their_position(same_models):
    target, draft = same_models
    log = []
    head = PositionalHead([_Recorder(draft.head_weight, i, log) for i in range(3)])
    dec = Decoder(target, draft, head, K=3, graphs=False)
    dec.generate([1, 2, 3], 8, "ordinary")
    assert log and all(log[i : i + 3] == [0, 1, 2] for i in range(0, len(log), 3))
    log.clear()
    dec.generate([1, 2, 3], 8, "pipelined-deferred")  # rounds of K, look-aheads of K + 1 steps
    assert log[:3] == [0, 1, 2] and log[3:7] == [0, 0, 1, 2]


def _same_draft_heads(draft):
    weight, vocab = draft.head_weight, draft.head_weight.shape[0]
    g = torch.Generator().manual_seed(4)
    router = _router(weight, clusters=16)
    frequent = torch.randperm(vocab, generator=g)
    return {
        "flashhead:8,4,1": PositionalHead(
            [FlashHead(weight, build_clustering(weight, seed=0), probes=p) for p in (8, 4, 1)]
        ),
        "shortlist:400,200": PositionalHead([ShortlistHead(weight, frequent[:n]) for n in (400, 200)]),
        "router:6,3": PositionalHead([RouterHead(weight, draft.embed_tokens.weight, router, b) for b in (6, 3)]),
    }


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_speculative_output_is_exact_under_every_head(same_models, schedule):
    target, draft = same_models
    prompts = ([7, 1, 300], list(b"Speculative decoding, greedily."))
    reference = Decoder(target, K=1, graphs=False)
    want = [reference.reference(p, 24) for p in prompts]
    accepted = {}
    for name, head in _same_draft_heads(draft).items():
        dec = Decoder(target, draft, head, K=3, graphs=False)
        gens = [dec.generate(p, 24, schedule) for p in prompts]
        assert [g.tokens for g in gens] == want, name
        rounds = [r for g in gens for r in g.rounds]
        accepted[name] = sum(r.accepted for r in rounds) / sum(r.proposed for r in rounds)
    # the heads miss some of the dense draft's (always accepted) tokens, but not all
    assert all(0 < a < 1 for a in accepted.values()), accepted


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--categories", "writing,qa"], "held out for evaluation"),
        (["--categories", "poetry"], "unknown categories poetry"),
        (["--kind", "sparse"], "unknown kind 'sparse'"),
        (["--new-tokens", "0"], "--new-tokens must be >= 1"),
        (["--categories", ""], "--categories names no category; valid: writing"),
        (["--seed", str(2**64)], "--seed must be in 0..4,294,967,295"),
        (["--router-clusters", "0"], "--router-clusters must be in [1, 512], got 0"),
        (["--new-tokens", "100000000"], "--prompt-max and --new-tokens: a cache of 100,000,"),
    ],
)
def test_build_head_refuses_bad_input_before_any_work(tmp_path, capsys, argv, message):
    from model import build_head

    assert build_head.main(["--out", str(tmp_path / "assets"), *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err
    assert not (tmp_path / "assets").exists()


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--categories", ""], "--categories names no category; valid: writing"),
        (["--seed", str(2**64)], "--seed must be in 0..4,294,967,295"),
        (["--new-tokens", "100000000"], "--prompt-max and --new-tokens: a cache of 100,000,"),
    ],
)
def test_head_agreement_refuses_bad_input_before_any_work(tmp_path, capsys, argv, message):
    from measure import head_agreement

    out = tmp_path / "agreement.json"
    assert head_agreement.main(["--heads", "flashhead:4", "--per-category", "1", "--out", str(out), *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err
    assert not out.exists()


def test_dense_logits_equal_the_linear_product_for_every_row_count():
    """The CPU's transposed product for a few rows (model/heads.dense_logits) is the same logits as
    F.linear, to float tolerance, on both sides of its row limit."""
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(300, 24, generator=generator)
    for rows in (1, 2, 3, CPU_TRANSPOSED_MAX_ROWS, CPU_TRANSPOSED_MAX_ROWS + 1):
        flat = torch.randn(rows, 24, generator=generator)
        got = dense_logits(flat, weight)
        assert got.shape == (rows, 300)
        torch.testing.assert_close(got, torch.nn.functional.linear(flat, weight), rtol=1e-5, atol=1e-5)
        assert torch.equal(DenseHead(weight).argmax(flat), got.argmax(-1))
