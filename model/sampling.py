"""Exact speculative sampling: settings, the logits -> probabilities transform, device-side random
numbers, and the verification rule of one round (Leviathan et al. 2023, Algorithm 1).

Random numbers are a counter-based hash of (generation seed, position, purpose, token id),
computed by torch integer ops on the device that needs them: no generator state, no host sync,
the same values on the CPU and on any GPU, and fixed tensor shapes, so they are recorded inside
CUDA graphs (the seed and the positions are device tensors at fixed addresses). Keying by
position is what keeps the output exact across rounds and schedules: whatever the decoder emitted
up to position x is a function of the numbers keyed at positions before x alone, so the numbers
keyed at x are still fresh when position x is decided, whichever round or look-ahead decides it
(docs/design.md, "Sampling").

Sampling a distribution r is the exponential race: argmax_j r_j / E_j with E_j ~ Exp(1), which
draws j with probability r_j / sum(r) without normalizing or a cumulative sum, and is independent
of the order in which a kernel visits the tokens (lowest index among exact ties).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from contracts import UsageError

DRAFT, ACCEPT, RACE = 0, 1, 2  # purposes of the random numbers of one position
_MASK = 0xFFFFFFFF
_GOLDEN = 0x9E3779B9
MAX_SEED = 2**32 - 1  # the simulator's bound too (sim.scenario.LIMITS); seed + 1 still seeds a torch generator


def check_seed(seed: int) -> None:
    """--seed in 0..MAX_SEED, or one line: a larger one overflows the generators it seeds."""
    if not 0 <= seed <= MAX_SEED:
        raise UsageError(f"--seed must be in 0..{MAX_SEED:,}, got {seed}")


@dataclass(frozen=True)
class SamplingSettings:
    """temperature 0 is greedy decoding (the decoder's greedy path, unchanged); top_k 0 and
    top_p 1.0 switch those filters off. `seed` seeds every generation's random numbers."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self):
        if not (self.temperature >= 0 and self.temperature < float("inf")):
            raise UsageError(f"--temperature must be a finite number >= 0 (0 is greedy), got {self.temperature}")
        if self.top_k < 0:
            raise UsageError(f"--top-k must be >= 0 (0 keeps every token), got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise UsageError(f"--top-p must be in (0, 1] (1 keeps every token), got {self.top_p}")
        check_seed(self.seed)
        if self.greedy and (self.top_k or self.top_p < 1):
            raise UsageError("--top-k and --top-p apply when sampling: give --temperature > 0 as well")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def describe(self) -> dict:
        """The summary's `sampling` object."""
        return {"temperature": self.temperature, "top_k": self.top_k, "top_p": self.top_p, "seed": self.seed}


GREEDY = SamplingSettings()


def probabilities(logits: torch.Tensor, settings: SamplingSettings) -> torch.Tensor:
    """logits [n, V] (-inf where a token cannot be drawn) -> probabilities [n, V] float32: divide by
    the temperature, keep the top_k highest, then the smallest set of highest whose mass reaches
    top_p. Fixed shapes, no host sync. Target and draft go through this same function."""
    scaled = logits.float() / settings.temperature
    if settings.top_k and settings.top_k < scaled.shape[-1]:
        kth = scaled.topk(settings.top_k, dim=-1).values[..., -1:]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    probs = torch.softmax(scaled, dim=-1)
    if settings.top_p < 1:
        ordered, order = probs.sort(dim=-1, descending=True)
        before = ordered.cumsum(dim=-1) - ordered  # mass of the tokens ranked above each one
        ordered = ordered.masked_fill(before >= settings.top_p, 0.0)
        probs = torch.zeros_like(probs).scatter_(-1, order, ordered)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


# --- random numbers ---------------------------------------------------------------------------------
def _mul32(x: torch.Tensor, constant: int) -> torch.Tensor:
    """(x * constant) mod 2**32 for x in [0, 2**32) in int64 without overflowing it."""
    low = x * (constant & 0xFFFF)
    high = ((x * (constant >> 16)) & 0xFFFF) << 16
    return (low + high) & _MASK


def _mix(x: torch.Tensor) -> torch.Tensor:
    """lowbias32 (C. Wellons): a bijective 32-bit hash with low bias."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def generation_seed(seed: int, sample: int) -> int:
    """The 32-bit seed of sample `sample` of a run seeded `seed` (an independent stream per sample)."""
    low, high, index = (torch.tensor([v & _MASK]) for v in (seed, seed >> 32, sample))
    return int(_mix(_mix(_mix(low) ^ high) ^ index).item())


def keys(seed: torch.Tensor, positions: torch.Tensor, purpose: int) -> torch.Tensor:
    """seed [1] int64 (a 32-bit generation seed), positions [n] int64 -> 32-bit keys [n]."""
    return _mix(_mix(seed & _MASK) ^ _mix((positions * 4 + purpose) & _MASK))


def _bits(keys: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """keys [n], tokens [m] -> 24 random bits [n, m] per (key, token)."""
    counter = (keys[:, None] + _mul32(tokens[None, :] + 1, _GOLDEN)) & _MASK
    return _mix(_mix(counter) ^ keys[:, None]) >> 8


def uniforms(keys: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Uniform [0, 1) float32 [n, m], one per (key, token id)."""
    return _bits(keys, tokens).float() * 2.0**-24


def exponentials(keys: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Exp(1) noise float32 [n, m] > 0, one per (key, token id): -log of a uniform in (0, 1). The
    uniform takes 23 bits, (b + 0.5) / 2**23, which float32 holds exactly, so it never rounds to 1
    (noise 0 would let a token of probability 0 win the race)."""
    return -torch.log(((_bits(keys, tokens) >> 1).float() + 0.5) * 2.0**-23)


def race(probs: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """The exponential race: one draw per row of probs [..., V] with noise [..., V]; argmax takes
    the lowest index among exact ties."""
    return (probs / noise).argmax(dim=-1)


def race_scored(probs: torch.Tensor, noise: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """The race over a head's scored tokens: probs, noise, tokens [N] (token ids, noise keyed by them)
    -> the winning token id [1]. Ties go to the lowest token id, whatever the order of the slots, so
    this is `race` over the whole vocabulary wherever the tokens left out have probability 0."""
    quotient = (probs / noise).view(torch.int32).long()  # >= +0: the bits order as the values
    key = (quotient << 32) | (_MASK - tokens)
    return tokens.gather(0, key.argmax().view(1))


# --- the verification rule --------------------------------------------------------------------------
def verify_block_reference(target_probs, draft_probs, draft_tokens, accept_uniforms, race_noise):
    """target_probs [K+1, V] float32 (p_1..p_{K+1}), draft_probs [K, V] float32 (q_1..q_K, zero
    outside a shortlist), draft_tokens [K] long, accept_uniforms [K] float32 in [0,1),
    race_noise [V] float32 > 0 (exponential noise, Exp(1)). Returns (accepted [1] long, final [1] long).

    Position i accepts iff u_i * q_i(d_i) < p_i(d_i) (probability min(1, p/q), no division);
    accepted a = the leading accepts. The final token races on the residual max(0, p_{a+1} - q_{a+1})
    (p_{a+1} itself where that is all zero) when a < K, on p_{K+1} when a == K. K may be 0."""
    K = draft_tokens.shape[0]
    rows = torch.arange(K, device=draft_tokens.device)
    p_of_draft = target_probs[:K][rows, draft_tokens]
    q_of_draft = draft_probs[rows, draft_tokens]
    accepts = (accept_uniforms * q_of_draft < p_of_draft).long()
    accepted = accepts.cumprod(0).sum(0, keepdim=True)
    p_next = target_probs.index_select(0, accepted)[0]
    q_next = torch.cat([draft_probs, torch.zeros_like(target_probs[:1])]).index_select(0, accepted)[0]
    residual = (p_next - q_next).clamp(min=0)
    residual = torch.where(residual.sum() > 0, residual, p_next)
    final = race(residual, race_noise).view(1)
    return accepted, final
