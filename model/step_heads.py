"""The draft heads as the decoder's draft steps call them: per draft position, its head's graphs.

A draft position's head gets one graph per acceptance-control slot: the draft position whose rate a
per-position control (model/acceptance_control.py) applies to the proposal, baked into the graph so
that choosing it costs nothing on the device; without such a control there is one slot. A router head
run beside the body (model/router_stream.py) also gets the graph of its cluster choice, which
`before_body` launches on the side stream and the head's call joins.
"""

from __future__ import annotations

from functools import partial

import torch

from model.graphs import GraphedCall
from model.heads import RouterHead
from model.router_stream import ChosenClusters, SideStream


class StepHead:
    """One draft position's head: `before_body(tokens)` as the step begins (the tokens the body is fed
    [1, n]), then `(hidden, pos, fed, slot)` (fed: the last of them [1, 1])."""

    def __init__(self, calls: list, route: GraphedCall | None = None, side: SideStream | None = None):
        self.calls, self.route, self.side = calls, route, side

    def before_body(self, tokens: torch.Tensor) -> None:
        """A router's cluster choice from the last fed token. The slice is taken only here: before the
        body, a step's host work delays its launch (a step after a read is on the round's critical path)."""
        if self.route is not None:
            with self.side.fork():
                self.route(tokens[:, -1:])

    def __call__(self, hidden: torch.Tensor, pos: torch.Tensor, fed: torch.Tensor, slot: int = 0):
        if self.route is not None:
            self.side.join()
        return self.calls[min(slot, len(self.calls) - 1)](hidden, pos, fed)

    @property
    def captured(self) -> int:
        """Graphs captured so far (heads per slot, and the router's choice)."""
        return sum(call.captured for call in self.calls) + (self.route.captured if self.route is not None else 0)

    def capture(self, hidden: torch.Tensor, pos: torch.Tensor, fed: torch.Tensor) -> None:
        """Run (so capture) every graph once, as a draft step would."""
        for slot in range(len(self.calls)):
            self.before_body(fed)
            self(hidden, pos, fed, slot)


def step_heads(heads: list, head_fn, graphs: bool, slots: int, side: SideStream | None) -> list[StepHead]:
    """The StepHead of each draft position's head: `head_fn(hidden, pos, fed, head=..., slot=...)` graphed
    per slot; with `side`, a router head chooses its clusters there, beside the body."""
    steps = []
    for head in heads:
        beside = side is not None and isinstance(head, RouterHead)
        scorer = ChosenClusters(head) if beside else head
        calls = [GraphedCall(partial(head_fn, head=scorer, slot=slot), enabled=graphs) for slot in range(slots)]
        steps.append(StepHead(calls, GraphedCall(head.choose, enabled=graphs) if beside else None, side))
    return steps
