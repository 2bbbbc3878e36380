"""Token-tree rounds: their acceptance from per-depth top-k rates, and their widths.

A tree round runs the events of a chain round with K = the tree's depth (docs/design.md, "Token
trees"): the draft's step j feeds its frontier at depth j-1 (the root first), and the verify covers
every node. Only the acceptance differs: at each depth the target's token is the draft's r-th
choice with the probabilities of the profile's `trees` rates (contracts.profile.check_trees), or of
the acceptance control's rule under `a=A` (contracts.acceptance), and the round accepts that
depth when the accepted node has a child of rank r. A trace recorded with the very tree is replayed
as recorded instead (its accepted path lengths, as a chain trace's accepted lengths).

Under `pipelined-deferred` the look-ahead guesses one path (the tree's first node at the full depth,
breadth-first: the rank-0 path of a top-k tree), and a round after a used look-ahead verifies a
chain: its depths accept at the top-1 rates (`block(..., chain=True)`).
"""

from __future__ import annotations

import random
from dataclasses import replace

from contracts import HEADS, UsageError
from contracts.acceptance import top_k_rate
from contracts.names import SPECULATIVE_SCHEDULES
from contracts.trees import ROOT, TREE_SCHEDULES, TreeShape, chain_shape, guessed_leaf, lookahead_fits, parse_tree

from .acceptance import ControlledAcceptance, TraceReplay
from .sampled_trees import check_sampled_source, sampled_schedules

MEASURE_HINT = "python -m measure.tree_rates measures them"


class TreeAcceptance:
    """Accepted depth of a static tree, drawn depth by depth from rank probabilities.

    The rank at depth d is drawn from the CDF `cdf[d][k-1]` = rate(d, top-k), taken as independent
    of the ranks drawn above it (the rates are already conditioned on acceptance so far). One
    uniform per position, K + 1 per round, as `PerPositionAcceptance` draws them: a chain tree
    (1x1x...) accepts exactly what per-position acceptance at the top-1 rates accepts."""

    name = "tree"

    def __init__(self, shape: TreeShape, cdf: list[list[float]], scope: str, label: str | None = None):
        self.shape, self.cdf, self.scope, self.label = shape, cdf, scope, label or shape.label
        self.children = {(parent, rank): node for node, (parent, rank) in enumerate(zip(shape.parents, shape.ranks))}
        self.guess = guessed_leaf(shape)  # pipelined-deferred: the look-ahead's guessed path ends here

    def describe(self) -> str:
        return f"tree {self.label}: per-depth top-k rates ({self.scope})"

    def mean_rate(self) -> float:
        return sum(row[0] for row in self.cdf) / len(self.cdf)

    def rank(self, depth: int, u: float) -> int:
        """The draft's rank of the target's token at `depth` (0-based) for a uniform draw u; top_k: not in its top-k."""
        row = self.cdf[min(depth, len(self.cdf) - 1)]
        return next((r for r, p in enumerate(row) if u < p), len(row))

    def stream(self, generation, seed: int):
        rng = random.Random(f"{seed}/{generation.prompt_id}")

        def block(pos: int, K: int, drafter: str | None = None, chain: bool = False) -> list[bool]:
            """K + 1 matches: the accepted depths, then whether the look-ahead's guess holds (the guessed
            path accepted and the bonus token the draft's first choice). `chain`: a chain round."""
            draws = [rng.random() for _ in range(K + 1)]
            node, accepted = ROOT, 0
            for depth in range(K):
                rank = self.rank(depth, draws[depth])
                # a chain round drafted the draft's first choice only
                node = (ROOT if rank == 0 else None) if chain else self.children.get((node, rank))
                if node is None:
                    break
                accepted += 1
            guessed = accepted == K and (chain or node == self.guess)
            return [True] * accepted + [False] * (K - accepted) + [guessed and self.rank(K, draws[K]) == 0]

        return block


def cumulative(rates: list[list[float | None]]) -> list[list[float]]:
    """Per depth, a CDF over ranks from the top-k rates. Each rate is conditioned on its own k's tree
    accepting the path so far, so a row need not rise with k; its running maximum is taken."""
    rows = []
    for row in rates:
        running, out = 0.0, []
        for rate in row:
            running = max(running, rate)
            out.append(running)
        rows.append(out)
    return rows


def dynamic_as_static(shape: TreeShape, cdf: list[list[float]]) -> TreeShape:
    """EAGLE-2's tree, approximated by one static tree: its draft ranks by cumulative probability, which
    the profile does not hold, so a node's score is the product of the rank probabilities on its path.
    Depth by depth the M best newest nodes get their top-M children; the N best nodes are verified.
    This keeps the budgets' shape but not the per-round adaptation (docs/design.md)."""

    def probability(depth: int, rank: int) -> float:
        row = cdf[depth]
        return row[rank] - (row[rank - 1] if rank else 0.0)

    nodes = {(): 1.0}  # path of ranks -> score
    newest = [()]
    for depth in range(shape.depth_budget):
        children = {
            path + (rank,): nodes[path] * probability(depth, rank) for path in newest for rank in range(shape.top_m)
        }
        nodes.update(children)
        newest = sorted(children, key=lambda path: -children[path])[: shape.top_m]
    ordered = sorted((p for p in nodes if p), key=lambda path: (-nodes[path], len(path), path))
    kept = ordered[: shape.node_budget]
    return parse_tree("paths:" + ";".join(".".join(map(str, path)) for path in kept), "tree")


def control_cdf(a: float, shape: TreeShape) -> list[list[float]]:
    """Per depth, the CDF over ranks under acceptance control a=A: top-k holds the token at 1-(1-a)^k."""
    return [[top_k_rate(a, k) for k in range(1, max(shape.children_per_depth()) + 1)]] * shape.depth


def tree_setup(
    scenario, profile, costs, K: int, notes: list, source=None
) -> tuple[TreeShape, TreeAcceptance, tuple, tuple, int]:
    """(the configurations' tree, its acceptance, schedules, heads, K) for a scenario with a tree; `costs`:
    the regime's; `source`: the scenario's acceptance source. UsageError, naming the tree, when the
    profile cannot answer it or the scenario asks what a tree does not run with."""
    label = f"tree {scenario.tree}"
    shape = parse_tree(scenario.tree, label)
    if shape.kind == "chain":
        shape = replace(chain_shape(K), label="chain")
    notes += check_sampled_source(shape, source, scenario.temperature, label)  # sim/sampled_trees.py
    if shape.label != "chain" and isinstance(source, TraceReplay) and source.trees == [shape.label]:
        tree_source = source  # the tree's own rounds, replayed as recorded
        notes.append(f"acceptance: {source.describe()}, recorded with tree {shape.label}")
    elif isinstance(source, ControlledAcceptance):
        tree_source = control_source(shape, source.a)
        notes.append(f"acceptance: {tree_source.describe()}")
    else:
        tree_source = rated_source(shape, _profile_cdf(profile, shape, label), "all categories pooled, measured")
        notes.append(
            f"acceptance: {tree_source.describe()} ({profile.raw['trees']['weights']} weights); the acceptance "
            "source applies to chains without --tree only"
        )
    if shape.kind == "dynamic" and tree_source is not source:
        notes.append(
            f"{shape.label}: acceptance of the static tree of its {tree_source.shape.node_count} nodes of highest "
            f"product of rank probabilities, {tree_source.shape.label} (docs/design.md)"
        )
    verify = costs.verify
    if "n_tokens" not in verify.axes or verify.values[verify.axes.index("n_tokens")][-1] < shape.node_count + 1:
        measured = verify.values[verify.axes.index("n_tokens")][-1] if "n_tokens" in verify.axes else 1
        raise UsageError(
            f"{label}: its verify covers {shape.node_count + 1} tokens, the profile's target.forward_ms is measured "
            f"up to {measured:g}; python -m measure --tree-widths N,... measures wider verifies"
        )
    chain = all(rank == 0 for rank in shape.ranks) and shape.kind == "static" and shape.node_count == shape.depth
    allowed = SPECULATIVE_SCHEDULES if chain else TREE_SCHEDULES
    if not lookahead_fits(shape):  # as the decoder refuses it
        allowed = tuple(s for s in allowed if s != "pipelined-deferred")
    allowed = sampled_schedules(allowed, shape, source, scenario.temperature, notes)  # sim/sampled_trees.py
    schedules = _chosen(scenario.schedules, allowed, SPECULATIVE_SCHEDULES, "schedules", label, notes)
    heads = _chosen(scenario.heads, ("dense",), HEADS, "heads", label, notes)
    if scenario.policies != ("fixed",) or scenario.drafters != ("draft-model",):
        raise UsageError(f"{label}: trees are drafted by a fixed draft model (no --policy or --drafter)")
    return shape, tree_source, schedules, heads, shape.depth


def _profile_cdf(profile, shape: TreeShape, label: str) -> list[list[float]]:
    """The CDFs of the profile's measured per-depth top-k rates (all categories pooled)."""
    section = profile.raw.get("trees")
    if section is None:
        raise UsageError(
            f"{label}: the profile has no per-depth top-k rates (no 'trees' section); {MEASURE_HINT}, or give "
            "--acceptance a=RATE for a run under acceptance control"
        )
    rates = section["rates"]["all"]["rate"]
    if shape.depth > section["depths"] or max(shape.children_per_depth()) > section["top_k"]:
        raise UsageError(
            f"{label}: needs depth {shape.depth} and top-{max(shape.children_per_depth())}, the profile's tree "
            f"rates cover depths 1..{section['depths']} and top-1..{section['top_k']}; {MEASURE_HINT}"
        )
    unmeasured = [
        (depth + 1, k + 1)
        for depth, width in enumerate(shape.children_per_depth())
        for k in range(width)
        if rates[depth][k] is None
    ]
    if unmeasured:
        raise UsageError(
            f"{label}: the profile's rate at depth {unmeasured[0][0]}, top-{unmeasured[0][1]} was never "
            "observed (n = 0); measure more states with python -m measure.tree_rates"
        )
    return cumulative([[0.0 if r is None else r for r in row] for row in rates])


def rated_source(shape: TreeShape, cdf: list[list[float]], scope: str) -> TreeAcceptance:
    """A tree's acceptance from per-depth rank CDFs; a dynamic tree's is its static stand-in's
    (dynamic_as_static), labeled as the tree."""
    accepting = dynamic_as_static(shape, cdf) if shape.kind == "dynamic" else shape
    return TreeAcceptance(accepting, cdf, scope, shape.label)


def control_source(shape: TreeShape, a: float) -> TreeAcceptance:
    """The acceptance a run under acceptance control a=A sees with this tree (a dynamic tree's
    approximately: the decoder chooses its nodes by the synthetic draft's own probabilities)."""
    return rated_source(shape, control_cdf(a, shape), f"acceptance control a={a:g}: 1-(1-a)^k")


def _chosen(asked: tuple, allowed: tuple, default: tuple, what: str, label: str, notes: list) -> tuple:
    """The asked values a tree runs with. From the default set, those it supports (a note names the
    others); asked by name, every one must be supported."""
    dropped = [v for v in asked if v not in allowed]
    if dropped and tuple(asked) != tuple(default):
        raise UsageError(f"{label}: runs on {what} {', '.join(allowed)} only (asked: {', '.join(asked)})")
    if dropped:
        notes.append(f"{label}: {what} {', '.join(dropped)} left out (it runs on {', '.join(allowed)} only)")
    return tuple(v for v in asked if v in allowed)


def draft_points(tree: TreeShape | None, steps: int, context: int, first_tokens: int) -> list[tuple[int, int]]:
    """Step j's (n_tokens, context): the first feeds `first_tokens` after `context` cached ones, every
    later one its frontier (a chain: the previous proposal), after all the tokens fed before it."""
    widths = tree.frontier_widths()[1:] if tree is not None else ()
    points, fed = [(first_tokens, context)], context + first_tokens
    for step in range(1, steps):
        width = widths[step - 1] if step - 1 < len(widths) else 1
        points.append((width, fed))
        fed += width
    return points


def verify_tokens(tree: TreeShape | None, K: int) -> int:
    """The draft tokens a verify covers (and the proposal copy carries): every node of the tree, or the chain's K."""
    return tree.node_count if tree is not None else K


def is_tree(tree: TreeShape | None) -> bool:
    """Whether rounds draft a tree (the decoder's TreeRounds), not a chain (`--tree chain` included)."""
    return tree is not None and tree.label != "chain"


def cursor_tokens(tree: TreeShape | None) -> int:
    """The tokens of the copy to the draft after a round: the cursor (prev, f, p), and with a tree the
    accepted path's cache moves (target sources, destinations, draft sources: 3 x depth)."""
    return 3 + 3 * tree.depth if is_tree(tree) else 3
