"""The sampled draft head's cost, the way model/sampling.py's torch ops draw against model/sampling_noise.py's
kernels (python -m measure.head_cost --temperature T adds these to each head that samples).

Under sampling a draft step forms q (the head's logits, temperature, top-k / top-p, softmax) and draws
from it with the hash noise keyed at its position. The torch hash spends about a hundred launches a
step; the kernels three. Each timing is device time per call inside a CUDA graph with L2 evicted, as
the decoder's graphed head step pays it.
"""

from __future__ import annotations

import torch

from model import sampling
from model.sampling import SamplingSettings
from model.sampling_noise import SamplingNoise

from .timing import time_in_graph

CHECKED_DRAWS = 64  # random states and positions on which both draws must pick the same token


def sampled_rows(head, states: list[tuple], settings: SamplingSettings, device: torch.device, reps: int) -> dict:
    """For one head that samples (dense, FlashHead, shortlist: a head with `logits`): device time per
    call of forming q alone, of q and today's torch draw, and of q and the kernels' draw; and the share
    of CHECKED_DRAWS random draws on which the two draws agree (1.0: the same tokens on this GPU)."""
    vocab = head.vocab_size
    seed = torch.tensor([sampling.generation_seed(settings.seed, 0)], device=device)
    position = torch.tensor([300], device=device)
    tokens = torch.arange(vocab, device=device)
    noise = SamplingNoise(device, vocab, backend="triton")

    def q_only(hidden):
        return sampling.probabilities(head.logits(hidden), settings)

    def torch_draw(hidden):
        q = q_only(hidden)
        return sampling.race(q, sampling.exponentials(sampling.keys(seed, position, sampling.DRAFT), tokens))

    def kernel_draw(hidden):
        return noise.draw(q_only(hidden), seed, position)

    rows = {
        name: time_in_graph(fn, states, device, reps=reps)
        for name, fn in (("q", q_only), ("q + torch hash draw", torch_draw), ("q + kernel draw", kernel_draw))
    }
    generator = torch.Generator(device=device).manual_seed(1)
    same = 0
    for index in range(CHECKED_DRAWS):
        hidden = torch.randn(1, head.hidden_size, device=device, generator=generator).to(head.weight.dtype)
        position.fill_(index * 37 + 1)
        same += int(torch.equal(torch_draw(hidden), kernel_draw(hidden)))
    return {"temperature": settings.temperature, "timings": rows, "same_tokens": same / CHECKED_DRAWS}


def format_sampled(name: str, result: dict) -> str:
    """One printed line per head: the three medians in us and the agreement."""
    medians = "  ".join(f"{op} {timing['median_ms'] * 1e3:7.2f} us" for op, timing in result["timings"].items())
    return f"{name:<24} T={result['temperature']}  {medians}  same tokens {result['same_tokens']:.3f}"
