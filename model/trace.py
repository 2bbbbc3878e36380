"""What a generation did, as the acceptance trace and run summary of docs/contracts.md.

The decoder returns `Generation` records (host values read once per generation); this module turns
them into `flashspec.trace/1` lines and a `flashspec.summary/1` object, checks both against the
contract, and writes them atomically (a temporary file, then a rename), so a reader never sees a
half-written file.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path

TRACE_SCHEMA = "flashspec.trace/1"
SUMMARY_SCHEMA = "flashspec.summary/1"
PHASES = ("draft_body", "draft_head", "verify", "finalize", "sync", "other")


@dataclass
class Round:
    """One speculative round (one token for baseline) as the host learned it."""

    proposed: int
    accepted: int
    emitted: int
    verify_skipped: bool
    context: int
    lookahead_used: bool | None = None
    phases_ms: dict[str, float] | None = None


@dataclass
class Generation:
    """One prompt's generation: its tokens (the first one included), rounds, times and call counts."""

    tokens: list[int]
    rounds: list[Round]
    ttft_ms: float
    decode_ms: float
    verify_calls: int
    append_calls: int

    @property
    def decode_tokens(self) -> int:
        return len(self.tokens) - 1


def trace_lines(gen: Generation, *, prompt_id: str, schedule: str, head: str, K: int,
                probes: int | None = None) -> list[dict]:
    """The generation's trace lines (K is 0 for baseline; probes None for a dense head)."""
    lines = []
    for index, r in enumerate(gen.rounds):
        line = {"schema": TRACE_SCHEMA, "prompt_id": str(prompt_id), "round": index, "schedule": schedule,
                "head": head, "probes": probes, "K": K, "proposed": r.proposed, "accepted": r.accepted,
                "emitted": r.emitted, "verify_skipped": r.verify_skipped, "context": r.context,
                "lookahead_used": r.lookahead_used}
        if r.phases_ms is not None:
            line["phases_ms"] = {p: round(r.phases_ms[p], 6) for p in PHASES}
        lines.append(line)
    return lines


def summarize(config: dict, runs: list[tuple[str, Generation]]) -> dict:
    """The run summary over (prompt_id, generation) pairs; config is the contract's config object."""
    gens = [g for _, g in runs]
    rounds = [r for g in gens for r in g.rounds]
    decode_tokens = sum(g.decode_tokens for g in gens)
    decode_ms = sum(g.decode_ms for g in gens)
    proposed = sum(r.proposed for r in rounds)
    timed = bool(rounds) and all(r.phases_ms is not None for r in rounds)
    return {
        "schema": SUMMARY_SCHEMA,
        "config": config,
        "ttft_ms": statistics.median(g.ttft_ms for g in gens) if gens else 0.0,
        "decode_tokens": decode_tokens,
        "decode_ms": decode_ms,
        "decode_tok_s": decode_tokens / decode_ms * 1000.0 if decode_ms > 0 else 0.0,
        "acceptance": sum(r.accepted for r in rounds) / proposed if proposed else None,
        "mean_emitted": decode_tokens / len(rounds) if rounds else 0.0,
        "verify_calls": sum(g.verify_calls for g in gens),
        "append_calls": sum(g.append_calls for g in gens),
        "phases_ms": {p: sum(r.phases_ms[p] for r in rounds) for p in PHASES} if timed else None,
        "per_prompt": [{"prompt_id": str(pid), "ttft_ms": g.ttft_ms, "decode_tokens": g.decode_tokens,
                        "decode_ms": g.decode_ms, "rounds": len(g.rounds)} for pid, g in runs],
    }


# --- contract checks ----------------------------------------------------------------------------

_TRACE_FIELDS = {"schema": str, "prompt_id": str, "round": int, "schedule": str, "head": str, "K": int,
                 "proposed": int, "accepted": int, "emitted": int, "verify_skipped": bool, "context": int}
_SUMMARY_FIELDS = {"schema": str, "config": dict, "ttft_ms": float, "decode_tokens": int, "decode_ms": float,
                   "decode_tok_s": float, "mean_emitted": float, "verify_calls": int, "append_calls": int,
                   "per_prompt": list}
_CONFIG_FIELDS = ("target", "draft", "weights", "head", "probes", "schedule", "K", "placement", "graphs",
                  "max_new_tokens", "prompts")


def _typed(obj: dict, name: str, kind: type, where: str) -> None:
    value = obj.get(name)
    ok = isinstance(value, kind) and not (kind is int and isinstance(value, bool))
    if kind is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not ok:
        raise ValueError(f"{where}: field {name!r} must be {kind.__name__}, got {value!r}")


def _check_phases(phases, where: str) -> None:
    if not isinstance(phases, dict) or set(phases) != set(PHASES):
        raise ValueError(f"{where}: phases_ms must have exactly {list(PHASES)}, got {phases!r}")
    for p in PHASES:
        _typed(phases, p, float, f"{where} phases_ms")


def check_trace_line(line: dict, where: str = "trace") -> None:
    """Raise ValueError unless `line` is a valid flashspec.trace/1 line."""
    if line.get("schema") != TRACE_SCHEMA:
        raise ValueError(f"{where}: unknown trace schema {line.get('schema')!r} (expected {TRACE_SCHEMA!r})")
    for name, kind in _TRACE_FIELDS.items():
        _typed(line, name, kind, where)
    if line.get("lookahead_used", "missing") not in (None, True, False):
        raise ValueError(f"{where}: lookahead_used must be true, false or null")
    probes = line.get("probes", "missing")
    if probes is not None and (isinstance(probes, bool) or not isinstance(probes, int) or probes < 1):
        raise ValueError(f"{where}: probes must be a positive integer or null, got {probes!r}")
    if not 0 <= line["accepted"] <= line["proposed"] <= line["K"]:
        raise ValueError(f"{where}: need 0 <= accepted <= proposed <= K, got {line}")
    if not 1 <= line["emitted"] <= line["accepted"] + 1:
        raise ValueError(f"{where}: emitted must be in 1..accepted+1, got {line['emitted']}")
    if "phases_ms" in line:
        _check_phases(line["phases_ms"], where)


def check_summary(summary: dict, where: str = "summary") -> None:
    """Raise ValueError unless `summary` is a valid flashspec.summary/1 object."""
    if summary.get("schema") != SUMMARY_SCHEMA:
        raise ValueError(f"{where}: unknown summary schema {summary.get('schema')!r} (expected {SUMMARY_SCHEMA!r})")
    for name, kind in _SUMMARY_FIELDS.items():
        _typed(summary, name, kind, where)
    missing = [k for k in _CONFIG_FIELDS if k not in summary["config"]]
    if missing:
        raise ValueError(f"{where}: config lacks {missing}")
    if summary.get("acceptance") is not None:
        _typed(summary, "acceptance", float, where)
    if summary.get("phases_ms") is not None:
        _check_phases(summary["phases_ms"], where)
    for p in summary["per_prompt"]:
        for name, kind in (("prompt_id", str), ("ttft_ms", float), ("decode_tokens", int),
                           ("decode_ms", float), ("rounds", int)):
            _typed(p, name, kind, f"{where} per_prompt")


# --- files --------------------------------------------------------------------------------------

def write_atomic(path: str | Path, text: str) -> None:
    """Write text to a temporary file beside `path`, then rename it over `path`."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, 0o644)  # mkstemp makes it private; outputs are ordinary files
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def write_trace(path: str | Path, lines: list[dict]) -> None:
    write_atomic(path, "".join(json.dumps(line) + "\n" for line in lines))


def write_summary(path: str | Path, summary: dict) -> None:
    write_atomic(path, json.dumps(summary, indent=2) + "\n")


def read_trace(path: str | Path) -> list[dict]:
    """Trace lines of a file, each checked against the contract."""
    lines = [json.loads(raw) for raw in Path(path).read_text(encoding="utf-8").splitlines() if raw.strip()]
    for number, line in enumerate(lines, 1):
        check_trace_line(line, f"{path}:{number}")
    return lines


def read_summary(path: str | Path) -> dict:
    summary = json.loads(Path(path).read_text(encoding="utf-8"))
    check_summary(summary, str(path))
    return summary
