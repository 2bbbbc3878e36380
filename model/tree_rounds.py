"""Token-tree rounds of the speculative decoder (docs/design.md, "Token trees").

A tree round drafts a static tree (contracts.trees: top-k per depth, or a list of paths) with one
draft forward per depth over the whole frontier, verifies every node in one target forward with tree
attention, accepts the longest root-to-node path that the target's greedy choices agree with (when
sampling, the path that multi-branch rejection accepts: docs/design.md, "Token trees"), and
compacts the accepted path's key-value entries into place in both caches.

Cache layout of a round whose root token f sits at position (and slot) p: node i (breadth-first)
is written at slot p + 1 + i, rotated at position p + depth(i), and attends to the slots <= p and
to its ancestors' slots and its own (one 64-bit word per node, `ancestor_bits`). After the verify,
the accepted path's entries move from slots p + 1 + node to slots p + 1, p + 2, ...: the caches
then hold what a chain round that drafted exactly the accepted tokens would have left. Rejected
branches need no trimming beyond that: the cursor moves to p + a + 1 and every slot above it is
masked until it is written again.

Everything here runs on the device with fixed shapes (graph-capturable); the host learns the
accepted length only at the round's read, as in chain rounds.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F

from contracts import UsageError
from contracts.trees import MAX_NODES, ROOT, TreeShape, ancestors, check_lookahead, guessed_leaf, node_depths
from model import sampling
from model.graphs import GraphedCall
from model.heads import DenseHead, FlashHead, ShortlistHead, heads_by_position
from model.tree_lookahead import TreeLookahead

TREE_HEADS = ("dense", "flashhead", "shortlist")  # the heads that rank a node's children
SLOT_AXIS = 4  # of Transformer.kv_caches [layers, K/V, 1, kv heads, slots, head_dim]


def check_tree(tree: TreeShape, schedules=(), head_kind: str = "dense", alone: bool = True, option: str = "--tree"):
    """One line for every combination a tree cannot run with, before any work starts. `head_kind`: the
    draft head's kind (contracts.heads); `alone`: the draft model drafts alone (no policy, no tpN);
    `option`: the command line option that named the tree."""
    if tree.kind == "chain":
        return
    label = f"{option} {tree.label}"
    if tree.kind == "dynamic" and (tree.depth_budget - 1) * tree.top_m > MAX_NODES:  # one ancestor word each
        raise UsageError(f"{label}: a dynamic tree feeds (D - 1) x M nodes to the draft, at most {MAX_NODES}")
    if "pipelined-deferred" in schedules:
        check_lookahead(tree, option)
    if not alone:
        raise UsageError(f"{label}: trees run with the draft model on one or two devices (no policy, drafter or tpN)")
    if head_kind not in TREE_HEADS:
        raise UsageError(f"{label}: trees rank children with {', '.join(TREE_HEADS)} heads, not {head_kind}")


def check_tree_precision(tree: TreeShape, device_type: str, dtype, kernels: str | None) -> None:
    """Trees on a GPU below float32 need the fused attention kernel. It reads a node's keys in path
    order, so a tree row sums exactly a chain row's terms in the chain's order; the torch path's masked
    attention sums them at other slots, and in bfloat16 that flipped near-tied argmaxes of a synthetic
    32B AWQ target within 9-32 tokens on an H200 (docs/design.md, "Token trees"). `kernels` None: not
    known yet (the decoder checks again)."""
    low_precision = device_type == "cuda" and dtype not in (torch.float32, "float32")
    if tree.kind != "chain" and low_precision and kernels not in (None, "fused"):
        raise UsageError(
            f"--tree {tree.label} on a GPU in bfloat16 or float16 needs the fused kernels (a Qwen3 or Llama target "
            "with --kernels fused), whose attention reads a node's keys in a chain's order; or use --dtype float32"
        )


def head_kind(draft_head) -> str:
    """The contracts.heads kind of a draft head object (a router anywhere makes it a router)."""
    kinds = {DenseHead: "dense", FlashHead: "flashhead", ShortlistHead: "shortlist"}
    found = [kinds.get(type(head), "router") for head in heads_by_position(draft_head)] if draft_head else []
    return "router" if "router" in found else (found[0] if found else "dense")


def top_children(head, hidden: torch.Tensor, k: int) -> torch.Tensor:
    """The head's k best tokens [n, k] for hidden states [n, d], best first. k = 1 is the head's own
    argmax (so a 1-wide tree drafts exactly the chain's tokens); k > 1 ranks the tokens the head
    scores (all for dense, the probed clusters for FlashHead, the shortlist's rows)."""
    if k == 1:
        return head.argmax(hidden).view(-1, 1)
    if isinstance(head, ShortlistHead):
        scores = F.linear(hidden.to(head.weight.dtype), head.weight[head.tokens])
        return head.tokens[scores.topk(k, dim=-1).indices]
    return head.logits(hidden).topk(k, dim=-1).indices


@dataclass
class _Depth:
    """One draft forward of a round: the nodes fed (None: the root, fed as [prev, f]) and where each
    new node's token comes from (row of the forward, sibling rank)."""

    fed: torch.Tensor | None
    children: torch.Tensor  # node indices created at this depth
    rows: torch.Tensor  # for each, the row of its parent among the fed
    ranks: torch.Tensor
    top_k: int


def ancestor_bits(parents: tuple[int, ...]) -> list[int]:
    """Per node, the bitmask of its ancestors and itself (bit j: node j), as signed 64-bit values."""
    words = []
    for node in range(len(parents)):
        word = sum(1 << j for j in ancestors(parents, node))
        words.append(word - (1 << 64) if word >= 1 << 63 else word)
    return words


def verify_tables(parents: tuple[int, ...], rows: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row r of a tree verify [f, nodes, pads] (`rows` + 1 of them): its rotation offset from p
    (f 0, a node its depth) and its ancestor word (0: a causal row)."""
    nodes = len(parents)
    rope = torch.arange(rows + 1, device=device)
    rope[1 : nodes + 1] = torch.tensor(node_depths(parents), dtype=torch.long, device=device)
    bits = torch.zeros(rows + 1, dtype=torch.long, device=device)
    bits[1 : nodes + 1] = torch.tensor(ancestor_bits(parents), dtype=torch.long, device=device)
    return rope, bits


def tree_verify_forward(dec, nodes: int, tokens, start, rope, bits) -> torch.Tensor:
    """The target of decoder `dec` over tokens [1, n] at slots start.. (padded to its fixed width) with
    tree attention (`verify_tables` rows; n = `nodes` + 1 starts at f, n = `nodes` at the first node)
    -> its argmax after each real row [n] (its distributions [n, V] when sampling)."""
    n = tokens.shape[1]
    if dec.rows:
        tokens = F.pad(tokens, (0, dec.rows - n))
    width = tokens.shape[1]
    slots = start + dec.positions[:width]
    base = (start + 1 if n == nodes + 1 else start).view(1)  # the first node's slot
    hidden = dec.target.forward_hidden(tokens, slots, (base - 1 + rope[:width], bits[:width], base))
    return dec._pick(hidden[0, :n])


def tree_body_forward(model, tokens, slots, rope, bits, base) -> torch.Tensor:
    """A draft body over frontier nodes [1, w] at their slots, with tree attention -> hidden [w, d]."""
    return model.forward_hidden(tokens, slots, (rope, bits, base))[0]


def frontier_inputs(tokens, fed, p, depths, bits) -> tuple:
    """`tree_body_forward`'s inputs for the nodes `fed` (tokens [w]) of a round rooted at slot p, given
    every node's depth and ancestor word."""
    return tokens.view(1, -1), p + 1 + fed, p + depths[fed], bits[fed], p + 1


class TreeRounds:
    """A decoder's static tree: the device tables, the draft forwards per depth, the tree verify and
    the accept-and-compact step. `dec` is the model.decoder.Decoder that owns it."""

    def __init__(self, dec, tree: TreeShape, graphs: bool):
        self.dec, self.tree = dec, tree
        self.nodes, self.depth = tree.node_count, tree.depth
        parents, depths = tree.parents, node_depths(tree.parents)
        target, draft = dec.target_device, dec.draft_device
        bits = ancestor_bits(parents)
        self.parents = torch.tensor([max(p, 0) for p in parents], device=target)
        self.from_root = torch.tensor([p == ROOT for p in parents], device=target)
        self.depths = torch.tensor(depths, device=target)
        self.verify_rope, self.verify_bits = verify_tables(parents, dec.rows or self.nodes + 1, target)
        # per node, its ancestors at depths 1..D (itself last); padded with the node itself
        table = [list(ancestors(parents, i)) for i in range(self.nodes)]
        self.path_table = torch.tensor([row + [row[-1]] * (self.depth - len(row)) for row in table], device=target)
        self.steps = torch.arange(self.depth, device=target)
        self.draft_slot = torch.arange(self.nodes, device=target)  # node -> its slot offset in the draft's cache
        self.node_ids = torch.arange(self.nodes, device=target)
        self.sibling_rank = torch.tensor(tree.ranks, device=target)  # sampling: which accept number a node reads
        self.widest = max(tree.ranks) + 1
        self.guess = guessed_leaf(tree)  # pipelined-deferred: the node whose path the look-ahead guesses
        self.capturing = False
        self.bits_on_draft = torch.tensor(bits, device=draft)
        self.depths_on_draft = torch.tensor(depths, device=draft)
        self.levels = []
        for level in range(1, self.depth + 1):
            fed = sorted({p for p, d in zip(parents, depths) if d == level and p != ROOT})
            children = [i for i, d in enumerate(depths) if d == level]
            row_of = {node: row for row, node in enumerate(fed)}
            self.levels.append(
                _Depth(
                    None if level == 1 else torch.tensor(fed, device=draft),
                    torch.tensor(children, device=draft),
                    torch.tensor([row_of.get(parents[i], 0) for i in children], device=draft),
                    torch.tensor([tree.ranks[i] for i in children], device=draft),
                    max(tree.ranks[i] for i in children) + 1,
                )
            )
        heads = heads_by_position(dec.draft_head)
        self._tree_body = GraphedCall(self._tree_body_fn, enabled=graphs)
        self._children = [
            GraphedCall(partial(self._children_fn, head=heads[min(i, len(heads) - 1)], k=level.top_k), enabled=graphs)
            for i, level in enumerate(self.levels)
        ]
        self._verify = GraphedCall(self._verify_fn, enabled=graphs)
        self.ahead = TreeLookahead(self, tree)

    # --- graph-captured functions ---------------------------------------------------------------
    def _tree_body_fn(self, tokens, slots, rope, bits, base):
        return tree_body_forward(self.dec.draft, tokens, slots, rope, bits, base)

    def _children_fn(self, hidden, pos, head, k):
        """Top-k children [w, k] of each fed node; acceptance control replaces them (real cost kept)."""
        children = top_children(head, hidden, k)
        control = self.dec.control
        return children if control is None else control.propose_children(children, pos)

    def _verify_fn(self, tokens, start, rope, bits):
        return tree_verify_forward(self.dec, self.nodes, tokens, start, rope, bits)

    def capture(self) -> None:
        """Every graph a round uses, with dummy inputs (their cache writes are rewritten before read)."""
        dec = self.dec
        self.capturing = True
        self._draft(torch.tensor([0, 0, 1], device=dec.draft_device))
        start = torch.zeros(1, dtype=torch.long, device=dec.target_device)
        for n in (self.nodes, self.nodes + 1):
            self.verify(torch.zeros(n, dtype=torch.long, device=dec.target_device), start + 1)
        self.ahead.capture()
        self.capturing = False

    def _step(self, phase: str, tokens: int):
        """A draft forward's event and phase (neither while capturing graphs)."""
        if self.capturing:
            return nullcontext()
        stream = self.dec.steppers["draft-model"][3]
        if phase == "draft_body":
            self.dec._event("draft_step", stream, tokens)
        return self.dec.clock.phase(phase, self.dec.draft_device)

    def _frontier(self, tokens: torch.Tensor, fed: torch.Tensor, p: torch.Tensor) -> tuple:
        return frontier_inputs(tokens, fed, p, self.depths_on_draft, self.bits_on_draft)

    # --- a round ----------------------------------------------------------------------------------
    def propose(self, run):
        """One draft forward per depth: the root as [prev, f], then each depth's frontier nodes with
        tree attention; every fed row ranks its children. Returns the node tokens [N] (draft device)."""
        return self._draft(run.draft_cursor)

    def _draft(self, cursor: torch.Tensor) -> torch.Tensor:
        dec = self.dec
        device = dec.draft_device
        body = dec.steppers["draft-model"][0]
        tokens = torch.empty(self.nodes, dtype=torch.long, device=device)
        p = cursor[2:3]
        for depth, level in enumerate(self.levels, start=1):
            if level.fed is None:
                with self._step("draft_body", 2):
                    hidden, _ = body(cursor[:2].view(1, 2), p - 1)
            else:
                with self._step("draft_body", level.fed.numel()):
                    hidden = self._tree_body(*self._frontier(tokens[level.fed], level.fed, p))
            with self._step("draft_head", 0):
                children = self._children[depth - 1](hidden, p + depth)
            tokens[level.children] = children[level.rows, level.ranks]
        return tokens

    def first_accepted(self, run, nodes: torch.Tensor) -> torch.Tensor:
        """The ordinary schedules' skip test: whether any depth-1 node equals the pending t* (sampling:
        whether the root accepts a child against the append's distribution p_1, with exactly the
        numbers and arithmetic that `settle` repeats, so a skipped verify is a round that accepts nothing)."""
        if self.dec.sampling.greedy:
            return ((nodes == run.pending) & self.from_root).any().view(1)
        parent_probs = run.pending.expand(self.nodes, -1)
        return (self._accepted_children(parent_probs, nodes, run.cursor[2:3]) & self.from_root).any().view(1)

    def _parent_rows(self) -> torch.Tensor:
        """Per node, its parent's row of [f, nodes]: 0 for the root's children."""
        return torch.where(self.from_root, 0, self.parents + 1)

    def _accepted_children(self, parent_probs: torch.Tensor, nodes: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
        """Multi-branch rejection at every node at once (docs/design.md, "Token trees"): with p = its
        parent's distribution (parent_probs [N, V]), a parent tries its children by rank, accepting child
        c with probability p(c) over the mass its rejected elder siblings left, u * (1 - their mass) < p(c).
        Returns, per node, whether it is the child its parent accepts (the first that passes)."""
        mass = parent_probs.gather(1, nodes[:, None])[:, 0]
        row = self._parent_rows()
        elder = (row[None, :] == row[:, None]) & (self.node_ids[None, :] < self.node_ids[:, None])
        left = (1 - (elder * mass[None, :]).sum(1)).clamp(min=0)
        passes = (self._accept_numbers(p) * left < mass) & (mass > 0)
        return passes & ~(elder & passes[None, :]).any(1)

    def _accept_numbers(self, p: torch.Tensor) -> torch.Tensor:
        """Each node's accept number [N]: keyed at its position p + depth with its sibling rank as the
        token id, so siblings read independent numbers and a position's numbers decide only that position;
        acceptance control replaces them (after computing them: the cost stays) by 0 at its hit rank, +inf elsewhere."""
        dec = self.dec
        table = dec.noise_on_target.uniforms(dec.seed_on_target, p + 1 + self.steps, sampling.ACCEPT, self.widest)
        numbers = table[self.depths - 1, self.sibling_rank]
        return numbers if dec.control is None else dec.control.tree_accept_numbers(p + self.depths, self.sibling_rank)

    def _bonus(self, preds: torch.Tensor, nodes: torch.Tensor, a: torch.Tensor, last: torch.Tensor, p) -> torch.Tensor:
        """The sampled final token: drawn (the round's race noise) from the last good node's distribution
        with its children's tokens removed, all of them rejected (a leaf removes none); from the
        distribution itself where nothing is left, which only rounding makes happen."""
        row = torch.where(a > 0, last + 1, 0)
        probs = preds.index_select(0, row)[0]
        children = (self._parent_rows() == row).float()
        removed = torch.zeros_like(probs).index_add_(0, nodes, children) > 0
        residual = probs.masked_fill(removed, 0.0)
        residual = torch.where(residual.sum() > 0, residual, probs)
        return sampling.race(residual, self.dec._race_noise(p)).view(1)

    def send_tables(self, tokens: torch.Tensor) -> None:
        """A static tree's tables are fixed on both devices: none travel with its node tokens (a dynamic
        tree's do, model/dynamic_tree.py)."""

    def verify(self, tokens: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
        """The tree verify: [f, nodes] at p (deferred) or the nodes at p + 1 (ordinary)."""
        rope, bits = (self.verify_rope, self.verify_bits)
        if tokens.numel() == self.nodes:  # no root row: the rows start at the first node
            rope, bits = rope[1:], bits[1:]
        return self._verify(tokens.view(1, -1), start, rope, bits)

    def settle(self, run, seq: torch.Tensor, preds: torch.Tensor):
        """Accept and emit on the device. seq = [f, nodes], preds [N + 1]: the target's token after f,
        then after each node. A node is good when its token is the target's choice after its parent
        and its parent is good; a = the deepest good node's depth (good nodes form one path: siblings
        differ). Emits the path and the bonus f' = the target's token after its last node, moves the
        cursor to p + a + 1 and compacts the path in the target's cache (the draft's: `to_draft`).
        Sampling: preds [N + 1, V] are the target's distributions; a node is good when its parent is
        good and accepts it (`_accepted_children`), and f' is drawn by `_bonus`."""
        dec = self.dec
        nodes, root_pred, node_preds = seq[1:], preds[:1], preds[1:]
        p = run.cursor[2:3]
        if dec.sampling.greedy:
            match = nodes == torch.where(self.from_root, root_pred, node_preds[self.parents])
        else:
            match = self._accepted_children(preds.index_select(0, self._parent_rows()), nodes, p)
        good = match
        for _ in range(self.depth - 1):
            good = match & (self.from_root | good[self.parents])
        reach = torch.where(good, self.depths, 0)
        a = reach.max().view(1)
        last = reach.argmax().view(1)
        self.guessed = last == self.guess  # pipelined-deferred: the look-ahead's path was accepted
        if dec.sampling.greedy:
            f = torch.where(a > 0, node_preds[last], root_pred)
        else:
            f = self._bonus(preds, nodes, a, last, p)
        path = self.path_table[last][0]  # the last good node's ancestors, itself last (padded)
        block = torch.cat([nodes[path], f]).scatter_(0, a, f)
        run.out.index_copy_(0, run.n + dec.positions[: self.depth + 1], block)
        if dec.eos_id is not None:
            run.eos |= ((block == dec.eos_id) & (dec.positions[: self.depth + 1] <= a)).any(0, keepdim=True)
        run.n += a + 1
        index = len(run.rounds) - 1
        run.accepted[index : index + 1] = a
        moving = self.steps < a
        fed = self.draft_slot[path]
        run.moves = (
            p
            + 1
            + torch.stack(
                [torch.where(moving, path, self.steps), self.steps, torch.where(moving & (fed >= 0), fed, self.steps)]
            )
        )
        compact(dec.target, run.moves[0], run.moves[1])
        run.cursor = torch.cat([torch.cat([seq[:1], nodes[path]]).gather(0, a), f, p + a + 1])
        return a, f

    def to_draft(self, run, moved: torch.Tensor) -> None:
        """The draft's side of the crop: the path's entries move in its cache (`moved`: the copied moves)."""
        compact(self.dec.draft, moved[2], moved[1])

    # --- pipelined-deferred (model/tree_lookahead.py) ----------------------------------------------
    def lookahead(self, run, nodes: torch.Tensor):
        """D + 1 draft steps past the guessed path's leaf, whose token is among the round's nodes [N]."""
        return self.ahead.propose(self.dec, run, nodes[self.guess : self.guess + 1])

    def lookahead_into_place(self) -> None:
        """A used look-ahead: its path and tokens move into place in the draft's cache."""
        compact(self.dec.draft, *self.ahead.moves())

    def chain_moves(self, p: torch.Tensor) -> torch.Tensor:
        """A chain round's cache moves [3, D] (it verified a used look-ahead, in place): none, each
        entry onto itself, so that every round's copy to the draft has one size."""
        return (p + 1 + self.steps).repeat(3, 1)


def compact(model, source: torch.Tensor, destination: torch.Tensor) -> None:
    """Copy every layer's K and V entries from the source slots to the destination slots [D] (read
    first, then written: a source never lies below its destination), in one copy over the model's
    `kv_caches` (model/transformer.py): four launches per layer cost a 64-layer target about 1.8 ms a
    round on an H200."""
    caches = model.kv_caches
    caches.index_copy_(SLOT_AXIS, destination, caches.index_select(SLOT_AXIS, source))
