"""python -m sim.heads_report: which draft head, at which budget? The Pareto front of head cost against
agreement with the dense draft, and the simulator's predicted tok/s per schedule for every head.

    python -m sim.heads_report --profile reports/heads/h200_heads_profile.json --out reports/heads/sim

The profile needs a `heads` section (python -m measure.profile_heads). Cost: the section's cost per
draft step, averaged over the K positions of a round; agreement: the mean over those positions of the
agreement the simulator draws from (sim/heads.py). A head is on the front when no other head is both
cheaper and agrees more. Writes heads.md (both tables), heads.json (every simulated row), pareto.png
and tok_s.png into --out (created whole at the end).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from contracts import UsageError
from contracts.cli import OneLineParser, run_command
from contracts.files import check_output_folder, staged, write_atomic
from contracts.heads import parse_heads
from contracts.names import SPECULATIVE_SCHEDULES

from .heads import agreement_per_position
from .profile import load_profile
from .report import _png, render
from .scenario import Scenario, resolve, run, with_change

COMMAND = "python -m sim.heads_report"
DEFAULT_HEADS = (
    "dense+flashhead:64+flashhead:128+flashhead:256+shortlist:8192+shortlist:16384+shortlist:65536"
    "+router:64+router:128+router:256+shortlist:65536,16384,8192+router:256,64,32+flashhead:256,256,64"
)


def head_points(profile, heads: tuple[str, ...], K: int, probes: int, regime: str) -> list[dict]:
    """Per head: its cost per draft step and its agreement, each the mean over a round's K positions."""
    costs = profile.costs[regime]
    points = []
    for head in heads:
        costs.head_table.check(head, probes)
        cost_ms = sum(costs.head_at(head, probes, j)[0] for j in range(K)) / K
        if head == "dense":
            agreement, how = [1.0] * (K + 1), "the dense head itself"
        else:
            agreement, how = agreement_per_position(profile, head, probes, K)
        points.append(
            {"head": head, "cost_us": 1000 * cost_ms, "agreement": sum(agreement[:K]) / K, "agreement_from": how}
        )
    for point in points:
        point["pareto"] = not any(
            other["cost_us"] <= point["cost_us"]
            and other["agreement"] >= point["agreement"]
            and (other["cost_us"], other["agreement"]) != (point["cost_us"], point["agreement"])
            for other in points
        )
    return points


def pareto_figure(points: list[dict], title: str) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    fig, ax = plt.subplots(figsize=(7, 4.5))
    kinds = {}
    for point in points:
        kinds.setdefault(point["head"].split(":")[0], []).append(point)
    for kind, group in kinds.items():
        ax.scatter([p["cost_us"] for p in group], [p["agreement"] for p in group], label=kind, s=30)
        for p in group:
            ax.annotate(
                p["head"], (p["cost_us"], p["agreement"]), fontsize=6, xytext=(3, 3), textcoords="offset points"
            )
    front = sorted((p for p in points if p["pareto"]), key=lambda p: p["cost_us"])
    ax.plot([p["cost_us"] for p in front], [p["agreement"] for p in front], "k--", lw=1, label="Pareto front")
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_xlabel("head cost per draft step, us (mean over the round's positions)")
    ax.set_ylabel("agreement with the dense draft (mean over positions)")
    ax.set_title(title, fontsize=8)
    ax.legend(fontsize=7)
    return _png(fig)


def tok_s_figure(rows: list[dict], title: str) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    heads = list(dict.fromkeys(r["head"] for r in rows))
    schedules = list(dict.fromkeys(r["schedule"] for r in rows))
    fig, ax = plt.subplots(figsize=(9, 4.5))
    width = 0.8 / len(schedules)
    for i, schedule in enumerate(schedules):
        values = {r["head"]: r["decode_tok_s"] for r in rows if r["schedule"] == schedule}
        ax.bar([h + i * width for h in range(len(heads))], [values[h] for h in heads], width, label=schedule)
    ax.set_xticks([h + 0.4 - width / 2 for h in range(len(heads))], heads, rotation=40, ha="right", fontsize=7)
    ax.set_ylabel("decode tok/s (predicted)")
    ax.set_title(title, fontsize=8)
    ax.legend(fontsize=7)
    return _png(fig)


def markdown(points: list[dict], rows: list[dict], notes: list[str], command: str) -> str:
    lines = ["# Draft heads: cost against agreement, and predicted tok/s (python -m sim.heads_report)", ""]
    lines += [f"Command: `{command}`", ""] + [f"- {note}" for note in notes] + [""]
    table = [
        [p["head"], f"{p['cost_us']:.1f}", f"{p['agreement']:.3f}", "yes" if p["pareto"] else "", p["agreement_from"]]
        for p in sorted(points, key=lambda p: p["cost_us"])
    ]
    lines += ["## Pareto front", "", "```", render(["head", "cost us", "agreement", "front", "from"], table), "```"]
    ranked = []
    for schedule in dict.fromkeys(r["schedule"] for r in rows):
        group = sorted((r for r in rows if r["schedule"] == schedule), key=lambda r: -r["decode_tok_s"])
        for rank, r in enumerate(group, 1):
            accepted = "-" if r["acceptance"] is None else f"{r['acceptance']:.3f}"
            ranked.append([schedule, str(rank), r["head"], f"{r['decode_tok_s']:.1f}", f"{r['speedup']:.3f}", accepted])
    headers = ["schedule", "rank", "head", "tok/s", "speedup", "acc/prop"]
    lines += ["", "## Predicted tok/s per schedule, heads ranked", "", "```", render(headers, ranked), "```", ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    def body():
        p = OneLineParser(prog=COMMAND, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
        p.add_argument("--profile", required=True, help="a profile with a heads section")
        p.add_argument("--heads", default=DEFAULT_HEADS, help="head specs joined by '+' (default: every kind)")
        p.add_argument("--acceptance", default="default", help="the dense draft's acceptance (python -m sim)")
        p.add_argument("--K", default=None, help="draft tokens per round (default: the trace's, else 6)")
        p.add_argument("--out", required=True, help="folder for heads.md, heads.json and the figures")
        args = p.parse_args(argv)
        heads = tuple(spec.label for spec in parse_heads(args.heads))
        check_output_folder(Path(args.out), "--out")
        profile = load_profile(args.profile)
        if not profile.raw.get("heads"):
            raise UsageError(f"--profile {args.profile}: no heads section (python -m measure.profile_heads adds it)")
        scenario = Scenario(
            profile=args.profile, acceptance=args.acceptance, schedules=SPECULATIVE_SCHEDULES, heads=heads
        )
        if args.K is not None:
            scenario = with_change(scenario, "K", "=", args.K, label="--K")
        resolved = resolve(scenario)  # every head checked before anything runs
        K = resolved.configs[-1].K
        points = head_points(profile, heads, K, resolved.configs[0].probes, resolved.regime)
        rows, resolved = run(scenario, ceiling=False, rounds=False)
        speculative = [r for r in rows if r["schedule"] != "baseline"]
        section = profile.raw["heads"]
        notes = [
            *resolved.notes,
            f"head costs: {section.get('cost', {}).get('weights', '?').upper()} weights, {section['cost']['source']}"
            if "cost" in section
            else "head costs: the regime's",
            f"agreement: {section['agreement']['weights'].upper()} weights, {section['agreement']['source']}"
            if "agreement" in section
            else "agreement: the profile's r(p)",
            f"K = {K}; baseline {rows[0]['decode_tok_s']:.1f} tok/s",
        ]
        command = " ".join([COMMAND, *(argv if argv is not None else sys.argv[1:])])
        weights = {part: section.get(part, {}).get("weights", "-").upper() for part in ("cost", "agreement")}
        title = f"{profile.label()}\nhead costs {weights['cost']}, agreement {weights['agreement']} (sources: heads.md)"
        with staged(Path(args.out)) as folder:
            write_atomic(folder / "heads.md", markdown(points, speculative, notes, command))
            payload = {"command": command, "notes": notes, "points": points, "rows": rows}
            write_atomic(folder / "heads.json", json.dumps(payload, indent=1) + "\n")
            write_atomic(folder / "pareto.png", pareto_figure(points, title))
            write_atomic(folder / "tok_s.png", tok_s_figure(speculative, profile.label()))
        print(markdown(points, speculative, notes, command))
        print(f"wrote {args.out}: heads.md, heads.json, pareto.png, tok_s.png")

    return run_command(body)


if __name__ == "__main__":
    sys.exit(main())
