"""The draft heads a validation runs (contracts.heads specs), checked before any model loads: every
spec parses, the budgeted kinds have their assets, and a given profile costs every head (sim/heads.py)."""

from __future__ import annotations

from contracts.heads import check_assets, parse_heads
from contracts.names import REGIME_OF_GRAPHS_FLAG
from sim.heads import is_budgeted
from sim.profile import load_profile
from sim.sampling_costs import sampled_profile

__all__ = ["check_profile_heads", "head_cost_path", "is_budgeted", "validated_heads"]


def validated_heads(text: str, head_assets: str | None) -> tuple[str, ...]:
    """--heads as canonical labels, each budgeted kind's assets given."""
    specs = parse_heads(text, "--heads")
    for spec in specs:
        check_assets(spec, head_assets)
    return tuple(spec.label for spec in specs)


def check_profile_heads(
    profile_path: str, heads: tuple[str, ...], graphs: bool, probes: int | None, sampled: bool = False
) -> None:
    """UsageError unless the profile costs every head (budgeted ones from its heads section; sampled runs
    as sim/sampling_costs.py charges them)."""
    profile = load_profile(profile_path)
    regime = REGIME_OF_GRAPHS_FLAG["on" if graphs else "off"]
    costs = (sampled_profile(profile, regime, []) if sampled else profile).costs[regime]
    for head in heads:
        costs.head_table.check(head, probes or profile.default_probes)


def head_cost_path(profile_path, head: str, regime_paths: dict[str, str]) -> str:
    """The profile path whose timings cost `head`: the heads section where it holds the head's kind
    (a calibration scales every timing under it; a configuration uses one kind), else the regime's."""
    profile = load_profile(str(profile_path))
    kind = head.split(":")[0]
    return "heads.cost" if next(iter(profile.costs.values())).head_table.covers(head) else regime_paths[kind]
