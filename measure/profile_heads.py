"""python -m measure.profile_heads: put measured head costs and agreements into a profile's `heads` section.

    python -m measure.profile_heads --profile sim/data/default_profile.json \\
        --cost reports/heads/h200_head_cost.json \\
        --agreement reports/heads/gemma3_270m_agreement.json \\
        --agreement reports/heads/gemma3_270m_flashhead_agreement.json --out profile_heads.json

Costs come from `python -m measure.head_cost` (each head's device time inside a CUDA graph, the time
the draft step pays for its head; shortlists from the fused kernel the decoder runs on GPU);
agreements from `python -m measure.head_agreement` (per-position curves of each measured spec,
pooled over every held-out category, and pooled agreement per kind and budget). The profile's other
sections are kept as they are; an earlier `heads` section is replaced by what is given. Torch-free.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from contracts import UsageError
from contracts.cli import OneLineParser, run_command
from contracts.files import check_output_file, read_json
from contracts.heads import parse_head
from contracts.profile import check_heads, read_profile, write_profile

COMMAND = "python -m measure.profile_heads"
AGREEMENT_SCHEMA = "specloop.head_agreement/1"
SHORTLIST_BACKEND = "triton"  # the fused gather-score-argmax kernel: what the decoder runs on GPU
TIMING = ("median_ms", "p10_ms", "p90_ms", "n", "host_ms")


def cost_section(record: dict, source: str) -> dict:
    """measure.head_cost's rows -> {kind: rows in increasing budget}, one row per head and budget."""
    rows = record.get("rows") if isinstance(record, dict) else None
    if not isinstance(rows, list) or not rows:
        raise UsageError(f"--cost {source}: not a python -m measure.head_cost record (no 'rows')")
    kinds: dict[str, dict] = {}
    for row in rows:
        name, _, backend = str(row.get("head", "")).partition(" ")
        if backend and backend != SHORTLIST_BACKEND:
            continue
        spec = parse_head(name, f"--cost {source}")
        entry = {key: row["in_graph"][key] for key in TIMING if key in row["in_graph"]}
        entry.update(budget=row.get("budget"), rows_scored=row.get("rows_scored"), floor_ms=row.get("floor_ms"))
        entry["draft_step_ms"] = row["draft_step"]["median_ms"]
        if backend:
            entry["backend"] = backend
        kinds.setdefault(spec.kind, {})[entry["budget"]] = entry
    env = record.get("env", {})
    return {
        "weights": env.get("weights", "synthetic"),
        "source": f"{source} ({env.get('gpu', 'unknown GPU')}, {env.get('weights_detail', '')})".replace(", )", ")"),
        "measured": "device time of the head per call inside a CUDA graph, L2 evicted (python -m measure.head_cost)",
        "kinds": {
            kind: [by_budget[b] for b in sorted(by_budget, key=lambda b: b or 0)] for kind, by_budget in kinds.items()
        },
    }


def agreement_section(records: list[tuple[str, dict]]) -> dict:
    """measure.head_agreement records -> per-position curves (every category pooled) and pooled rows per
    kind and budget; a later record's values replace an earlier one's for the same head and budget."""
    curves, pooled, weights, sources = {}, {}, set(), []
    for source, record in records:
        if not isinstance(record, dict) or record.get("schema") != AGREEMENT_SCHEMA:
            raise UsageError(
                f"--agreement {source}: not a {AGREEMENT_SCHEMA} record (python -m measure.head_agreement)"
            )
        weights.add(record["weights"])
        sources.append(f"{source} (commit {record.get('commit', '?')}, draft {record.get('draft', '?')})")
        for label, data in record["heads"].items():
            spec = parse_head(label, f"--agreement {source}")
            curves[spec.label] = [
                {key: row[key] for key in ("position", "n", "agree", "prefix")} for row in data["per_position"]["all"]
            ]
            for row in data["pooled"]:
                if row["budget"] is not None:
                    pooled.setdefault(spec.kind, {})[row["budget"]] = {
                        key: row[key] for key in ("budget", "rows_scored", "n", "agree")
                    }
    if len(weights) != 1:
        raise UsageError(f"--agreement: the records mix weights ({', '.join(sorted(weights))}); give one kind")
    return {
        "weights": weights.pop(),
        "source": "; ".join(sources),
        "curves": curves,
        "pooled": {kind: [rows[b] for b in sorted(rows)] for kind, rows in pooled.items()},
    }


def main(argv=None) -> int:
    def body():
        p = OneLineParser(prog=COMMAND, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
        p.add_argument("--profile", required=True, help="the profile to add the section to (left unchanged)")
        p.add_argument("--cost", default=None, help="a python -m measure.head_cost record")
        p.add_argument(
            "--agreement", action="append", default=[], help="a python -m measure.head_agreement record (repeatable)"
        )
        p.add_argument("--out", required=True, help="the profile to write (with the heads section)")
        args = p.parse_args(argv)
        if args.cost is None and not args.agreement:
            raise UsageError("give --cost and/or --agreement: there is nothing to add")
        check_output_file(Path(args.out), "--out")
        profile = read_profile(args.profile)
        heads = {}
        try:
            if args.cost:
                heads["cost"] = cost_section(read_json(args.cost, "--cost"), args.cost)
                check_heads({"cost": heads["cost"]}, f"--cost {args.cost}")
            if args.agreement:
                heads["agreement"] = agreement_section(
                    [(path, read_json(path, "--agreement")) for path in args.agreement]
                )
                check_heads({"agreement": heads["agreement"]}, f"--agreement {' '.join(args.agreement)}")
        except (KeyError, TypeError, AttributeError) as error:
            raise UsageError(
                f"--cost/--agreement: a record lacks a field ({error!r}); give the commands' own output"
            ) from None
        write_profile(args.out, dict(profile, heads=heads))
        kinds = ", ".join(heads.get("cost", {}).get("kinds", {})) or "none"
        curves = ", ".join(heads.get("agreement", {}).get("curves", {})) or "none"
        print(f"wrote {args.out}: head costs for {kinds}; agreement curves for {curves}")

    return run_command(body)


if __name__ == "__main__":
    sys.exit(main())
