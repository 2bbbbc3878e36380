"""Progress of long work, for a person watching: one line redrawn on a terminal, nothing in a log.

Every command shows its progress through `Progress`. It draws on stderr only when stderr is a
terminal, so output redirected to a file or a pipe (logs, CI) gets no extra bytes, and stdout, which
carries the results, is never touched.
"""

from __future__ import annotations

import shutil
import sys
import time
from collections.abc import Iterator, Sequence
from typing import TextIO

REDRAW_SECONDS = 0.1  # at most ten redraws a second: cheap inside tight loops


class Progress:
    """`with Progress(total, "simulating", "tok") as progress: ... progress.update(n)`.

    `shown`: draw or not; None (the default) draws exactly when `stream` is a terminal. The line is
    erased when the block ends, so the results that follow start on a clean line."""

    def __init__(self, total: int, label: str, unit: str = "", stream: TextIO | None = None, shown: bool | None = None):
        self.total, self.label, self.unit = max(int(total), 0), label, unit
        self.stream = sys.stderr if stream is None else stream
        self.shown = _is_terminal(self.stream) if shown is None else shown
        self.done = 0
        self.text = ""
        self.started = time.monotonic()
        self.drawn_at = float("-inf")
        self.width = 0

    def __enter__(self) -> Progress:
        self._draw(force=True)
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def update(self, count: int = 1) -> None:
        """`count` more units done."""
        self.done += count
        self._draw(force=self.done >= self.total)

    def note(self, text: str) -> None:
        """What is being done now, shown after the count."""
        self.text = text
        self._draw()

    def close(self) -> None:
        """Erase the line (a no-op when nothing was drawn)."""
        if self.shown and self.width:
            self.stream.write("\r" + " " * self.width + "\r")
            self.stream.flush()
            self.width = 0

    def line(self) -> str:
        """The progress line: label, count, percentage, elapsed and remaining time, and the note."""
        elapsed = time.monotonic() - self.started
        unit = f" {self.unit}" if self.unit else ""
        parts = [f"{self.label}: {self.done:,}/{self.total:,}{unit}"]
        if self.total:
            parts.append(f"{min(self.done / self.total, 1.0):.0%}")
        parts.append(f"{_clock(elapsed)} elapsed")
        if 0 < self.done < self.total:
            parts.append(f"{_clock(elapsed * (self.total - self.done) / self.done)} left")
        if self.text:
            parts.append(self.text)
        return "  ".join(parts)

    def _draw(self, force: bool = False) -> None:
        if not self.shown:
            return
        now = time.monotonic()
        if not force and now - self.drawn_at < REDRAW_SECONDS:
            return
        self.drawn_at = now
        columns = shutil.get_terminal_size((100, 24)).columns
        text = self.line()[: max(columns - 1, 10)]  # never wrap: a wrapped line cannot be redrawn
        self.stream.write("\r" + text.ljust(self.width))
        self.stream.flush()
        self.width = max(self.width, len(text))


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


def _clock(seconds: float) -> str:
    minutes, seconds = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{seconds:02d}" if hours else f"{minutes}:{seconds:02d}"


def each(items: Sequence, label: str, unit: str = "") -> Iterator:
    """The items one by one, with a progress line on a terminal while they are worked through."""
    with Progress(len(items), label, unit) as progress:
        for item in items:
            yield item
            progress.update()
