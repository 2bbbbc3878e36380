"""`pipelined-deferred` with token trees: the look-ahead of a tree round (docs/design.md, "Token trees").

While the target verifies a tree round rooted at f (position p), the draft guesses that the round
accepts its guessed path, the path to one leaf at the full depth D (a static tree: its first such
node, the rank-0 path of a top-k tree; a dynamic tree: the depth-D candidate of highest cumulative
draft probability), and proposes as a chain past it: fed the leaf it proposes e1 (the bonus guess),
fed e1..eD it proposes e2..e(D+1). These D + 1 fed tokens go to draft-cache slots reserved after the
tree's fed nodes, with tree attention: each one attends to the context, the guessed path's fed nodes where the
round's forwards wrote them, and the look-ahead's tokens before it, so no entry that the round's
compaction may still read is overwritten. The look-ahead is used when the round accepts the whole
guessed path and its bonus token equals e1: the path and the look-ahead's entries then move into
place (p + 1 .. p + 2D), and the next round verifies the chain [f, e2..e(D+1)] without drafting.
"""

from __future__ import annotations

import torch

from contracts.trees import TreeShape, ancestors, guessed_leaf, lookahead_slot


class TreeLookahead:
    """The look-ahead's tables on the draft device (fixed addresses, graph-safe) for one tree decoder:
    the slots of the guessed path's fed nodes, the look-ahead tokens' ancestor words, the leaf token."""

    def __init__(self, rounds, tree: TreeShape):
        self.rounds, self.depth = rounds, tree.depth
        device, D = rounds.dec.draft_device, tree.depth
        self.reserved = lookahead_slot(tree)
        own = torch.ones(D + 1, dtype=torch.long, device=device) << (self.reserved + torch.arange(D + 1, device=device))
        self.own_words = own.cumsum(0)  # look-ahead token j sees the look-ahead's tokens 0..j (distinct bits)
        self.words = self.own_words.clone()
        self.path_slots = torch.zeros(max(D - 1, 0), dtype=torch.long, device=device)  # the guessed path's fed nodes
        self.look_slots = self.reserved + torch.arange(D + 1, device=device)
        self.in_place = torch.arange(2 * D, device=device)  # where the path and e1..eD belong, from p + 1
        self.leaf = torch.zeros(1, dtype=torch.long, device=device)  # a dynamic tree's guessed leaf token
        self.base = torch.zeros(1, dtype=torch.long, device=device)  # the round's p
        if tree.kind == "static":
            path = ancestors(tree.parents, guessed_leaf(tree))[:-1]  # static trees feed node i at slot offset i
            self.set_path(torch.tensor(path, dtype=torch.long, device=device))

    def set_path(self, slots: torch.Tensor) -> None:
        """The guessed path's fed nodes' slot offsets [D - 1], root side first."""
        self.path_slots.copy_(slots)
        path_word = (torch.ones_like(slots) << slots).sum()
        self.words.copy_(self.own_words | path_word)

    def body(self, tokens: torch.Tensor, start: torch.Tensor):
        """The draft body over one look-ahead token at position `start` with tree attention ->
        (hidden [1, d], the next position): a stepper body (Decoder.draft_steps)."""
        step = start - self.base - self.depth  # 0 for the leaf, j for e_j
        base = self.base + 1
        slot = base + self.reserved + step
        hidden = self.rounds._tree_body(tokens.view(1, 1), slot, start, self.words.index_select(0, step), base)
        return hidden, start + 1

    def propose(self, dec, run, leaf: torch.Tensor):
        """D + 1 draft steps from the guessed leaf [1] at p + D: e1..e(D+1), as Decoder.lookahead's."""
        self.base.copy_(run.draft_cursor[2:3])
        start = self.base + self.depth
        return dec.draft_steps(leaf.view(1, 1), start, self.depth + 1, drafter="tree-lookahead", shift=-1)

    def moves(self) -> tuple[torch.Tensor, torch.Tensor]:
        """A used look-ahead's draft-cache moves (sources, destinations): the guessed path's fed nodes,
        then the leaf and e1..eD from the reserved slots, to p + 1 .. p + 2D, where a chain that drafted
        them would hold them."""
        origin = self.base + 1
        return origin + torch.cat([self.path_slots, self.look_slots]), origin + self.in_place

    def capture(self) -> None:
        """The look-ahead's one-token tree forward (dummy inputs; its cache writes are rewritten before read)."""
        zero = torch.zeros(1, dtype=torch.long, device=self.base.device)
        self.base.zero_()
        self.body(zero.view(1, 1), zero + self.depth)
