"""Read a cost profile (`flashspec.profile/1`), apply dotted-path edits, and answer r(p)."""
from __future__ import annotations

import copy
import json
import math
from pathlib import Path

from .costs import Costs
from .errors import SimInputError

PROFILE_SCHEMA = "flashspec.profile/1"
DATA = Path(__file__).parent / "data"
PLACEMENTS = ("two-gpu", "one-gpu", "cpu")
REGIMES = ("graphs", "eager")


class Profile:
    """A validated profile: its raw dict (for edits and provenance) and the costs per regime."""

    def __init__(self, raw: dict, source: str):
        if not isinstance(raw, dict):
            raise SimInputError(f"{source}: a profile is a JSON object")
        if raw.get("schema") != PROFILE_SCHEMA:
            raise SimInputError(
                f"{source}: unknown profile schema {raw.get('schema')!r} (expected {PROFILE_SCHEMA!r})")
        self.raw, self.source = raw, source
        setup = raw.get("setup")
        if not isinstance(setup, dict):
            raise SimInputError(f"{source}: missing 'setup' section")
        if setup.get("placement") not in PLACEMENTS:
            raise SimInputError(f"{source}: setup.placement must be one of {', '.join(PLACEMENTS)}")
        regimes = raw.get("regimes")
        if not isinstance(regimes, dict) or not regimes or set(regimes) - set(REGIMES):
            raise SimInputError(f"{source}: 'regimes' must hold 'graphs' and/or 'eager'")
        self.costs = {name: Costs(body, f"{source}: regimes.{name}") for name, body in regimes.items()}
        default = setup.get("default_regime", next(iter(regimes)))
        if default not in regimes:
            raise SimInputError(f"{source}: setup.default_regime {default!r} is not among its regimes")
        self.default_regime = default
        fh = raw.get("flashhead")
        if not isinstance(fh, dict) or not all(isinstance(fh.get(k), int) and fh[k] > 0
                                               for k in ("clusters", "cluster_size")):
            raise SimInputError(f"{source}: 'flashhead' needs positive integers clusters and cluster_size")
        self.clusters = fh["clusters"]
        self.default_probes = int(fh.get("default_probes") or max(1, self.clusters // 16))
        raw_agreement = fh.get("agreement")
        # random weights say nothing about how often FlashHead agrees with the dense head
        self.agreement_ignored = bool(raw_agreement and raw_agreement.get("synthetic"))
        self.agreement = None if self.agreement_ignored else _agreement(raw_agreement, self.clusters, source)

    @property
    def placement(self) -> str:
        return self.raw["setup"]["placement"]

    def label(self) -> str:
        setup = self.raw["setup"]
        t, d = setup.get("target", {}), setup.get("draft", {})
        return (f"{t.get('name', '?')} ({t.get('weights', '?')}) + {d.get('name', '?')} "
                f"({d.get('weights', '?')}), {setup['placement']}")

    def agreement_at(self, probes: int) -> float | None:
        """r(p), linear in log2(p) between measured points, 1 when every cluster is probed."""
        if self.agreement is None:
            return None
        ps, rs = self.agreement
        if probes >= self.clusters:
            return 1.0
        xs = [math.log2(p) for p in ps] + ([math.log2(self.clusters)] if ps[-1] < self.clusters else [])
        ys = list(rs) + ([1.0] if ps[-1] < self.clusters else [])
        x = math.log2(probes)
        if x <= xs[0]:
            return ys[0]
        for x0, x1, y0, y1 in zip(xs, xs[1:], ys, ys[1:]):
            if x <= x1:
                return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
        return ys[-1]

    def edited(self, edits: list[tuple[str, str, float]], regime: str) -> "Profile":
        """A copy with numeric fields set (`=`) or scaled (`*=`); paths resolve in the regime first."""
        raw = copy.deepcopy(self.raw)
        for path, op, value in edits:
            _edit(raw, path, op, value, regime)
        return Profile(raw, self.source + " (edited)")


def _agreement(raw, clusters: int, source: str):
    if raw is None:
        return None
    try:
        ps = [int(p) for p in raw["probes"]]
        rs = [float(r) for r in raw["r"]]
    except (KeyError, TypeError, ValueError):
        raise SimInputError(f"{source}: flashhead.agreement needs lists 'probes' and 'r'") from None
    if len(ps) != len(rs) or not ps or ps != sorted(set(ps)) or ps[0] < 1:
        raise SimInputError(f"{source}: flashhead.agreement probes must be increasing positive and match r")
    if any(not 0 <= r <= 1 for r in rs):
        raise SimInputError(f"{source}: flashhead.agreement r values must be in [0, 1]")
    return ps, rs


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
        raise SimInputError(f"what-if {path}: a cost or count cannot be negative ({value:g})")
    parts = path.split(".")
    for root in (raw["regimes"][regime], raw):
        node = root
        for part in parts[:-1]:
            node = node.get(part) if isinstance(node, dict) else None
        leaf = node.get(parts[-1]) if isinstance(node, dict) else None
        if isinstance(leaf, dict):
            if op == "=" and "points" in leaf:
                leaf.clear()
                leaf.update({"median_ms": value, "p10_ms": value, "p90_ms": value, "n": 1})
            else:
                _scale_timings(leaf, op, value, path)
            return
        if isinstance(leaf, (int, float)) and not isinstance(leaf, bool):
            new = leaf * value if op == "*=" else value
            node[parts[-1]] = type(leaf)(new) if isinstance(leaf, int) and float(new).is_integer() else new
            return
    valid = ", ".join(editable_paths(raw, regime))
    raise SimInputError(f"unknown what-if key {path!r}; profile paths are: {valid}")


def load_profile(name_or_path: str) -> Profile:
    """`thesis` (the study-derived profile), `default`, or a path to a profile JSON."""
    path = _resolve(name_or_path)
    try:
        raw = json.loads(path.read_text())
    except OSError as e:
        raise SimInputError(f"cannot read profile {path}: {e.strerror}") from None
    except json.JSONDecodeError as e:
        raise SimInputError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from None
    return Profile(raw, str(path))


BUILTIN_PROFILES = {"thesis": DATA / "thesis_profile.json"}


def _resolve(name_or_path: str) -> Path:
    if name_or_path == "default":
        return default_profile_path()
    return BUILTIN_PROFILES.get(name_or_path, Path(name_or_path))


def default_profile_path() -> Path:
    """The measured profile shipped as sim/data/default_profile.json when there is one, else the study's."""
    measured = DATA / "default_profile.json"
    return measured if measured.exists() else BUILTIN_PROFILES["thesis"]
