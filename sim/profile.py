"""A cost profile (contracts.profile) ready to simulate: costs per regime, dotted-path edits, r(p), and the
expected acceptance beta of speculative sampling per temperature."""

from __future__ import annotations

import copy
import difflib
import math
from pathlib import Path

from contracts import UsageError
from contracts.profile import check_profile, cost_grid, read_profile

from .costs import Cost, Costs

DATA = Path(__file__).parent / "data"


class Profile:
    """A validated profile: its raw dict (for edits and provenance) and the costs per regime."""

    def __init__(self, raw: dict, source: str):
        check_profile(raw, source)
        self.raw, self.source = raw, source
        fixed_width = raw["setup"].get("fixed_width")
        self.costs = {
            name: Costs(body, f"{source}: regimes.{name}", fixed_width, raw.get("heads"))
            for name, body in raw["regimes"].items()
        }
        self.default_regime = raw["setup"].get("default_regime", next(iter(raw["regimes"])))
        flashhead = raw["flashhead"]
        self.clusters = flashhead["clusters"]
        self.default_probes = flashhead.get("default_probes") or max(1, self.clusters // 16)
        agreement = flashhead.get("agreement")
        # random weights say nothing about how often FlashHead agrees with the dense head
        self.agreement_ignored = bool(agreement and agreement.get("synthetic"))
        self.agreement = None if self.agreement_ignored or not agreement else (agreement["probes"], agreement["r"])
        sampling = raw.get("sampling") or {}
        self.sampling_weights = sampling.get("weights")
        self.beta = {float(t): curves for t, curves in sampling.get("beta", {}).items()}

    @property
    def placement(self) -> str:
        return self.raw["setup"]["placement"]

    def label(self) -> str:
        setup = self.raw["setup"]
        t, d = setup.get("target", {}), setup.get("draft", {})
        return (
            f"{t.get('name', '?')} ({t.get('weights', '?')}) + {d.get('name', '?')} "
            f"({d.get('weights', '?')}), {setup['placement']}"
        )

    def agreement_at(self, probes: int) -> float | None:
        """r(p), linear in log2(p) between measured points, 1 when every cluster is probed."""
        if self.agreement is None:
            return None
        ps, rs = self.agreement
        return self._over_probes(ps, rs, probes, 1.0)

    def beta_at(self, temperature: float, head: str, probes: int) -> float | None:
        """The expected acceptance beta at `temperature` for `head` (FlashHead: linear in log2(p)
        between measured probe counts, the dense head's beta when every cluster is probed); None where
        the profile has no curve for them."""
        curves = self.beta.get(temperature, {})
        dense = curves.get("dense", {}).get("beta")
        if head == "dense":
            return dense
        flashhead = curves.get("flashhead")
        if flashhead is None:
            return None
        if dense is None and probes > flashhead["probes"][-1]:
            return None  # past the last measured count, with no dense value to end the curve at
        return self._over_probes(flashhead["probes"], flashhead["beta"], probes, dense)

    def _over_probes(self, probes: list[int], values: list[float], at: int, full: float | None) -> float:
        """A curve over probe counts, linear in log2(p), flat below its first point, and ending at
        `full` when every cluster is probed (flat past its last point where `full` is None)."""
        if full is not None and at >= self.clusters:
            return full
        extend = full is not None and probes[-1] < self.clusters
        xs = [math.log2(p) for p in probes] + ([math.log2(self.clusters)] if extend else [])
        ys = list(values) + ([full] if extend else [])
        x = math.log2(at)
        if x <= xs[0]:
            return ys[0]
        for x0, x1, y0, y1 in zip(xs, xs[1:], ys, ys[1:]):
            if x <= x1:
                return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
        return ys[-1]

    def edited(self, edits: list[tuple[str, str, float]], regime: str) -> Profile:
        """A copy with numeric fields set (`=`) or scaled (`*=`), or a one-axis cost measured at one more
        point (`@X=`); paths resolve in the regime first."""
        raw = copy.deepcopy(self.raw)
        for path, op, value in edits:
            _edit(raw, path, op, value, regime)
        return Profile(raw, self.source + " (edited)")


def _numeric_leaves(node, prefix: str = ""):
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _numeric_leaves(value, f"{prefix}.{key}" if prefix else key)
    elif isinstance(node, (int, float)) and not isinstance(node, bool):
        yield prefix


def editable_paths(raw: dict, regime: str) -> list[str]:
    """Dotted paths a what-if may edit: costs of the regime (scaling every timing under them) and
    the profile's other numeric fields."""
    costs = raw["regimes"][regime]
    cost_paths = [f"{g}.{name}" for g, section in costs.items() for name in section]
    other = [p for p in _numeric_leaves({k: v for k, v in raw.items() if k != "regimes"})]
    return sorted(cost_paths) + sorted(other)


def _scale_timings(node, op: str, value: float, path: str) -> int:
    """Apply an edit to every timing field below node; returns how many were changed."""
    changed = 0
    if isinstance(node, dict):
        for key in list(node):
            if key in ("median_ms", "p10_ms", "p90_ms", "host_ms"):
                node[key] = node[key] * value if op == "*=" else value
                changed += 1
            elif isinstance(node[key], (dict, list)):
                changed += _scale_timings(node[key], op, value, path)
    elif isinstance(node, list):
        for item in node:
            changed += _scale_timings(item, op, value, path)
    return changed


def _edit(raw: dict, path: str, op: str, value: float, regime: str) -> None:
    if op == "*=" and value < 0 or op == "=" and value < 0:
        raise UsageError(f"what-if {path}: a cost or count cannot be negative ({value:g})")
    node, name = check_path(raw, path, regime)
    leaf = node[name]
    if isinstance(leaf, dict):
        if op.startswith("@"):
            _measured_at(leaf, path, op, value)
        elif op == "=" and "points" in leaf:
            leaf.clear()
            leaf.update({"median_ms": value, "p10_ms": value, "p90_ms": value, "n": 1})
        else:
            _scale_timings(leaf, op, value, path)
        return
    new = leaf * value if op == "*=" else value
    node[name] = type(leaf)(new) if isinstance(leaf, int) and float(new).is_integer() else new


def check_path(raw: dict, path: str, regime: str, named: tuple = ()) -> tuple[dict, str]:
    """(parent, field name) of what a what-if path edits, in the regime's costs first; bad input naming close
    paths, and the `named` keys a what-if takes besides paths, where the profile has no such field."""
    parts = path.split(".")
    for root in (raw["regimes"][regime], raw):
        node = root
        for part in parts[:-1]:
            node = node.get(part) if isinstance(node, dict) else None
        leaf = node.get(parts[-1]) if isinstance(node, dict) else None
        if isinstance(leaf, dict) or isinstance(leaf, (int, float)) and not isinstance(leaf, bool):
            return node, parts[-1]
    close = difflib.get_close_matches(path, editable_paths(raw, regime), n=3)
    hint = f"did you mean {', '.join(close)}? " if close else ""
    keys = f"{', '.join(named)}, or " if named else ""
    raise UsageError(
        f"unknown what-if key {path!r}; {hint}valid: {keys}a dotted profile path (python -m sim --keys lists them)"
    )


def _measured_at(leaf: dict, path: str, op: str, value: float) -> None:
    """`path@X=ms`: a cost of one axis measured at X too (a calibration's measurement where the profile
    has no point): the point is added, or replaces the one at X, with the host time the other points give
    there (the host's issue does not grow with what the device does)."""
    axes, grid = cost_grid(leaf, path)
    try:
        x = float(op[1:].removesuffix("="))
    except ValueError:
        raise UsageError(f"what-if {path}{op}: expected {path}@X= with X a number") from None
    if len(axes) != 1:
        raise UsageError(f"what-if {path}{op}: only a cost measured along one axis takes a point (it has {axes})")
    host = Cost.parse(leaf, path, path).host_ms(**{axes[0]: x})
    axis = int(x) if x.is_integer() else x
    point = {axes[0]: axis, "median_ms": value, "p10_ms": value, "p90_ms": value, "n": 1, "host_ms": host}
    leaf["points"] = sorted([p for p in leaf["points"] if p[axes[0]] != x] + [point], key=lambda p: p[axes[0]])


def load_profile(name_or_path: str) -> Profile:
    """`study` (the study-derived profile), `default`, or a path to a profile JSON."""
    path = _resolve(name_or_path)
    return Profile(read_profile(path), str(path))


BUILTIN_PROFILES = {"study": DATA / "study_profile.json"}


def _resolve(name_or_path: str) -> Path:
    if name_or_path == "default":
        return default_profile_path()
    return BUILTIN_PROFILES.get(name_or_path, Path(name_or_path))


def default_profile_path() -> Path:
    """The measured profile shipped as sim/data/default_profile.json when there is one, else the study's."""
    measured = DATA / "default_profile.json"
    return measured if measured.exists() else BUILTIN_PROFILES["study"]
