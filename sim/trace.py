"""An acceptance trace (contracts.trace) grouped into per-prompt rounds for replay."""

from __future__ import annotations

from pathlib import Path

from contracts import UsageError
from contracts.trace import read_trace


def rounds_by_prompt(path: str | Path) -> tuple[dict[str, list[dict]], dict]:
    """Rounds grouped by generation (prompt, and sample when sampled; in file order) and the trace's
    head, probes and schedule."""
    by_prompt: dict[str, list[dict]] = {}
    meta: dict = {}
    for number, line in enumerate(read_trace(path), 1):
        if line["K"] == 0:
            raise UsageError(f"{path}:{number}: a baseline trace (K=0) carries no acceptance to replay")
        # each sample of a sampled run is its own generation
        generation = line["prompt_id"] if not line.get("sample") else f"{line['prompt_id']}#{line['sample']}"
        by_prompt.setdefault(generation, []).append(line)
        meta.setdefault("head", line["head"])
        meta.setdefault("probes", line.get("probes"))
        meta.setdefault("schedule", line["schedule"])
    return by_prompt, meta
