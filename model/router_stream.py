"""The router head's cluster choice beside the draft body, as DynaSpec runs it.

The router reads only the token fed to the body and the previous hidden state, both known before the
body runs, so its choice (`RouterHead.choose`) can run on a second CUDA stream while the body runs on
the current one; the head then scores the chosen clusters (`RouterHead.argmax_chosen`) once both are
done. `SideStream` forks and joins with CUDA events, which graph capture records as graph edges: inside
a captured draft step (measure.head_cost) the choice becomes a parallel branch of the graph, and
between graph launches (the decoder's body and head graphs) it orders the launches on the two streams.
No host sync either way. On the CPU there is one stream: the same calls run in issue order.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


class SideStream:
    """A second stream of `device` (none on the CPU): `fork()` runs its block there after the work
    issued so far on the current stream; `join()` makes the current stream wait for it."""

    def __init__(self, device: torch.device):
        self.device = device
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None

    @contextmanager
    def fork(self) -> Iterator[None]:
        if self.stream is None:
            yield
            return
        forked = torch.cuda.Event()
        forked.record(torch.cuda.current_stream(self.device))
        self.stream.wait_event(forked)
        with torch.cuda.stream(self.stream):
            yield

    def join(self) -> None:
        if self.stream is not None:
            joined = torch.cuda.Event()
            joined.record(self.stream)
            torch.cuda.current_stream(self.device).wait_event(joined)


class ChosenClusters:
    """A router head whose clusters were chosen beside the body: the draft step's head only scores them."""

    def __init__(self, router):
        self.router = router

    def argmax(self, hidden: torch.Tensor, tokens: torch.Tensor | None = None) -> torch.Tensor:
        return self.router.argmax_chosen(hidden)

    def scored_logits(self, hidden: torch.Tensor, tokens: torch.Tensor | None = None):
        return self.router.scored_logits_chosen(hidden)


def routed_step(body, router, side: SideStream, tokens: torch.Tensor, *body_inputs) -> torch.Tensor:
    """One draft step with the router's choice beside the body: fork the choice, run
    `body(tokens, *body_inputs)` -> hidden [1, d], join, score. Capturable as one graph."""
    with side.fork():
        router.choose(tokens)
    hidden = body(tokens, *body_inputs)
    side.join()
    return router.argmax_chosen(hidden)
