"""The sampled draft head's cost: q over the whole vocabulary against q over the head's scored tokens
alone (model/draft_q.py), each with its draw (python -m measure.head_cost --temperature T adds these to
every head).

Under sampling a draft step scores its tokens, forms q (temperature, top-k / top-p, the normalization;
model/draft_q_triton.py's kernels, as the decoder on a GPU) and draws from it with the hash noise keyed
at its position. Laid out over the vocabulary (what the decoder did before q went compact, and still does
for the dense head) every step spends launches over all V entries; over the scored tokens only, over the
N the head scored. Each timing is device time per call inside a CUDA graph with L2 evicted, as the
decoder's graphed head step pays it. `same_tokens`: the share of CHECKED_DRAWS random states and
positions on which both layouts draw the same token (1.0 is what model/draft_q.py promises).
"""

from __future__ import annotations

import torch

from model import draft_q, sampling
from model.draft_q_triton import DraftQ
from model.sampling import SamplingSettings
from model.sampling_noise import SamplingNoise

from .timing import time_in_graph

CHECKED_DRAWS = 64


def sampled_rows(head, states: list[tuple], settings: SamplingSettings, device: torch.device, reps: int) -> dict:
    """For one head: device time per call of q over the vocabulary with its draw, of the scored q alone,
    and of the scored q with its draw (the decoder's sampled head step); and the share of draws on which
    the two layouts agree."""
    vocab = head.vocab_size
    seed = torch.tensor([sampling.generation_seed(settings.seed, 0)], device=device)
    position = torch.tensor([300], device=device)
    fed = torch.tensor([[5]], device=device)  # the token the body was fed (the router reads it)
    noise = SamplingNoise(device, vocab, backend="triton")
    q_of = DraftQ(device, settings, backend="triton")  # the decoder's q on a GPU (model/draft_q_triton.py)

    def vocabulary_draw(hidden):
        ids, logits = head.scored_logits(hidden, fed)
        logits = logits if ids is None else draft_q.dense_layout(ids, logits, vocab, float("-inf"))
        return noise.draw(q_of(logits), seed, position)

    def scored_q(hidden):
        ids, logits = head.scored_logits(hidden, fed)
        return q_of(logits, ids), ids

    def scored_draw(hidden):
        q, ids = scored_q(hidden)
        return noise.draw(q, seed, position, ids)

    timed = (("vocabulary q + draw", vocabulary_draw), ("scored q", scored_q), ("scored q + draw", scored_draw))
    rows = {name: time_in_graph(fn, states, device, reps=reps) for name, fn in timed}
    generator = torch.Generator(device=device).manual_seed(1)
    previous = getattr(head, "previous", None)  # a router's input state: both layouts route from the same one
    same = 0
    for index in range(CHECKED_DRAWS):
        hidden = torch.randn(1, head.hidden_size, device=device, generator=generator).to(head.weight.dtype)
        position.fill_(index * 37 + 1)
        before = None if previous is None else previous.clone()
        vocabulary = vocabulary_draw(hidden)
        if before is not None:
            previous.copy_(before)
        same += int(torch.equal(vocabulary, scored_draw(hidden)))
    return {"temperature": settings.temperature, "timings": rows, "same_tokens": same / CHECKED_DRAWS}


def format_sampled(name: str, result: dict) -> str:
    """One printed line per head: the medians in us and the agreement."""
    medians = "  ".join(f"{op} {timing['median_ms'] * 1e3:7.2f} us" for op, timing in result["timings"].items())
    return f"{name:<24} T={result['temperature']}  {medians}  same tokens {result['same_tokens']:.3f}"
