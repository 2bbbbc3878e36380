"""Costs read from one regime of a profile, interpolated where they were measured on a grid.

A cost is a timing (`median_ms`, optional `host_ms`) or a table of timings over axes such as
`n_tokens`, `context`, `prompt_len`, `probes` (contracts.profile). Interpolation is piecewise linear
along each axis and extrapolates linearly from the two nearest points, never below zero.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass

from contracts import UsageError
from contracts.profile import REQUIRED_COSTS, cost_grid


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
        axes, grid = cost_grid(raw, where)
        values = tuple(tuple(sorted({k[d] for k in grid})) for d in range(len(axes)))
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
            raise UsageError(f"cost needs axis {missing} (has {list(self.axes)})") from None
        key = (which, query)
        if key not in self.memo:
            self.memo[key] = self._at(which, query)
        return self.memo[key]

    def device_ms(self, **axes) -> float:
        return self._lookup(0, axes)

    def host_ms(self, **axes) -> float:
        return self._lookup(1, axes)


class Costs:
    """The costs of one regime (`graphs` or `eager`), named for the operation they time."""

    def __init__(self, regime: dict, where: str):
        parsed = {f"{group}.{name}": Cost.parse(regime[group][name], f"{where}.{group}.{name}")
                  for group, names in REQUIRED_COSTS.items() for name in names}
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
