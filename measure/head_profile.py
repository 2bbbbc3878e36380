"""The profile's `heads` section from python -m measure --heads: each head the decoder would run at
each of its budgets, and the dense head beside them, timed as the draft's dense and FlashHead heads
are (measure.benchmarks.draft_costs: one call per state, a CUDA graph in the graphs regime), so that
the simulator costs a validated head from the same profile as the rest of the draft step."""

from __future__ import annotations

import torch

from contracts.heads import parse_heads
from model.graphs import GraphedCall
from model.heads import DenseHead, heads_by_position

from .benchmarks import Bench


def head_cost_section(bench: Bench, pair, heads: str, graphs: bool, weights: str) -> dict:
    """{weights, source, measured, kinds}: the rows contracts.profile.check_heads reads."""
    model, device = bench.draft.model, bench.draft_device
    weight = model.head_weight
    generator = torch.Generator().manual_seed(0)
    states = [(torch.randn(1, weight.shape[1], generator=generator).to(device, weight.dtype),) for _ in range(4)]
    fed = torch.tensor([[5]], device=device)
    kinds: dict[str, dict] = {}
    specs = ("dense", *(spec.label for spec in parse_heads(heads, "--heads")))
    for label in dict.fromkeys(specs):
        head = DenseHead(weight) if label == "dense" else pair.head(label)
        for one in dict.fromkeys(heads_by_position(head)):
            timing = bench.time(
                GraphedCall(lambda hidden, one=one: one.argmax(hidden, fed), enabled=graphs), states, device
            )
            rows = round(one.work_ratio * one.vocab_size)
            kind = label.split(":")[0]
            kinds.setdefault(kind, {})[one.budget] = dict(timing, budget=one.budget, rows_scored=rows)
            bench.tick(f"draft head {kind}:{one.budget}")
    return {
        "weights": weights,
        "source": "python -m measure --heads",
        "measured": "device time per call, "
        + ("in a CUDA graph" if graphs else "eager")
        + ", timed as draft_costs times heads",
        "kinds": {kind: [rows[b] for b in sorted(rows, key=lambda b: b or 0)] for kind, rows in kinds.items()},
    }


def head_points(heads: str | None) -> int:
    """The timings head_cost_section makes (for the progress total): the dense head and each budget."""
    if not heads:
        return 0
    specs = parse_heads(heads, "--heads")
    return 1 + sum(len(set(spec.budgets or (None,))) for spec in specs if spec.kind != "dense")
