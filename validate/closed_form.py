"""The study's closed-form per-token time (sec. 2.2), on the same profile and trace as the simulator:

    TPOT = (T_p(K) + K * T_q + T_o) / E[R]

- T_p(K): the profile's target forward (`target.forward_ms`) for the verify size the schedule uses
  (K new tokens for ordinary and pipelined, K + 1 for deferred and pipelined-deferred, 1 for the
  baseline) at the trace's mean context (mean of the rounds' `context`).
- T_q: one draft step = `draft.body_ms` at the mean context + the head (`draft.head_dense_ms`, or
  `draft.head_flashhead_ms` at the run's probes, or the profile's heads section: sim/heads.py), its
  mean over the round's K positions.
- A token tree (K = its depth): T_p covers its nodes (one more in deferred), and a draft step's body
  is fed the step's frontier (its mean over the K steps).
- T_o: per-round overhead = the standalone one-token append (`target.forward_ms` at n = 1) for
  ordinary and pipelined, plus host costs: one scalar read (`host.item_ms`), the decoder's per-round
  bookkeeping (`host.round_bookkeeping_ms`) and, on two GPUs, two token copies (`host.copy_token_ms`:
  proposals to the target, the final token to the draft).
- E[R]: the trace's mean tokens emitted per round.
The baseline is T_p(1) per token. The formula knows nothing of skipped verifies, overlap between the
devices, the look-ahead or launch-bound host time: that is what it is compared for.
"""

from __future__ import annotations

from dataclasses import dataclass

from contracts.trees import TreeShape
from sim.costs import Costs
from sim.trees import verify_tokens

APPENDING = ("ordinary", "pipelined")


@dataclass(frozen=True)
class ClosedForm:
    T_p: float
    T_q: float
    T_o: float
    E_R: float
    K: int
    verify_tokens: int
    context: float

    @property
    def tpot_ms(self) -> float:
        return (self.T_p + self.K * self.T_q + self.T_o) / self.E_R

    @property
    def tok_s(self) -> float:
        return 1000.0 / self.tpot_ms


def closed_form(
    costs: Costs,
    schedule: str,
    head: str,
    K: int,
    probes: int | None,
    placement: str,
    lines: list[dict],
    tree: TreeShape | None = None,
) -> ClosedForm:
    """The estimate for one configuration from its profile costs and its trace lines (`tree`: a token
    tree's, K its depth)."""
    context = sum(line["context"] for line in lines) / len(lines)
    if schedule == "baseline":
        return ClosedForm(costs.verify.device_ms(n_tokens=1, context=context), 0.0, 0.0, 1.0, 0, 1, context)
    n = verify_tokens(tree, K) + (0 if schedule in APPENDING else 1)
    T_p = costs.verify.device_ms(n_tokens=n, context=context)
    head_ms = sum(costs.head_at(head, probes, position)[0] for position in range(K)) / K  # per position
    fed = tree.frontier_widths() if tree is not None else (1,) * K
    T_q = sum(costs.draft_body.device_ms(n_tokens=w, context=context) for w in fed) / K + head_ms
    T_o = costs.item.device_ms() + costs.bookkeeping.device_ms()
    if placement == "two-gpu":
        T_o += 2 * costs.copy_token.device_ms()
    if schedule in APPENDING:
        T_o += costs.verify.device_ms(n_tokens=1, context=context)
    E_R = sum(line["emitted"] for line in lines) / len(lines)
    return ClosedForm(T_p, T_q, T_o, E_R, K, n, context)
