"""FlashHead agreement r(p): how often its argmax equals the dense head's, on the draft's own hidden
states for Spec-Bench prompts (the states a proposal step sees)."""

from __future__ import annotations

from collections import defaultdict

import torch

from model.flashhead import Clustering
from model.heads import DenseHead, FlashHead
from model.loading import Loaded
from model.prompts import Prompt


@torch.no_grad()
def draft_hidden_states(draft: Loaded, prompts: list[Prompt], device: torch.device, max_len: int) -> dict:
    """Final-norm hidden states of every prompt position, grouped by category."""
    states = defaultdict(list)
    for prompt in prompts:
        ids = draft.tokenizer.encode(prompt.text)[:max_len]
        tokens = torch.tensor([ids], device=device)
        hidden = draft.model.forward_hidden(tokens, torch.arange(len(ids), device=device))
        states[prompt.category].append(hidden[0])
    return {category: torch.cat(parts) for category, parts in states.items()}


@torch.no_grad()
def agreement_curve(weight: torch.Tensor, clustering: Clustering, probes: list[int], states: dict) -> dict:
    """r(p) over all states and per category, with the sample sizes."""
    dense = DenseHead(weight)
    reference = {c: dense.argmax(h) for c, h in states.items()}
    total = sum(h.shape[0] for h in states.values())
    r, per_category = [], {c: [] for c in states}
    for p in probes:
        head = FlashHead(weight, clustering, probes=p)
        same = 0
        for category, h in states.items():
            agree = int((head.argmax(h) == reference[category]).sum())
            per_category[category].append(agree / h.shape[0])
            same += agree
        r.append(same / total)
    return {
        "probes": list(probes),
        "r": r,
        "n": total,
        "per_category": {c: {"r": v, "n": states[c].shape[0]} for c, v in per_category.items()},
    }
