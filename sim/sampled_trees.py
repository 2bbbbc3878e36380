"""Token trees under speculative sampling: which acceptance source answers a sampled tree round, and
which of sampling's costs it pays.

A sampled tree round (docs/design.md, "Token trees", Sampling) keeps the greedy round's events and
its draft: each node's children are still the head's top-k, so no q is formed and nothing is drawn
in the draft. Only the verify's decision changes (the target's distributions, multi-branch rejection,
the final token drawn from the residual). So its target forwards cost what sampling adds
(sim/sampling_costs.py, at the tree's token count) and its draft heads their greedy cost.

Acceptance under acceptance control (`a=A`): the decoder sets each node's accept number to 0 at its
position's hit rank and to +inf at every other rank, so the child at the hit rank is accepted (the
target gives its token p > 0 without top-k and top-p) and no other. That is the greedy round's path,
so the control's rule, 1 - (1 - a)^k per depth (sim/trees.py), holds unchanged. A trace recorded under
sampling with the very tree is replayed as recorded. With real weights, the rate at which a node
accepts one of its k children is E[p(c_1) + ... + p(c_k)], the target's mass on the draft's top-k
(the proof in docs/design.md); the profile holds neither that nor anything it follows from: its
`trees` rates are greedy (whether the target's argmax is in the top-k) and its beta curves a sampled
chain's (sum_x min(p(x), q(x))). So every other source is refused.
"""

from __future__ import annotations

from contracts import UsageError
from contracts.trees import TreeShape

from .acceptance import ControlledAcceptance, TraceReplay

LOOK_AHEAD = "pipelined-deferred"  # the schedule whose look-ahead a sampled bonus decides


def is_sampled(temperature: float, source) -> bool:
    """Whether the rounds simulated are sampled: a temperature above 0, or a trace recorded under sampling."""
    return temperature > 0 or (isinstance(source, TraceReplay) and source.sampled)


def drafts_sample(tree: TreeShape | None) -> bool:
    """Whether a sampled round's draft forms q and draws from it: a chain's does, a tree's ranks its top-k."""
    return tree is None or tree.label == "chain"


def check_sampled_source(shape: TreeShape, source, temperature: float, label: str) -> list[str]:
    """Notes on where a sampled tree's acceptance comes from (none for greedy rounds); UsageError, in one
    line, when its acceptance source cannot answer a sampled tree."""
    if not is_sampled(temperature, source):
        return []
    if isinstance(source, ControlledAcceptance):
        return [
            f"{label} under sampling: acceptance control accepts the child at each position's hit rank and no "
            "other (accept numbers 0 and +inf), the greedy round's path, so its rule applies unchanged"
        ]
    recorded = isinstance(source, TraceReplay) and shape.label != "chain" and source.trees == [shape.label]
    if recorded and source.sampled:
        return []
    if recorded:
        raise UsageError(
            f"{label}: temperature={temperature:g} with a trace recorded greedy; a sampled tree replays a trace "
            "recorded under sampling with it, or takes --acceptance a=RATE"
        )
    raise UsageError(
        f"{label}: under sampling a tree's acceptance comes from acceptance control (--acceptance a=RATE) or a "
        "trace recorded with it under sampling; the profile's tree rates (greedy top-k) and beta curves (a "
        "sampled chain's) do not give multi-branch rejection's rate"
    )


def sampled_schedules(allowed: tuple, shape: TreeShape, source, temperature: float, notes: list) -> tuple:
    """The schedules a tree (`allowed` greedy) runs with under sampling. pipelined-deferred's look-ahead
    is used when the sampled bonus token equals the draft's guess e1: acceptance control does not set
    that (the draft keeps its own sampled tokens), so a chain under control leaves it out; a trace
    recorded with the tree would carry it."""
    own_trace = isinstance(source, TraceReplay) and source.trees == [shape.label]
    if not is_sampled(temperature, source) or own_trace or LOOK_AHEAD not in allowed:
        return allowed
    notes.append(
        f"tree {shape.label} under sampling: {LOOK_AHEAD} is left out (its look-ahead is used when the sampled "
        "bonus equals the draft's guess, which acceptance control does not set)"
    )
    return tuple(schedule for schedule in allowed if schedule != LOOK_AHEAD)
