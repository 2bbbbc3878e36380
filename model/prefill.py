"""The draft model's prefill as replays of a few CUDA graphs, a chunk of the prompt each.

Eager, the 0.6B draft's prefill is some two hundred kernel launches that the host issues one by one:
on one H200 it took 7 to 17 ms up to 1,024 tokens with little regard to the length, and 10 to 25 ms a
generation in a validation, moving from one stretch of generations to the next with the host's launch
speed (docs/design.md, "Calibration"). On one device it lies in each generation's first round, so that
spread was the simulator's error. Graphs of CHUNK_WIDTHS tokens leave the device's time alone: 1.2 ms
at 128 tokens, 2.4 at 300 and 4.3 at 1,024 on one H200 (`python -m measure.routes --routes
draft-prefill`, reports/speed/h200_routes_draft_prefill.json). Past about 2,500 tokens the eager
forward, bound by the device by then, is the faster (by 8% at 3,000 tokens); the chunks stay, for one rule.

The chunks follow contracts.policies.chunk_widths from position 0: the widest while more than it
remain, then the narrowest that holds the rest, which ends at the prompt's last token and so reaches
back over tokens an earlier chunk fed (their slots are rewritten from the same tokens, as a catch-up
does). A prompt shorter than its chunk is padded: the padding's slots lie above the prompt, where no
query reads before the decoder rewrites them (the caches mask every slot above a query's position).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from contracts.policies import chunk_widths
from model.graphs import GraphedCall

CHUNK_WIDTHS = (128, 256, 512, 1024)  # measure.routes `draft-prefill` times single widths around them


def decoding_widths(device: torch.device, graphs: bool) -> tuple[int, ...]:
    """The chunk widths a decoder prefills its draft with: CHUNK_WIDTHS in graphs, else none (eager)."""
    return CHUNK_WIDTHS if graphs and device.type == "cuda" else ()


def chunks(prompt_len: int, widths: tuple[int, ...]) -> list[tuple[int, int]]:
    """(first position, width) of each chunk over a prompt of `prompt_len` tokens."""
    *leading, last = chunk_widths(prompt_len, widths)
    return [(index * widths[-1], width) for index, width in enumerate(leading)] + [(max(prompt_len - last, 0), last)]


class GraphedPrefill:
    """Fills `model`'s cache with a prompt: in chunks of `widths` tokens, each a graph replay on a GPU
    (no widths: one eager forward of the whole prompt; decoding_widths says which a decoder uses)."""

    def __init__(self, model, device: torch.device, widths: tuple[int, ...]):
        self.model = model
        self.widths = tuple(sorted({min(width, model.max_seq_len) for width in widths}))
        self.positions = torch.arange(model.max_seq_len, device=device)
        self._chunk = GraphedCall(self._forward)

    def _forward(self, tokens: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
        return self.model.forward_hidden(tokens, start + self.positions[: tokens.shape[1]])

    def __call__(self, prompt: torch.Tensor) -> None:
        """prompt [1, P] on the model's device."""
        length = prompt.shape[1]
        if not self.widths:
            self.model.forward_hidden(prompt, self.positions[:length])
            return
        for start, width in chunks(length, self.widths):
            tokens = prompt[:, start : start + width]
            if tokens.shape[1] < width:  # a prompt shorter than its one chunk
                tokens = F.pad(tokens, (0, width - tokens.shape[1]))
            self._chunk(tokens, self.positions[start : start + 1])

    @property
    def captured(self) -> int:
        return self._chunk.captured

    def capture(self) -> None:
        """Each width's graph, on a dummy chunk at position 0 (slots every generation's prefill rewrites)."""
        for width in self.widths:
            self(torch.zeros(1, width, dtype=torch.long, device=self.positions.device))
