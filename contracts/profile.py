"""The cost profile (`specloop.profile/1`): written by `measure`, read by `sim`; one checker, one reader.

A timing is `{median_ms, p10_ms, p90_ms, n, host_ms?}`; a table is `{"points": [timing + axes]}` over
the axes below, forming a full grid. `docs/contracts.md` lists every field.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from contracts.cli import UsageError
from contracts.files import read_json, write_atomic
from contracts.names import PLACEMENTS, REGIMES

PROFILE_SCHEMA = "specloop.profile/1"
READABLE_SCHEMAS = (PROFILE_SCHEMA, "flashspec.profile/1")  # the tool's earlier name
AXES = ("n_tokens", "context", "prompt_len", "probes")
WEIGHTS = ("synthetic", "real", "study-derived")
TIMING_FIELDS = ("median_ms", "p10_ms", "p90_ms", "host_ms")
REQUIRED_COSTS = {
    "target": ("forward_ms", "prefill_ms"),
    "draft": ("body_ms", "head_dense_ms", "head_flashhead_ms", "prefill_ms"),
    "host": ("item_ms", "copy_token_ms", "event_sync_ms", "round_bookkeeping_ms"),
}
# Costs a profile may carry (older ones do not): the host's time from a read's end to its next launch;
# prompt lookup's n-gram search over the context (on the target device, table over `context`); and the
# early-exit draft's step on the target device: its first L layers (table over n_tokens, context) and
# the target's head (setup.early_exit_layers names L).
OPTIONAL_COSTS = {"host": ("read_gap_ms",), "draft": ("lookup_ms", "early_exit_body_ms", "early_exit_head_ms")}


def finite(value, where: str) -> float:
    """A finite, non-negative number, or UsageError naming where it sits."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise UsageError(f"{where}: expected a finite number, got {value!r}")
    if value < 0:
        raise UsageError(f"{where}: must not be negative, got {value!r}")
    return float(value)


def cost_grid(raw, where: str) -> tuple[tuple[str, ...], dict[tuple[float, ...], tuple[float, float]]]:
    """A timing or table as (axes, {axis values: (median_ms, host_ms)}), checked to be a full grid."""
    if not isinstance(raw, dict):
        raise UsageError(f"{where}: expected a timing or a table object")
    points = raw.get("points", [raw])
    if not isinstance(points, list) or not points:
        raise UsageError(f"{where}.points: expected a non-empty list")
    first = points[0] if isinstance(points[0], dict) else {}
    axes = tuple(a for a in AXES if a in first)
    grid = {}
    for i, point in enumerate(points):
        here = f"{where}.points[{i}]" if "points" in raw else where
        if not isinstance(point, dict) or tuple(a for a in AXES if a in point) != axes:
            raise UsageError(f"{here}: every point needs the same axes {list(axes)}")
        if "median_ms" not in point:
            raise UsageError(f"{here}: missing median_ms")
        key = tuple(finite(point[a], f"{here}.{a}") for a in axes)
        grid[key] = (
            finite(point["median_ms"], f"{here}.median_ms"),
            finite(point.get("host_ms", 0.0), f"{here}.host_ms"),
        )
    sizes = [len({k[d] for k in grid}) for d in range(len(axes))]
    if len(grid) != math.prod(sizes) or len(grid) != len(points):
        raise UsageError(f"{where}: table points must form a full grid over {list(axes)}, each point once")
    return axes, grid


def check_profile(raw, source: str) -> None:
    """Raise UsageError unless `raw` is a valid profile (schema, setup, every required cost, FlashHead)."""
    if not isinstance(raw, dict):
        raise UsageError(f"{source}: a profile is a JSON object")
    if raw.get("schema") not in READABLE_SCHEMAS:
        raise UsageError(f"{source}: unknown profile schema {raw.get('schema')!r} (expected {PROFILE_SCHEMA!r})")
    setup = raw.get("setup")
    if not isinstance(setup, dict):
        raise UsageError(f"{source}: missing 'setup' section")
    for model in ("target", "draft"):
        identity = setup.get(model)
        if not isinstance(identity, dict) or not isinstance(identity.get("name"), str):
            raise UsageError(f"{source}: setup.{model} must be an object with a 'name'")
        if identity.get("weights") not in WEIGHTS:
            raise UsageError(f"{source}: setup.{model}.weights must be one of {', '.join(WEIGHTS)}")
    if setup.get("placement") not in PLACEMENTS:
        raise UsageError(f"{source}: setup.placement must be one of {', '.join(PLACEMENTS)}")
    lengths = setup.get("prompt_lengths", [])
    if not isinstance(lengths, list) or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in lengths):
        raise UsageError(f"{source}: setup.prompt_lengths must be a list of positive integers")
    width = setup.get("fixed_width")
    if width is not None and (isinstance(width, bool) or not isinstance(width, int) or width < 1):
        raise UsageError(f"{source}: setup.fixed_width must be a positive integer or null")
    regimes = raw.get("regimes")
    if not isinstance(regimes, dict) or not regimes or set(regimes) - set(REGIMES):
        raise UsageError(f"{source}: 'regimes' must hold {' and/or '.join(repr(r) for r in REGIMES)}")
    for name, regime in regimes.items():
        for group, costs in REQUIRED_COSTS.items():
            section = regime.get(group) if isinstance(regime, dict) else None
            if not isinstance(section, dict):
                raise UsageError(f"{source}: regimes.{name}.{group}: missing section")
            for cost in costs:
                if cost not in section:
                    raise UsageError(f"{source}: regimes.{name}.{group}.{cost}: missing cost")
                cost_grid(section[cost], f"{source}: regimes.{name}.{group}.{cost}")
            for cost in OPTIONAL_COSTS.get(group, ()):
                if cost in section:
                    cost_grid(section[cost], f"{source}: regimes.{name}.{group}.{cost}")
    default = setup.get("default_regime", next(iter(regimes)))
    if not isinstance(default, str) or default not in regimes:
        raise UsageError(f"{source}: setup.default_regime {default!r} is not among its regimes")
    _check_flashhead(raw.get("flashhead"), source)
    if raw.get("sampling") is not None:
        check_sampling(raw["sampling"], source)


def _check_flashhead(flashhead, source: str) -> None:
    def positive_int(key):
        value = flashhead.get(key)
        return isinstance(value, int) and not isinstance(value, bool) and value > 0

    if not isinstance(flashhead, dict) or not (positive_int("clusters") and positive_int("cluster_size")):
        raise UsageError(f"{source}: 'flashhead' needs positive integers clusters and cluster_size")
    if flashhead.get("default_probes") is not None and not positive_int("default_probes"):
        raise UsageError(f"{source}: flashhead.default_probes must be a positive integer")
    if (flashhead.get("default_probes") or 1) > flashhead["clusters"]:
        raise UsageError(f"{source}: flashhead.default_probes exceeds the {flashhead['clusters']} clusters")
    agreement = flashhead.get("agreement")
    if agreement is not None:
        check_probe_curve(agreement, "r", f"{source}: flashhead.agreement")


def check_probe_curve(curve, values: str, where: str) -> None:
    """A curve over FlashHead probe counts: increasing positive integers `probes` and, as many, numbers
    in [0, 1] under `values` (agreement r, or expected acceptance beta)."""
    probes, ys = (curve.get("probes"), curve.get(values)) if isinstance(curve, dict) else (None, None)
    if not isinstance(probes, list) or not isinstance(ys, list):
        raise UsageError(f"{where} needs lists 'probes' and '{values}'")
    if (
        len(probes) != len(ys)
        or not probes
        or any(isinstance(p, bool) or not isinstance(p, int) for p in probes)
        or probes != sorted(set(probes))
        or probes[0] < 1
    ):
        raise UsageError(f"{where} probes must be increasing positive integers matching {values}")
    if any(not _fraction(y) for y in ys):
        raise UsageError(f"{where} {values} values must be numbers in [0, 1]")


def _fraction(value) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and 0 <= value <= 1


# What `python -m measure --temperature T` adds to the sampling section, per regime: the verify's
# decision as the decoder makes it greedily and under sampling (tables over n_tokens = K + 1), and the
# draft's heads under sampling (q and its draw; dense a timing, FlashHead a table over probes).
SAMPLING_COSTS = ("verify_greedy_ms", "verify_sampled_ms", "head_dense_ms", "head_flashhead_ms")


def check_sampling(sampling, source: str) -> None:
    """The optional `sampling` section: `beta` and/or `costs`. `beta`: expected acceptance
    beta = sum_x min(p(x), q(x)) per temperature (a key: the temperature as a decimal string, > 0),
    for the dense draft head (`dense.beta`) and FlashHead per probe count (`flashhead.probes` /
    `.beta`), with the number of states `n` each is a mean over, and the `weights` (`real` or
    `synthetic`) it was measured on. `costs`: the sampling settings they were timed at and, per regime,
    every cost of SAMPLING_COSTS."""
    where = f"{source}: sampling"
    if not isinstance(sampling, dict) or not ({"beta", "costs"} & set(sampling)):
        raise UsageError(
            f"{where} needs 'beta' (python -m measure.beta) and/or 'costs' (python -m measure --temperature)"
        )
    if "beta" in sampling:
        _check_beta(sampling, where)
    if "costs" in sampling:
        _check_sampling_costs(sampling["costs"], f"{where}.costs")


def _check_beta(sampling: dict, where: str) -> None:
    if not isinstance(sampling.get("beta"), dict) or not sampling["beta"]:
        raise UsageError(f"{where} needs a non-empty object 'beta' of temperatures")
    if sampling.get("weights") not in WEIGHTS:
        raise UsageError(f"{where}.weights must be one of {', '.join(WEIGHTS)}")
    for key, curves in sampling["beta"].items():
        try:
            temperature = float(key)
        except ValueError:
            temperature = float("nan")
        if not 0 < temperature < float("inf"):
            raise UsageError(f"{where}.beta: temperature {key!r} is not a number > 0")
        if not isinstance(curves, dict) or not curves or set(curves) - {"dense", "flashhead"}:
            raise UsageError(f"{where}.beta.{key}: expected curves 'dense' and/or 'flashhead'")
        dense = curves.get("dense")
        if dense is not None and not (isinstance(dense, dict) and _fraction(dense.get("beta"))):
            raise UsageError(f"{where}.beta.{key}.dense needs 'beta', a number in [0, 1]")
        if "flashhead" in curves:
            check_probe_curve(curves["flashhead"], "beta", f"{where}.beta.{key}.flashhead")
        for curve in curves.values():
            n = curve.get("n")
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise UsageError(f"{where}.beta.{key}: each curve needs 'n', the positive number of states")


def _check_sampling_costs(costs, where: str) -> None:
    if not isinstance(costs, dict):
        raise UsageError(f"{where}: expected an object")
    temperature, top_k, top_p = costs.get("temperature"), costs.get("top_k"), costs.get("top_p")
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not 0 < temperature < math.inf:
        raise UsageError(f"{where}.temperature: expected the number > 0 the costs were timed at")
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0 or not _fraction(top_p) or top_p == 0:
        raise UsageError(f"{where}: needs top_k (an integer >= 0, 0: off) and top_p (in (0, 1], 1: off)")
    regimes = costs.get("regimes")
    if not isinstance(regimes, dict) or not regimes or set(regimes) - set(REGIMES):
        raise UsageError(f"{where}.regimes must hold {' and/or '.join(repr(r) for r in REGIMES)}")
    for name, regime in regimes.items():
        for cost in SAMPLING_COSTS:
            if not isinstance(regime, dict) or cost not in regime:
                raise UsageError(f"{where}.regimes.{name}.{cost}: missing cost")
            cost_grid(regime[cost], f"{where}.regimes.{name}.{cost}")


def read_profile(path: str | Path) -> dict:
    """A profile file, parsed and checked."""
    raw = read_json(path, "profile")
    check_profile(raw, str(path))
    return raw


def write_profile(path: str | Path, profile: dict) -> None:
    """Check, then write atomically: a profile on disk is always one its readers accept."""
    check_profile(profile, str(path))
    write_atomic(path, json.dumps(profile, indent=1) + "\n")
