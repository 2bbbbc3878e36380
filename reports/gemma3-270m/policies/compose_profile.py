"""One-off: the Gemma CPU profile for the policies report. Target, draft and host costs: the committed
reports/gemma3-270m/cpu_profile.json (measured on this VM). The early-exit drafter (the target's first 12
layers and its head) is the same computation as that profile's draft ('#layers=12': its body and dense
head), so its costs are those. Prompt lookup's search: timed now by measure.benchmarks.drafter_costs."""

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import torch

from measure.benchmarks import Bench, drafter_costs
from model.loading import load_model

source, out = sys.argv[1], sys.argv[2]
profile = json.loads(Path(source).read_text())
target = load_model("/root/.cache/flashspec/gemma-3-270m", "cpu", max_seq_len=1100)
device = torch.device("cpu")
bench = Bench(
    target, None, device, device, (64, 256, 1024), (32,), 4, (1,), None, 10, 2, lambda what: print(what, flush=True)
)
lookup = drafter_costs(bench, False, SimpleNamespace(lookup_ngram=2, early_exit_layers=None))["lookup_ms"]
draft = profile["regimes"]["eager"]["draft"]
draft["lookup_ms"] = lookup
draft["early_exit_body_ms"] = draft["body_ms"]
draft["early_exit_head_ms"] = draft["head_dense_ms"]
profile["notes"] = list(profile.get("notes", [])) + [
    "policies report: draft.early_exit_body_ms and early_exit_head_ms are draft.body_ms and head_dense_ms "
    "(the draft is the target's first 12 layers and its head: the early-exit drafter's computation); "
    "draft.lookup_ms timed on 2026-11-23 by measure.benchmarks.drafter_costs (10 reps, K 4, n-gram 2)"
]
Path(out).write_text(json.dumps(profile, indent=1))
print("wrote", out)
