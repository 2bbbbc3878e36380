"""Acceptance-controlled draft proposals, for models with synthetic (random) weights.

A random-weight draft almost never agrees with a random-weight target, so its acceptance says
nothing. For timing validation the draft still runs its real body and head every step, but its
proposal is then replaced on the device: for the token at absolute position q it proposes the
target's own greedy token there (from a reference run of the target alone) when the pattern says
"accept", and that token + 1 (mod V), which the target rejects, when it says "reject".

Under sampling (model/sampling.py) the draft keeps its own sampled proposal and q; the control sets
instead the accept number of each position: 0 where the pattern says "accept" (accepted wherever the
target gives the token any probability, which holds for every token when no top-k or top-p cuts the
distribution) and +inf where it says "reject" (u * q(d) < p(d) then fails). Every real cost stays:
the draft's sampling, the acceptance test, the residual or bonus sample. The output is then no
longer the target's distribution; with synthetic weights it is not language either.

The pattern is a bit per output position (position P + 1 + j for bit j, P the prompt length).
Every position is tested at most once on the accepted path (a round ends at its first rejection,
and the next round starts after the correction), so i.i.d. bits give exactly i.i.d. per-token
acceptance, and every schedule sees the same bits. The decoder's logic is unchanged, so the output
still equals target greedy; the trace records what the target actually accepted.

Token trees (model/tree_rounds.py): at position q the target's token is among a node's drafted
children at sibling rank r when bit (q, r) is the first set bit of q's ranks; rank 0's bits are the
chain's bits, and each further rank gets its own i.i.d. stream at the same rate a (a pattern sets
rank 0 only). So a node's top-k children hold the target's token with probability 1 - (1 - a)^k
(contracts.acceptance_control.top_k_rate, which the simulator predicts from),
a chain (or a 1-wide tree) sees exactly the chain's bits, and every child that is not the target's
token is a distinct wrong token. Only nodes whose ancestors all match can be accepted, so at each
depth one node's children matter, and a position is again tested at most once on the accepted path.
"""

from __future__ import annotations

import zlib

import torch

from contracts import UsageError
from contracts.acceptance_control import parse_spec
from contracts.trees import MAX_BRANCHING

__all__ = ["AcceptanceControl", "parse_spec"]


class AcceptanceControl:
    """Replaces draft proposals on the device; its buffers have fixed addresses (graph-safe)."""

    def __init__(
        self,
        spec: str,
        vocab_size: int,
        capacity: int,
        device: torch.device,
        seed: int = 0,
        verify_device: torch.device | None = None,
    ):
        """`device`: the draft's (greedy proposals); `verify_device`: the target's, where sampling's
        accept numbers are set (default `device`)."""
        self.kind, self.rate, self.pattern = parse_spec(spec)
        self.spec, self.vocab_size, self.seed = spec, vocab_size, seed
        self.reference = torch.zeros(capacity, dtype=torch.long, device=device)
        self.accept = torch.zeros(capacity, dtype=torch.bool, device=device)
        self.hit_rank = torch.zeros(capacity, dtype=torch.long, device=device)  # MAX_BRANCHING: no rank hits
        self.ranks = torch.arange(MAX_BRANCHING, device=device)
        self.accept_on_verify = self.accept if verify_device is None else self.accept.to(verify_device)
        self.hit_rank_on_verify = self.hit_rank if verify_device is None else self.hit_rank.to(verify_device)

    def describe(self) -> dict:
        """The summary's `acceptance_control` object."""
        if self.kind == "iid":
            return {"kind": "iid", "a": self.rate, "seed": self.seed}
        return {"kind": "pattern", "pattern": self.pattern}

    def bind(self, reference: list[int], prompt_len: int, key: str) -> None:
        """Load one prompt's reference continuation (the first token first) and its acceptance bits.

        `key` (the prompt id) seeds the i.i.d. bits, so each prompt gets its own stream."""
        capacity = self.reference.numel()
        if prompt_len + len(reference) > capacity:
            raise UsageError(
                f"acceptance control holds {capacity} positions, the prompt and reference need "
                f"{prompt_len + len(reference)}"
            )
        ref = torch.zeros(capacity, dtype=torch.long)
        ref[prompt_len : prompt_len + len(reference)] = torch.tensor(reference, dtype=torch.long)
        bits = torch.zeros(capacity, dtype=torch.bool)
        bits[prompt_len + 1 :] = self._bits(capacity - prompt_len - 1, key)
        self.reference.copy_(ref)
        self.accept.copy_(bits)
        self.hit_rank.copy_(self._hit_ranks(bits, prompt_len, key))
        if self.accept_on_verify is not self.accept:
            self.accept_on_verify.copy_(bits)
            self.hit_rank_on_verify.copy_(self.hit_rank)

    def _hit_ranks(self, bits: torch.Tensor, prompt_len: int, key: str) -> torch.Tensor:
        """Per position, the first sibling rank whose bit is set (rank 0: the chain's bits)."""
        n = bits.numel() - prompt_len - 1
        ranks = [bits]
        for rank in range(1, MAX_BRANCHING):
            more = torch.zeros_like(bits)
            if self.kind == "iid":
                more[prompt_len + 1 :] = self._bits(n, f"{key}/rank{rank}")
            ranks.append(more)
        stacked = torch.stack(ranks + [torch.ones_like(bits)], dim=1)  # the last column: no rank hits
        return stacked.long().argmax(dim=1)

    def _bits(self, n: int, key: str) -> torch.Tensor:
        if self.kind == "pattern":
            return torch.tensor(self.pattern, dtype=torch.bool).repeat(n // len(self.pattern) + 1)[:n]
        generator = torch.Generator().manual_seed(zlib.crc32(f"{self.seed}/{key}".encode()))
        return torch.rand(n, generator=generator) < self.rate

    def propose(self, token: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """The controlled proposal for the token at positions `pos` (the draft's own `token` is
        computed and discarded: it is what the timing must include)."""
        ref = self.reference[pos]
        return torch.where(self.accept[pos], ref, (ref + 1) % self.vocab_size).view_as(token)

    def propose_children(self, children: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """Tree rounds: the controlled children [w, k] (sibling ranks 0..k-1) of nodes whose children
        sit at position `pos` [1]: the target's token at its hit rank, distinct wrong tokens elsewhere."""
        ref = self.reference[pos]
        ranks = self.ranks[: children.shape[1]]
        chosen = torch.where(ranks == self.hit_rank[pos], ref, (ref + 1 + ranks) % self.vocab_size)
        return chosen.expand_as(children)

    def accept_numbers(self, positions: torch.Tensor) -> torch.Tensor:
        """Sampling: the accept numbers [n] of the draft tokens at `positions` (on the verify device)."""
        return torch.where(self.accept_on_verify[positions], 0.0, float("inf"))

    def tree_accept_numbers(self, positions: torch.Tensor, ranks: torch.Tensor) -> torch.Tensor:
        """Sampled tree rounds: the accept numbers [n] of nodes at `positions` with sibling `ranks`: 0 for
        the node at its position's hit rank (the child holding the target's token), +inf for the others."""
        return torch.where(self.hit_rank_on_verify[positions] == ranks, 0.0, float("inf"))
