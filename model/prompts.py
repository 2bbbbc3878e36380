"""Spec-Bench prompts: load `question.jsonl` and select a fixed subset by a short spec string.

Specs: `first:N` (the first N questions in file order), `per-category:N` (the first N of every
category), or a comma-separated list of category names and question ids (`writing,math`, `81,82`,
`qa,81`). The prompt text is a question's first turn. Selections keep file order, without repeats.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from contracts import UsageError
from contracts.files import read_text

DEFAULT_PATH = (
    Path(__file__).resolve().parent / "data" / "spec_bench" / "question.jsonl"
)  # Apache-2.0, see LICENSE there


@dataclass(frozen=True)
class Prompt:
    id: str
    category: str
    text: str


def load_questions(path: str | Path | None = None) -> list[Prompt]:
    """Every question of the file as a Prompt (its first turn)."""
    path = Path(path) if path is not None else DEFAULT_PATH
    lines = read_text(path, "prompts file").split("\n")  # not splitlines: JSON strings may hold U+2028
    prompts = [_question(line, path, number) for number, line in enumerate(lines, start=1) if line.strip()]
    if not prompts:
        raise UsageError(f"{path} is not a Spec-Bench question file (no questions)")
    return prompts


def _question(line: str, path: Path, number: int) -> Prompt:
    """One line's question; what is wrong with it names the file's line, which the JSON decoder cannot."""

    def bad(problem: str) -> UsageError:
        return UsageError(f"{path} is not a Spec-Bench question file (line {number}: {problem})")

    try:
        row = json.loads(line)
    except json.JSONDecodeError as e:
        raise bad(f"not valid JSON ({e.msg} at column {e.colno})") from None
    if not isinstance(row, dict):
        raise bad("not a JSON object")
    missing = [key for key in ("question_id", "category", "turns") if key not in row]
    if missing:
        raise bad(f"missing {', '.join(missing)}")
    turns = row["turns"]
    if not isinstance(turns, list):
        raise bad('"turns" is not a list')
    if not turns:
        raise bad('"turns" is empty')
    if not isinstance(turns[0], str) or not turns[0]:
        raise bad("the first turn is empty or not text")
    return Prompt(str(row["question_id"]), str(row["category"]), turns[0])


def select_prompts(spec: str, path: str | Path | None = None) -> list[Prompt]:
    """The questions `spec` names (see the module docstring)."""
    questions = load_questions(path)
    kind, _, count = spec.partition(":")
    if kind in ("first", "per-category"):
        n = _positive(count, spec)
        if kind == "first":
            return questions[:n]
        seen: dict[str, int] = {}
        chosen = []
        for q in questions:
            seen[q.category] = seen.get(q.category, 0) + 1
            if seen[q.category] <= n:
                chosen.append(q)
        return chosen
    return _by_names(spec, questions)


def _positive(count: str, spec: str) -> int:
    if not count.isdigit() or int(count) < 1:
        raise UsageError(f"prompt spec {spec!r}: expected a positive count after ':'")
    return int(count)


def _by_names(spec: str, questions: list[Prompt]) -> list[Prompt]:
    categories = list(dict.fromkeys(q.category for q in questions))
    ids = {q.id for q in questions}
    items = [item.strip() for item in spec.split(",") if item.strip()]
    unknown = [item for item in items if item not in categories and item not in ids]
    if unknown or not items:
        raise UsageError(
            f"unknown prompt selection {', '.join(unknown) or repr(spec)}; valid: first:N, per-category:N, "
            f"categories {', '.join(categories)}, or question ids {questions[0].id}..{questions[-1].id}"
        )
    wanted = set(items)
    return [q for q in questions if q.category in wanted or q.id in wanted]
