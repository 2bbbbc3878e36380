"""The figures the measure commands draw, written as PNG whole or not at all (no torch needed)."""

from __future__ import annotations

import io
from pathlib import Path

from contracts.files import write_atomic


def write_figure(fig, path: Path, dpi: int) -> None:
    """`fig` as a PNG at `path`, then closed: a reader never finds half a figure, and a command that draws
    several does not keep them all open."""
    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi)
    plt.close(fig)
    write_atomic(path, buffer.getvalue())
