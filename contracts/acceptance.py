"""Acceptance control specs: the acceptance that synthetic-weight runs impose, read alike by the decoder
(`python -m model --acceptance`, `python -m validate --acceptance`: model/acceptance_control.py) and
the simulator (`python -m sim --acceptance`: sim/acceptance.py), so both draw from the same numbers.

    a=RATE                 every proposal is accepted with probability RATE (i.i.d.)
    a=R1,R2,...            the proposal at draft position j of its round with probability Rj (the last
                           repeats; position K + 1 is the look-ahead's guess of the token after the block)
    pattern=BITS           bit per output position, repeated (decoder tests: 1,1,0)
    curve:a=...            per draft head: the rates times that head's agreement with the dense draft per
                           draft position, from the profile's `heads` section (sim/heads.py), so each head
                           kind's acceptance differs per position as on real weights; the dense head keeps
                           the rates. `for_head` resolves it into a plain a=R1,R2,... per head.

With a token tree under `a=RATE`, at each depth the target's token is among a node's top-k drafted
children with probability 1 - (1 - a)^k (`top_k_rate`), i.i.d. per position: rank 0 uses the chain's
bits and every further rank its own stream at rate a. A pattern sets rank 0 only.
"""

from __future__ import annotations

from dataclasses import dataclass

from contracts.cli import UsageError

CONTROL_FORMS = (
    "a=RATE with RATE in [0, 1] (e.g. a=0.43), a=R1,R2,... per draft position (e.g. a=0.8,0.7,0.6), "
    "pattern=BITS with comma-separated 0/1 (e.g. pattern=1,1,0), or curve:a=... (the rates times each "
    "head's measured agreement per draft position)"
)
CURVE = "curve:"


@dataclass(frozen=True)
class ControlSpec:
    """Rates per draft position (one: i.i.d.), or a bit pattern; `curve`: still to be scaled per head."""

    rates: tuple[float, ...] = ()
    pattern: tuple[int, ...] = ()
    curve: bool = False

    def rate(self, position: int) -> float:
        """The acceptance probability at draft position `position` (0-based); the last rate repeats."""
        return self.rates[min(position, len(self.rates) - 1)]

    @property
    def per_position(self) -> bool:
        return len(self.rates) > 1

    @property
    def label(self) -> str:
        """The spec in canonical form (parses back to the same numbers)."""
        if self.pattern:
            return "pattern=" + ",".join(map(str, self.pattern))
        return (CURVE if self.curve else "") + "a=" + ",".join(map(repr, self.rates))

    def for_head(self, agreement: list[float]) -> ControlSpec:
        """The rates at draft positions 1..len(agreement), each times the head's agreement there (the
        simulator's model of a head's greedy acceptance, sim/heads.py), rounded to 6 decimals; a
        repeated last rate is written once (the last rate repeats)."""
        rates = [round(self.rate(j) * agree, 6) for j, agree in enumerate(agreement)]
        while len(rates) > 1 and rates[-1] == rates[-2]:
            rates.pop()
        return ControlSpec(tuple(rates))


def parse_control(text: str, option: str = "--acceptance") -> ControlSpec:
    """One acceptance-control spec -> ControlSpec; bad input names the option and the valid forms."""
    body = str(text).strip()
    curve = body.startswith(CURVE)
    kind, _, value = body.removeprefix(CURVE).partition("=")
    try:
        if kind == "a":
            rates = tuple(float(r) for r in value.split(","))
            if all(0.0 <= r <= 1.0 for r in rates):
                return ControlSpec(rates=rates, curve=curve)
        elif kind == "pattern" and not curve:
            bits = tuple(int(b) for b in value.split(","))
            if set(bits) <= {0, 1}:
                return ControlSpec(pattern=bits)
    except ValueError:
        pass
    raise UsageError(f"{option}: bad acceptance control {text!r}; valid: {CONTROL_FORMS}")


def is_control(text: str) -> bool:
    """Whether `text` is written in this grammar (a=..., pattern=..., curve:...), not another source's."""
    return str(text).strip().removeprefix(CURVE).partition("=")[0] in ("a", "pattern")


def top_k_rate(a: float, k: int) -> float:
    """The rate at which a node's top-k children hold the target's token under control a=A."""
    return 1.0 - (1.0 - a) ** k
