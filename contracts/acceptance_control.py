"""The acceptance-control spec (`a=RATE`, `pattern=BITS`) and what it means for token trees: one
definition for the decoder, which enforces it on synthetic weights (model.acceptance_control), and
the simulator, which predicts from it (`python -m sim --acceptance a=RATE`).

Under `a=RATE` every output position is accepted i.i.d. with probability a. With a tree, at each
depth the target's token is among a node's top-k drafted children with probability 1 - (1 - a)^k,
i.i.d. per position: rank 0 uses the chain's bits and every further rank its own stream at rate a.
A pattern sets rank 0 only.
"""

from __future__ import annotations

from contracts.cli import UsageError


def parse_spec(spec: str) -> tuple[str, float | None, list[int] | None]:
    """`a=0.43` (i.i.d. per-token acceptance) or `pattern=1,1,0` (bits per position, repeated)."""
    kind, _, value = spec.partition("=")
    try:
        if kind == "a":
            rate = float(value)
            if 0.0 <= rate <= 1.0:
                return "iid", rate, None
        elif kind == "pattern":
            bits = [int(b) for b in value.split(",")]
            if bits and set(bits) <= {0, 1}:
                return "pattern", None, bits
    except ValueError:
        pass
    raise UsageError(
        f"bad acceptance control {spec!r}; valid: a=RATE with RATE in [0, 1] (e.g. a=0.43), "
        "or pattern=BITS with comma-separated 0/1 (e.g. pattern=1,1,0)"
    )


def top_k_rate(a: float, k: int) -> float:
    """The rate at which a node's top-k children hold the target's token under control a=A."""
    return 1.0 - (1.0 - a) ** k
