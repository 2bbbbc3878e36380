"""Costs read from one regime of a profile, interpolated where they were measured on a grid.

A cost is a timing (`median_ms`, optional `host_ms`) or a table of timings over axes such as
`n_tokens`, `context`, `prompt_len`, `probes` (contracts.profile). Interpolation is piecewise linear
along each axis and extrapolates linearly from the two nearest points, never below zero, and never
below the largest point's value past it (nor above the smallest point's value before it): more work
does not cost less, so a slope that falls at an end of the measured range is noise (a launch-bound
cost measured at two sizes), which extrapolation would multiply.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from contracts import UsageError
from contracts.heads import parse_head
from contracts.profile import OPTIONAL_COSTS, REQUIRED_COSTS, TREE_ATTENTION_COSTS, cost_grid

from .heads import HeadCosts

MEMO_ENTRIES = 100_000  # lookups remembered per cost (a few MB); repeated contexts hit it
# a measured point is noisy where its p90 is this many times its p10 and NOISY_MS above it: its median may
# come from a burst of host or device activity, which then moves every prediction that uses it
NOISY_SPREAD = 5.0
NOISY_MS = 0.1


def _interp_1d(xs: list[float], ys: list[float], x: float) -> float:
    if len(xs) == 1:
        return ys[0]
    i = bisect.bisect_left(xs, x)
    i = min(max(i, 1), len(xs) - 1)
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    value = y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    if x > xs[-1]:
        value = max(value, ys[-1])
    elif x < xs[0]:
        value = min(value, ys[0])
    return max(0.0, value)


def _noisiest(raw: dict, name: str, axes: tuple[str, ...]) -> str | None:
    """The warning for the measured point (with p10_ms and p90_ms) whose spread is widest past
    NOISY_SPREAD and NOISY_MS, or None."""
    spreads = []
    for point in raw.get("points", [raw]):
        low, high = point.get("p10_ms"), point.get("p90_ms")
        timed = isinstance(low, (int, float)) and isinstance(high, (int, float)) and low > 0
        if timed and high >= NOISY_SPREAD * low and high - low >= NOISY_MS:
            spreads.append((high / low, low, high, point))
    if not spreads:
        return None
    ratio, low, high, point = max(spreads, key=lambda spread: spread[0])
    where = " at " + ", ".join(f"{axis}={point[axis]:g}" for axis in axes) if axes else ""
    return (
        f"{name}: noisy measurement{where}: p10 {low:.4g} ms, median {point['median_ms']:.4g}, p90 {high:.4g} "
        f"({ratio:.1f}x): measure it again"
    )


@dataclass(frozen=True)
class Cost:
    """One operation's cost: `device_ms(**axes)` and `host_ms(**axes)` at any point."""

    name: str
    axes: tuple[str, ...]
    grid: dict  # tuple of axis values -> (median_ms, host_ms)
    values: tuple[tuple[float, ...], ...]  # sorted values per axis
    flat_up_to: dict  # axis -> value up to which the cost stays at its largest measured point
    memo: dict
    outside: dict  # axis -> (lowest, highest) value queried outside the measured range
    noisy: str | None  # the warning for its noisiest measured point, if one is noisy

    @classmethod
    def parse(cls, raw, where: str, name: str, flat_up_to: dict | None = None) -> Cost:
        axes, grid = cost_grid(raw, where)
        values = tuple(tuple(sorted({k[d] for k in grid})) for d in range(len(axes)))
        return cls(name, axes, grid, values, flat_up_to or {}, {}, {}, _noisiest(raw, name, axes))

    def _measured(self, query: tuple[float, ...]) -> tuple[float, ...]:
        """The query with flat axes held at their last measured point, and every value still outside
        the measured range recorded (it is then extrapolated linearly)."""
        held = []
        for axis, xs, x in zip(self.axes, self.values, query):
            if xs[-1] < x <= self.flat_up_to.get(axis, xs[-1]):
                x = xs[-1]
            if not xs[0] <= x <= xs[-1]:
                low, high = self.outside.get(axis, (x, x))
                self.outside[axis] = (min(low, x), max(high, x))
            held.append(x)
        return tuple(held)

    def warnings(self) -> list[str]:
        """One line per axis queried outside what was measured, and one if the cost was used and a
        measured point of it is noisy."""
        lines = [
            f"{self.name}: {axis} {low:g}..{high:g} was asked, measured {xs[0]:g}..{xs[-1]:g}: extrapolated"
            for axis, xs in zip(self.axes, self.values)
            if axis in self.outside
            for low, high in [self.outside[axis]]
        ]
        return lines + ([self.noisy] if self.noisy and self.memo else [])

    def _at(self, which: int, query: tuple[float, ...], prefix: tuple = ()) -> float:
        """Interpolated along each axis in turn between the two grid values around the query (the
        only two that `_interp_1d` uses): 2^axes grid points per lookup, not the whole grid."""
        d = len(prefix)
        if d == len(self.axes):
            return self.grid[prefix][which]
        xs = self.values[d]
        if len(xs) > 2:
            i = min(max(bisect.bisect_left(xs, query[d]), 1), len(xs) - 1)
            xs = xs[i - 1 : i + 1]
        ys = [self._at(which, query, prefix + (x,)) for x in xs]
        return _interp_1d(list(xs), ys, query[d])

    def _lookup(self, which: int, kw: dict) -> float:
        try:
            query = tuple(float(kw[a]) for a in self.axes)
        except KeyError as missing:
            raise UsageError(f"cost needs axis {missing} (has {list(self.axes)})") from None
        key = (which, query)
        if key not in self.memo:
            if len(self.memo) >= MEMO_ENTRIES:  # long generations ask a new context every step
                self.memo.clear()
            self.memo[key] = self._at(which, self._measured(query))
        return self.memo[key]

    def device_ms(self, **axes) -> float:
        return self._lookup(0, axes)

    def host_ms(self, **axes) -> float:
        return self._lookup(1, axes)


class Costs:
    """The costs of one regime (`graphs` or `eager`), named for the operation they time."""

    def __init__(self, regime: dict, where: str, fixed_width: int | None = None, heads: dict | None = None):
        """`fixed_width`: the rows every target decode forward runs (the decoder pads to it on GPUs),
        so the target forward costs the same for every token count up to it. `heads`: the profile's
        heads section, which costs every head spec of the kinds it holds (sim/heads.py)."""
        parsed = {}
        padded = ("target.forward_ms", TREE_ATTENTION_COSTS["target.forward_ms"])  # the fixed-width forwards
        for group, names in REQUIRED_COSTS.items():
            for name in names:
                parsed[f"{group}.{name}"] = self._parse(regime, where, group, name, padded, fixed_width)
        for group, names in OPTIONAL_COSTS.items():
            for name in names:
                if name in regime[group]:
                    parsed[f"{group}.{name}"] = self._parse(regime, where, group, name, padded, fixed_width)
        self.named = parsed
        self.verify = parsed["target.forward_ms"]
        self.target_prefill = parsed["target.prefill_ms"]
        self.draft_body = parsed["draft.body_ms"]
        self.head_dense = parsed["draft.head_dense_ms"]
        self.head_flashhead = parsed["draft.head_flashhead_ms"]
        self.draft_prefill = parsed["draft.prefill_ms"]
        self.item = parsed["host.item_ms"]
        self.copy_token = parsed["host.copy_token_ms"]
        self.event_sync = parsed["host.event_sync_ms"]
        self.bookkeeping = parsed["host.round_bookkeeping_ms"]
        self.read_gap = parsed.get("host.read_gap_ms")  # None in profiles measured before it was
        self.lookup = parsed.get("draft.lookup_ms")  # the drafters' costs, where the profile measured them
        self.early_exit_body = parsed.get("draft.early_exit_body_ms")
        self.early_exit_head = parsed.get("draft.early_exit_head_ms")
        # a tree round's verify and frontier steps under the tree rule, where the profile measured them
        self.tree_verify = parsed.get(TREE_ATTENTION_COSTS["target.forward_ms"], self.verify)
        self.tree_body = parsed.get(TREE_ATTENTION_COSTS["draft.body_ms"], self.draft_body)
        self.head_table = HeadCosts(heads)

    @staticmethod
    def _parse(regime: dict, where: str, group: str, name: str, padded: tuple, fixed_width: int | None) -> Cost:
        path = f"{group}.{name}"
        flat = {"n_tokens": fixed_width} if path in padded and fixed_width else None
        return Cost.parse(regime[group][name], f"{where}.{path}", path, flat)

    def check_drafters(self, drafters: tuple[str, ...]) -> None:
        """UsageError unless the profile carries the costs of every drafter in `drafters`."""
        needs = {"prompt-lookup": ("lookup",), "early-exit": ("early_exit_body", "early_exit_head")}
        for drafter in drafters:
            for name in needs.get(drafter, ()):
                if getattr(self, name) is None:
                    raise UsageError(
                        f"drafter {drafter}: the profile has no draft.{name}_ms (python -m measure "
                        "times prompt lookup always, and early exit with --early-exit-layers L)"
                    )

    def warnings(self) -> list[str]:
        """Warnings for every cost asked outside its measured grid so far, and for noisy ones used."""
        return [line for cost in self.named.values() for line in cost.warnings()]

    def head(self, head: str) -> Cost:
        return self.head_dense if head == "dense" else self.head_flashhead

    def head_at(self, head: str, probes: int, position: int) -> tuple[float, float]:
        """(device_ms, host_ms) of the head spec `head` at draft position `position` (0-based)."""
        if self.head_table.covers(head):
            return self.head_table.at(head, probes, position)
        spec = parse_head(head)
        cost, budget = self.head(spec.kind), spec.budget(position) or probes
        return cost.device_ms(probes=budget), cost.host_ms(probes=budget)
