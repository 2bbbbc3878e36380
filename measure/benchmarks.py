"""The microbenchmarks: every cost the speculative loop pays, timed the way the loop pays it.

Target and draft forwards run through `GraphedCall` exactly as the decoder runs them (a CUDA graph
per shape with graphs on, eager with graphs off), on static caches, with device-side positions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch

from contracts.policies import CATCH_UP_WIDTHS
from contracts.trees import MAX_NODES, ROOT
from model import fused_ops
from model.acceptance_control import AcceptanceControl
from model.decoder import Decoder
from model.early_exit import early_exit
from model.flashhead import Clustering
from model.graphs import GraphedCall
from model.heads import DenseHead, FlashHead
from model.loading import Loaded
from model.prefill import GraphedPrefill, decoding_widths
from model.prompt_lookup import LookupSearch
from model.tree_rounds import ancestor_bits, frontier_inputs, tree_body_forward, tree_verify_forward, verify_tables

from .timing import summarize, time_interleaved, time_op


@dataclass
class Bench:
    """What every benchmark needs: the two models, where they run, and the grid to measure."""

    target: Loaded
    draft: Loaded
    target_device: torch.device
    draft_device: torch.device
    contexts: list[int]
    prompt_lengths: list[int]
    K_max: int
    probes: list[int]
    clustering: Clustering
    reps: int
    warmup: int
    tick: Callable[[str], None]  # progress: called once per measured point
    tree_widths: tuple[int, ...] = ()  # token counts a tree's verify and draft frontier need besides the chain's
    target_contexts: list[int] | None = None  # the target forward's contexts (`split_step_contexts`; default contexts)

    def target_widths(self) -> list[int]:
        return target_widths(self.K_max, self.tree_widths)

    def tokens(self, n: int, device: torch.device, vocab: int, variants: int = 4) -> list[torch.Tensor]:
        g = torch.Generator().manual_seed(n)
        return [torch.randint(0, vocab, (1, n), generator=g).to(device) for _ in range(variants)]

    def time(self, fn, inputs, device, **kw) -> dict:
        return time_op(fn, inputs, device, reps=self.reps, warmup=self.warmup, **kw)

    def time_grid(self, points: list[dict], operations: list[tuple], device, what: str) -> list[dict]:
        """Each point of a grid with its timing, the points' repetitions interleaved
        (measure.timing.time_interleaved); one progress tick per point, named `what` and the point."""
        timings = time_interleaved(operations, device, reps=self.reps, warmup=self.warmup)
        for point in points:
            self.tick(f"{what} " + " ".join(f"{key}={value}" for key, value in point.items()))
        return [{**point, **timing} for point, timing in zip(points, timings, strict=True)]


def target_widths(K_max: int, tree_widths) -> list[int]:
    """Token counts of the target forward: the chain's 1..K_max+2 and every tree width."""
    return sorted(set(range(1, K_max + 3)) | set(tree_widths))


def verify_widths(K_max: int, tree_widths) -> list[int]:
    """Token counts of the sampling verify tables: the chain's K + 1 for K = 0..K_max and every tree
    width, so that a tree's verify (node count + 1) is read where it was timed."""
    return sorted(set(range(1, K_max + 2)) | set(tree_widths))


def decode_K(K_max: int, tree_widths) -> int:
    """The K of the decoder the target forwards are timed in: its fixed width covers K_max + 2 tokens
    and every tree width (the decoder's width grows to a tree's node count + 1)."""
    return max(K_max + 1, max(tree_widths, default=0) - 1)


# Contexts either side of a split step at which the target forward is timed besides the profile's own.
STEP_MARGIN = 8


def split_step_contexts(contexts: list[int], model, rows: int) -> list[int]:
    """The target forward's contexts: `contexts` and, where its decode attention runs in splits (the fused
    kernels, fused_ops.split_starts), a point STEP_MARGIN either side of each split step inside their range.
    A fixed-width forward of `rows` rows at context c reaches a new split where c + rows passes its start, and
    its cost steps up there: on one H200 the 32B AWQ verify (512 slots, 16 rows) took 10.43 ms at
    context 3,057 and 10.64 at 3,058, flat within a split count and rising within the next, which a line
    between contexts 2,048 and 3,072 missed by up to 3% (session 16). Around each step the profile's
    linear interpolation is then a step too."""
    slots = getattr(model, "attention_split_slots", None)
    if getattr(model, "kernels", None) != "fused" or not slots or rows > fused_ops.SPLIT_MAX_TOKENS:
        return sorted(set(contexts))
    low, high = min(contexts), max(contexts)
    points = set(contexts)
    for boundary in fused_ops.split_starts(slots, high + rows + 1)[1:]:
        first = boundary - rows + 1  # the first context whose forward reaches slot `boundary`
        points |= {c for c in (first - STEP_MARGIN, first + STEP_MARGIN - 1) if low <= c <= high}
    return sorted(points)


def _positions(start: int, n: int, device: torch.device) -> torch.Tensor:
    return torch.arange(start, start + n, device=device)


def target_costs(b: Bench, graphs: bool) -> dict:
    """Target decode forward (new tokens -> greedy tokens, the dense head included) for n = 1..K_max+2
    and every tree width at each context, run by the decoder's own step (graphs, fixed width); prefill
    for each prompt length, eager, as the decoder runs it."""
    model = b.target.model
    step = Decoder(model, K=decode_K(b.K_max, b.tree_widths), graphs=graphs).target_forward
    vocab = model.config.vocab_size
    points, operations = [], []
    for n in b.target_widths():
        for context in b.target_contexts or b.contexts:
            start = torch.tensor([context], device=b.target_device)
            points.append({"n_tokens": n, "context": context})
            operations.append((step, [(t, start) for t in b.tokens(n, b.target_device, vocab)]))
    forward = b.time_grid(points, operations, b.target_device, "target forward")
    return {
        "forward_ms": {"points": forward},
        "prefill_ms": {"points": _prefill(b, b.target, b.target_device, _target_prefill(model))},
    }


def _prefill(b: Bench, loaded: Loaded, device: torch.device, prefill: Callable) -> list[dict]:
    """`prefill(tokens [1, P])` timed at each prompt length, run as the decoder runs it."""
    points = []
    for length in b.prompt_lengths:
        inputs = [(t,) for t in b.tokens(length, device, loaded.model.config.vocab_size, 2)]
        points.append({"prompt_len": length, **b.time(prefill, inputs, device)})
        b.tick(f"{loaded.info['name']} prefill {length}")
    return points


def _target_prefill(model) -> Callable:
    """The target's prefill, eager as in the decoder, with its last token's greedy choice: the first token
    (on a 262k vocabulary the choice alone costs 60 ms on a CPU)."""
    head = DenseHead(model.head_weight)

    def prefill(tokens):
        hidden = model.forward_hidden(tokens, _positions(0, tokens.shape[1], tokens.device))
        return head.argmax(hidden[0, -1:])

    return prefill


def draft_costs(b: Bench, graphs: bool) -> dict:
    """Draft body step over 1 and 2 new tokens, every catch-up width and every tree width (a tree's
    frontier), at each context (a table over n_tokens and context: `Decoder.propose` feeds [prev, f] or f
    to its first step (`Decoder.missed`), every later step one token, a drafter back from idle rounds its
    catch-up, or a tree's frontier), its dense and
    FlashHead heads (per probe count), prefill, and the KV crop (a cursor move on our static caches)."""
    model, device = b.draft.model, b.draft_device
    vocab, hidden = model.config.vocab_size, model.config.hidden_size
    body = GraphedCall(model.forward_hidden, enabled=graphs)
    body_points = _body_grid(b, body, draft_body_widths(b.tree_widths), device, vocab, "draft body")
    states = [
        (torch.randn(1, 1, hidden, generator=torch.Generator().manual_seed(i)).to(device, model.head_weight.dtype),)
        for i in range(4)
    ]
    dense = DenseHead(model.head_weight)
    dense_ms = b.time(GraphedCall(dense.argmax, enabled=graphs), states, device)
    b.tick("draft dense head")
    flash = []
    for p in b.probes:
        head = FlashHead(model.head_weight, b.clustering, probes=p)
        flash.append({"probes": p, **b.time(GraphedCall(head.argmax, enabled=graphs), states, device)})
        b.tick(f"draft FlashHead p={p}")
    cursor = torch.zeros(3, dtype=torch.long, device=device)
    moves = [(torch.full((3,), i, dtype=torch.long, device=device),) for i in range(4)]
    crop = b.time(cursor.copy_, moves, device)
    return {
        "body_ms": {"points": body_points},
        "head_dense_ms": dense_ms,
        "head_flashhead_ms": {"points": flash},
        "append_ms": {
            k: v for k, v in body_points[0].items() if k not in ("n_tokens", "context")
        },  # one 1-token body step
        "prefill_ms": {
            "points": _prefill(b, b.draft, device, GraphedPrefill(model, device, decoding_widths(device, graphs)))
        },
        "kv_crop_ms": crop,
    }


CHAIN_BODY_WIDTHS = sorted({1, 2, *CATCH_UP_WIDTHS})  # a drafter body: [prev, f], one token, a catch-up


def draft_body_widths(tree_widths) -> list[int]:
    """Token counts of the draft model's body: a chain's and every tree width (a tree's frontier)."""
    return sorted(set(CHAIN_BODY_WIDTHS) | set(tree_widths))


def _body_grid(b: Bench, body, widths: list[int], device: torch.device, vocab: int, what: str) -> list[dict]:
    """A draft body's forward over each of `widths` new tokens at each context, interleaved."""
    points = [{"n_tokens": n, "context": c} for c in b.contexts for n in widths]
    operations = [
        (body, [(t, _positions(p["context"], p["n_tokens"], device)) for t in b.tokens(p["n_tokens"], device, vocab)])
        for p in points
    ]
    return b.time_grid(points, operations, device, what)


def tree_body_widths(tree_widths) -> list[int]:
    """Frontier widths a tree's draft forward can have: 1..MAX_NODES nodes (one ancestor bit each)."""
    return sorted(n for n in set(tree_widths) if n <= MAX_NODES)


def tree_costs(b: Bench, graphs: bool) -> tuple[dict, dict]:
    """(target costs, draft costs) under the tree rule, as a tree decoder runs them (model/tree_rounds.py):
    its target forward over [f, n - 1 nodes] at every target width and context (n = 1, no node, is its
    append: a tree decoder runs every target forward so), and the draft body over a frontier of n nodes at
    every tree width. On a GPU the rule is the fused kernel's path-ordered attention, not the chain's
    split-KV one; on the CPU the same masked attention as the causal rule. A star tree of the size stands
    for every tree of it: the rule reads every node's slot, the shape only sets which of them count."""
    target, draft = b.target.model, b.draft.model
    decoder = Decoder(target, K=decode_K(b.K_max, b.tree_widths), graphs=graphs)
    points, operations = [], []
    for n in b.target_widths():
        star = (ROOT,) * (n - 1)
        rope, bits = verify_tables(star, decoder.rows or n, b.target_device)
        step = GraphedCall(partial(tree_verify_forward, decoder, n - 1), enabled=graphs)
        for context in b.contexts:
            start = torch.tensor([context], device=b.target_device)
            points.append({"n_tokens": n, "context": context})
            operations.append(
                (step, [(t, start, rope, bits) for t in b.tokens(n, b.target_device, target.config.vocab_size)])
            )
    verify = b.time_grid(points, operations, b.target_device, "target tree forward")
    step = GraphedCall(partial(tree_body_forward, draft), enabled=graphs)
    points, operations = [], []
    for n in tree_body_widths(b.tree_widths):
        fed = torch.arange(n, device=b.draft_device)
        depths = torch.ones(n, dtype=torch.long, device=b.draft_device)
        bits = torch.tensor(ancestor_bits((ROOT,) * n), device=b.draft_device)
        for context in b.contexts:
            p = torch.tensor([context], device=b.draft_device)
            points.append({"n_tokens": n, "context": context})
            operations.append(
                (
                    step,
                    [
                        frontier_inputs(t[0], fed, p, depths, bits)
                        for t in b.tokens(n, b.draft_device, draft.config.vocab_size)
                    ],
                )
            )
    body = b.time_grid(points, operations, b.draft_device, "draft tree body")
    return {"tree_forward_ms": {"points": verify}}, {"tree_body_ms": {"points": body}}


def drafter_costs(b: Bench, graphs: bool, settings) -> dict:
    """The other drafters' costs, on the target's device where they run: prompt lookup's search over
    the prompt and output buffer (as the decoder runs it, model/prompt_lookup.LookupSearch: the
    gathering copy and the search, a graph with graphs on) at each context, for K_max proposals, the
    contexts interleaved as every grid's points are (the gathering copy is bound by the host); and
    with `settings.early_exit_layers` the early-exit draft's body over 1 and 2 new tokens at each
    context and the target's dense head."""
    model, device = b.target.model, b.target_device
    vocab = model.config.vocab_size
    search = LookupSearch(model.max_seq_len, b.K_max, device, settings.lookup_ngram, graphs)
    operations = []
    for context in b.contexts:
        length = torch.tensor([context], device=device)
        inputs = [
            (t[0, : context // 2], t[0, context // 2 :], length, b.K_max, length - 1)
            for t in b.tokens(context + b.K_max + 2, device, vocab)
        ]
        operations.append((search, inputs))
    points = b.time_grid([{"context": context} for context in b.contexts], operations, device, "prompt lookup")
    costs = {"lookup_ms": {"points": points}}
    if settings.early_exit_layers is None:
        return costs
    early = early_exit(model, settings.early_exit_layers)
    early.setup_cache(model.max_seq_len, device)
    body = GraphedCall(early.forward_hidden, enabled=graphs)
    body_points = _body_grid(b, body, CHAIN_BODY_WIDTHS, device, vocab, "early-exit body")
    hidden = model.config.hidden_size
    states = [
        (torch.randn(1, 1, hidden, generator=torch.Generator().manual_seed(i)).to(device, model.head_weight.dtype),)
        for i in range(4)
    ]
    head = b.time(GraphedCall(DenseHead(model.head_weight).argmax, enabled=graphs), states, device)
    b.tick("early-exit head")
    return {**costs, "early_exit_body_ms": {"points": body_points}, "early_exit_head_ms": head}


def host_costs(b: Bench) -> dict:
    """Reading a scalar to the host, the cross-device token copy, and an event wait."""
    td, dd = b.target_device, b.draft_device
    values = [(torch.tensor([i], device=td),) for i in range(4)]
    item = b.time(lambda t: t.item(), values, td)
    tokens = [(torch.tensor([[i]], device=dd),) for i in range(4)]
    copy = b.time(lambda t: t.to(td, non_blocking=True), tokens, td, also_sync=[dd] if dd != td else [])
    event = b.time(_record_and_wait, [(td,)], td)
    b.tick("host costs")
    return {"item_ms": item, "copy_token_ms": copy, "event_sync_ms": event}


def _record_and_wait(device: torch.device) -> None:
    if device.type == "cuda":
        done = torch.cuda.Event()
        done.record(torch.cuda.current_stream(device))
        done.synchronize()


def copy_bandwidth_gbs(device: torch.device, gib: float = 2.0) -> float | None:
    """Device-memory bandwidth (bytes read + written per second) of one large copy: the floor's rate."""
    if device.type != "cuda":
        return None
    n = int(gib * 2**30) // 2
    src = torch.randn(n, dtype=torch.bfloat16, device=device)
    dst = torch.empty_like(src)
    result = time_op(lambda: dst.copy_(src), [()], device, reps=10, warmup=2)
    return 2 * src.numel() * 2 / (result["median_ms"] / 1e3) / 1e9


BOOKKEEPING_NEW_TOKENS = 48


def round_host_costs(b: Bench, prompt) -> tuple[dict, dict]:
    """From a short real deferred run (acceptance-controlled at 0.5, K = min(6, K_max)), the decoder's
    own host costs as its loop pays them: (per round, the host time outside the device phases and the
    read; per read, the host's time from the read's end to its next launch)."""
    K, new_tokens = min(6, b.K_max), BOOKKEEPING_NEW_TOKENS
    ids = b.target.tokenizer.encode(prompt.text)[: min(b.prompt_lengths)]
    control = AcceptanceControl("a=0.5", b.draft.model.config.vocab_size, b.draft.model.max_seq_len, b.draft_device)
    decoder = Decoder(
        b.target.model,
        b.draft.model,
        DenseHead(b.draft.model.head_weight),
        K=K,
        graphs=b.target_device.type == "cuda",
        control=control,
    )
    control.bind(decoder.reference(ids, new_tokens), len(ids), prompt.id)
    others, gaps = [], []
    for _ in range(3):  # the first run warms up
        generation = decoder.generate(ids, new_tokens, "deferred")
        others = [r.phases_ms["other"] for r in generation.rounds if r.phases_ms] or others
        gaps = [r.host_gap_ms / r.host_gaps for r in generation.rounds if r.host_gaps] or gaps
    return summarize(others, others), summarize(gaps or [0.0], gaps or [0.0])
