"""The profile's `heads` section from python -m measure --heads: each head the decoder would run at
each of its budgets, and the dense head beside them, timed as the draft's dense and FlashHead heads
are (measure.benchmarks.draft_costs: one call per state, a CUDA graph in the graphs regime), so that
the simulator costs a validated head from the same profile as the rest of the draft step. With
--temperature as well, measure/sampling_costs.py times the same heads' sampled step into the same rows."""

from __future__ import annotations

import torch

from contracts.heads import parse_heads
from model.graphs import GraphedCall
from model.heads import DenseHead, heads_by_position

from .benchmarks import Bench


def budget_heads(pair, heads: str) -> list[tuple[str, object]]:
    """(kind, head) for the dense head and each budget of the head specs `heads` (each kind's budget
    once; a spec with budgets per position gives one head per budget)."""
    chosen = {("dense", None): DenseHead(pair.draft.model.head_weight)}
    for spec in parse_heads(heads, "--heads"):
        if spec.kind != "dense":
            for one in heads_by_position(pair.head(spec)):
                chosen.setdefault((spec.kind, one.budget), one)
    return [(kind, head) for (kind, _), head in chosen.items()]


def cost_kinds(bench: Bench, heads: list[tuple[str, object]], time_head, what: str) -> dict:
    """{kind: rows in increasing budget} (contracts.profile's cost rows): time_head(head)'s timing of each
    head with its budget and the head rows it scores."""
    kinds: dict[str, dict] = {}
    for kind, head in heads:
        rows = round(head.work_ratio * head.vocab_size)
        kinds.setdefault(kind, {})[head.budget] = dict(time_head(head), budget=head.budget, rows_scored=rows)
        bench.tick(f"{what} {kind}:{head.budget}")
    return {kind: [rows[b] for b in sorted(rows, key=lambda b: b or 0)] for kind, rows in kinds.items()}


def head_cost_section(bench: Bench, heads: list[tuple[str, object]], graphs: bool, weights: str) -> dict:
    """{weights, source, measured, kinds}: the rows contracts.profile.check_heads reads."""
    model, device = bench.draft.model, bench.draft_device
    weight = model.head_weight
    generator = torch.Generator().manual_seed(0)
    states = [(torch.randn(1, weight.shape[1], generator=generator).to(device, weight.dtype),) for _ in range(4)]
    fed = torch.tensor([[5]], device=device)

    def greedy(head):
        return bench.time(GraphedCall(lambda hidden: head.argmax(hidden, fed), enabled=graphs), states, device)

    return {
        "weights": weights,
        "source": "python -m measure --heads",
        "measured": "device time per call, "
        + ("in a CUDA graph" if graphs else "eager")
        + ", timed as draft_costs times heads",
        "kinds": cost_kinds(bench, heads, greedy, "draft head"),
    }


def head_points(heads: str | None) -> int:
    """The timings head_cost_section makes (for the progress total): the dense head and each budget."""
    if not heads:
        return 0
    specs = parse_heads(heads, "--heads")
    budgets = {(spec.kind, budget) for spec in specs if spec.kind != "dense" for budget in spec.budgets or (None,)}
    return 1 + len(budgets)
