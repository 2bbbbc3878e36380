"""The costs of a regime as speculative sampling pays them (the profile's `sampling.costs`, from
`python -m measure --temperature T`): every target forward costs what sampling adds to the verify's
decision on top of the greedy forward, and the draft's heads cost their sampled form (q and its draw):
a head kind timed sampled per budget (`--heads` as well) from those rows; else the dense head and
FlashHead from the regime's sampled ones, and the other kinds from the heads section's greedy rows,
which the notes then warn of.

Why a separate view: the profile's target forward and heads are timed greedily; the sampling costs sit
in their own optional section, so a greedy simulation never reads them and old profiles stay valid.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

from contracts import UsageError
from contracts.heads import parse_head
from contracts.profile import SAMPLED_HEAD_KINDS

from .costs import Cost, Costs
from .heads import LEGACY, HeadCosts

MEASURE_SAMPLED_HEADS = "python -m measure --temperature T --heads SPECS"


@dataclass(frozen=True)
class SampledForward:
    """The target forward under sampling: the greedy forward plus the sampled verify less the greedy
    one at the same n_tokens (never below the greedy forward)."""

    forward: Cost
    greedy: Cost
    sampled: Cost

    def device_ms(self, **axes) -> float:
        n = {"n_tokens": axes["n_tokens"]}
        return self.forward.device_ms(**axes) + max(0.0, self.sampled.device_ms(**n) - self.greedy.device_ms(**n))

    def host_ms(self, **axes) -> float:
        n = {"n_tokens": axes["n_tokens"]}
        return self.forward.host_ms(**axes) + max(0.0, self.sampled.host_ms(**n) - self.greedy.host_ms(**n))


def sampled_costs(
    costs: Costs, sampling: dict | None, regime: str, where: str, notes: list, heads: bool = True
) -> Costs:
    """`costs` as sampling pays them where the profile measured it; else `costs` unchanged and a
    warning in `notes` (the verify and heads are then charged as greedy). `heads` False: the draft's
    heads stay greedy (a token tree's draft ranks its top-k children, sim/sampled_trees.py)."""
    section = ((sampling or {}).get("costs") or {}).get("regimes", {}).get(regime)
    if section is None:
        notes.append(
            f"warning: the profile has no sampling costs for the {regime} regime (python -m measure "
            "--temperature T times them): the verify and the draft heads are charged as greedy"
        )
        return costs
    timed = sampling["costs"]
    parsed = {
        name: Cost.parse(section[name], f"{where}.sampling.costs.regimes.{regime}.{name}", f"sampling.{name}")
        for name in ("verify_greedy_ms", "verify_sampled_ms", "head_dense_ms", "head_flashhead_ms")
    }
    if "n_tokens" not in parsed["verify_sampled_ms"].axes or "n_tokens" not in parsed["verify_greedy_ms"].axes:
        raise UsageError(f"{where}: sampling.costs verify tables need the n_tokens axis")
    sampled = copy.copy(costs)
    sampled.named = {**costs.named, **{f"sampling.{name}": cost for name, cost in parsed.items()}}
    extra = parsed["verify_greedy_ms"], parsed["verify_sampled_ms"]
    sampled.verify, sampled.tree_verify = (SampledForward(c, *extra) for c in (costs.verify, costs.tree_verify))
    if heads:
        sampled.head_dense, sampled.head_flashhead = parsed["head_dense_ms"], parsed["head_flashhead_ms"]
        sampled.head_table = _sampled_head_table(costs.head_table, section.get(SAMPLED_HEAD_KINDS, {}), regime, notes)
    notes.append(
        f"sampling costs: the verify{' and the draft heads' if heads else ''} as timed at temperature "
        f"{timed['temperature']:g}, top-k {timed['top_k'] or 'off'}, top-p {timed['top_p']:g} (the profile's "
        "sampling.costs)" + ("" if heads else "; the tree's draft heads as greedy (they rank, nothing is drawn)")
    )
    return sampled


def _sampled_head_table(greedy: HeadCosts, measured: dict, regime: str, notes: list) -> HeadCosts:
    """The head kinds' costs under sampling, in `sampled_head_cost_path`'s order: the kinds timed sampled per
    budget, then (dense, FlashHead) the regime's sampled heads, then the heads section's greedy rows."""
    kinds = {kind: rows for kind, rows in greedy.kinds.items() if kind not in LEGACY}
    kinds.update(measured)
    if measured:
        notes.append(
            f"sampled draft heads: {', '.join(measured)} per budget as timed under sampling "
            f"(sampling.costs.regimes.{regime}.{SAMPLED_HEAD_KINDS})"
        )
    greedy_only = [kind for kind in kinds if kind not in measured]
    if greedy_only:
        notes.append(
            f"warning: {', '.join(greedy_only)} heads are charged the heads section's greedy costs under sampling "
            f"(the profile did not time them sampled: {MEASURE_SAMPLED_HEADS})"
        )
    return HeadCosts({"cost": {"kinds": kinds}}, MEASURE_SAMPLED_HEADS)


def sampled_profile(profile, regime: str, notes: list, heads: bool = True):
    """A view of `profile` whose `regime` costs are `sampled_costs` (the profile itself is unchanged)."""
    view = copy.copy(profile)
    sampling = profile.raw.get("sampling")
    view.costs = {
        **profile.costs,
        regime: sampled_costs(profile.costs[regime], sampling, regime, profile.source, notes, heads),
    }
    return view


def sampled_head_cost_path(raw: dict, regime: str, head: str, heads: bool = True) -> str:
    """The profile path (a what-if key) whose timings cost the draft head `head` in a sampled run, first
    found: its kind's rows timed under sampling, the regime's sampled dense or FlashHead head, the heads
    section's greedy rows of its kind, the regime's greedy head (a calibration scales the one charged).
    `heads` False (a tree's draft ranks, nothing is drawn, as in `sampled_costs`): the greedy paths only."""
    kind = parse_head(head).kind
    measured = ((raw.get("sampling") or {}).get("costs") or {}).get("regimes", {}).get(regime)
    if heads and measured is not None:
        if kind in measured.get(SAMPLED_HEAD_KINDS, {}):  # every kind's rows (a configuration runs one kind)
            return f"sampling.costs.regimes.{regime}.{SAMPLED_HEAD_KINDS}"
        if kind in LEGACY:
            return f"sampling.costs.regimes.{regime}.head_{kind}_ms"
    if kind in ((raw.get("heads") or {}).get("cost") or {}).get("kinds", {}):
        return "heads.cost"
    return f"draft.head_{kind}_ms"
