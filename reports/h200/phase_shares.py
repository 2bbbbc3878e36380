"""Decode tok/s and the phase shares of decode time per schedule, from `python -m model --out DIR` runs.

    python reports/h200/phase_shares.py reports/h200/e2e/dense reports/h200/e2e/flashhead

Shares are each phase's summed CUDA-event time over the decode wall time; on two GPUs phases that
overlap (the pipelined schedules) can sum past 100%.
"""
import json
import sys
from pathlib import Path

from model.trace import PHASES


def main(dirs):
    print(f"{'run':<16} {'schedule':<19} {'head':<16} {'tok/s':>7} {'accept':>7} " + " ".join(f"{p:>10}" for p in PHASES))
    for directory in dirs:
        for path in sorted(Path(directory).glob("*.summary.json")):
            s = json.loads(path.read_text())
            c = s["config"]
            head = c["head"] if c["probes"] is None else f"{c['head']} p={c['probes']}"
            shares = " ".join(f"{100 * s['phases_ms'][p] / s['decode_ms']:9.1f}%" if s["phases_ms"] else f"{'-':>10}"
                              for p in PHASES)
            accept = f"{s['acceptance']:.3f}" if s["acceptance"] is not None else "-"
            print(f"{Path(directory).name:<16} {c['schedule']:<19} {head:<16} {s['decode_tok_s']:7.2f} {accept:>7} {shares}")


if __name__ == "__main__":
    main(sys.argv[1:])
