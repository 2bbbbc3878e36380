"""python -m sim: predict speculative-decoding throughput from a cost profile and an acceptance source."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from contracts import UsageError
from .report import comparison_table, phase_share_figure, results_table, sweep_figure, write_outputs
from .scenario import NAMED_KEYS, Scenario, parse_change, run, with_change

EPILOG = """\
acceptance sources (--acceptance):
  default                 the trace shipped with the default profile (the study's Table 4.7 counts)
  trace:PATH | PATH.jsonl replay a recorded trace (flashspec.trace/1)
  0.43                    i.i.d. per-token acceptance
  0.8,0.6,0.5             per-position acceptance a_1..a_K (the last repeats)
  lengths:0=3,1=2,6=5     empirical distribution of accepted lengths (weights)

what-if keys (--what-if KEY=VALUE, repeatable; --sweep KEY=V1,V2,...):
  """ + ", ".join(NAMED_KEYS) + """, or any numeric profile field by dotted path,
  set or scaled: draft.body_ms*=0.5, host.item_ms=0, target.forward_ms*=0.8
  A probes what-if changes the FlashHead head cost and, where the profile carries the agreement
  curve r(p), the draft's acceptance (scaled by r(p) / r(p_source)); the output says which applies.

examples:
  python -m sim                                  every schedule x head on the default profile
  python -m sim --profile study                 the profile derived from the study's tables
  python -m sim --what-if probes=2               side by side with the default probes
  python -m sim --sweep K=1,2,4,6,8 --out out --plot
"""


class OneLineParser(argparse.ArgumentParser):
    """Usage mistakes get the same one-line error and exit code 2 as every other bad input."""

    def error(self, message):
        self.exit(2, f"error: {message} (see python -m sim --help)\n")


def parse_args(argv):
    p = OneLineParser(prog="python -m sim", description=__doc__, epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--profile", default="default",
                   help="'default' (measured profile if shipped, else the study's), 'study', or a profile JSON path")
    p.add_argument("--acceptance", default=None, help="acceptance source (see below); default: the shipped trace")
    p.add_argument("--trace", default=None, help="shorthand for --acceptance trace:PATH")
    p.add_argument("--schedule", default=None,
                   help="schedules to run, joined by '+' (baseline always runs for speedups); default: all")
    p.add_argument("--head", default=None, help="dense, flashhead or dense+flashhead (default)")
    p.add_argument("--K", default=None, help="draft tokens per round (default: the trace's K, else 6)")
    p.add_argument("--probes", default=None, help="FlashHead probes (default: the profile's, c/16)")
    p.add_argument("--placement", default=None, help="two-gpu, one-gpu or cpu (default: the profile's)")
    p.add_argument("--graphs", default=None, choices=["on", "off"],
                   help="use the profile's graph-captured (on) or eager (off) costs (default: the profile's)")
    p.add_argument("--prompts", default=None, help="number of generations (synthetic acceptance: default 8)")
    p.add_argument("--max-new-tokens", default=None, help="tokens per generation (synthetic acceptance: 64)")
    p.add_argument("--prompt-len", default=None, help="prompt length (default: the profile's first)")
    p.add_argument("--seed", default="0", help="seed of every random draw (default 0)")
    p.add_argument("--what-if", action="append", default=[], metavar="KEY=VALUE",
                   help="a change to compare against the scenario (repeatable; applied together)")
    p.add_argument("--sweep", default=None, metavar="KEY=V1,V2,...", help="run the scenario for each value")
    p.add_argument("--out", default=None, help="folder for results.json, results.csv and plots")
    p.add_argument("--plot", action="store_true", help="write PNG figures into --out")
    p.add_argument("--no-ceiling", action="store_true", help="skip the head-only ceiling (halves the run time)")
    return p.parse_args(argv)


def build_scenario(args) -> Scenario:
    s = Scenario(profile=args.profile)
    acceptance = f"trace:{args.trace}" if args.trace else args.acceptance
    options = {"acceptance": acceptance, "schedule": args.schedule, "head": args.head, "K": args.K,
               "probes": args.probes, "placement": args.placement, "graphs": args.graphs,
               "prompts": args.prompts, "max_new_tokens": args.max_new_tokens,
               "prompt_len": args.prompt_len, "seed": args.seed}
    for key, value in options.items():
        if value is not None:
            s = with_change(s, key, "=", str(value))
    return s


def main(argv=None) -> int:
    try:
        args = parse_args(sys.argv[1:] if argv is None else argv)
    except SystemExit as stop:  # --help, or a usage error already printed as one line
        return stop.code
    try:
        if args.plot and not args.out:
            raise UsageError("--plot writes PNG files and needs --out DIR")
        scenario = build_scenario(args)
        ceiling = not args.no_ceiling
        rows, resolved = run(scenario, ceiling)
        payload = {"scenario": scenario.describe(), "notes": resolved.notes}
        print("\n".join(f"# {n}" for n in resolved.notes))
        print(results_table(rows))
        figures = {"phase_shares.png": None} if args.plot else {}
        out_rows = rows
        if args.what_if:
            changed = scenario
            for text in args.what_if:
                changed = with_change(changed, *parse_change(text))
            after, after_resolved = run(changed, ceiling)
            label = ", ".join(args.what_if)
            print("\n".join(f"# what-if {n}" for n in after_resolved.notes if n not in resolved.notes))
            print()
            print(results_table(after))
            print()
            print(comparison_table(rows, after, label))
            payload.update(what_if=args.what_if, what_if_notes=after_resolved.notes)
            for row in after:
                row["label"] = "what-if"
            for row in rows:
                row["label"] = "base"
            out_rows = rows + after
        if args.sweep:
            key, op, values = parse_change(args.sweep)
            sweep_rows = []
            for value in values.split(","):
                changed = with_change(scenario, key, op, value.strip())
                for row in run(changed, ceiling)[0]:
                    row["sweep_value"] = _number(value.strip())
                    row["label"] = f"{key}{op}{value.strip()}"
                    sweep_rows.append(row)
            print()
            print(results_table(sweep_rows, label="sweep"))
            payload.update(sweep=args.sweep)
            out_rows = sweep_rows
            if args.plot:
                figures["sweep.png"] = sweep_figure(sweep_rows, key, f"sweep {key} ({resolved.profile.label()})")
        if args.plot:
            figures["phase_shares.png"] = phase_share_figure(rows, resolved.profile.label())
        if args.out:
            for path in write_outputs(Path(args.out), payload, out_rows, figures):
                print(f"wrote {path}")
        return 0
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def _number(text: str):
    try:
        return int(text)
    except ValueError:
        try:
            return float(text)
        except ValueError:
            return text


if __name__ == "__main__":
    sys.exit(main())
