"""What the torch commands (model, measure, validate) add to contracts.cli: running out of device
memory is bad input too, reported in one line; and the sampling options all three take, defined once
(their checks live in model.sampling.SamplingSettings)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from contracts import UsageError
from contracts.cli import run_command
from model.sampling import SamplingSettings

OUT_OF_MEMORY = "out of GPU memory (try fewer or shorter prompts, fewer tokens, a smaller model or another placement)"


def run_torch_command(body: Callable[[], int | None]) -> int:
    def guarded():
        try:
            return body()
        except torch.cuda.OutOfMemoryError:
            raise UsageError(OUT_OF_MEMORY) from None

    return run_command(guarded)


def add_sampling_options(parser, defaults: bool = True) -> None:
    """--temperature, --top-k and --top-p (--seed, which each command also uses for its weights, stays
    the command's own). `defaults=False` leaves them unset (measure's options that override validate's)."""

    def default(value):
        return {"default": value} if defaults else {}

    add = parser.add_argument
    add(
        "--temperature",
        type=float,
        **default(0.0),
        help="sampling temperature; 0 (default) is greedy decoding; speculation keeps the target's distribution",
    )
    add("--top-k", type=int, **default(0), help="sample from the k most likely tokens only (default 0: all)")
    add("--top-p", type=float, **default(1.0), help="sample from the smallest set of mass >= p (default 1: all)")


def sampling_settings(temperature: float, top_k: int, top_p: float, seed: int, acceptance: str | None = None):
    """The checked SamplingSettings (bad values: one line, exit 2). Under sampling an acceptance control
    sets accept numbers 0 or +inf, which needs every token's p > 0: no top-k, no top-p."""
    settings = SamplingSettings(temperature, top_k, top_p, seed)
    if not settings.greedy and acceptance not in (None, "none") and (settings.top_k or settings.top_p < 1):
        raise UsageError("--acceptance under sampling needs --top-k 0 and --top-p 1 (a controlled accept needs p > 0)")
    return settings
