"""The draft's distribution q under sampling, formed over the tokens its head scores only.

A FlashHead, shortlist or router head scores N tokens of the vocabulary; q is zero on the rest, so a
draft step keeps q in its compact form (those N token ids and their probabilities) and the verifier
reads it sparsely (`Decoder._dense_q` scatters it where the verify needs a full row). For the compact
form to give the same tokens as q over the whole vocabulary, every number the transform produces
for a token must not depend on where the token sits or on how many zeros sit beside it:

- temperature, top-k and the exponential of the shifted logits are per element, and the max and the
  k-th value do not depend on order;
- the normalizing sum is taken in fixed point (each weight rounded to a multiple of 2^-40, summed as
  64-bit integers), which is exact, so it is the same for any order of the terms: a float sum (torch's
  softmax) rounds differently when the same terms sit in another layout;
- top-p ranks the tokens by (weight, lowest token id first), as a stable sort of the whole vocabulary
  does, and sums the fixed-point weights ranked above each token.

The draw (`model/sampling_noise.py`) keys each token's noise by its real token id and breaks ties by
the lowest token id, so drawing from the compact q is drawing from the full one.

`probabilities` is the reference and the CPU decoder's path; on a GPU the decoder forms the same q, bit
for bit, in three launches (model/draft_q_triton.py).
"""

from __future__ import annotations

import torch

from model.sampling import SamplingSettings

FIXED_POINT = 2.0**40  # a weight in [0, 1] times this is at most 2^40; 2^22 of them still fit in int64
_LOW_MASK = 0xFFFFFFFF


def probabilities(logits: torch.Tensor, settings: SamplingSettings, tokens: torch.Tensor | None = None) -> torch.Tensor:
    """logits [n, N] (-inf where a token cannot be drawn) of the token ids `tokens` [n, N] (None: the
    whole vocabulary, token id = column) -> q [n, N] float32. Temperature, top-k and top-p as
    model.sampling.probabilities, with the exact normalization above. Fixed shapes, no host sync."""
    scaled = logits.float() / settings.temperature
    if settings.top_k and settings.top_k < scaled.shape[-1]:
        kth = scaled.topk(settings.top_k, dim=-1).values[..., -1:]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    weights = (scaled - scaled.amax(dim=-1, keepdim=True)).exp()  # the best token weighs exactly 1
    fixed = (weights * FIXED_POINT).round().long()
    if settings.top_p < 1:
        ids = torch.arange(scaled.shape[-1], device=scaled.device).expand_as(fixed) if tokens is None else tokens
        rank_key = (weights.view(torch.int32).long() << 32) | (_LOW_MASK - ids)
        order = rank_key.argsort(dim=-1, descending=True)  # keys are distinct but for zero weights
        ranked = fixed.gather(-1, order)
        before = ranked.cumsum(dim=-1) - ranked  # fixed-point mass ranked above each token
        keep = before.double() < settings.top_p * ranked.sum(dim=-1, keepdim=True).double()
        kept = torch.zeros_like(keep).scatter(-1, order, keep)
        fixed, weights = fixed * kept, torch.where(kept, weights, 0.0)
    total = fixed.sum(dim=-1, keepdim=True).float() / FIXED_POINT
    return weights / total


def dense_layout(tokens: torch.Tensor, values: torch.Tensor, vocab_size: int, fill: float) -> torch.Tensor:
    """Scored values [n, N] of tokens [n, N] laid out over the vocabulary [n, V], `fill` elsewhere. A
    token scored twice keeps its larger value (a repeated slot is -inf or 0 beside the real one)."""
    out = torch.full((tokens.shape[0], vocab_size), fill, device=values.device, dtype=values.dtype)
    return out.scatter_reduce_(1, tokens, values, "amax")
