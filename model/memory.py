"""Whether an allocation fits, asked before it is made: sizes the machine cannot hold are bad input."""

from __future__ import annotations

from pathlib import Path

import torch

from contracts import UsageError

HEADROOM = 0.95  # leave a little for activations, graphs and the allocator's rounding


def available_bytes(device: torch.device) -> int | None:
    """Free memory on `device` (the GPU's free memory, or the host's available memory on Linux)."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def check_fits(what: str, need_bytes: int, device: torch.device, advice: str) -> None:
    """UsageError naming `what` and `advice` when `need_bytes` more than fills what `device` has free."""
    free = available_bytes(device)
    if free is not None and need_bytes > HEADROOM * free:
        raise UsageError(
            f"{what} needs {need_bytes / 1e9:.1f} GB, but {device} has {free / 1e9:.1f} GB free ({advice})"
        )


def tensor_bytes(module: torch.nn.Module) -> int:
    """Bytes of a module's parameters and buffers (works on the meta device, before allocation)."""
    tensors = [*module.parameters(), *module.buffers()]
    return sum(t.numel() * t.element_size() for t in tensors)


# Cache slots past the model's maximum positions a generation may use: a look-ahead and the fixed-width
# rows of the last forward sit past its last token (model/decoder.py, cache_room).
CACHE_SLACK = 160


def check_cache(model, slots: int, name: str) -> None:
    """A static KV cache of `slots` positions is within the model's positions and fits its device."""
    config = model.config
    if slots > config.max_positions + CACHE_SLACK:
        raise UsageError(
            f"{name}: a cache of {slots:,} positions exceeds the model's {config.max_positions:,} "
            "positions (use shorter prompts, fewer new tokens or shorter contexts)"
        )
    element = model.embed_tokens.weight.element_size()
    need = 2 * config.n_layers * config.n_kv_heads * config.head_dim * slots * element
    check_fits(
        f"{name}'s KV cache of {slots:,} positions",
        need,
        model.embed_tokens.weight.device,
        "use shorter prompts, fewer new tokens or shorter contexts",
    )
