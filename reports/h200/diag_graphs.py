import sys, traceback, warnings, torch
from model.decoder import Decoder, placement_devices
from model.loading import load_model
from model.heads import DenseHead, FlashHead
from model.flashhead import build_clustering
from model.acceptance_control import AcceptanceControl
import model.graphs as G
orig = G.GraphedCall._capture
def capture(self, inputs):
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        r = orig(self, inputs)
    for x in w:
        if "empty" in str(x.message):
            print("EMPTY GRAPH:", getattr(self.fn, "__qualname__", self.fn), [ (tuple(t.shape), str(t.device)) for t in inputs])
    return r
G.GraphedCall._capture = capture
PROMPT = list(b"Speculative decoding on the GPU.")
for placement in ["one-gpu", "two-gpu"]:
    for head in ["dense", "flashhead"]:
        td, dd = placement_devices(placement)
        t = load_model("tiny-qwen3", td, "float32", seed=1, max_seq_len=160).model
        d = load_model("tiny-qwen3-draft", dd, "float32", seed=2, max_seq_len=160).model
        w = d.head_weight
        h = DenseHead(w) if head == "dense" else FlashHead(w, build_clustering(w, seed=0), probes=4)
        c = AcceptanceControl("a=1", 512, 160, dd, seed=0)
        dec = Decoder(t, d, h, K=3, graphs=True, control=c)
        ref = dec.reference(PROMPT, 48)
        c.bind(ref, len(PROMPT), "p")
        for s in ["ordinary", "deferred"]:
            g = dec.generate(PROMPT, 40, s)
            print(placement, head, s, "exact", g.tokens == ref[:40], "accepted", [r.accepted for r in g.rounds][:8])
