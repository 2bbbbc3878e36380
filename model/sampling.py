"""Exact speculative sampling (Leviathan et al. 2023, Algorithm 1): the torch reference of one round's
acceptance and its residual or bonus draw, from random numbers the caller supplies.

The same random numbers give the same tokens in model/sampling_triton.py's fused kernel, so the
reference is both the CPU path and the kernel's test oracle. No host sync and no data-dependent
Python branching: it runs inside CUDA-graph capture too.
"""

from __future__ import annotations

import torch


def verify_block_reference(target_probs, draft_probs, draft_tokens, accept_uniforms, race_noise):
    """target_probs [K+1, V] float32 (p_1..p_{K+1}), draft_probs [K, V] float32 (q_1..q_K, zero
    outside a shortlist), draft_tokens [K] long, accept_uniforms [K] float32 in [0,1),
    race_noise [V] float32 > 0 (exponential noise, Exp(1)). Returns (accepted [1] long, final [1] long).

    Position i accepts iff u_i q_i(d_i) < p_i(d_i) (probability min(1, p/q)); a = the leading accepts.
    The final token races the residual max(0, p_{a+1} - q_{a+1}) (p_{a+1} where that is all zero,
    and p_{K+1} after a full block): argmax r / noise with Exp(1) noise draws from r / sum(r)
    (lowest index among exact ties)."""
    K = draft_tokens.numel()
    positions = torch.arange(K, device=draft_tokens.device)
    accept = accept_uniforms * draft_probs[positions, draft_tokens] < target_probs[positions, draft_tokens]
    accepted = accept.long().cumprod(0).sum(0, keepdim=True)
    target_row = target_probs.index_select(0, accepted)[0]
    draft_row = draft_probs.index_select(0, accepted.clamp(max=K - 1))[0]
    residual = torch.where(accepted < K, (target_row - draft_row).clamp(min=0), target_row)
    residual = torch.where(residual.sum() == 0, target_row, residual)
    final = (residual / race_noise).argmax(0, keepdim=True)
    return accepted, final
