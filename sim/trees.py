"""Token-tree rounds: their acceptance from the profile's per-depth top-k rates, and their widths.

A tree round runs the events of a chain round with K = the tree's depth (docs/design.md, "Token
trees"): the draft's step j feeds its frontier at depth j-1 (the root first), and the verify covers
every node. Only the acceptance differs: at each depth the target's token is the draft's r-th
choice with the probabilities the profile's `trees` rates give (contracts.profile.check_trees), and
the round accepts that depth when the accepted node has a child of rank r.
"""

from __future__ import annotations

import random
from dataclasses import replace

from contracts import HEADS, UsageError
from contracts.names import SPECULATIVE_SCHEDULES
from contracts.trees import ROOT, TREE_SCHEDULES, TreeShape, chain_shape, parse_tree

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

    def describe(self) -> str:
        return f"tree {self.label}: per-depth top-k rates ({self.scope}) of the profile's trees section"

    def mean_rate(self) -> float:
        return sum(row[0] for row in self.cdf) / len(self.cdf)

    def rank(self, depth: int, u: float) -> int:
        """The draft's rank of the target's token at `depth` (0-based) for a uniform draw u; top_k: not in its top-k."""
        row = self.cdf[min(depth, len(self.cdf) - 1)]
        return next((r for r, p in enumerate(row) if u < p), len(row))

    def stream(self, generation, seed: int):
        rng = random.Random(f"{seed}/{generation.prompt_id}")

        def block(pos: int, K: int, drafter: str | None = None) -> list[bool]:
            draws = [rng.random() for _ in range(K + 1)]
            node, accepted = ROOT, 0
            for depth in range(K):
                node = self.children.get((node, self.rank(depth, draws[depth])))
                if node is None:
                    break
                accepted += 1
            bonus = accepted == K and self.rank(K, draws[K]) == 0  # the look-ahead's guess (chains only)
            return [True] * accepted + [False] * (K - accepted) + [bonus]

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


def tree_setup(scenario, profile, costs, K: int, notes: list) -> tuple[TreeShape, TreeAcceptance, tuple, tuple, int]:
    """(the configurations' tree, its acceptance, schedules, heads, K) for a scenario with a tree; `costs`:
    the regime's. UsageError, naming the tree, when the profile cannot answer it or the scenario asks
    what a tree does not run with."""
    label = f"tree {scenario.tree}"
    shape = parse_tree(scenario.tree, label)
    if shape.kind == "chain":
        shape = replace(chain_shape(K), label="chain")
    section = profile.raw.get("trees")
    if section is None:
        raise UsageError(f"{label}: the profile has no per-depth top-k rates (no 'trees' section); {MEASURE_HINT}")
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
    verify = costs.verify
    if "n_tokens" not in verify.axes or verify.values[verify.axes.index("n_tokens")][-1] < shape.node_count + 1:
        measured = verify.values[verify.axes.index("n_tokens")][-1] if "n_tokens" in verify.axes else 1
        raise UsageError(
            f"{label}: its verify covers {shape.node_count + 1} tokens, the profile's target.forward_ms is measured "
            f"up to {measured:g}; python -m measure --tree-widths N,... measures wider verifies"
        )
    chain = all(rank == 0 for rank in shape.ranks) and shape.kind == "static" and shape.node_count == shape.depth
    allowed = SPECULATIVE_SCHEDULES if chain else TREE_SCHEDULES
    schedules = _chosen(scenario.schedules, allowed, SPECULATIVE_SCHEDULES, "schedules", label, notes)
    heads = _chosen(scenario.heads, ("dense",), HEADS, "heads", label, notes)
    if scenario.policies != ("fixed",) or scenario.drafters != ("draft-model",):
        raise UsageError(f"{label}: trees are drafted by a fixed draft model (no --policy or --drafter)")
    if scenario.temperature > 0:
        raise UsageError(f"{label}: trees are simulated for greedy decoding only (temperature 0)")
    cdf = cumulative([[0.0 if r is None else r for r in row] for row in rates])
    accepting = dynamic_as_static(shape, cdf) if shape.kind == "dynamic" else shape
    source = TreeAcceptance(accepting, cdf, "all categories pooled", shape.label)
    notes.append(
        f"acceptance: {source.describe()} ({section['weights']} weights); the acceptance source applies "
        "to chains without --tree only"
    )
    if shape.kind == "dynamic":
        notes.append(
            f"{shape.label}: acceptance of the static tree of its {accepting.node_count} nodes of highest product of "
            f"rank probabilities, {accepting.label} (docs/design.md)"
        )
    return shape, source, schedules, heads, shape.depth


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


def cursor_tokens(tree: TreeShape | None) -> int:
    """The tokens of the copy to the draft after a round: the cursor (prev, f, p), and with a tree the
    accepted path's cache moves (target sources, destinations, draft sources: 3 x depth)."""
    return 3 if tree is None or tree.label == "chain" else 3 + 3 * tree.depth
