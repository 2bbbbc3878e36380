"""The costs of a regime as speculative sampling pays them (the profile's `sampling.costs`, from
`python -m measure --temperature T`): every target forward costs what sampling adds to the verify's
decision on top of the greedy forward, and the draft's heads cost their sampled form (q and its draw).

Why a separate view: the profile's target forward and heads are timed greedily; the sampling costs sit
in their own optional section, so a greedy simulation never reads them and old profiles stay valid.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

from contracts import UsageError

from .costs import Cost, Costs


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
    sampled.verify = SampledForward(costs.verify, parsed["verify_greedy_ms"], parsed["verify_sampled_ms"])
    if heads:
        sampled.head_dense, sampled.head_flashhead = parsed["head_dense_ms"], parsed["head_flashhead_ms"]
    notes.append(
        f"sampling costs: the verify{' and the draft heads' if heads else ''} as timed at temperature "
        f"{timed['temperature']:g}, top-k {timed['top_k'] or 'off'}, top-p {timed['top_p']:g} (the profile's "
        "sampling.costs)" + ("" if heads else "; the tree's draft heads as greedy (they rank, nothing is drawn)")
    )
    return sampled


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
    """The profile path (a what-if key) of the draft head's cost as a sampled run pays it: its sampled
    form where the profile timed it and the draft samples (`heads`, as in `sampled_costs`), else the
    greedy head's."""
    name = "head_dense_ms" if head == "dense" else "head_flashhead_ms"
    measured = ((raw.get("sampling") or {}).get("costs") or {}).get("regimes", {})
    return f"sampling.costs.regimes.{regime}.{name}" if heads and regime in measured else f"draft.{name}"
