"""Early-exit self-speculation: a draft made of the target checkpoint's first N layers.

The draft is the same checkpoint cut after N layers, followed by the checkpoint's final norm and
its (tied) head. It shares the full model's parameter tensors (no copy) but owns its KV cache, so
it can run ahead of the target. It needs no second checkpoint, which is what makes a real-language
speculative run possible with the one real model our machines can install (Gemma 3 270M).

Spec syntax understood by `model.loading.load_model`: `SPEC#layers=N` (SPEC a preset or a folder).
"""

from __future__ import annotations

import dataclasses

import torch

from contracts import UsageError
from model.transformer import Transformer

MARKER = "#layers="


def split_spec(spec: str) -> tuple[str, int | None]:
    """`base#layers=N` -> (base, N); any other spec -> (spec, None)."""
    base, marker, count = spec.rpartition(MARKER)
    if not marker:
        return spec, None
    if not count.isdigit() or int(count) < 1:
        raise UsageError(f"{spec!r}: expected {MARKER}N with N a positive number of layers")
    return base, int(count)


def early_exit(model: Transformer, n_layers: int) -> Transformer:
    """The first `n_layers` layers of `model` + its final norm and head, sharing `model`'s
    parameter tensors. Its cache is not set up (call `setup_cache`); it never touches `model`'s."""
    config = model.config
    if not 1 <= n_layers <= config.n_layers:
        raise UsageError(
            f"early exit after {n_layers} layers: the model has {config.n_layers} (valid: 1..{config.n_layers})"
        )
    short = dataclasses.replace(config, n_layers=n_layers, layer_types=config.layer_types[:n_layers])
    with torch.device("meta"):
        draft = Transformer(short, model.embed_tokens.weight.dtype)
    shared = {
        name: tensor
        for name, tensor in model.state_dict().items()
        if not name.startswith("layers.") or int(name.split(".")[1]) < n_layers
    }
    draft.load_state_dict(shared, assign=True)  # assign: the draft's parameters are these tensors
    return draft.requires_grad_(False).eval()
