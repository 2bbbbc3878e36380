"""Runs of one configuration, each run of every configuration before the next, measured as the median run.

A host's slow spell moves one run, not the median. On one H200 in session 16 one fixed arm's rounds paid
0.3 ms more host time for a whole run (6% of its tok/s); on two H200s in session 18 the same
pipelined-deferred configuration measured 236.6 and 246.8 tok/s in two runs a minute apart, its host
gaps 27.5 against 8.4 ms. A run's files are named by `run_stem`: the first run keeps the configuration's
name, so a folder of single runs reads as before.
"""

from __future__ import annotations

import re

from contracts import UsageError

MAX_REPEATS = 15
_REPEAT_SUFFIX = re.compile(r"\.repeat-(\d+)$")


def checked_repeats(count: int | None, default: int) -> int:
    """--repeats, checked: an odd count up to MAX_REPEATS (None: `default`)."""
    count = default if count is None else count
    if not (count % 2 and 1 <= count <= MAX_REPEATS):
        raise UsageError(f"--repeats must be odd from 1 to {MAX_REPEATS} (the median is one run), got {count}")
    return count


def run_stem(name: str, repeat: int) -> str:
    """The file stem of a configuration's run: its name for the first, name.repeat-N for run N."""
    return name if repeat == 1 else f"{name}.repeat-{repeat}"


def split_stem(stem: str) -> tuple[str, int]:
    """`run_stem` undone: (the configuration's name, which run)."""
    match = _REPEAT_SUFFIX.search(stem)
    return (stem[: match.start()], int(match.group(1))) if match else (stem, 1)


def median_by_tok_s(runs: list, summary_of) -> tuple:
    """The run of median decode tok/s (an odd count) and the runs' (slowest, fastest) tok/s, None for one run."""
    ordered = sorted(runs, key=lambda run: summary_of(run)["decode_tok_s"])
    middle = ordered[len(ordered) // 2]
    if len(runs) == 1:
        return middle, None
    return middle, (summary_of(ordered[0])["decode_tok_s"], summary_of(ordered[-1])["decode_tok_s"])
