"""Derive the embedded default profile and trace from the study's published tables.

    python -m sim.derive_study [--out-dir DIR]   # default: rewrites sim/data/study_profile.json and study_trace.jsonl

Every number below is either an INPUT taken from a published table, a DERIVED value computed from
inputs, or an ASSUMPTION where the study publishes nothing; the profile's notes say which is which.
The simulator's outputs on this profile are then predictions to compare with the tables that were
not used as inputs (reports/study_replay.md).
"""

from __future__ import annotations

import argparse
import json
import math
import random
from pathlib import Path

from contracts.cli import OneLineParser, run_command
from contracts.files import check_output_folder
from contracts.profile import PROFILE_SCHEMA, write_profile
from contracts.trace import TRACE_SCHEMA, write_trace

DATA = Path(__file__).parent / "data"

# INPUTS (the study's published tables; see README)
BASELINE_TOK_S = 5.715  # Table 4.5, baseline decode tok/s -> target forward of 1 token
TTFT_MS = 1156.7  # Table 4.5, baseline TTFT -> target prefill
DENSE_STEP_MS = 18.330  # Table 4.3, complete dense draft step
DENSE_HEAD_MS = 2.493  # Table 4.1, dense head (mean)
FLASH_HEAD_MS = (0.577, 0.575, 0.593)  # Table 4.1, FlashHead head: mean, p50, p95
T47_DECODE_MS = 16606.9  # Table 4.7, dense draft decode total
T47_VERIFY_SHARE = 0.327  # Table 4.7, dense draft verify share
T47_PROMPTS, T47_NEW_TOKENS, T47_K = 2, 64, 6
T47_ACCEPTANCE, T47_MEAN_EMITTED = 0.333, 2.930
VOCAB, CLUSTERS, CLUSTER_SIZE = 151_936, 9_496, 16
GEMMA_AGREEMENT = DATA / "gemma3_270m_agreement.json"  # ours: python -m measure.recall on Gemma 3 270M
# ASSUMPTIONS
PROMPT_LEN = 128  # not published
ITEM_MS, COPY_MS = 0.014, 0.021  # machines.md (our H200), the study publishes none


def timing(ms: float, p10: float | None = None, p90: float | None = None, n: int = 1) -> dict:
    return {
        "median_ms": round(ms, 4),
        "p10_ms": round(p10 if p10 is not None else ms, 4),
        "p90_ms": round(p90 if p90 is not None else ms, 4),
        "n": n,
    }


def table4_7_trace(seed_limit: int = 100_000) -> list[dict]:
    """Round-level detail consistent with Table 4.7's aggregates: 2 prompts x 63 decode tokens,
    K=6, acceptance 0.333 and mean emitted 2.930, i.e. exactly 43 rounds and 86 accepted tokens
    (86/258 = 0.333, 126/43 = 2.930). Only the aggregates are published, so rounds are drawn from
    an i.i.d. per-token match stream (a = 0.69) and the first seed that hits both counts is kept."""
    decode = T47_NEW_TOKENS - 1
    want_rounds = round(T47_PROMPTS * decode / T47_MEAN_EMITTED)
    want_accepted = round(T47_ACCEPTANCE * want_rounds * T47_K)
    for seed in range(seed_limit):
        rng = random.Random(seed)
        lines = []
        for prompt in range(T47_PROMPTS):
            remaining, context, index = decode, PROMPT_LEN + 1, 0
            while remaining > 0:
                accepted = 0
                while accepted < T47_K and rng.random() < 0.69:
                    accepted += 1
                emitted = min(accepted + 1, remaining)
                lines.append(
                    {
                        "schema": TRACE_SCHEMA,
                        "prompt_id": f"study-{prompt + 1}",
                        "round": index,
                        "schedule": "ordinary",
                        "head": "dense",
                        "probes": None,
                        "K": T47_K,
                        "proposed": T47_K,
                        "accepted": accepted,
                        "emitted": emitted,
                        "verify_skipped": accepted == 0,
                        "context": context,
                        "lookahead_used": None,
                        "weights": "study-derived",
                    }
                )
                remaining -= emitted
                context += accepted + 1
                index += 1
        if len(lines) == want_rounds and sum(x["accepted"] for x in lines) == want_accepted:
            return lines
    raise RuntimeError("no seed reproduces Table 4.7's counts")


def flashhead_ms(probes: int) -> float:
    """Head cost as fixed overhead + rows scored at the dense head's per-row rate: the rate is
    2.493 ms / 151,936 rows; at the default p = c/16 = 593 FlashHead scores c + 16p = 18,984 rows,
    which at that rate is 0.311 ms, so the remaining 0.266 ms of the measured 0.577 ms is overhead."""
    per_row = DENSE_HEAD_MS / VOCAB
    overhead = FLASH_HEAD_MS[0] - per_row * (CLUSTERS + CLUSTER_SIZE * (CLUSTERS // 16))
    return overhead + per_row * (CLUSTERS + CLUSTER_SIZE * probes)


def agreement(probes: list[int]) -> dict:
    """FlashHead agreement r(p) for the study's c = 9,496 clusters, taken from the curve we measured
    on Gemma 3 270M's real head (c = 16,384; the study publishes none): probes are matched by the
    fraction of clusters probed, p/c, linear in log2 between measured points. Probe counts past the
    largest measured fraction are left out (the simulator interpolates to r = 1 at p = c)."""
    measured = json.loads(GEMMA_AGREEMENT.read_text())
    xs = [math.log2(p / measured["clusters"]) for p in measured["probes"]]
    rs = measured["r"]
    out = []
    for p in probes:
        x = max(math.log2(p / CLUSTERS), xs[0])
        if x > xs[-1]:
            continue
        j = next(i for i in range(1, len(xs)) if x <= xs[i])
        out.append((p, rs[j - 1] + (rs[j] - rs[j - 1]) * (x - xs[j - 1]) / (xs[j] - xs[j - 1])))
    return {
        "source": "gemma-3-270m (real weights), not Qwen3-0.6B",
        "synthetic": False,
        "probes": [p for p, _ in out],
        "r": [round(r, 6) for _, r in out],
        "n": measured["n"],
        "measured_on": {k: measured[k] for k in ("model", "clusters", "cluster_size", "probes", "r", "source")},
    }


def profile(trace: list[dict]) -> dict:
    t1 = 1000.0 / BASELINE_TOK_S
    verify_calls = sum(1 for x in trace if not x["verify_skipped"])
    t6 = T47_DECODE_MS * T47_VERIFY_SHARE / verify_calls
    slope = (t6 - t1) / (T47_K - 1)
    forward = [dict(timing(t1 + slope * (n - 1)), n_tokens=n, context=PROMPT_LEN) for n in range(1, 11)]
    probes = sorted({1, 2, 4, 8, 16, 32, 64, 128, 256, 593, 1024, 2048, 4096, CLUSTERS})
    body = DENSE_STEP_MS - DENSE_HEAD_MS
    return {
        "schema": PROFILE_SCHEMA,
        "created": "2026-11-22T00:00:00Z",
        "env": {"gpus": ["the study's GPU (not named in our reference)"], "source": "published tables"},
        "setup": {
            "target": {
                "name": "Qwen3-32B-AWQ",
                "weights": "study-derived",
                "dtype": "awq-int4",
                "kernel": "Hugging Face eager (study)",
            },
            "draft": {"name": "Qwen3-0.6B", "weights": "study-derived", "dtype": "bf16"},
            "placement": "two-gpu",
            "context_lengths": [PROMPT_LEN],
            "prompt_lengths": [PROMPT_LEN],
            "K_max": 8,
            "default_regime": "eager",
        },
        "flashhead": {
            "clusters": CLUSTERS,
            "cluster_size": CLUSTER_SIZE,
            "default_probes": CLUSTERS // 16,
            "agreement": agreement(probes),
        },
        "regimes": {
            "eager": {
                "target": {
                    "forward_ms": {"points": forward},
                    "prefill_ms": {"points": [dict(timing(TTFT_MS), prompt_len=PROMPT_LEN)]},
                },
                "draft": {
                    "body_ms": timing(body),
                    "head_dense_ms": timing(DENSE_HEAD_MS),
                    "head_flashhead_ms": {"points": [dict(timing(flashhead_ms(p)), probes=p) for p in probes]},
                    "append_ms": timing(body),
                    "prefill_ms": {"points": [dict(timing(DENSE_STEP_MS), prompt_len=PROMPT_LEN)]},
                    "kv_crop_ms": timing(0.0),
                },
                "host": {
                    "item_ms": timing(ITEM_MS),
                    "copy_token_ms": timing(COPY_MS),
                    "event_sync_ms": timing(0.0),
                    "round_bookkeeping_ms": timing(0.0),
                },
            }
        },
        "notes": [
            "STUDY-DERIVED, not measured by us: every cost comes from the study's published tables.",
            f"INPUT target forward n=1: 1000 / {BASELINE_TOK_S} baseline tok/s (Table 4.5) = {t1:.2f} ms.",
            f"DERIVED target forward n=6: Table 4.7 verify share {T47_VERIFY_SHARE} x decode {T47_DECODE_MS} ms "
            f"/ {verify_calls} verify calls of the shipped trace = {t6:.2f} ms; n=2..10 linear through "
            f"n=1 and n=6 (eager forwards are nearly flat in n).",
            f"INPUT target prefill (it yields the first token): Table 4.5 baseline TTFT {TTFT_MS} ms.",
            f"DERIVED draft body: Table 4.3 dense step {DENSE_STEP_MS} - Table 4.1 dense head {DENSE_HEAD_MS} ms "
            f"= {body:.3f} ms (the FlashHead step, 16.550 - 0.577 = 15.973 ms, agrees within 0.9%).",
            "INPUT dense head 2.493 ms and FlashHead head 0.577 ms at the default 593 probes (Table 4.1).",
            "DERIVED FlashHead cost at other probe counts: fixed overhead + rows scored at the dense head's "
            "per-row rate (sim/derive_study.py:flashhead_ms); only p=593 is published.",
            "ASSUMED draft prefill = one draft step; prompt length 128; no per-round bookkeeping; "
            "host issue time 0 (device-bound: pipelined overlap is ideal, as the study expects). "
            "item and cross-GPU copy costs as measured on our H200 (0.014 and 0.021 ms, first GPU session).",
            "MEASURED ELSEWHERE agreement r(p): the study publishes none; the curve is FlashHead's agreement with "
            "the dense argmax measured on Gemma 3 270M's real head and hidden states (c = 16,384 clusters of 16; "
            "reports/gemma3-270m/), NOT on Qwen3-0.6B (c = 9,496). Probes are mapped by the fraction of clusters "
            "probed (p/c): Qwen3 p = 593 (c/16) reads Gemma's r at p = 1,023 of 16,384.",
            "Shipped trace (study_trace.jsonl): round detail drawn to match Table 4.7's counts exactly "
            "(43 rounds, 86 of 258 accepted, 126 decode tokens); see sim/derive_study.py.",
        ],
    }


def main(argv=None) -> int:
    return run_command(lambda: _derive(argv))


def _derive(argv) -> int:
    parser = OneLineParser(
        prog="python -m sim.derive_study", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out-dir", default=str(DATA), help=f"folder for the two files (default {DATA})")
    out = Path(parser.parse_args(argv).out_dir)
    check_output_folder(out, "--out-dir")
    trace = table4_7_trace()
    write_trace(out / "study_trace.jsonl", trace)
    write_profile(out / "study_profile.json", profile(trace))
    print(f"wrote {out / 'study_trace.jsonl'} ({len(trace)} rounds) and {out / 'study_profile.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
