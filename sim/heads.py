"""Draft head specs in the simulator (contracts.heads): each head's cost and its agreement with the dense
draft, per draft position, from the profile's optional `heads` section (contracts.profile.check_heads).

Cost: the rows of the spec's kind (python -m measure.head_cost: the head's device time inside a CUDA
graph, what the draft step pays for it), linear in the budget between measured budgets; the dense head
has one row. Where the section holds a kind, every head of that kind is costed from it (the dense head
too), so that heads are ranked on one measurement. Where the section lacks dense or FlashHead heads,
they keep the regime's own head costs (FlashHead at each position's probes). A kind the profile does
not cost, or a budget outside the measured range, is refused.

Acceptance (greedy): a head's proposal is accepted where the dense draft's would be and the head's
token is the dense draft's:

    acceptance_head(j) = acceptance_dense(j) x agreement(j)

with agreement(j) the head's agreement with the dense draft at draft position j given that its tokens
agreed at positions 1..j-1 (until they differ, the head drafts on the dense draft's own states). Two
approximations: a token other than the dense draft's is never the target's, and agreement is
independent of the dense token's acceptance (both tend to hold on confident states), so each makes the
prediction a lower bound. agreement(j) comes, first found first:
  1. the pooled agreement of its kind at budget(j) over every held-out state of the dense trajectory,
     linear in log2(budget) between measured budgets (hundreds of states per budget: the level), times
     the position's lift from a measured per-position curve of the same kind (this spec's own, else
     the one whose first budget is nearest). Pooled states are all states, but position j > 1 is only
     reached after j - 1 agreements, on easier states: on real Gemma 32 of 33 curve positions 2..4
     agree more than the pooled rate at their budget. A curve has tens of rounds per position, so its
     lift at j, measured / expected with no lift, is shrunk towards 1 by SHAPE_PRIOR_ROUNDS
     pseudo-rounds: a position reached by few agreeing rounds stays near the flat pooled rate. The
     `curve:a=...` control (head_control) and validate read these same numbers;
  2. the measured per-position curve of this very spec, prefix(j) / prefix(j-1) with prefix(0) = 1
     (where the pooled rows do not cover its budgets), past its end its last value;
  3. FlashHead only: the profile's r(p) (flashhead.agreement) at p = budget(j).
"""

from __future__ import annotations

import math
import random

from contracts import UsageError
from contracts.acceptance import ControlSpec
from contracts.heads import HeadSpec, parse_head, parse_heads

from .report import render

LEGACY = ("dense", "flashhead")  # heads the regime's own costs describe (contracts.names.HEADS)
MEASURE_COSTS = "python -m measure.head_cost, then python -m measure.profile_heads --cost"
MEASURE_AGREEMENT = "python -m measure.head_agreement, then python -m measure.profile_heads --agreement"
SHAPE_PRIOR_ROUNDS = 10  # pseudo-rounds at no lift: a position reached by 10 agreeing rounds moves halfway


def _between(xs: list[float], ys: list[float], x: float) -> float | None:
    """Linear between the two measured points around x; None outside the measured range."""
    if not xs[0] <= x <= xs[-1]:
        return None
    for x0, x1, y0, y1 in zip(xs, xs[1:], ys, ys[1:]):
        if x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return ys[0]


class HeadCosts:
    """The section's head costs per kind: `at(spec, probes, position)` in ms (device, host). `measured_by`:
    the commands that time more (named when a head cannot be costed)."""

    def __init__(self, section: dict | None, measured_by: str = MEASURE_COSTS):
        self.kinds = (section or {}).get("cost", {}).get("kinds", {})
        self.measured_by = measured_by

    def covers(self, label: str) -> bool:
        return parse_head(label).kind in self.kinds

    def check(self, label: str, probes: int) -> None:
        """UsageError unless every position of the spec can be costed."""
        spec = parse_head(label)
        if spec.kind not in self.kinds:
            if spec.kind in LEGACY:  # the regime's own dense head, or its FlashHead table over probes
                return
            have = ", ".join(self.kinds) or "none"
            raise UsageError(
                f"head {label!r}: the profile has no cost for {spec.kind} heads (costed kinds: {have}); "
                f"{self.measured_by} adds them"
            )
        for budget in _budgets(spec, probes):
            self._row_ms(spec, budget)

    def at(self, label: str, probes: int, position: int) -> tuple[float, float]:
        spec = parse_head(label)
        return self._row_ms(spec, spec.budget(position) or probes)

    def _row_ms(self, spec: HeadSpec, budget: int) -> tuple[float, float]:
        rows = self.kinds[spec.kind]
        if spec.kind == "dense":
            return rows[0]["median_ms"], rows[0].get("host_ms", 0.0)
        xs = [row["budget"] for row in rows]
        device = _between(xs, [row["median_ms"] for row in rows], budget)
        if device is None:
            raise UsageError(
                f"head {spec.label!r}: budget {budget} is outside the {xs[0]}..{xs[-1]} the profile costs for "
                f"{spec.kind} heads; {self.measured_by} measures it"
            )
        return device, _between(xs, [row.get("host_ms", 0.0) for row in rows], budget)


def _budgets(spec: HeadSpec, probes: int) -> tuple[int, ...]:
    return spec.budgets or ((probes,) if spec.kind == "flashhead" else ())


def agreement_per_position(profile, label: str, probes: int, K: int) -> tuple[list[float], str]:
    """The head's agreement with the dense draft at positions 1..K+1 (given agreement so far), and which
    of the sources in the module's docstring gave it; UsageError where none can."""
    spec = parse_head(label)
    section = (profile.raw.get("heads") or {}).get("agreement", {})
    budgets = [spec.budget(j) or probes for j in range(K + 1)]
    pooled = section.get("pooled", {}).get(spec.kind)
    curves = section.get("curves", {})
    level = _pooled_at(pooled, budgets) if pooled else None
    if level is not None:
        how = f"pooled agreement of {spec.kind} per budget ({section['weights']} weights)"
        shaped = _shaping_curve(curves, spec, pooled, probes)
        if shaped is None:
            return level, how
        name, lifts = shaped
        rates = [min(1.0, rate * lift) for rate, lift in zip(level, _extend(lifts, K))]
        rounds = curves[name][0]["n"]
        return rates, f"{how}, x the lift per position of {name}'s measured curve ({rounds} rounds)"
    curve = curves.get(spec.label)
    if curve:
        rates, before = [], 1.0
        for row in curve:
            rates.append(min(1.0, row["prefix"] / before) if before > 0 else 0.0)
            before = row["prefix"]
        return _extend(rates, K), f"its measured per-position curve ({section['weights']} weights)"
    if pooled:
        raise UsageError(
            f"head {label!r}: the profile's {spec.kind} agreement is measured at budgets "
            f"{pooled[0]['budget']}..{pooled[-1]['budget']} only; {MEASURE_AGREEMENT} measures more"
        )
    if spec.kind == "flashhead" and profile.agreement is not None:
        return [profile.agreement_at(b) for b in budgets], "FlashHead's r(p) curve of the profile"
    raise UsageError(f"head {label!r}: the profile has no agreement for {spec.kind} heads; {MEASURE_AGREEMENT}")


def _pooled_at(pooled: list[dict], budgets: list[int]) -> list[float] | None:
    """The pooled agreement at each budget, linear in log2(budget); None if one is outside the rows."""
    xs = [math.log2(row["budget"]) for row in pooled]
    rates = [_between(xs, [row["agree"] for row in pooled], math.log2(b)) for b in budgets]
    return None if None in rates else rates


def _shaping_curve(curves: dict, spec: HeadSpec, pooled: list[dict], probes: int):
    """(label, lift per position) of the curve that shapes `spec`: its own, else the same kind's whose
    first budget is nearest in log2; None where no curve of the kind has pooled rows at its budgets."""
    candidates = []
    for name, rows in curves.items():
        other = parse_head(name)
        if other.kind != spec.kind:
            continue
        level = _pooled_at(pooled, [other.budget(j) or probes for j in range(len(rows))])
        if level is None or rows[0]["prefix"] <= 0:
            continue
        distance = abs(math.log2(other.budget(0) or probes) - math.log2(spec.budget(0) or probes))
        candidates.append((name != spec.label, distance, name, _lifts(rows, level)))
    if not candidates:
        return None
    _, _, name, lifts = min(candidates)
    return name, lifts


def _lifts(rows: list[dict], level: list[float]) -> list[float]:
    """Per position: the curve's agreement given agreement so far over what it would be with no lift
    (its first position's, moved by the pooled rates' change of budget), shrunk towards 1 by
    SHAPE_PRIOR_ROUNDS; position 1 is 1 by construction."""
    n, first = rows[0]["n"], rows[0]["prefix"]
    lifts = [1.0]
    for j in range(1, len(rows)):
        reached, agreed = n * rows[j - 1]["prefix"], n * rows[j]["prefix"]
        expected = first * level[j] / level[0] if level[0] > 0 else 0.0
        if expected <= 0:
            lifts.append(1.0)
            continue
        lifts.append((agreed + SHAPE_PRIOR_ROUNDS * expected) / ((reached + SHAPE_PRIOR_ROUNDS) * expected))
    return lifts


def _extend(rates: list[float], K: int) -> list[float]:
    return [rates[min(j, len(rates) - 1)] for j in range(K + 1)]


class AgreementPerPosition:
    """The dense draft's acceptance, each position's match kept with the head's agreement there."""

    def __init__(self, source, rates: list[float], label: str):
        self.source, self.rates, self.label = source, rates, label
        self.generations = getattr(source, "generations", None)

    def describe(self) -> str:
        shown = ",".join(f"{r:.3f}" for r in self.rates)
        return f"{self.source.describe()}, x {self.label}'s agreement per position {shown}"

    def mean_rate(self) -> float:
        return self.source.mean_rate() * sum(self.rates) / len(self.rates)

    def stream(self, generation, seed: int):
        inner = self.source.stream(generation, seed)
        rng = random.Random(f"head-agreement/{seed}/{generation.prompt_id}")
        rates = self.rates

        def block(pos: int, K: int, drafter: str | None = None) -> list[bool]:
            return [
                match and rng.random() < rates[min(j, len(rates) - 1)] for j, match in enumerate(inner(pos, K, drafter))
            ]

        return block


def head_control(spec: ControlSpec, profile, label: str, probes: int, K: int) -> ControlSpec:
    """A `curve:a=...` acceptance control resolved for one head at K: its rates at draft positions 1..K+1
    times the head's agreement there (as `head_source` models it; the dense head agrees everywhere).
    The decoder (python -m validate) and the simulator both take the head's rates from here."""
    agreement = [1.0] * (K + 1) if label == "dense" else agreement_per_position(profile, label, probes, K)[0]
    return spec.for_head(agreement)


def head_source(source, label: str, probes: int, K: int, profile, notes: list):
    """The acceptance a budgeted head sees: the source's (the dense draft's) times its agreement."""
    head = getattr(source, "head", "dense")
    if head == label:  # a trace recorded with this very head (validate): its outcomes, replayed as they are
        notes.append(f"{label}: acceptance replayed from a trace recorded with this head")
        return source
    if head != "dense":
        raise UsageError(
            f"head {label!r}: its acceptance is the dense draft's times its agreement, but the trace was recorded "
            f"with the {head} head; give a trace of the dense head or a synthetic acceptance"
        )
    rates, how = agreement_per_position(profile, label, probes, K)
    notes.append(f"{label}: acceptance = the source's x agreement per position from {how}")
    return AgreementPerPosition(source, rates, label)


def is_budgeted(label: str) -> bool:
    """Heads this module models (every spec but plain `dense` and `flashhead`)."""
    return label not in LEGACY


def sweep_values(text: str, label: str) -> list[str]:
    """A head sweep's points: one head spec each (joined by '+', budgets per position by ',')."""
    return [spec.label for spec in parse_heads(text, label)]


def ranking(rows: list[dict]) -> str:
    """Per schedule, the swept heads from the highest predicted tok/s down."""
    by_schedule: dict = {}
    for row in rows:
        if row["schedule"] != "baseline":
            by_schedule.setdefault(row["schedule"], []).append(row)
    lines = []
    for schedule, group in by_schedule.items():
        for rank, row in enumerate(sorted(group, key=lambda r: -r["decode_tok_s"]), 1):
            accepted = "-" if row["acceptance"] is None else f"{row['acceptance']:.3f}"
            head_ms = row["phase_ms"]["draft_head"] / max(1, row["draft_steps"])
            cells = [f"{row['decode_tok_s']:.1f}", f"{row['speedup']:.3f}", accepted, f"{1000 * head_ms:.1f}"]
            lines.append([schedule, str(rank), row["head"], *cells])
    headers = ["schedule", "rank", "head", "tok/s", "speedup", "acc/prop", "head us/step"]
    return "heads ranked by predicted tok/s\n" + render(headers, lines)
