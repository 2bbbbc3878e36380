"""Prompt lookup's acceptance under control, per Spec-Bench category (synthetic weights).

With random weights the output is no language, so prompt lookup finds nothing worth copying and a
policy has nothing to choose between drafters. For timing runs the lookup still searches the real
context every round (its cost is real), and its K proposals are then replaced on the device as the
draft model's are (model/acceptance_control.py): the target's own token where the control's bit says
accept, a token it rejects elsewhere. The bits are i.i.d. at a rate set per category of the prompt,
so the best drafter shifts from one category to the next (copying pays on summarization and
retrieval, not on math), as it does with real weights. The bits are keyed by `lookup/<prompt id>`,
independent of the draft model's.

Spec: `CATEGORY=RATE` items joined by ',', `*` for every category not named (default 0), e.g.
`summarization=0.9,rag=0.8,*=0.1`.
"""

from __future__ import annotations

import torch

from contracts import UsageError
from model.acceptance_control import AcceptanceControl
from model.prompts import Prompt, load_questions


def parse_rates(spec: str, prompts_file=None) -> dict[str, float]:
    """{category or '*': rate} of a spec (UsageError naming the valid categories)."""
    categories = sorted({q.category for q in load_questions(prompts_file)})
    rates = {}
    for item in spec.split(","):
        name, equals, value = item.strip().partition("=")
        try:
            rate = float(value)
        except ValueError:
            rate = -1.0
        if not equals or not 0.0 <= rate <= 1.0 or (name != "*" and name not in categories):
            raise UsageError(
                f"--lookup-acceptance {spec!r}: expected CATEGORY=RATE items joined by ',' with RATE in [0, 1] and "
                f"CATEGORY one of {', '.join(categories)} or * (every other), e.g. summarization=0.9,*=0.1"
            )
        rates[name] = rate
    return rates


class LookupControl:
    """Replaces prompt lookup's proposals by the bits of the bound prompt's category rate."""

    def __init__(
        self, spec: str, vocab_size: int, capacity: int, device: torch.device, seed: int = 0, prompts_file=None
    ):
        self.spec, self.rates = spec, parse_rates(spec, prompts_file)
        # one control whose rate each bind sets: its buffers stay where prompt lookup's graph reads them
        self.control = AcceptanceControl(f"a={self.rate(None)}", vocab_size, capacity, device, seed)

    def rate(self, category: str | None) -> float:
        return self.rates.get(category, self.rates.get("*", 0.0))

    def describe(self) -> dict:
        """The summary's `lookup_acceptance_control` object."""
        return {"kind": "iid-per-category", "rates": self.rates, "seed": self.control.seed}

    def bind(self, reference: list[int], prompt_len: int, prompt: Prompt) -> None:
        """Load one prompt's reference continuation and the bits of its category's rate."""
        self.control.bind(reference, prompt_len, f"lookup/{prompt.id}", self.rate(prompt.category))

    @property
    def accept(self) -> torch.Tensor:
        return self.control.accept

    def propose(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The controlled proposals for the looked-up `tokens` at absolute `positions`."""
        return self.control.propose(tokens, positions)
