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


def head_controls(text: str | None, profile_path: str | None, heads, ks, probes: int | None) -> dict:
    """{(K, head): its resolved control, a=R1,...} for a curve spec ({} for any other); bad input where
    the profile lacks a head's agreement."""
    if not is_curve(text):
        return {}
    if not profile_path:
        raise UsageError(f"--acceptance {text}: a curve needs --profile (its heads section holds the agreement)")
    profile = load_profile(profile_path)
    spec = parse_control(text)
    probes = probes or profile.default_probes
    return {(K, head): head_control(spec, profile, head, probes, K).label for K in ks for head in heads}


def base_control(text: str | None) -> str | None:
    """The spec without its curve: the dense head's control (what the references and the report describe)."""
    return text.removeprefix(CURVE) if is_curve(text) else text
