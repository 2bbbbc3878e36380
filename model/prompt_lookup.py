"""Prompt-lookup drafting with Hugging Face's semantics, on the device and without a host sync.

Hugging Face's `PromptLookupCandidateGenerator` (`prompt_lookup_num_tokens` K,
`max_matching_ngram_size` G): for n from min(G, length - 1) down to 1, take the context's last n
tokens, find their first occurrence in the context whose continuation starts before the context's
end, and propose up to K tokens that followed it; the first n that has such an occurrence wins.
Our blocks have a fixed size K (fixed shapes, CUDA graphs), so where that gives fewer than K tokens
(the continuation reaches the context's end, or no n-gram recurs) the block is filled with the
context's last token. The filler is only a proposal: verification keeps the output exact.

`lookup` runs on a fixed-size token buffer with the valid length as a device tensor: every n-gram
size and every start is compared at once, so the host never waits for it. `LookupSearch` is how a
drafter runs it: the context gathered into one buffer of fixed capacity, and the search replayed as
one CUDA graph per K. `lookup_reference` is the
same rule in plain Python (the tests hold them equal); `match_runs` uses it to record, for every
output position, how many proposals a block begun there would have had accepted (the trace's `runs`).
"""

from __future__ import annotations

from functools import partial

import torch

from contracts.trace import RUN_CAP
from model.graphs import GraphedCall


def lookup(tokens: torch.Tensor, length: torch.Tensor, K: int, max_ngram: int) -> torch.Tensor:
    """tokens [capacity] (valid up to `length`, a [1] long tensor on the same device) -> K proposals."""
    capacity = tokens.numel()
    index = torch.arange(capacity, device=tokens.device)
    last = (length - 1).clamp(min=0)
    best_start = torch.full_like(length, -1)
    for n in range(1, min(max_ngram, capacity) + 1):  # the largest n with an occurrence wins: written last
        tail = tokens[(length - n + torch.arange(n, device=tokens.device)).clamp(min=0)]  # the last n tokens
        starts = index[: capacity - n + 1]
        windows = tokens.unfold(0, n, 1)  # [capacity - n + 1, n]
        ok = (windows == tail).all(1) & (starts + n < length) & (length > n)
        first = torch.where(ok, starts, capacity).min().view(1)
        best_start = torch.where(first < capacity, first + n, best_start)
    positions = best_start + torch.arange(K, device=tokens.device)
    valid = (best_start >= 0) & (positions < length)
    return torch.where(valid, tokens[positions.clamp(0, capacity - 1)], tokens[last])


class LookupSearch:
    """Prompt lookup as the decoder runs it: the prompt and the output buffer gathered into one context
    buffer of fixed capacity (one copy), then `lookup` over the whole buffer (slots past the context's
    length are masked) and, with synthetic weights, the LookupControl's replacement of the proposals,
    replayed as one CUDA graph per K with graphs on. Launched op by op, its 25 or so small kernels cost
    0.7-1.3 ms a round on an H200's host, varying with the host's speed in stretches of rounds
    (reports/policies/README.md); the control's few kernels, launched after the graph, were the larger
    part of what the host still issued a round."""

    def __init__(self, room: int, K_max: int, device, max_ngram: int, graphs: bool, control=None):
        """`room`: the target's cache slots, which bound prompt + output; the decoder's output buffer
        holds K_max + 2 slots past its last token. `control`: a LookupControl (its buffers are bound
        in place per prompt, so one graph per K serves every prompt)."""
        self.context = torch.zeros(room + K_max + 2, dtype=torch.long, device=device)
        self.max_ngram, self.graphs, self.control = max_ngram, graphs, control
        self.offsets = torch.arange(1, K_max + 1, device=device)
        self._searches: dict[int, GraphedCall] = {}

    def __call__(
        self, prompt: torch.Tensor, out: torch.Tensor, length: torch.Tensor, K: int, last_position: torch.Tensor
    ) -> torch.Tensor:
        """K proposals for the context prompt + out[: length - len(prompt)] (`length` a [1] device tensor),
        for the positions after `last_position` ([1], the context's last token's)."""
        n = prompt.numel() + out.numel()
        if n > self.context.numel():
            raise ValueError(f"prompt lookup: a context of {n} tokens exceeds its buffer of {self.context.numel()}")
        torch.cat([prompt, out], out=self.context[:n])
        if K not in self._searches:
            self._searches[K] = GraphedCall(partial(self._search, K=K), enabled=self.graphs)
        return self._searches[K](length, last_position).clone()  # the graph's output is rewritten by its next replay

    def _search(self, length: torch.Tensor, last_position: torch.Tensor, K: int) -> torch.Tensor:
        tokens = lookup(self.context, length, K, self.max_ngram)
        if self.control is None:
            return tokens
        return self.control.propose(tokens, last_position + self.offsets[:K])


def lookup_reference(context: list[int], K: int, max_ngram: int) -> list[int]:
    """The same proposals in plain Python, written as Hugging Face's loop."""
    length = len(context)
    for n in range(min(max_ngram, length - 1), 0, -1):
        tail = context[-n:]
        for start in range(length - n + 1):
            if context[start : start + n] == tail and start + n < length:
                chosen = context[start + n : start + n + K]
                return chosen + [context[-1]] * (K - len(chosen))
    return [context[-1]] * K


def match_runs(prompt: list[int], tokens: list[int], max_ngram: int, cap: int = RUN_CAP) -> list[int]:
    """For each decode position q (output token q + 1, the first token being output token 0): how many
    of a prompt-lookup block begun there the target accepts, i.e. the leading proposals equal to the
    target's tokens, counting at most `cap`."""
    runs = []
    for q in range(1, len(tokens)):
        context = prompt + tokens[:q]
        wanted = tokens[q : q + cap]
        proposals = lookup_reference(context, len(wanted), max_ngram)
        run = 0
        while run < len(wanted) and proposals[run] == wanted[run]:
            run += 1
        runs.append(run)
    return runs
