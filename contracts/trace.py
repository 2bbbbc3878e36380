"""The acceptance trace (`specloop.trace/1`, JSONL, one line per round) and the run summary
(`specloop.summary/1`, JSON): written by the decoder, read by `sim` and `validate`."""

from __future__ import annotations

import json
from pathlib import Path

from contracts.cli import UsageError
from contracts.files import read_json, read_text, write_atomic
from contracts.heads import parse_head
from contracts.names import DRAFTERS, PHASES, SCHEDULES
from contracts.trees import MAX_K, MAX_NODES, parse_tree

TRACE_SCHEMA = "specloop.trace/1"
SUMMARY_SCHEMA = "specloop.summary/1"
READABLE_TRACE_SCHEMAS = (TRACE_SCHEMA, "flashspec.trace/1")  # the tool's earlier name
READABLE_SUMMARY_SCHEMAS = (SUMMARY_SCHEMA, "flashspec.summary/1")
RUN_CAP = 65  # a `runs` value counts matches up to the largest K (64) and the bonus token after it
# The most tokens a round's context may hold: the simulator's prompt-length limit (README, "Limits"), which
# every line of a trace it replays must keep, not only the first round of each prompt.
MAX_CONTEXT = 1_000_000

_TRACE_FIELDS = {
    "prompt_id": str,
    "round": int,
    "schedule": str,
    "head": str,
    "K": int,
    "proposed": int,
    "accepted": int,
    "emitted": int,
    "verify_skipped": bool,
    "context": int,
}
# optional keys a trace line or summary may carry; any other is refused (a misspelling would be ignored)
_TRACE_OPTIONAL = ("schema", "weights", "probes", "lookahead_used", "sample", "phases_ms", "host_gap_ms", "host_gaps")
_TRACE_OPTIONAL += ("drafter", "runs", "tree", "nodes")
_SUMMARY_OPTIONAL = ("schema", "acceptance", "phases_ms", "host_gap_ms", "host_gaps")
_SUMMARY_FIELDS = {
    "config": dict,
    "ttft_ms": float,
    "decode_tokens": int,
    "decode_ms": float,
    "decode_tok_s": float,
    "mean_emitted": float,
    "verify_calls": int,
    "append_calls": int,
    "per_prompt": list,
}
_CONFIG_FIELDS = (
    "target",
    "draft",
    "weights",
    "head",
    "probes",
    "schedule",
    "K",
    "placement",
    "graphs",
    "max_new_tokens",
    "prompts",
)
_PER_PROMPT_FIELDS = {"prompt_id": str, "ttft_ms": float, "decode_tokens": int, "decode_ms": float, "rounds": int}


def _typed(obj: dict, name: str, kind: type, where: str) -> None:
    value = obj.get(name)
    if kind is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value == value and value >= 0
    elif kind is int:
        ok = isinstance(value, int) and not isinstance(value, bool) and value >= 0
    else:
        ok = isinstance(value, kind)
    if not ok:
        wanted = {float: "a non-negative number", int: "a non-negative integer"}.get(kind, kind.__name__)
        raise UsageError(f"{where}: field {name!r} must be {wanted}, got {value!r}")


def _check_phases(phases, where: str) -> None:
    if not isinstance(phases, dict) or set(phases) != set(PHASES):
        raise UsageError(f"{where}: phases_ms must have exactly {list(PHASES)}")
    for phase in PHASES:
        _typed(phases, phase, float, f"{where} phases_ms")


def _check_object(obj, kind: str, readable: tuple[str, ...], fields: dict, optional: tuple, where: str) -> None:
    """A JSON object of one of the `readable` schemas whose `fields` have their types, and no key beyond
    them and the `optional` ones."""
    if not isinstance(obj, dict):
        raise UsageError(f"{where}: expected a JSON object")
    if obj.get("schema") not in readable:
        raise UsageError(f"{where}: unknown {kind} schema {obj.get('schema')!r} (expected {readable[0]!r})")
    unknown = sorted(set(obj) - set(fields) - set(optional))
    if unknown:
        valid = ", ".join((*fields, *optional))
        raise UsageError(f"{where}: unknown {kind} key {unknown[0]!r}; valid: {valid}")
    for name, wanted in fields.items():
        _typed(obj, name, wanted, where)


def check_trace_line(line, where: str = "trace") -> None:
    """Raise UsageError unless `line` is a valid trace line."""
    _check_object(line, "trace", READABLE_TRACE_SCHEMAS, _TRACE_FIELDS, _TRACE_OPTIONAL, where)
    if line["schedule"] not in SCHEDULES:
        raise UsageError(f"{where}: unknown schedule {line['schedule']!r}; valid: {', '.join(SCHEDULES)}")
    parse_head(line["head"], f"{where}: head")
    if line["K"] > MAX_K:
        raise UsageError(f"{where}: K must be in 0..{MAX_K} (0 for baseline), got {line['K']}")
    if not 1 <= line["context"] <= MAX_CONTEXT:
        raise UsageError(f"{where}: context must be in 1..{MAX_CONTEXT:,} tokens, got {line['context']:,}")
    if "sample" in line:
        _typed(line, "sample", int, where)
    if line.get("lookahead_used") not in (None, True, False):
        raise UsageError(f"{where}: lookahead_used must be true, false or null")
    probes = line.get("probes")
    if probes is not None and (isinstance(probes, bool) or not isinstance(probes, int) or probes < 1):
        raise UsageError(f"{where}: probes must be a positive integer or null, got {probes!r}")
    if not line["accepted"] <= line["proposed"] <= line["K"]:
        raise UsageError(
            f"{where}: need accepted <= proposed <= K, got {line['accepted']}, {line['proposed']}, {line['K']}"
        )
    if not 1 <= line["emitted"] <= line["accepted"] + 1:
        raise UsageError(f"{where}: emitted must be in 1..accepted+1, got {line['emitted']}")
    if "phases_ms" in line:
        _check_phases(line["phases_ms"], where)
    _check_host_gaps(line, where)
    _check_arm_fields(line, where)
    _check_tree_fields(line, where)


def _check_tree_fields(line: dict, where: str) -> None:
    """`tree` (the round's tree label, contracts.trees) and `nodes` (nodes verified) come together, in
    tree rounds only; `accepted` is then the accepted path's length, at most the tree's depth (K)."""
    if "tree" not in line and "nodes" not in line:
        return
    if "tree" not in line or "nodes" not in line:
        raise UsageError(f"{where}: tree and nodes come together")
    try:
        shape = parse_tree(line["tree"], f"{where}: tree")
    except (UsageError, TypeError):
        raise UsageError(f"{where}: tree must be a tree label, got {line['tree']!r}") from None
    _typed(line, "nodes", int, where)
    if shape.kind == "chain" or line["K"] != shape.depth or not line["K"] <= line["nodes"] <= MAX_NODES:
        raise UsageError(
            f"{where}: a tree round needs K = the tree's depth and K <= nodes <= {MAX_NODES}, "
            f"got tree {line['tree']!r}, K {line['K']}, nodes {line['nodes']}"
        )


def _check_arm_fields(line: dict, where: str) -> None:
    """`drafter` (the round's drafter) and `runs` (per drafter, for each position the round emitted, how
    many proposals a block begun there would have had accepted) are optional; older traces lack them."""
    drafter = line.get("drafter")
    if drafter is not None and drafter not in DRAFTERS:
        raise UsageError(f"{where}: drafter must be one of {', '.join(DRAFTERS)} or null, got {drafter!r}")
    runs = line.get("runs")
    if runs is None:
        return
    if not isinstance(runs, dict) or set(runs) - set(DRAFTERS):
        raise UsageError(f"{where}: runs must map drafters ({', '.join(DRAFTERS)}) to lists")
    for name, values in runs.items():
        if (
            not isinstance(values, list)
            or len(values) != line["emitted"]
            or any(isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= RUN_CAP for v in values)
        ):
            raise UsageError(
                f"{where}: runs[{name!r}] must list one integer in 0..{RUN_CAP} per emitted token ({line['emitted']})"
            )


def _check_host_gaps(obj: dict, where: str) -> None:
    """`host_gap_ms` (total host time from reads to the next launch) and `host_gaps` (how many) go
    together, or are absent (null in a summary)."""
    if obj.get("host_gap_ms") is None and obj.get("host_gaps") is None:
        return
    _typed(obj, "host_gap_ms", float, where)
    _typed(obj, "host_gaps", int, where)


def check_summary(summary, where: str = "summary") -> None:
    """Raise UsageError unless `summary` is a valid run summary."""
    _check_object(summary, "summary", READABLE_SUMMARY_SCHEMAS, _SUMMARY_FIELDS, _SUMMARY_OPTIONAL, where)
    missing = [k for k in _CONFIG_FIELDS if k not in summary["config"]]
    if missing:
        raise UsageError(f"{where}: config lacks {missing}")
    if summary.get("acceptance") is not None:
        _typed(summary, "acceptance", float, where)
    if summary.get("phases_ms") is not None:
        _check_phases(summary["phases_ms"], where)
    _check_host_gaps(summary, where)
    for entry in summary["per_prompt"]:
        if not isinstance(entry, dict):
            raise UsageError(f"{where}: per_prompt entries must be objects")
        for name, kind in _PER_PROMPT_FIELDS.items():
            _typed(entry, name, kind, f"{where} per_prompt")
        if "sample" in entry or "tokens" in entry:
            _typed(entry, "sample", int, f"{where} per_prompt")
            tokens = entry.get("tokens")
            if not (isinstance(tokens, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in tokens)):
                raise UsageError(f"{where} per_prompt: tokens must be a list of token ids")
    if summary["config"].get("sampling") is not None:
        _check_sampling(summary["config"]["sampling"], f"{where} config.sampling")


def _check_sampling(sampling, where: str) -> None:
    """The optional `sampling` object of a summary's config (absent or null: greedy)."""
    if not isinstance(sampling, dict):
        raise UsageError(f"{where}: expected an object")
    for name, kind in (("temperature", float), ("top_k", int), ("top_p", float), ("seed", int), ("samples", int)):
        _typed(sampling, name, kind, where)
    if not 0 < sampling["top_p"] <= 1 or sampling["samples"] < 1:
        raise UsageError(f"{where}: need top_p in (0, 1] and samples >= 1")


def check_trace_lines(numbered: list[tuple[int, dict]], path: str | Path) -> None:
    """Raise UsageError unless every (line number, line) is a valid trace line and each generation (a
    prompt, and its sample in sampled runs) numbers its rounds 0, 1, 2, ... in file order: the simulator
    replays a generation's rounds in file order as one stream, so a repeated or missing round (two runs
    of one prompt in one file, a line copied or lost) would silently merge or shift its positions."""
    next_round: dict[tuple[str, int], int] = {}
    for number, line in numbered:
        where = f"{path}:{number}"
        check_trace_line(line, where)
        generation = (line["prompt_id"], line.get("sample", 0))
        expected = next_round.get(generation, 0)
        if line["round"] != expected:
            sample = f" sample {generation[1]}" if generation[1] else ""
            raise UsageError(
                f"{where}: round {line['round']} of prompt {line['prompt_id']!r}{sample} should be {expected}: "
                "a generation's rounds count 0, 1, 2, ... in file order, each once"
            )
        next_round[generation] = expected + 1


def read_trace(path: str | Path) -> list[dict]:
    """Every line of a trace file, each checked."""
    path = Path(path)
    numbered = []
    for number, raw in enumerate(read_text(path, "trace").splitlines(), 1):
        if not raw.strip():
            continue
        try:
            numbered.append((number, json.loads(raw)))
        except json.JSONDecodeError as e:
            raise UsageError(f"{path}:{number}: not valid JSON ({e.msg})") from None
    if not numbered:
        raise UsageError(f"{path}: trace has no rounds")
    check_trace_lines(numbered, path)
    return [line for _, line in numbered]


def read_summary(path: str | Path) -> dict:
    """A run summary file, parsed and checked."""
    summary = read_json(path, "run summary")
    check_summary(summary, str(path))
    return summary


def write_trace(path: str | Path, lines: list[dict]) -> None:
    """Check, then write atomically: a trace on disk is always one its readers accept."""
    check_trace_lines(list(enumerate(lines, 1)), path)
    write_atomic(path, "".join(json.dumps(line) + "\n" for line in lines))


def write_summary(path: str | Path, summary: dict) -> None:
    check_summary(summary, str(path))
    write_atomic(path, json.dumps(summary, indent=2) + "\n")
