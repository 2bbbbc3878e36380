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
from contracts.heads import HEAD_KINDS, parse_head
from contracts.names import PLACEMENTS, REGIMES, tensor_parallel_size
from contracts.trees import MAX_K

PROFILE_SCHEMA = "specloop.profile/1"
READABLE_SCHEMAS = (PROFILE_SCHEMA, "flashspec.profile/1")  # the tool's earlier name
AXES = ("n_tokens", "context", "prompt_len", "probes", "bytes")
WEIGHTS = ("synthetic", "real", "study-derived")
TIMING_FIELDS = ("median_ms", "p10_ms", "p90_ms", "host_ms")
# The longest a measured operation may take: one hour. No forward, head or copy of a decode loop comes near it
# (the slowest committed timing is under 4 s), so a larger value in a file is a unit slip or a corrupted value,
# and would turn every prediction into nothing (0.00 tok/s) instead of an error. Bounded where a profile is read
# or written, not in check_profile: a what-if may scale a cost past it (the simulator bounds its factors).
MAX_TIMING_MS = 3_600_000.0
REQUIRED_COSTS = {
    "target": ("forward_ms", "prefill_ms"),
    "draft": ("body_ms", "head_dense_ms", "head_flashhead_ms", "prefill_ms"),
    "host": ("item_ms", "copy_token_ms", "event_sync_ms", "round_bookkeeping_ms"),
}
# Costs a profile may carry (older ones do not): the host's time from a read's end to its next launch;
# prompt lookup's n-gram search over the context (on the target device, table over `context`); and the
# early-exit draft's step on the target device: its first L layers (table over n_tokens, context) and
# the target's head (setup.early_exit_layers names L). With tree widths, the target forward and the draft
# body under the tree rule (tables over n_tokens, context), each the tree-attention form of a required cost
# (TREE_ATTENTION_COSTS: tree rounds read it where the profile has it).
OPTIONAL_COSTS = {
    "host": ("read_gap_ms",),
    "target": ("tree_forward_ms",),
    "draft": ("lookup_ms", "early_exit_body_ms", "early_exit_head_ms", "tree_body_ms"),
}
TREE_ATTENTION_COSTS = {"target.forward_ms": "target.tree_forward_ms", "draft.body_ms": "draft.tree_body_ms"}
# The optional `tensor_parallel` section: per placement tpN, a target tensor-parallel over N ranks, its
# tables (axes) timing one rank: compute alone (all-reduces off), one all-reduce per message size, and the
# decode step with its all-reduces (a check of compute + all-reduces).
TENSOR_PARALLEL_COSTS = {
    "forward_ms": ("n_tokens", "context"),
    "prefill_ms": ("prompt_len",),
    "all_reduce_ms": ("bytes",),
    "measured_forward_ms": ("n_tokens", "context"),
}


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
        times = {name: finite(point[name], f"{here}.{name}") for name in TIMING_FIELDS if name in point}
        grid[key] = (times["median_ms"], times.get("host_ms", 0.0))
    sizes = [len({k[d] for k in grid}) for d in range(len(axes))]
    if len(grid) != math.prod(sizes) or len(grid) != len(points):
        raise UsageError(f"{where}: table points must form a full grid over {list(axes)}, each point once")
    return axes, grid


# a profile's top-level keys (docs/contracts.md); any other is a misspelling, refused
PROFILE_SECTIONS = ("schema", "created", "env", "setup", "regimes", "flashhead", "sampling", "trees", "heads")
PROFILE_SECTIONS += ("tensor_parallel", "notes")


def setup_K_max(setup: dict):
    """The most proposals a profile was measured for (`setup.K_max`; profiles written before the
    restructure of 2026-11-22 call it `k_max`), or None."""
    return setup.get("K_max", setup.get("k_max"))


def check_profile(raw, source: str) -> None:
    """Raise UsageError unless `raw` is a valid profile (schema, setup, every required cost, FlashHead)."""
    if not isinstance(raw, dict):
        raise UsageError(f"{source}: a profile is a JSON object")
    if raw.get("schema") not in READABLE_SCHEMAS:
        raise UsageError(f"{source}: unknown profile schema {raw.get('schema')!r} (expected {PROFILE_SCHEMA!r})")
    unknown = sorted(set(raw) - set(PROFILE_SECTIONS))
    if unknown:
        raise UsageError(f"{source}: unknown profile section {unknown[0]!r}; valid: {', '.join(PROFILE_SECTIONS)}")
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
    lengths = setup.get("prompt_lengths")  # optional: the simulator's default prompt is then 128 tokens
    if "prompt_lengths" in setup and (
        not isinstance(lengths, list)
        or not lengths
        or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in lengths)
    ):
        raise UsageError(
            f"{source}: setup.prompt_lengths must be a list of positive integers, not empty; got {lengths!r}"
        )
    K_max = setup_K_max(setup)
    if K_max is not None and (isinstance(K_max, bool) or not isinstance(K_max, int) or not 1 <= K_max <= MAX_K):
        key = "K_max" if "K_max" in setup else "k_max"
        raise UsageError(
            f"{source}: setup.{key} must be an integer in 1..{MAX_K} (the most proposals of a round), got {K_max!r}"
        )
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
    if raw.get("trees") is not None:
        check_trees(raw["trees"], source)
    if raw.get("heads") is not None:
        check_heads(raw["heads"], source)
    if raw.get("tensor_parallel") is not None:
        check_tensor_parallel(raw["tensor_parallel"], source)


def check_tensor_parallel(section, source: str) -> None:
    """The optional `tensor_parallel` section: {tpN: the target over N ranks}, each with `ranks` (N), the
    `target`'s identity, the sizes of its all-reduce messages (`layers`, `hidden_size`, `dtype_bytes`,
    `fixed_width`: rows of every decode forward, or null), the `regime` it was timed in, and the tables of
    TENSOR_PARALLEL_COSTS over their axes."""
    if not isinstance(section, dict) or not section:
        raise UsageError(f"{source}: 'tensor_parallel' must be a non-empty object of placements tpN")
    for placement, entry in section.items():
        where = f"{source}: tensor_parallel.{placement}"
        ranks = tensor_parallel_size(placement)
        if ranks is None:
            raise UsageError(f"{source}: tensor_parallel: {placement!r} is not a placement tpN (N >= 2, e.g. tp2)")
        if not isinstance(entry, dict) or entry.get("ranks") != ranks:
            raise UsageError(f"{where}.ranks must be {ranks}")
        target = entry.get("target")
        named = isinstance(target, dict) and isinstance(target.get("name"), str)
        if not named or target.get("weights") not in WEIGHTS:
            raise UsageError(f"{where}.target needs a 'name' and 'weights' (one of {', '.join(WEIGHTS)})")
        for key in ("layers", "hidden_size", "dtype_bytes"):
            value = entry.get(key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise UsageError(f"{where}.{key} must be a positive integer")
        width = entry.get("fixed_width")
        if width is not None and (isinstance(width, bool) or not isinstance(width, int) or width < 1):
            raise UsageError(f"{where}.fixed_width must be a positive integer or null")
        if entry.get("regime") not in REGIMES:
            raise UsageError(f"{where}.regime must be one of {', '.join(REGIMES)}")
        for cost, axes in TENSOR_PARALLEL_COSTS.items():
            if cost not in entry:
                raise UsageError(f"{where}.{cost}: missing cost")
            if cost_grid(entry[cost], f"{where}.{cost}")[0] != axes:
                raise UsageError(f"{where}.{cost}: expected a table over {list(axes)}")


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
# decision as the decoder makes it greedily and under sampling (tables over n_tokens = K + 1 and any tree
# widths), and the draft's heads under sampling (q and its draw; dense a timing, FlashHead a table over probes).
SAMPLING_COSTS = ("verify_greedy_ms", "verify_sampled_ms", "head_dense_ms", "head_flashhead_ms")
# With --heads as well: every head kind of --heads (and the dense head) under sampling, per budget as the
# draft step pays it, in the rows of the heads section's `cost.kinds` (optional: older profiles lack it).
SAMPLED_HEAD_KINDS = "head_kinds_ms"


def check_sampling(sampling, source: str) -> None:
    """The optional `sampling` section: `beta` and/or `costs`. `beta`: expected acceptance
    beta = sum_x min(p(x), q(x)) per temperature (a key: the temperature as a decimal string, > 0),
    for the dense draft head (`dense.beta`) and FlashHead per probe count (`flashhead.probes` /
    `.beta`), with the number of states `n` each is a mean over, and the `weights` (`real` or
    `synthetic`) it was measured on. `costs`: the sampling settings they were timed at and, per regime,
    every cost of SAMPLING_COSTS, and optionally SAMPLED_HEAD_KINDS."""
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


def check_trees(trees, source: str) -> None:
    """The optional `trees` section (python -m measure.tree_rates): per depth d = 1..`depths` and
    top-k, k = 1..`top_k`, the rate at which the target's greedy token is among the draft's top-k at
    depth d given that it was at every depth before, pooled (`rates.all`) and per category. Each
    scope holds `rate` ([depths][top_k] numbers in [0, 1], null where `n` is 0), `n` (the rounds each
    rate is over) and optionally `low`/`high` (an interval, same shape), with the `weights` measured on."""
    where = f"{source}: trees"
    if not isinstance(trees, dict) or trees.get("weights") not in WEIGHTS:
        raise UsageError(f"{where}.weights must be one of {', '.join(WEIGHTS)}")
    depths, top_k, rates = trees.get("depths"), trees.get("top_k"), trees.get("rates")
    if not all(isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= 16 for v in (depths, top_k)):
        raise UsageError(f"{where} needs integers 'depths' and 'top_k' in 1..16")
    if not isinstance(rates, dict) or "all" not in rates:
        raise UsageError(f"{where}.rates must be an object of scopes with the pooled one, 'all'")
    for scope, table in rates.items():
        here = f"{where}.rates.{scope}"
        if not isinstance(table, dict):
            raise UsageError(f"{here} must be an object with 'rate' and 'n'")
        for key in ("rate", "n", "low", "high"):
            rows = table.get(key)
            if rows is None and key in ("low", "high"):
                continue
            if (
                not isinstance(rows, list)
                or len(rows) != depths
                or any(not isinstance(row, list) or len(row) != top_k for row in rows)
            ):
                raise UsageError(f"{here}.{key} must be {depths} lists (depths) of {top_k} values (top-k)")
            for row in rows:
                for value in row:
                    if key == "n":
                        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                            raise UsageError(f"{here}.n values must be non-negative integers")
                    elif value is not None and not _fraction(value):
                        raise UsageError(f"{here}.{key} values must be numbers in [0, 1] or null")
        for rate_row, n_row in zip(table["rate"], table["n"]):
            if any((rate is None) != (n == 0) for rate, n in zip(rate_row, n_row)):
                raise UsageError(f"{here}.rate is null exactly where n is 0")


def check_heads(heads, source: str) -> None:
    """The optional `heads` section: `cost`, each head kind's cost per budget as the draft step pays it
    (`kinds`: kind -> rows {budget (none for dense), median_ms, ...} in increasing budget), and
    `agreement`, each head's agreement with the dense draft: per-position curves of measured head specs
    (`curves`: spec -> positions {position, n, agree, prefix}) and pooled agreement per kind and budget
    (`pooled`: kind -> rows {budget, n, agree}). Each part names its `weights` and `source`."""
    where = f"{source}: heads"
    if not isinstance(heads, dict) or not heads or set(heads) - {"cost", "agreement"}:
        raise UsageError(f"{where} must be an object with 'cost' and/or 'agreement'")
    for part in heads.values():
        if not isinstance(part, dict) or part.get("weights") not in WEIGHTS or not isinstance(part.get("source"), str):
            raise UsageError(f"{where}: each part needs 'weights' (one of {', '.join(WEIGHTS)}) and a 'source' string")
    if "cost" in heads:
        _check_cost_kinds(heads["cost"].get("kinds"), f"{where}.cost.kinds")
    if "agreement" in heads:
        agreement = heads["agreement"]
        curves, pooled = agreement.get("curves", {}), agreement.get("pooled", {})
        if not isinstance(curves, dict) or not isinstance(pooled, dict) or not (curves or pooled):
            raise UsageError(f"{where}.agreement needs objects 'curves' and/or 'pooled', not both empty")
        for kind, rows in pooled.items():
            _check_budget_rows(kind, rows, f"{where}.agreement.pooled.{kind}", "agree", with_dense=False)
        for label, positions in curves.items():
            _check_curve(label, positions, f"{where}.agreement.curves.{label}")


def _check_cost_kinds(kinds, where: str) -> None:
    """Head kind -> its cost rows in increasing budget (the dense head: one row, no budget)."""
    if not isinstance(kinds, dict) or not kinds:
        raise UsageError(f"{where}: expected a non-empty object of head kinds")
    for kind, rows in kinds.items():
        _check_budget_rows(kind, rows, f"{where}.{kind}", "median_ms", with_dense=True)
        for i, row in enumerate(rows):
            cost_grid(row, f"{where}.{kind}[{i}]")


def _check_budget_rows(kind, rows, where: str, value: str, with_dense: bool) -> None:
    """Rows of one head kind in increasing budget, each with `value` (a cost, or an agreement in [0, 1])."""
    if kind not in HEAD_KINDS or (kind == "dense" and not with_dense):
        raise UsageError(
            f"{where}: unknown head kind; valid: {', '.join(k for k in HEAD_KINDS if with_dense or k != 'dense')}"
        )
    if not isinstance(rows, list) or not rows or not all(isinstance(r, dict) and value in r for r in rows):
        raise UsageError(f"{where}: expected a non-empty list of rows, each with '{value}'")
    budgets = [r.get("budget") for r in rows]
    if kind == "dense":
        if budgets != [None]:
            raise UsageError(f"{where}: the dense head has one row and no budget")
        return
    if any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in budgets) or budgets != sorted(set(budgets)):
        raise UsageError(f"{where}: budgets must be increasing positive integers")
    if value == "agree":
        for r in rows:
            if (
                not _fraction(r["agree"])
                or isinstance(r.get("n"), bool)
                or not isinstance(r.get("n"), int)
                or r["n"] < 1
            ):
                raise UsageError(f"{where}: each row needs 'agree' in [0, 1] and 'n', a positive number of states")


def _check_curve(label: str, positions, where: str) -> None:
    """Per draft position 1..K: agreement with the dense draft's token, and `prefix`, the share of rounds
    whose tokens all agreed so far (never increasing)."""
    try:
        parse_head(label, where)
    except UsageError as error:
        raise UsageError(f"{where}: not a head spec ({error})") from None
    if not isinstance(positions, list) or not positions or not all(isinstance(p, dict) for p in positions):
        raise UsageError(f"{where}: expected a non-empty list of positions")
    if [p.get("position") for p in positions] != list(range(1, len(positions) + 1)):
        raise UsageError(f"{where}: positions must be 1, 2, ... in order")
    for p in positions:
        n = p.get("n")
        if (
            not (_fraction(p.get("agree")) and _fraction(p.get("prefix")))
            or isinstance(n, bool)
            or not isinstance(n, int)
            or n < 1
        ):
            raise UsageError(f"{where}: each position needs 'agree' and 'prefix' in [0, 1] and 'n' >= 1")
    prefixes = [p["prefix"] for p in positions]
    if any(later > earlier for earlier, later in zip(prefixes, prefixes[1:])):
        raise UsageError(f"{where}: 'prefix' (all tokens agreed so far) cannot grow with the position")


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
        if SAMPLED_HEAD_KINDS in regime:
            _check_cost_kinds(regime[SAMPLED_HEAD_KINDS], f"{where}.regimes.{name}.{SAMPLED_HEAD_KINDS}")


def _timings(node, path: str = ""):
    """(dotted path, value) of every timing field below `node`."""
    if isinstance(node, dict):
        for key, value in node.items():
            here = f"{path}.{key}" if path else key
            if key in TIMING_FIELDS:
                yield here, value
            yield from _timings(value, here)
    elif isinstance(node, list):
        for index, item in enumerate(node):
            yield from _timings(item, f"{path}[{index}]")


def check_measured_profile(raw, source: str) -> None:
    """check_profile, and every timing at most MAX_TIMING_MS: what a profile file may hold."""
    check_profile(raw, source)
    for path, value in _timings(raw):
        if isinstance(value, (int, float)) and value > MAX_TIMING_MS:
            raise UsageError(f"{source}: {path}: must be at most {MAX_TIMING_MS:,.0f} ms (one hour), got {value!r}")


def read_profile(path: str | Path) -> dict:
    """A profile file, parsed and checked."""
    raw = read_json(path, "profile")
    check_measured_profile(raw, str(path))
    return raw


def write_profile(path: str | Path, profile: dict) -> None:
    """Check, then write atomically: a profile on disk is always one its readers accept."""
    check_measured_profile(profile, str(path))
    write_atomic(path, json.dumps(profile, indent=1) + "\n")
