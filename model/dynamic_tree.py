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


class RoundTables:
    """A dynamic tree round's tables for the verify, the acceptance and the compaction
    (model/tree_rounds.py reads them by these names), in one buffer at fixed addresses: built where the
    draft runs, and with the models on two devices sent where the target verifies in one copy."""

    def __init__(self, nodes: int, depth: int, rows: int, device):
        flag_longs = -(-nodes // 8)  # from_root: one byte a node, in whole int64 words
        longs = 4 * nodes + nodes * depth + 2 * (rows + 1) + 1
        self.buffer = torch.zeros(longs + flag_longs, dtype=torch.long, device=device)
        taken = 0

        def take(size: int) -> torch.Tensor:
            nonlocal taken
            taken += size
            return self.buffer[taken - size : taken]

        self.parents, self.depths, self.draft_slot, self.sibling_rank = (take(nodes) for _ in range(4))
        self.path_table = take(nodes * depth).view(nodes, depth)
        self.verify_rope, self.verify_bits = take(rows + 1), take(rows + 1)
        self.guess = take(1)  # pipelined-deferred (`DynamicTreeRounds._guess`)
        self.from_root = self.buffer[taken:].view(torch.uint8)[:nodes].view(torch.bool)
        self.verify_rope.copy_(torch.arange(rows + 1))  # the pad rows past the nodes keep their offsets
        self.guess.fill_(-1)


class DynamicTreeRounds(TreeRounds):
    """Tree rounds whose tree the draft's probabilities choose each round. The round's tables are built
    where the draft runs (`built`); with the models on two devices they travel to the target's copy
    (`tables`) inside the round's copy_tokens (`send_tables`), on one device they are the same."""

    def __init__(self, dec, tree: TreeShape, graphs: bool):
        M, N, D = tree.top_m, tree.node_budget, tree.depth_budget
        self.dec, self.tree = dec, tree
        self.nodes, self.depth, self.top_m = N, D, M
        target, draft = dec.target_device, dec.draft_device
        self.candidates = M + (D - 1) * M * M
        rows = dec.rows or N + 1
        self.built = RoundTables(N, D, rows, draft)
        self.tables = self.built if draft == target else RoundTables(N, D, rows, target)
        t = self.tables  # what TreeRounds' verify, acceptance and compaction read
        self.parents, self.from_root, self.depths, self.path_table = t.parents, t.from_root, t.depths, t.path_table
        self.draft_slot, self.sibling_rank, self.guess = t.draft_slot, t.sibling_rank, t.guess
        self.verify_rope, self.verify_bits = t.verify_rope, t.verify_bits
        self.node_ids = torch.arange(N, device=target)
        self.steps = torch.arange(D, device=target)
        self.widest = M
        self.capturing = False
        self.proposed = None  # the last round's node tokens (`_draft`), whose tables `send_tables` sends
        # the round's candidates and each fed depth's nodes and ancestor words (`_record`, `_grow_fn`)
        self.candidate_depth = torch.tensor([1] * M + [d for d in range(2, D + 1) for _ in range(M * M)], device=draft)
        self.ranks = torch.arange(M, device=draft)
        self.own_bits = torch.ones(N, dtype=torch.long, device=draft) << torch.arange(N, device=draft)
        self.token = torch.zeros(self.candidates, dtype=torch.long, device=draft)
        self.score = torch.zeros(self.candidates, device=draft)
        self.parent = torch.full((self.candidates,), -1, dtype=torch.long, device=draft)
        self.fed_slot = torch.full((self.candidates,), -1, dtype=torch.long, device=draft)
        self.depth_ids = [M + (d - 2) * M * M + torch.arange(M * M, device=draft) for d in range(2, D + 1)]
        self.frontiers = [self.ranks.clone() for _ in range(D - 1)]
        self.fed_words = [torch.ones_like(self.ranks) << self.ranks for _ in range(D - 1)]
        heads = heads_by_position(dec.draft_head)
        self._tree_body = GraphedCall(self._tree_body_fn, enabled=graphs)
        self._children = [
            GraphedCall(partial(self._scored_fn, head=heads[min(i, len(heads) - 1)], k=M), enabled=graphs)
            for i in range(D)
        ]
        self._grow = [GraphedCall(partial(self._grow_fn, depth=d), enabled=graphs) for d in range(1, D)]
        self._finish = GraphedCall(self._finish_fn, enabled=graphs)
        self._verify = GraphedCall(self._verify_fn, enabled=graphs)
        self.ahead = TreeLookahead(self, tree)

    def _scored_fn(self, hidden, pos, head, k):
        """Top-k children [w, k] and their log-probabilities; acceptance control replaces the tokens."""
        tokens, logp = scored_children(head, hidden, k)
        control = self.dec.control
        return (tokens if control is None else control.propose_children(tokens, pos)), logp

    def _draft(self, cursor: torch.Tensor) -> torch.Tensor:
        """The root's forward, then per depth the M best new nodes fed with tree attention. The work
        between the forwards (the candidates' bookkeeping, the next frontier, the round's tables) replays
        as graphs (`_grow`, `_finish`): eager it was about a hundred small launches a round, host-bound."""
        p = cursor[2:3]
        with self._step("draft_body", 2):
            hidden, _ = self.dec.steppers["draft-model"][0](cursor[:2].view(1, 2), p - 1)
        for depth in range(1, self.depth):
            with self._step("draft_head", 0):
                children, logp = self._children[depth - 1](hidden, p + depth)
            inputs = self._grow[depth - 1](children, logp, p)
            with self._step("draft_body", self.top_m):
                hidden = self._tree_body(*inputs)
        with self._step("draft_head", 0):
            children, logp = self._children[self.depth - 1](hidden, p + self.depth)
        self.proposed = self._finish(children, logp).clone()  # the graph's output is rewritten by its next replay
        return self.proposed

    def send_tables(self, tokens: torch.Tensor) -> None:
        """Within the copy_tokens of a round's node `tokens` to the target device: their tables travel with
        them, in one more copy on the same two-way barrier (a look-ahead's tokens need none)."""
        if self.tables is not self.built and tokens is self.proposed:
            self.tables.buffer.copy_(self.built.buffer, non_blocking=True)

    # --- graph-captured bookkeeping (the candidates live at fixed addresses) ----------------------
    def _record(self, children, logp, depth: int) -> torch.Tensor:
        """Writes the children of the nodes fed at `depth` - 1 (the root's at depth 1) as candidates:
        tokens, cumulative log-probabilities and parents. Returns their candidate indices."""
        M = self.top_m
        if depth == 1:
            self.token.zero_()
            self.score.zero_()
            self.parent.fill_(-1)
            self.fed_slot.fill_(-1)
            self.token[:M], self.score[:M] = children[0], logp[0]
            return self.ranks
        frontier, ids = self.frontiers[depth - 2], self.depth_ids[depth - 2]
        self.token[ids] = children.flatten()
        self.score[ids] = (self.score[frontier][:, None] + logp).flatten()
        self.parent[ids] = frontier.repeat_interleave(M)
        return ids

    def _grow_fn(self, children, logp, p, depth: int) -> tuple:
        """Records depth `depth`'s children, feeds the M best of them next (their slots, ancestor words)
        and returns the draft body's inputs for them (`tree_body_forward`)."""
        M = self.top_m
        ids = self._record(children, logp, depth)
        if depth > 1:
            best = self.score[ids].topk(M).indices
            own = torch.ones_like(best) << ((depth - 1) * M + self.ranks)
            self.fed_words[depth - 1].copy_(self.fed_words[depth - 2][best // M] | own)
            self.frontiers[depth - 1].copy_(ids[best])
        frontier, words = self.frontiers[depth - 1], self.fed_words[depth - 1]
        slots = (depth - 1) * M + self.ranks
        self.fed_slot[frontier] = slots
        rope = p + depth + torch.zeros_like(slots)
        return self.token[frontier].view(1, -1), p + 1 + slots, rope, words, p + 1

    def _finish_fn(self, children, logp) -> torch.Tensor:
        """Records the deepest children, then chooses the verified nodes: their tokens [N]."""
        self._record(children, logp, self.depth)
        return self._choose()

    def _choose(self) -> torch.Tensor:
        """The N best candidates, parents first, and the round's tables for verify and compaction."""
        N, D = self.nodes, self.depth
        chosen = torch.sort(self.score, descending=True, stable=True).indices[:N].sort().values
        where = torch.zeros(self.candidates, dtype=torch.long, device=chosen.device)
        where[chosen] = torch.arange(N, device=chosen.device)
        up = self.parent[chosen]
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
        built = self.built
        built.parents.copy_(parents)
        built.from_root.copy_(~has_parent)
        built.depths.copy_(depths)
        built.path_table.copy_(table)
        built.draft_slot.copy_(self.fed_slot[chosen])
        built.sibling_rank.copy_(chosen % self.top_m)  # candidates come in sibling groups of M, by rank
        built.verify_rope[1 : N + 1] = depths
        built.verify_bits[1 : N + 1] = words
        self._guess(chosen, where)
        return self.token[chosen]

    def _guess(self, chosen, where) -> None:
        """pipelined-deferred: the look-ahead guesses the path to the depth-D candidate of highest
        cumulative draft log-probability; its leaf token, its fed ancestors' slots, and its index among
        the verified nodes (-1 when it is not verified: the look-ahead is then never used)."""
        M, D = self.top_m, self.depth
        last_depth = M if D == 1 else M * M  # the depth-D candidates come last
        leaf = (self.candidates - last_depth + self.score[-last_depth:].argmax()).view(1)  # [1]: a 0-d index syncs
        slots, node = torch.zeros(D - 1, dtype=torch.long, device=leaf.device), leaf
        for step in range(D - 1):
            node = self.parent[node]
            slots[D - 2 - step : D - 1 - step] = self.fed_slot[node]
        self.ahead.set_path(slots)
        self.ahead.leaf.copy_(self.token[leaf])
        verified = torch.zeros(self.candidates, dtype=torch.bool, device=leaf.device).index_fill_(0, chosen, True)
        self.built.guess.copy_(torch.where(verified[leaf], where[leaf], -1))

    def lookahead(self, run, nodes: torch.Tensor):
        """D + 1 draft steps past the guessed leaf, which need not be among the verified nodes."""
        return self.ahead.propose(self.dec, run, self.ahead.leaf)
