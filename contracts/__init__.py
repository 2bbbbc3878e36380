"""The names and file formats that `measure`, `model`, `sim` and `validate` share, defined once.

Torch-free and dependency-free (standard library only), so the simulator can import it anywhere:
- `names`: schedules, heads, phases, placements and cost regimes;
- `profile`, `trace`, `summary`: the three file formats, each with one reader and one checker
  (`docs/contracts.md` describes their fields);
- `timeline`: one generation's streams as a Chrome/Perfetto trace, written by the simulator and the
  decoder alike, with its reader and checker;
- `files`: atomic writing of files and folders;
- `progress`: progress of long work on a terminal, silent in logs;
- `cli`: the one-line-error argument parser and `UsageError`, the one exception for bad input.
"""

from contracts.cli import UsageError
from contracts.names import HEADS, PHASES, PLACEMENTS, REGIMES, SCHEDULES

__all__ = ["HEADS", "PHASES", "PLACEMENTS", "REGIMES", "SCHEDULES", "UsageError"]
