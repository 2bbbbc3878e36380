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

Rates per draft position (contracts.acceptance, `a=R1,R2,...`): each output position gets an i.i.d. bit
per draft position j at rate Rj, and the proposal reads the bit of the draft position it is drafted at
(its slot, baked into the head's graph). Which slot tests a position on the accepted path depends only
on earlier positions' outcomes, and its bits are independent of theirs, so a proposal at draft position
j is accepted with probability exactly Rj, as the simulator draws it (sim/acceptance.py). Greedy chain
rounds only: the first slot is the i.i.d. stream (the same bits as `a=R1`).

Token trees (model/tree_rounds.py): at position q the target's token is among a node's drafted
children at sibling rank r when bit (q, r) is the first set bit of q's ranks; rank 0's bits are the
chain's bits, and each further rank gets its own i.i.d. stream at the same rate a (a pattern sets
rank 0 only). So a node's top-k children hold the target's token with probability 1 - (1 - a)^k
(contracts.acceptance.top_k_rate, which the simulator predicts from),
a chain (or a 1-wide tree) sees exactly the chain's bits, and every child that is not the target's
token is a distinct wrong token. Only nodes whose ancestors all match can be accepted, so at each
depth one node's children matter, and a position is again tested at most once on the accepted path.
"""

from __future__ import annotations

import zlib

import torch

from contracts import UsageError
from contracts.acceptance import parse_control
from contracts.trees import MAX_BRANCHING


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
        parsed = parse_control(spec)
        if parsed.curve:
            raise UsageError(
                f"acceptance control {spec!r}: a curve is scaled per head from a profile's agreement; "
                "python -m validate --profile resolves it, python -m model takes a=R1,R2,... or pattern=BITS"
            )
        self.rates, self.pattern = parsed.rates, list(parsed.pattern)
        self.kind = "pattern" if self.pattern else "per-position" if parsed.per_position else "iid"
        self.spec, self.vocab_size, self.seed = spec, vocab_size, seed
        self.reference = torch.zeros(capacity, dtype=torch.long, device=device)
        # accept[q, j]: the bit of output position q drafted at draft position j (one column unless per position)
        self.accept = torch.zeros((capacity, max(1, len(self.rates))), dtype=torch.bool, device=device)
        self.hit_rank = torch.zeros(capacity, dtype=torch.long, device=device)  # MAX_BRANCHING: no rank hits
        self.ranks = torch.arange(MAX_BRANCHING, device=device)
        first = self.accept[:, 0]
        self.accept_on_verify = first if verify_device is None else first.to(verify_device)
        self.hit_rank_on_verify = self.hit_rank if verify_device is None else self.hit_rank.to(verify_device)

    def describe(self) -> dict:
        """The summary's `acceptance_control` object."""
        if self.kind == "pattern":
            return {"kind": "pattern", "pattern": self.pattern}
        return {"kind": self.kind, "a": self.rates[0] if self.kind == "iid" else list(self.rates), "seed": self.seed}

    def slots(self, K: int) -> int:
        """Head graphs a decoder of K draft tokens needs, one per draft position with its own rate
        (1..K and the look-ahead's K + 1)."""
        return min(self.accept.shape[1], K + 1)

    def bind(self, reference: list[int], prompt_len: int, key: str, rate: float | None = None) -> None:
        """Load one prompt's reference continuation (the first token first) and its acceptance bits.

        `key` (the prompt id) seeds the i.i.d. bits, so each prompt gets its own stream. `rate`: an i.i.d.
        control's rate from this prompt on (LookupControl's per category), in the same buffers, so the
        graphs that read them serve every rate."""
        if rate is not None:
            if self.kind != "iid":
                raise ValueError(f"a rate of its own needs an i.i.d. control, not {self.kind}")
            self.rates = [rate]
        capacity = self.reference.numel()
        if prompt_len + len(reference) > capacity:
            raise UsageError(
                f"acceptance control holds {capacity} positions, the prompt and reference need "
                f"{prompt_len + len(reference)}"
            )
        ref = torch.zeros(capacity, dtype=torch.long)
        ref[prompt_len : prompt_len + len(reference)] = torch.tensor(reference, dtype=torch.long)
        bits = torch.zeros(self.accept.shape, dtype=torch.bool)
        for slot in range(bits.shape[1]):  # slot 0 keeps the i.i.d. stream's key
            slot_key = key if slot == 0 else f"{key}/position{slot + 1}"
            bits[prompt_len + 1 :, slot] = self._bits(capacity - prompt_len - 1, slot_key, slot)
        self.reference.copy_(ref)
        self.accept.copy_(bits)
        self.hit_rank.copy_(self._hit_ranks(bits[:, 0], prompt_len, key))
        if self.accept_on_verify.device != self.accept.device:
            self.accept_on_verify.copy_(bits[:, 0])
            self.hit_rank_on_verify.copy_(self.hit_rank)

    def _hit_ranks(self, bits: torch.Tensor, prompt_len: int, key: str) -> torch.Tensor:
        """Per position, the first sibling rank whose bit is set (rank 0: the chain's bits)."""
        n = bits.numel() - prompt_len - 1
        ranks = [bits]
        for rank in range(1, MAX_BRANCHING):
            more = torch.zeros_like(bits)
            if self.kind != "pattern":
                more[prompt_len + 1 :] = self._bits(n, f"{key}/rank{rank}")
            ranks.append(more)
        stacked = torch.stack(ranks + [torch.ones_like(bits)], dim=1)  # the last column: no rank hits
        return stacked.long().argmax(dim=1)

    def _bits(self, n: int, key: str, slot: int = 0) -> torch.Tensor:
        if self.kind == "pattern":
            return torch.tensor(self.pattern, dtype=torch.bool).repeat(n // len(self.pattern) + 1)[:n]
        generator = torch.Generator().manual_seed(zlib.crc32(f"{self.seed}/{key}".encode()))
        return torch.rand(n, generator=generator) < self.rates[slot]

    def propose(self, token: torch.Tensor, pos: torch.Tensor, slot: int = 0) -> torch.Tensor:
        """The controlled proposal for the token at positions `pos`, drafted at draft position `slot`
        (0-based; the draft's own `token` is computed and discarded: it is what the timing must include)."""
        ref = self.reference[pos]
        accept = self.accept[pos, min(slot, self.accept.shape[1] - 1)]
        return torch.where(accept, ref, (ref + 1) % self.vocab_size).view_as(token)

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


def check_spec(spec: str, greedy: bool = True, chain: bool = True, curve_allowed: bool = False) -> None:
    """Bad input unless `spec` parses (contracts.acceptance), rates per draft position come with greedy
    chain rounds, and a curve only where a profile resolves it per head (`curve_allowed`)."""
    parsed = parse_control(spec)
    if parsed.curve and not curve_allowed:
        raise UsageError(
            f"--acceptance {spec}: a curve is scaled per head from a profile's agreement; "
            "use it with python -m validate --profile, or give a=R1,R2,..."
        )
    if parsed.per_position and not (greedy and chain):
        raise UsageError(f"--acceptance {spec}: a rate per draft position runs greedy chain rounds only")
