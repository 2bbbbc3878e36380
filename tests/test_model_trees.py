"""Token trees in the decoder (CPU, tiny presets): every static and dynamic tree emits exactly
target-only greedy under ordinary, pipelined, deferred and pipelined-deferred (its look-ahead used,
the next round then a chain, and wasted) with dense, FlashHead and shortlist heads;
a 1-wide tree is the chain; compaction leaves in both caches exactly what the accepted tokens alone
would have left; tree rounds log the agreed events; the fused kernel's tree rule equals the dense-mask reference."""

import pytest
import torch

from contracts import UsageError
from contracts.trace import check_trace_line
from contracts.trees import TREE_SCHEDULES, node_depths, parse_tree
from model import fused_ops, tree_rounds, triton_support
from model.acceptance_control import AcceptanceControl
from model.decoder import Decoder
from model.dynamic_tree import RoundTables
from model.heads import DenseHead
from model.loading import load_model
from model.trace import trace_lines
from model.transformer import tree_visible
from tests.attention_reference import reference_attention
from tests.tiny_pair import target_references, tiny_head, tiny_pair

PROMPTS = {"short": list(b"Hi there"), "longer": list(b"Speculative decoding, greedily.")}
MAX_NEW, ROOM = 20, 128
TREES = ("2x2x1", "3x1x1", "paths:0;1;0.0;1.0;0.0.0;0.1", "1x1x1", "dynamic:2,7,3", "dynamic:3,12,4")


@pytest.fixture(scope="module")
def models():
    return tiny_pair(ROOM)


@pytest.fixture(scope="module")
def references(models):
    return target_references(models[0], PROMPTS, MAX_NEW + 16)


def _decoder(models, tree, head="dense", spec=None, name="short", references=None, **kw):
    target, draft = models
    control = None
    if spec is not None:
        control = AcceptanceControl(spec, 512, ROOM, torch.device("cpu"), seed=3)
        control.bind(references[name], len(PROMPTS[name]), name)
    shape = parse_tree(tree)
    return Decoder(target, draft, tiny_head(draft, head), K=3, graphs=False, control=control, tree=shape, **kw)


# the real draft (spec None) and acceptance control, with dense and FlashHead (its real draft: static trees)
CASES = [
    (t, h, a) for t in TREES for h in ("dense", "flashhead") for a in (None, "a=0.5") if "x" in t or h == "dense" or a
]


@pytest.mark.parametrize("tree, head, spec", CASES)
def test_tree_output_equals_target_greedy(models, references, tree, head, spec):
    for name in ("longer",) if spec else ("short",):
        ids = PROMPTS[name]
        dec = _decoder(models, tree, head, spec, name, references)
        for schedule in TREE_SCHEDULES:
            g = dec.generate(ids, MAX_NEW, schedule)
            assert g.tokens == references[name][:MAX_NEW], (tree, schedule, name)
            assert all(r.accepted <= dec.K == parse_tree(tree).depth for r in g.rounds)


def test_shortlist_tree_equals_target_greedy(models, references):
    dec = _decoder(models, "2x2x1", "shortlist", "a=0.6", "longer", references)
    for schedule in TREE_SCHEDULES:
        assert dec.generate(PROMPTS["longer"], MAX_NEW, schedule).tokens == references["longer"][:MAX_NEW]


def test_a_wider_tree_accepts_more_under_control(models, references):
    """Rank r holds the target's token with its own i.i.d. bit: 3 siblings accept more than 1."""
    accepted = {}
    for tree in ("1x1x1", "3x3x1"):
        dec = _decoder(models, tree, "dense", "a=0.4", "longer", references)
        accepted[tree] = sum(r.accepted for r in dec.generate(PROMPTS["longer"], MAX_NEW + 10, "deferred").rounds)
    assert accepted["3x3x1"] > accepted["1x1x1"]


def test_a_dynamic_tree_verifies_its_best_nodes_parents_first(models, references):
    """After a round the tables describe a tree of N nodes, parents first, whose depths and ancestor
    words agree; a 1-wide dynamic tree drafts the chain's rounds."""
    dec = _decoder(models, "dynamic:3,9,4", "dense", "a=0.5", "longer", references)
    dec.generate(PROMPTS["longer"], 6, "deferred")
    trees = dec.trees
    parents = [-1 if root else int(p) for p, root in zip(trees.parents, trees.from_root)]
    assert all(p < i for i, p in enumerate(parents))
    assert trees.depths.tolist() == list(node_depths(parents))
    assert trees.verify_bits[1:10].tolist() == tree_rounds.ancestor_bits(tuple(parents))
    rounds = {}
    for tree in ("chain", "dynamic:1,3,3"):
        generated = _decoder(models, tree, "dense", None, "longer", references).generate(
            PROMPTS["longer"], MAX_NEW, "deferred"
        )
        rounds[tree] = [(r.accepted, r.emitted) for r in generated.rounds]
    assert rounds["chain"] == rounds["dynamic:1,3,3"]


@pytest.mark.parametrize("schedule", TREE_SCHEDULES)
def test_a_one_wide_tree_is_the_chain_token_for_token_and_round_for_round(models, references, schedule):
    def run(tree, events):
        dec = _decoder(models, tree, "flashhead", "a=0.5", "longer", references, events=events)
        return dec.generate(PROMPTS["longer"], MAX_NEW, schedule), dec

    chain_events, tree_events = [], []
    chain, chain_dec = run("chain", chain_events)
    tree, tree_dec = run("1x1x1", tree_events)
    assert tree.tokens == chain.tokens
    assert [(r.proposed, r.accepted, r.emitted, r.verify_skipped) for r in tree.rounds] == [
        (r.proposed, r.accepted, r.emitted, r.verify_skipped) for r in chain.rounds
    ]
    if schedule in ("ordinary", "pipelined"):
        assert tree_events == chain_events
    else:  # a deferred chain's first step feeds f alone where the draft fed prev (Decoder.missed); the root re-feeds it
        assert len(tree_events) == len(chain_events)
        firsts = [i for i, e in enumerate(chain_events) if e != tree_events[i]]
        assert firsts and all(chain_events[i] == ("draft_step", "draft", 1) for i in firsts)
        assert all(tree_events[i] == ("draft_step", "draft", 2) for i in firsts)
    keys = ("K", "proposed", "accepted", "emitted", "verify_skipped", "context")
    tree_lines = trace_lines(tree, prompt_id="p", schedule=schedule, head="flashhead", K=3)
    chain_lines = trace_lines(chain, prompt_id="p", schedule=schedule, head="flashhead", K=3)
    assert [{k: x[k] for k in keys} for x in tree_lines] == [{k: x[k] for k in keys} for x in chain_lines]
    assert all(x["tree"] == "1x1x1" and x["nodes"] == 3 for x in tree_lines)


@pytest.mark.parametrize("schedule, verified", [("ordinary", 10), ("deferred", 11)])
def test_a_tree_round_logs_one_draft_step_per_depth_over_its_frontier(models, references, schedule, verified):
    events = []
    dec = _decoder(models, "2x2x1", "dense", "a=0.5", "short", references, events=events)
    g = dec.generate(PROMPTS["short"], MAX_NEW, schedule)
    steps = [e for e in events if e[0] == "draft_step"]
    assert [e[2] for e in steps[:3]] == [2, 2, 4]  # the root as [prev, f], then each depth's nodes with children
    assert len(steps) == 3 * len(g.rounds)
    verifies = {e[2] for e in events if e[0] == "verify"}
    assert verifies == {verified}


def _cache(model, slots: int) -> list[torch.Tensor]:
    return [
        c[:, :, :slots].clone() for layer in model.layers for c in (layer.self_attn.k_cache, layer.self_attn.v_cache)
    ]


def _fresh(spec, seed):
    return load_model(spec, "cpu", seed=seed, max_seq_len=ROOM).model


def _close(got, want) -> bool:
    return all(torch.allclose(a, b, atol=1e-5, rtol=1e-4) for a, b in zip(got, want))


@pytest.mark.parametrize("schedule", TREE_SCHEDULES)
def test_compaction_leaves_exactly_the_accepted_path_in_both_caches(models, references, schedule, monkeypatch):
    """After tree rounds, the slots below the cursor hold what a model that saw only the emitted tokens
    holds (pipelined-deferred: a used look-ahead's path and tokens moved into place too); without the
    compaction they do not (the control)."""

    def caches_after(compacting: bool):
        if not compacting:
            monkeypatch.setattr(tree_rounds, "compact", lambda model, source, destination: None)
        target, draft = _fresh("tiny-qwen3", 1), _fresh("tiny-qwen3-draft", 2)
        control = AcceptanceControl("a=0.8", 512, ROOM, torch.device("cpu"), seed=3)
        control.bind(references["longer"], len(PROMPTS["longer"]), "longer")
        dec = Decoder(
            target, draft, DenseHead(draft.head_weight), graphs=False, control=control, tree=parse_tree("3x2x2")
        )
        g = dec.generate(PROMPTS["longer"], MAX_NEW, schedule)
        monkeypatch.undo()
        assert any(r.accepted >= 2 for r in g.rounds)  # paths that had to move
        assert schedule != "pipelined-deferred" or any(r.lookahead_used for r in g.rounds)  # moved into place
        return g, target, draft

    def seen_alone(spec, seed, tokens, slots):
        model = _fresh(spec, seed)
        model.forward_hidden(torch.tensor([tokens]), torch.arange(len(tokens)))
        return _cache(model, slots)

    g, target, draft = caches_after(True)
    sequence = PROMPTS["longer"] + g.tokens
    committed = len(sequence) - 1  # every emitted token but the last one has its entries in place
    assert _close(_cache(target, committed), seen_alone("tiny-qwen3", 1, sequence[:committed], committed))
    drafted = committed - 1  # the draft gets the last accepted token again with the next round's root
    assert _close(_cache(draft, drafted), seen_alone("tiny-qwen3-draft", 2, sequence[:drafted], drafted))
    g, target, draft = caches_after(False)
    assert not _close(_cache(target, committed), seen_alone("tiny-qwen3", 1, sequence[:committed], committed))


def test_tree_trace_fields_are_checked():
    line = {
        "schema": "specloop.trace/1",
        "prompt_id": "p",
        "round": 0,
        "schedule": "deferred",
        "head": "dense",
        "probes": None,
        "K": 3,
        "proposed": 3,
        "accepted": 2,
        "emitted": 3,
        "verify_skipped": False,
        "context": 10,
        "lookahead_used": None,
    }
    check_trace_line(dict(line, tree="2x2x1", nodes=10))
    check_trace_line(line)
    for bad in (
        {"tree": "2x2x1"},
        {"tree": "2x2", "nodes": 6},
        {"tree": "nonsense", "nodes": 3},
        {"tree": "chain", "nodes": 3},
    ):
        with pytest.raises(UsageError):
            check_trace_line(dict(line, **bad))


PIPELINED_DEFERRED_TREES = ("2x1x1", "2x2x1", "4x2x1x1", "8x1x1x1", "dynamic:4,16,4", "dynamic:2,7,3")


@pytest.mark.parametrize("tree", PIPELINED_DEFERRED_TREES)
def test_pipelined_deferred_trees_equal_target_greedy_with_lookaheads_used_and_wasted(models, references, tree):
    """The look-ahead past the guessed path, used (the next round verifies its chain of depth nodes) and
    wasted, with every head that ranks children; dynamic:4,16,4 never verifies its depth-4 guess here
    (the tiny draft's flat probabilities choose shallower nodes), so it wastes every look-ahead."""
    rounds = []
    for head, name in (("dense", "longer"), ("flashhead", "short"), ("shortlist", "longer")):
        dec = _decoder(models, tree, head, "a=0.8", name, references)
        g = dec.generate(PROMPTS[name], MAX_NEW, "pipelined-deferred")
        assert g.tokens == references[name][:MAX_NEW], (tree, head)
        rounds += g.rounds
    used = [r.lookahead_used for r in rounds]
    assert False in used and (True in used) == (tree != "dynamic:4,16,4")
    after_used = [r.nodes for r, before in zip(rounds[1:], used) if before]
    assert all(nodes == dec.K for nodes in after_used) and after_used == [r.nodes for r in rounds if r.nodes == dec.K]


def test_trees_refuse_what_they_cannot_run(models):
    with pytest.raises(UsageError, match="at most 64"):
        _decoder(models, "dynamic:16,64,6")
    with pytest.raises(UsageError, match=r"pipelined-deferred: .* need 65 draft-cache slots after the root"):
        _decoder(models, "dynamic:8,64,8").generate(PROMPTS["short"], 4, "pipelined-deferred")


def _ancestor_words(parents):
    return torch.tensor(tree_rounds.ancestor_bits(tuple(parents)))


def test_tree_mask_is_the_ancestor_rule():
    parents = parse_tree("2x2x1").parents
    mask = tree_visible(
        torch.arange(20), torch.cat([torch.zeros(1, dtype=torch.long), _ancestor_words(parents)]), torch.tensor([5])
    )
    assert mask[0].tolist() == [True] * 5 + [False] * 15  # the root row: the committed context only
    for node in range(len(parents)):
        row = mask[node + 1, 5:15].nonzero().flatten().tolist()
        chain = []
        while node != -1:
            chain.append(node)
            node = parents[node]
        assert row == sorted(chain)
    # the 64th node's bit is the sign bit of the word
    deep = _ancestor_words(tuple(range(-1, 63)))
    assert deep[-1] == -1 and tree_visible(torch.arange(80), deep[-1:], torch.tensor([10]))[0, 10:74].all()


@pytest.mark.skipif(not triton_support.runs_on(torch.device("cpu")), reason="needs triton's interpreter")
@pytest.mark.parametrize("base", [7, 62])  # the tree inside one slot block, and across two
def test_fused_attention_tree_rule_equals_the_dense_mask(base):
    g = torch.Generator().manual_seed(0)
    n_heads, n_kv, head_dim, slots = 4, 2, 16, 200
    parents = parse_tree("paths:0;1;2;0.0;0.1;1.0;0.0.0;0.1.0").parents
    words = torch.cat([torch.zeros(1, dtype=torch.long), _ancestor_words(parents), torch.zeros(3, dtype=torch.long)])
    n = words.numel()
    pos = base - 1 + torch.arange(n)
    rope = pos.clone()
    q = torch.randn(n, n_heads, head_dim, generator=g)
    k_cache, v_cache = (torch.randn(1, n_kv, slots, head_dim, generator=g) for _ in range(2))
    k_cache[:, :, pos[-1] + 1 :], v_cache[:, :, pos[-1] + 1 :] = float("nan"), float("nan")  # never read
    got = fused_ops.attention(q, k_cache, v_cache, pos, 0.3, tree=(rope, words, torch.tensor([base]))).view(
        n, n_heads, -1
    )
    want = reference_attention(q, k_cache, v_cache, tree_visible(torch.arange(slots), words, torch.tensor([base])), 0.3)
    for head in range(n_heads):
        assert torch.allclose(got[:, head], want[:, head], atol=1e-5)
    broken = (rope, torch.zeros_like(words), torch.tensor([base]))  # the control: no ancestors at all
    assert not torch.allclose(fused_ops.attention(q, k_cache, v_cache, pos, 0.3, tree=broken).view(n, n_heads, -1), got)


def tree_rows_equal_chain_rows(device, dtype, base: int, wrong_key: bool = False) -> bool:
    """Whether each tree node's attention row is bit for bit the row of the same query in a chain whose
    cache holds the node's path at base, base + 1, ... (with `wrong_key`, the control: the chain's
    last path key and value come from a context slot instead, which must not match)."""
    g = torch.Generator().manual_seed(base)
    n_heads, n_kv, head_dim = 16, 2, 64
    parents = parse_tree("paths:0;1;2;0.0;0.1;1.0;0.0.0;0.1.0;0.0.0.0").parents
    words = torch.cat([torch.zeros(1, dtype=torch.long), _ancestor_words(parents)])
    n, slots = words.numel(), base + 80
    pos = (base - 1 + torch.arange(n)).to(device)
    q = torch.randn(n, n_heads, head_dim, generator=g).to(device, dtype)
    k_cache, v_cache = (torch.randn(1, n_kv, slots, head_dim, generator=g).to(device, dtype) for _ in range(2))
    tree = (pos, words.to(device), torch.tensor([base], device=device))
    tree_rows = fused_ops.attention(q, k_cache, v_cache, pos, 0.3, None, tree=tree)
    for node in range(len(parents)):
        path = [base + j for j in range(64) if (int(words[node + 1]) >> j) & 1]
        path = path[:-1] + [base - 2] if wrong_key else path
        chain_k, chain_v = k_cache.clone(), v_cache.clone()
        chain_k[:, :, base : base + len(path)], chain_v[:, :, base : base + len(path)] = (
            k_cache[:, :, path],
            v_cache[:, :, path],
        )
        chain_pos = torch.tensor([base - 1 + len(path)], device=device)
        if not torch.equal(
            tree_rows[node + 1], fused_ops.attention(q[node + 1 : node + 2], chain_k, chain_v, chain_pos, 0.3, None)[0]
        ):
            return False
    return True


@pytest.mark.skipif(not triton_support.runs_on(torch.device("cpu")), reason="needs triton's interpreter")
@pytest.mark.parametrize("base", [7, 62])  # the path inside one slot block, and across two
def test_a_tree_row_is_bit_for_bit_the_chain_row_of_its_path(base):
    assert tree_rows_equal_chain_rows("cpu", torch.float32, base)
    assert not tree_rows_equal_chain_rows("cpu", torch.float32, base, wrong_key=True)


@pytest.mark.skipif(not triton_support.runs_on(torch.device("cpu")), reason="needs triton's interpreter")
def test_fused_tree_forward_matches_the_torch_path():
    """The whole fused layer (rotation at the nodes' positions, cache writes at their slots, the tree
    rule) against the torch path's explicit mask; the root sits at slot 0."""
    reference = load_model("tiny-qwen3", "cpu", "float32", seed=1, max_seq_len=16, kernels="torch").model
    fused = load_model("tiny-qwen3", "cpu", "float32", seed=1, max_seq_len=16, kernels="fused").model
    parents = parse_tree("2x1x1").parents
    words = torch.cat([torch.zeros(1, dtype=torch.long), _ancestor_words(parents)])
    rope = torch.tensor([0] + list(node_depths(parents)))
    tokens = torch.randint(0, 512, (1, words.numel()), generator=torch.Generator().manual_seed(1))
    tree = (rope, words, torch.tensor([1]))
    pos = torch.arange(words.numel())
    want, got = reference.forward_hidden(tokens, pos, tree), fused.forward_hidden(tokens, pos, tree)
    assert (want - got).abs().max() < 1e-4 * want.abs().max()


def test_a_dynamic_round_s_tables_share_one_buffer_and_travel_in_one_copy():
    """With the models on two devices a dynamic tree round's tables go to the target's device as one buffer
    copy (model/dynamic_tree.py): every table must be its own part of that buffer, or the copy would carry
    one table's values into another, or leave one behind."""
    nodes, depth, rows = 7, 3, 9
    built, sent = RoundTables(nodes, depth, rows, "cpu"), RoundTables(nodes, depth, rows, "cpu")
    longs = ("parents", "depths", "draft_slot", "sibling_rank", "path_table", "verify_rope", "verify_bits", "guess")
    for value, name in enumerate(longs, start=10):
        getattr(built, name).fill_(value)
    built.from_root.copy_(torch.tensor([True, False] * 3 + [True]))
    sent.buffer.copy_(built.buffer)
    for value, name in enumerate(longs, start=10):
        assert bool((getattr(sent, name) == value).all()), name
    assert sent.from_root.tolist() == [True, False] * 3 + [True]
    assert sent.path_table.shape == (nodes, depth) and sent.verify_rope.numel() == rows + 1
    assert RoundTables(nodes, depth, rows, "cpu").verify_rope.tolist() == list(range(rows + 1))  # pad rows


def test_trees_on_a_gpu_below_float32_need_the_fused_kernels():
    """The torch path's masked attention is not path-ordered (docs/design.md): refused in one line."""
    tree = parse_tree("2x2x1")
    for dtype in (torch.bfloat16, torch.float16, "bfloat16"):
        with pytest.raises(UsageError, match="needs the fused kernels"):
            tree_rounds.check_tree_precision(tree, "cuda", dtype, "torch")
        tree_rounds.check_tree_precision(tree, "cuda", dtype, "fused")
        tree_rounds.check_tree_precision(tree, "cuda", dtype, None)
    tree_rounds.check_tree_precision(tree, "cuda", torch.float32, "torch")
    tree_rounds.check_tree_precision(tree, "cpu", torch.bfloat16, "torch")
    tree_rounds.check_tree_precision(parse_tree("chain"), "cuda", torch.bfloat16, "torch")
