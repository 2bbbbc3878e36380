"""`--acceptance curve:a=...`: each head's acceptance control per draft position, from the measured
agreement curves of the profile's `heads` section (sim/heads.py: head_control). Synthetic-weight runs
then see each head kind's acceptance differ per position as on real weights, and the simulator fed the
same spec draws from the very same rates."""

from __future__ import annotations

from contracts import UsageError
from contracts.acceptance import CURVE, is_control, parse_control
from sim.heads import head_control
from sim.profile import load_profile


def is_curve(text: str | None) -> bool:
    return text not in (None, "none") and is_control(text) and parse_control(text).curve


def head_controls(
    text: str | None, profile_path: str | None, heads, ks, probes: int | None, greedy: bool = True
) -> dict:
    """{(K, head): its resolved control, a=R1,...} for a curve spec ({} for any other); bad input where
    the profile lacks a head's agreement, or where sampled rounds (one rate) would meet rates per position."""
    if not is_curve(text):
        return {}
    if not profile_path:
        raise UsageError(f"--acceptance {text}: a curve needs --profile (its heads section holds the agreement)")
    profile = load_profile(profile_path)
    spec = parse_control(text)
    probes = probes or profile.default_probes
    controls = {(K, head): head_control(spec, profile, head, probes, K) for K in ks for head in heads}
    for (_, head), control in controls.items():
        if control.per_position and not greedy:
            raise UsageError(
                f"--acceptance {text}: head {head}'s agreement differs per draft position ({control.label}), and "
                "sampled rounds are controlled at one rate; under sampling give a=RATE"
            )
    return {key: control.label for key, control in controls.items()}


def base_control(text: str | None) -> str | None:
    """The spec without its curve: the dense head's control (what the references and the report describe)."""
    return text.removeprefix(CURVE) if is_curve(text) else text
