"""Why the draft body costs more in the decode loop than the profile measures (synthetic weights,
two H200s, draft on cuda:0, target on cuda:1 as in the two-gpu placement): one draft body step timed
(A) as measure times it (GraphedCall of forward_hidden, one call from an idle device), (B) the
decoder's own body graph the same way, (C) inside the decoder's draft_steps (K = 6 body + head
steps, phase events, a sync per round), (D) as C with a target forward running on the other GPU
during each round, (E) as C with FlashHead p=593 instead of the dense head."""
import statistics
import time

import torch

from measure.timing import time_op
from model.decoder import Decoder
from model.flashhead import build_clustering
from model.graphs import GraphedCall
from model.heads import DenseHead, FlashHead
from model.loading import load_model

dd, td = torch.device("cuda:0"), torch.device("cuda:1")
draft = load_model("qwen3-0.6b", dd, "bfloat16", 1, 1104).model
target = load_model("qwen3-32b-awq", td, "bfloat16", 0, 1104).model
CONTEXT, K, ROUNDS = 200, 6, 30
pos = torch.tensor([CONTEXT], device=dd)
tokens = [(torch.randint(0, 1000, (1, 1), device=dd), pos) for _ in range(4)]
first = torch.randint(0, 1000, (1, 2), device=dd)

body = GraphedCall(draft.forward_hidden)
a = time_op(body, [(t, pos.expand(1)) for t, _ in tokens], dd, reps=30, warmup=3)
print(f"A measure's way (forward_hidden graph, idle device)   {a['median_ms']:.4f} ms [{a['p10_ms']:.4f}, {a['p90_ms']:.4f}]")


def in_loop(head, with_target: bool):
    dec = Decoder(target, draft, head, K=K)
    b = time_op(dec._body, tokens, dd, reps=30, warmup=3)
    dec.clock.reset(time.perf_counter())
    t_tokens = torch.zeros(1, K, dtype=torch.long, device=td)
    t_start = torch.tensor([CONTEXT], device=td)
    for _ in range(ROUNDS):
        dec.clock.next_round()
        if with_target:
            dec._target(t_tokens, t_start)
        proposals = dec.draft_steps(first, pos - 1, K)  # the first step feeds [prev, f], as propose does
        dec.clock.read(proposals[:1])
    rounds = dec.clock.results(time.perf_counter())[3:]  # the first rounds warm up
    per_step = [r["draft_body"] / K for r in rounds]
    heads = [r["draft_head"] / K for r in rounds]
    return b, statistics.median(per_step), statistics.median(heads)


dense = DenseHead(draft.head_weight)
b, body_c, head_c = in_loop(dense, with_target=False)
print(f"B decoder's body graph, idle device                   {b['median_ms']:.4f} ms")
print(f"C in draft_steps, dense head                          body {body_c:.4f} ms, head {head_c:.4f} ms")
_, body_d, head_d = in_loop(dense, with_target=True)
print(f"D as C, target forward on the other GPU meanwhile     body {body_d:.4f} ms, head {head_d:.4f} ms")
w = draft.head_weight
flash = FlashHead(w, build_clustering(w, seed=0), probes=593, backend="triton")
_, body_e, head_e = in_loop(flash, with_target=False)
print(f"E as C, FlashHead p=593                               body {body_e:.4f} ms, head {head_e:.4f} ms")
