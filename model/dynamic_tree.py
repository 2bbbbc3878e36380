"""EAGLE-2's dynamic draft tree (`dynamic:M,N,D`, contracts.trees), on the device with fixed shapes.

Each round: the root's forward gives M children; at each further depth the M newest nodes of highest
cumulative draft log-probability are fed (one draft forward, tree attention) and each ranks its top M
children, so there are C = M + (D - 1) M^2 candidates. The N candidates of highest cumulative
log-probability are verified. A child's log-probability is at most 0, so it never ranks above its
parent, and ties are broken by candidate index (parents first): the chosen set holds every chosen
node's parent. Sorted by candidate index, it is in an order where parents come first, which is all
that the static tree's verify, acceptance and compaction need (model/tree_rounds.py); this class
only rebuilds those tables each round.

In the draft's cache the fed nodes of depth d sit at slots p + 1 + (d - 1) M + rank, so at most 64
of them (one ancestor word); the verify lays the chosen nodes out breadth-first as for static trees.
"""

from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F

from contracts.trees import TreeShape
from model.graphs import GraphedCall
from model.heads import ShortlistHead, heads_by_position
from model.tree_lookahead import TreeLookahead
from model.tree_rounds import TreeRounds


def scored_children(head, hidden: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The head's k best tokens [n, k] and their log-probabilities over the tokens it scores."""
    if isinstance(head, ShortlistHead):
        scores = F.linear(hidden.to(head.weight.dtype), head.weight[head.tokens]).float()
        best = scores.log_softmax(-1).topk(k, dim=-1)
        return head.tokens[best.indices], best.values
    best = head.logits(hidden).log_softmax(-1).topk(k, dim=-1)
    return best.indices, best.values


class DynamicTreeRounds(TreeRounds):
    """Tree rounds whose tree the draft's probabilities choose each round (one device only: the
    round's tables are built where the draft runs and read where the target verifies; the decoder
    refuses two, contracts.trees.check_tree_devices)."""

    def __init__(self, dec, tree: TreeShape, graphs: bool):
        M, N, D = tree.top_m, tree.node_budget, tree.depth_budget
        self.dec, self.tree = dec, tree
        self.nodes, self.depth, self.top_m = N, D, M
        device = dec.target_device
        self.candidates = M + (D - 1) * M * M
        self.candidate_depth = torch.tensor([1] * M + [d for d in range(2, D + 1) for _ in range(M * M)], device=device)
        # the round's tables (rebuilt by each proposal; fixed addresses)
        self.parents = torch.zeros(N, dtype=torch.long, device=device)
        self.from_root = torch.zeros(N, dtype=torch.bool, device=device)
        self.depths = torch.zeros(N, dtype=torch.long, device=device)
        self.path_table = torch.zeros(N, D, dtype=torch.long, device=device)
        self.draft_slot = torch.zeros(N, dtype=torch.long, device=device)
        self.node_ids = torch.arange(N, device=device)
        self.sibling_rank = torch.zeros(N, dtype=torch.long, device=device)
        self.widest = M
        rows = dec.rows or N + 1
        self.verify_rope = torch.arange(rows + 1, device=device)
        self.verify_bits = torch.zeros(rows + 1, dtype=torch.long, device=device)
        self.steps = torch.arange(D, device=device)
        self.ranks = torch.arange(M, device=device)
        self.own_bits = torch.ones(N, dtype=torch.long, device=device) << torch.arange(N, device=device)
        self.guess = torch.full((1,), -1, dtype=torch.long, device=device)  # pipelined-deferred (`_guess`)
        self.capturing = False
        heads = heads_by_position(dec.draft_head)
        self._tree_body = GraphedCall(self._tree_body_fn, enabled=graphs)
        self._children = [
            GraphedCall(partial(self._scored_fn, head=heads[min(i, len(heads) - 1)], k=M), enabled=graphs)
            for i in range(D)
        ]
        self._verify = GraphedCall(self._verify_fn, enabled=graphs)
        self.ahead = TreeLookahead(self, tree)

    def _scored_fn(self, hidden, pos, head, k):
        """Top-k children [w, k] and their log-probabilities; acceptance control replaces the tokens."""
        tokens, logp = scored_children(head, hidden, k)
        control = self.dec.control
        return (tokens if control is None else control.propose_children(tokens, pos)), logp

    def _draft(self, cursor: torch.Tensor) -> torch.Tensor:
        M, D, device = self.top_m, self.depth, self.dec.draft_device
        p = cursor[2:3]
        token = torch.zeros(self.candidates, dtype=torch.long, device=device)
        score = torch.zeros(self.candidates, device=device)
        parent = torch.full((self.candidates,), -1, dtype=torch.long, device=device)
        fed_slot = torch.full((self.candidates,), -1, dtype=torch.long, device=device)
        with self._step("draft_body", 2):
            hidden, _ = self.dec.steppers["draft-model"][0](cursor[:2].view(1, 2), p - 1)
        with self._step("draft_head", 0):
            children, logp = self._children[0](hidden, p + 1)
        token[:M], score[:M] = children[0], logp[0]
        frontier, words = self.ranks, torch.ones_like(self.ranks) << self.ranks
        for depth in range(2, D + 1):
            slots = (depth - 2) * M + self.ranks
            fed_slot[frontier] = slots
            with self._step("draft_body", M):
                rope = p + depth - 1 + torch.zeros_like(slots)
                hidden = self._tree_body(token[frontier].view(1, -1), p + 1 + slots, rope, words, p + 1)
            with self._step("draft_head", 0):
                children, logp = self._children[depth - 1](hidden, p + depth)
            ids = M + (depth - 2) * M * M + torch.arange(M * M, device=device)
            token[ids] = children.flatten()
            score[ids] = (score[frontier][:, None] + logp).flatten()
            parent[ids] = frontier.repeat_interleave(M)
            if depth < D:
                best = score[ids].topk(M).indices
                words = words[best // M] | (torch.ones_like(best) << ((depth - 1) * M + self.ranks))
                frontier = ids[best]
        return self._choose(token, score, parent, fed_slot)

    def _choose(self, token, score, parent, fed_slot) -> torch.Tensor:
        """The N best candidates, parents first, and the round's tables for verify and compaction."""
        N, D = self.nodes, self.depth
        chosen = torch.sort(score, descending=True, stable=True).indices[:N].sort().values
        where = torch.zeros(self.candidates, dtype=torch.long, device=chosen.device)
        where[chosen] = torch.arange(N, device=chosen.device)
        up = parent[chosen]
        has_parent = up >= 0
        parents = torch.where(has_parent, where[up.clamp(min=0)], 0)
        depths = self.candidate_depth[chosen]
        words = self.own_bits
        for _ in range(D - 1):
            words = self.own_bits | torch.where(has_parent, words[parents], 0)
        table = torch.arange(N, device=chosen.device)[:, None].repeat(1, D)
        node = torch.arange(N, device=chosen.device)
        for climbed in range(D):
            column = depths - 1 - climbed
            kept = table.gather(1, column.clamp(min=0)[:, None])[:, 0]
            table.scatter_(1, column.clamp(min=0)[:, None], torch.where(column >= 0, node, kept)[:, None])
            node = torch.where(has_parent[node], parents[node], node)
        self.parents.copy_(parents)
        self.from_root.copy_(~has_parent)
        self.depths.copy_(depths)
        self.path_table.copy_(table)
        self.draft_slot.copy_(fed_slot[chosen])
        self.sibling_rank.copy_(chosen % self.top_m)  # candidates come in sibling groups of M, by rank
        self.verify_rope[1 : N + 1] = depths
        self.verify_bits[1 : N + 1] = words
        self._guess(token, score, parent, fed_slot, chosen, where)
        return token[chosen]

    def _guess(self, token, score, parent, fed_slot, chosen, where) -> None:
        """pipelined-deferred: the look-ahead guesses the path to the depth-D candidate of highest
        cumulative draft log-probability; its leaf token, its fed ancestors' slots, and its index among
        the verified nodes (-1 when it is not verified: the look-ahead is then never used)."""
        M, D = self.top_m, self.depth
        last_depth = M if D == 1 else M * M  # the depth-D candidates come last
        leaf = self.candidates - last_depth + score[-last_depth:].argmax()
        slots, node = torch.zeros(D - 1, dtype=torch.long, device=leaf.device), leaf
        for step in range(D - 1):
            node = parent[node]
            slots[D - 2 - step] = fed_slot[node]
        self.ahead.set_path(slots)
        self.ahead.leaf.copy_(token[leaf].view(1))
        verified = torch.zeros(self.candidates, dtype=torch.bool, device=leaf.device).index_fill_(0, chosen, True)
        self.guess.copy_(torch.where(verified[leaf], where[leaf], -1).view(1))

    def lookahead(self, run, nodes: torch.Tensor):
        """D + 1 draft steps past the guessed leaf, which need not be among the verified nodes."""
        return self.ahead.propose(self.dec, run, self.ahead.leaf)
