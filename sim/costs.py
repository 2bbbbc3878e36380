"""Costs read from one regime of a profile, interpolated where they were measured on a grid.

A cost is a timing (`median_ms`, optional `host_ms`) or a table of timings over axes such as
`n_tokens`, `context`, `prompt_len`, `probes` (docs/contracts.md). Interpolation is piecewise linear
along each axis and extrapolates linearly from the two nearest points, never below zero.
"""
from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

from .errors import SimInputError

AXES = ("n_tokens", "context", "prompt_len", "probes")
TIMING_FIELDS = ("median_ms", "p10_ms", "p90_ms", "n", "host_ms")


def _finite(value, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise SimInputError(f"{where}: expected a finite number, got {value!r}")
    if value < 0:
        raise SimInputError(f"{where}: must not be negative, got {value!r}")
    return float(value)


def _interp_1d(xs: list[float], ys: list[float], x: float) -> float:
    if len(xs) == 1:
        return ys[0]
    i = bisect.bisect_left(xs, x)
    i = min(max(i, 1), len(xs) - 1)
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return max(0.0, y0 + (y1 - y0) * (x - x0) / (x1 - x0))


@dataclass(frozen=True)
class Cost:
    """One operation's cost: `device_ms(**axes)` and `host_ms(**axes)` at any point."""

    axes: tuple[str, ...]
    grid: dict  # tuple of axis values -> (median_ms, host_ms)
    values: tuple[tuple[float, ...], ...]  # sorted values per axis
    memo: dict

    @classmethod
    def parse(cls, raw, where: str) -> "Cost":
        if not isinstance(raw, dict):
            raise SimInputError(f"{where}: expected a timing or a table object")
        points = raw.get("points", [raw])
        if not isinstance(points, list) or not points:
            raise SimInputError(f"{where}.points: expected a non-empty list")
        axes = tuple(a for a in AXES if a in points[0])
        grid = {}
        for i, point in enumerate(points):
            here = f"{where}.points[{i}]" if "points" in raw else where
            if not isinstance(point, dict) or tuple(a for a in AXES if a in point) != axes:
                raise SimInputError(f"{here}: every point needs the same axes {list(axes)}")
            if "median_ms" not in point:
                raise SimInputError(f"{here}: missing median_ms")
            key = tuple(_finite(point[a], f"{here}.{a}") for a in axes)
            grid[key] = (_finite(point["median_ms"], f"{here}.median_ms"),
                         _finite(point.get("host_ms", 0.0), f"{here}.host_ms"))
        values = tuple(tuple(sorted({k[d] for k in grid})) for d in range(len(axes)))
        if len(grid) != math.prod(len(v) for v in values):
            raise SimInputError(f"{where}: table points must form a full grid over {list(axes)}")
        return cls(axes, grid, values, {})

    def _at(self, which: int, query: tuple[float, ...], prefix: tuple = ()) -> float:
        d = len(prefix)
        if d == len(self.axes):
            return self.grid[prefix][which]
        xs = self.values[d]
        ys = [self._at(which, query, prefix + (x,)) for x in xs]
        return _interp_1d(list(xs), ys, query[d])

    def _lookup(self, which: int, kw: dict) -> float:
        try:
            query = tuple(float(kw[a]) for a in self.axes)
        except KeyError as missing:
            raise SimInputError(f"cost needs axis {missing} (has {list(self.axes)})") from None
        key = (which, query)
        if key not in self.memo:
            self.memo[key] = self._at(which, query)
        return self.memo[key]

    def device_ms(self, **axes) -> float:
        return self._lookup(0, axes)

    def host_ms(self, **axes) -> float:
        return self._lookup(1, axes)


REQUIRED = {
    "target": ("forward_ms", "prefill_ms"),
    "draft": ("body_ms", "head_dense_ms", "head_flashhead_ms", "prefill_ms"),
    "host": ("item_ms", "copy_token_ms", "event_sync_ms", "round_bookkeeping_ms"),
}


class Costs:
    """The costs of one regime (`graphs` or `eager`), named for the operation they time."""

    def __init__(self, regime: dict, where: str):
        if not isinstance(regime, dict):
            raise SimInputError(f"{where}: expected an object")
        parsed = {}
        for group, names in REQUIRED.items():
            section = regime.get(group)
            if not isinstance(section, dict):
                raise SimInputError(f"{where}.{group}: missing section")
            for name in names:
                if name not in section:
                    raise SimInputError(f"{where}.{group}.{name}: missing cost")
                parsed[f"{group}.{name}"] = Cost.parse(section[name], f"{where}.{group}.{name}")
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

    def head(self, head: str) -> Cost:
        return self.head_dense if head == "dense" else self.head_flashhead
