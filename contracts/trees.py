"""Draft tree specs: which continuations a round drafts, and how the target verifies them.

One grammar for every command (`python -m model --tree`, `measure`, `validate --trees`,
`sim --tree`, `--what-if tree=...`, `--sweep tree=...`):

    chain                  one continuation of K tokens (no tree; the default)
    AxBxC                  a static tree: the top A draft tokens at depth 1, the top B under each
                           of them at depth 2, the top C under each of those at depth 3
    paths:P1;P2;...        a static tree given by its root-to-node paths, each a dot-joined list of
                           sibling ranks (0 is the draft's best token): paths:0;1;0.0;0.1;0.0.0
    dynamic:M,N,D          EAGLE-2's dynamic tree: D depths; at each depth the M newest nodes of
                           highest cumulative draft probability are expanded to their top M
                           children; the N most probable nodes of the whole tree are verified

A node is one draft token. Nodes are numbered breadth-first (depth by depth, siblings by rank), so
a parent always comes before its children. `parents[i]` is the node that node i continues, or
ROOT for the round's last accepted token. The target verifies every node in one forward with tree
attention: node i attends to the committed context, to its ancestors and to itself. It keeps the
longest root-to-node path whose every token equals the target's own choice after its parent.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from contracts.cli import UsageError

ROOT = -1
TREE_KINDS = ("chain", "static", "dynamic")
TREE_FORMS = "chain, AxBxC (top-k per depth), paths:0;1;0.0;..., or dynamic:M,N,D"
MAX_NODES = 64  # the largest node budget; the target's verify width grows to cover it
MAX_K = 64  # the largest K of a chain round: its verify is at most MAX_K + 1 tokens, as a tree's MAX_NODES + 1
MAX_DEPTH = 16
MAX_BRANCHING = 16
# the schedules that run tree rounds (pipelined-deferred: a look-ahead past a guessed path, whose use
# makes the next round a chain round; docs/design.md, "Token trees")
TREE_SCHEDULES = ("ordinary", "pipelined", "deferred", "pipelined-deferred")


@dataclass(frozen=True)
class TreeShape:
    """A tree to draft each round. Static trees fix `parents`/`ranks`; a dynamic tree fixes only its
    budgets, and its parents are chosen each round from the draft's probabilities."""

    kind: str
    label: str
    parents: tuple[int, ...] = ()
    ranks: tuple[int, ...] = ()
    top_m: int = 0
    node_budget: int = 0
    depth_budget: int = 0

    @property
    def node_count(self) -> int:
        """Nodes the target verifies each round (the verify width, bonus position excluded)."""
        return len(self.parents) if self.kind == "static" else self.node_budget

    @property
    def depth(self) -> int:
        """Draft forwards per round: the longest path a round can accept."""
        return max(node_depths(self.parents)) if self.kind == "static" else self.depth_budget

    def frontier_widths(self) -> tuple[int, ...]:
        """Nodes the draft feeds at each of its forwards: the root, then each depth's expanded nodes.

        A static tree feeds every node that has children; a dynamic tree feeds its M best nodes."""
        if self.kind == "dynamic":
            return (1,) + (self.top_m,) * (self.depth_budget - 1)
        depths = node_depths(self.parents)
        with_children = {p for p in self.parents if p != ROOT}
        widths = [1]
        for level in range(1, self.depth):
            widths.append(sum(1 for i in with_children if depths[i] == level))
        return tuple(widths)

    def children_per_depth(self) -> tuple[int, ...]:
        """The top-k the draft must rank at each depth (the largest sibling rank + 1)."""
        if self.kind == "dynamic":
            return (self.top_m,) * self.depth_budget
        depths = node_depths(self.parents)
        return tuple(max(r for r, d in zip(self.ranks, depths) if d == level) + 1 for level in range(1, self.depth + 1))


CHAIN = TreeShape(kind="chain", label="chain")


def node_depths(parents: tuple[int, ...] | list[int]) -> tuple[int, ...]:
    """Depth of every node (1 for the root's children), from a parents array in breadth-first order."""
    depths: list[int] = []
    for parent in parents:
        depths.append(1 if parent == ROOT else depths[parent] + 1)
    return tuple(depths)


def ancestors(parents: tuple[int, ...] | list[int], node: int) -> tuple[int, ...]:
    """The nodes on the path from the root to `node`, `node` included, root side first."""
    path = []
    while node != ROOT:
        path.append(node)
        node = parents[node]
    return tuple(reversed(path))


def lookahead_slot(tree: TreeShape) -> int:
    """pipelined-deferred: the draft-cache slot offset (from the root's p + 1) where a tree round's
    look-ahead writes, after every node the round feeds to the draft (docs/design.md, "Token trees")."""
    if tree.kind == "dynamic":
        return (tree.depth_budget - 1) * tree.top_m
    return max((parent + 1 for parent in tree.parents if parent != ROOT), default=0)


def guessed_leaf(tree: TreeShape) -> int:
    """pipelined-deferred: the static tree's node whose path the look-ahead guesses, its first node at
    the full depth (breadth-first: the rank-0 path of a top-k tree)."""
    return node_depths(tree.parents).index(tree.depth)


def lookahead_fits(tree: TreeShape) -> bool:
    """Whether a tree round's fed nodes and its look-ahead's D + 1 tokens fit one 64-bit ancestor word."""
    return tree.kind == "chain" or lookahead_slot(tree) + tree.depth + 1 <= 64


def check_lookahead(tree: TreeShape, option: str = "--tree") -> None:
    """One line when a tree cannot look ahead (`lookahead_fits`)."""
    if not lookahead_fits(tree):
        need = lookahead_slot(tree) + tree.depth + 1
        raise UsageError(
            f"{option} {tree.label} with pipelined-deferred: its fed nodes and the look-ahead's {tree.depth + 1} "
            f"tokens need {need} draft-cache slots after the root, at most 64 (one ancestor word)"
        )


def chain_shape(length: int) -> TreeShape:
    """A chain of `length` tokens written as a static tree (for tests and the simulator)."""
    parents = tuple(range(-1, length - 1))
    return TreeShape(kind="static", label="x".join(["1"] * length), parents=parents, ranks=(0,) * length)


def _bad(option: str, text: str, why: str) -> UsageError:
    return UsageError(f"{option}: tree {text!r}: {why}; valid: {TREE_FORMS}")


def _static_from_paths(paths: list[tuple[int, ...]], label: str, option: str) -> TreeShape:
    """Breadth-first parents and ranks from root-to-node paths; every prefix must be a path too."""
    known = set(paths)
    if len(known) != len(paths):
        raise _bad(option, label, "a path is given twice")
    for path in paths:
        if len(path) > 1 and path[:-1] not in known:
            raise _bad(option, label, f"path {'.'.join(map(str, path))} has no parent path")
    ordered = sorted(paths, key=lambda path: (len(path), path))
    index = {path: i for i, path in enumerate(ordered)}
    parents = tuple(ROOT if len(path) == 1 else index[path[:-1]] for path in ordered)
    ranks = tuple(path[-1] for path in ordered)
    return TreeShape(kind="static", label=label, parents=parents, ranks=ranks)


def _check_size(shape: TreeShape, text: str, option: str) -> TreeShape:
    if shape.node_count > MAX_NODES:
        raise _bad(option, text, f"{shape.node_count} nodes exceed the limit of {MAX_NODES}")
    if shape.depth > MAX_DEPTH:
        raise _bad(option, text, f"depth {shape.depth} exceeds the limit of {MAX_DEPTH}")
    if shape.kind == "static" and max(shape.ranks) + 1 > MAX_BRANCHING:
        raise _bad(option, text, f"sibling rank {max(shape.ranks)} exceeds the limit of {MAX_BRANCHING - 1}")
    return shape


def _positive_ints(pieces: list[str], text: str, option: str) -> list[int]:
    if not pieces or not all(p.strip().isdigit() and int(p) >= 1 for p in pieces):
        raise _bad(option, text, "every number must be a positive integer")
    return [int(p) for p in pieces]


def parse_tree(text: str, option: str = "--tree") -> TreeShape:
    """One tree spec -> TreeShape; bad input names the option and the valid forms."""
    text = str(text).strip()
    if text == "chain":
        return CHAIN
    kind, colon, rest = text.partition(":")
    if colon and kind == "paths":
        pieces = [p.strip() for p in rest.split(";") if p.strip()]
        if not pieces:
            raise _bad(option, text, "no path given")
        paths = []
        for piece in pieces:
            steps = piece.split(".")
            if not all(s.isdigit() for s in steps):
                raise _bad(option, text, f"path {piece!r} must be sibling ranks joined by '.'")
            paths.append(tuple(int(s) for s in steps))
        return _check_size(_static_from_paths(paths, f"paths:{';'.join(pieces)}", option), text, option)
    if colon and kind == "dynamic":
        numbers = _positive_ints(rest.split(","), text, option)
        if len(numbers) != 3:
            raise _bad(option, text, "a dynamic tree takes M,N,D (top M, N nodes, D depths)")
        top_m, node_budget, depth_budget = numbers
        if top_m > MAX_BRANCHING:
            raise _bad(option, text, f"M = {top_m} exceeds the limit of {MAX_BRANCHING}")
        if node_budget < depth_budget:
            raise _bad(option, text, f"N = {node_budget} nodes cannot reach D = {depth_budget} depths")
        shape = TreeShape(
            kind="dynamic",
            label=f"dynamic:{top_m},{node_budget},{depth_budget}",
            top_m=top_m,
            node_budget=node_budget,
            depth_budget=depth_budget,
        )
        return _check_size(shape, text, option)
    if colon or not text:
        raise _bad(option, text, "unknown tree kind")
    if not all(piece.strip().isdigit() for piece in text.split("x")):
        raise _bad(option, text, "unknown tree kind")
    widths = _positive_ints(text.split("x"), text, option)
    if len(widths) > MAX_DEPTH:
        raise _bad(option, text, f"depth {len(widths)} exceeds the limit of {MAX_DEPTH}")
    if max(widths) > MAX_BRANCHING:
        raise _bad(option, text, f"top-{max(widths)} exceeds the limit of {MAX_BRANCHING}")
    paths: list[tuple[int, ...]] = [()]
    all_paths: list[tuple[int, ...]] = []
    for width in widths:
        paths = [path + (rank,) for path in paths for rank in range(width)]
        all_paths.extend(paths)
        if len(all_paths) > MAX_NODES:
            raise _bad(option, text, f"more than {MAX_NODES} nodes")
    return _check_size(_static_from_paths(all_paths, text, option), text, option)


def parse_trees(text: str, option: str = "--trees") -> tuple[TreeShape, ...]:
    """Specs joined by '+' or ','; a bare number after ',' continues a dynamic spec's M,N,D. Repeats
    dropped, order kept. An empty item is a typo (`chain+`, `2x2,,chain`): refused."""
    if not str(text).strip():
        raise UsageError(f"{option}: no tree given; valid: {TREE_FORMS}")
    specs: list[str] = []
    for piece in re.split(r"(?=[+,])", str(text)):
        separator, body = (piece[0], piece[1:].strip()) if piece[:1] in ("+", ",") else ("", piece.strip())
        if not body:
            raise UsageError(f"{option}: empty item in {text!r}; valid: {TREE_FORMS}")
        if separator == "," and body.isdigit() and specs and specs[-1].startswith("dynamic:"):
            specs[-1] += "," + body
        else:
            specs.append(body)
    return tuple(dict.fromkeys(parse_tree(spec, option) for spec in specs))
