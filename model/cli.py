"""What the torch commands (model, measure, validate) add to contracts.cli: running out of device
memory is bad input too, reported in one line."""

from __future__ import annotations

from collections.abc import Callable

import torch

from contracts import UsageError
from contracts.cli import run_command

OUT_OF_MEMORY = "out of GPU memory (try fewer or shorter prompts, fewer tokens, a smaller model or another placement)"


def run_torch_command(body: Callable[[], int | None]) -> int:
    def guarded():
        try:
            return body()
        except torch.cuda.OutOfMemoryError:
            raise UsageError(OUT_OF_MEMORY) from None

    return run_command(guarded)
