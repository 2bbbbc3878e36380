"""Read an acceptance trace (JSONL, `flashspec.trace/1`) into per-prompt rounds."""
from __future__ import annotations

import json
from pathlib import Path

from .errors import SimInputError

TRACE_SCHEMA = "flashspec.trace/1"
INT_FIELDS = ("round", "K", "proposed", "accepted", "emitted", "context")


def _check_line(line: dict, where: str) -> None:
    if not isinstance(line, dict):
        raise SimInputError(f"{where}: expected a JSON object")
    if line.get("schema") != TRACE_SCHEMA:
        raise SimInputError(f"{where}: unknown trace schema {line.get('schema')!r} (expected {TRACE_SCHEMA!r})")
    for name in INT_FIELDS:
        value = line.get(name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise SimInputError(f"{where}: field {name!r} must be a non-negative integer, got {value!r}")
    if "prompt_id" not in line:
        raise SimInputError(f"{where}: missing prompt_id")
    if not isinstance(line.get("verify_skipped"), bool):
        raise SimInputError(f"{where}: field 'verify_skipped' must be true or false")
    if line["accepted"] > line["K"] or line["accepted"] > line["proposed"]:
        raise SimInputError(f"{where}: accepted {line['accepted']} exceeds K/proposed")
    if not 0 < line["emitted"] <= line["accepted"] + 1:
        raise SimInputError(f"{where}: emitted must be in 1..accepted+1, got {line['emitted']}")


def read_trace(path: str | Path) -> tuple[dict[str, list[dict]], dict]:
    """Rounds grouped by prompt (in file order) and the trace's head/probes/schedule."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise SimInputError(f"cannot read trace {path}: {e.strerror}") from None
    by_prompt: dict[str, list[dict]] = {}
    meta: dict = {}
    for number, raw in enumerate(text.splitlines(), 1):
        if not raw.strip():
            continue
        where = f"{path}:{number}"
        try:
            line = json.loads(raw)
        except json.JSONDecodeError as e:
            raise SimInputError(f"{where}: not valid JSON ({e.msg})") from None
        _check_line(line, where)
        if line["K"] == 0:
            raise SimInputError(f"{where}: a baseline trace (K=0) carries no acceptance to replay")
        by_prompt.setdefault(str(line["prompt_id"]), []).append(line)
        meta.setdefault("head", line.get("head", "dense"))
        meta.setdefault("probes", line.get("probes"))
        meta.setdefault("schedule", line.get("schedule"))
    if not by_prompt:
        raise SimInputError(f"{path}: trace has no rounds")
    return by_prompt, meta
