"""The draft body graph alone (synthetic Qwen3-0.6B on cuda:0, context 200, one call from an idle
device, 30 reps): measure's graph of forward_hidden against the decoder's body graph and the
pieces in between, each timed twice in alternation to expose drift."""
import torch

from measure.timing import time_op
from model.decoder import Decoder
from model.graphs import GraphedCall
from model.heads import DenseHead
from model.loading import load_model

dd = torch.device("cuda:0")
draft = load_model("qwen3-0.6b", dd, "bfloat16", 1, 1104).model
pos = torch.tensor([200], device=dd)
ar = torch.arange(8, device=dd)
tokens = [(torch.randint(0, 1000, (1, 1), device=dd), pos) for _ in range(4)]
dec = Decoder(draft, draft, DenseHead(draft.head_weight), K=6)  # the draft as its own target: one GPU
variants = {
    "forward_hidden (measure)": GraphedCall(draft.forward_hidden),
    "forward_hidden(t, s + ar[:1])": GraphedCall(lambda t, s: draft.forward_hidden(t, s + ar[:1])),
    "forward_hidden(t, s)[0, -1:]": GraphedCall(lambda t, s: draft.forward_hidden(t, s)[0, -1:]),
    "decoder body (_body_fn)": dec._body,
    "decoder body, eager calls": lambda t, s: dec._body_fn(t, s),
}
for round_ in (1, 2):
    for name, fn in variants.items():
        t = time_op(fn, tokens, dd, reps=30, warmup=3)
        print(f"round {round_}  {name:32s} {t['median_ms']:.4f} ms [{t['p10_ms']:.4f}, {t['p90_ms']:.4f}] host {t['host_ms']:.4f}",
              flush=True)
