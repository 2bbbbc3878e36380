"""The tiny pair and the small router that the sampling tests decode with (CPU)."""

import torch

from model.loading import load_model
from model.router import build_router


def tiny_pair():
    """A 2-layer tiny target and a 1-layer draft of the same preset (512 tokens), on the CPU."""
    target = load_model("tiny-qwen3#layers=2", "cpu", seed=1, max_seq_len=48).model
    draft = load_model("tiny-qwen3#layers=1", "cpu", seed=1, max_seq_len=48).model
    return target, draft


def small_router(weight: torch.Tensor, embedding: torch.Tensor, clusters: int = 12, cap: int = 80):
    """A router trained briefly on 64 random states (its choices need not be good, only real)."""
    g = torch.Generator().manual_seed(0)
    n, d = 64, weight.shape[1]
    samples = {"tokens": torch.randint(0, weight.shape[0], (n,), generator=g)}
    samples["previous"], samples["hidden"] = torch.randn(n, d, generator=g), torch.randn(n, d, generator=g)
    return build_router(weight.cpu(), embedding.cpu(), samples, clusters, cap=cap, iters=3, width=16, epochs=2)
