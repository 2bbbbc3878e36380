"""python -m sim: predict speculative-decoding throughput from a cost profile and an acceptance source."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from pathlib import Path

from contracts import UsageError
from contracts.cli import OneLineParser, run_command
from contracts.files import check_output_file, check_output_folder, staged
from contracts.progress import Progress
from contracts.timeline import write_timeline
from contracts.trees import parse_trees

from .heads import ranking, sweep_values
from .profile import editable_paths
from .report import (
    LEGEND,
    comparison_table,
    phase_share_figure,
    policy_table,
    results_table,
    sweep_figure,
    write_outputs,
)
from .scenario import (
    LIMITS,
    MAX_DECODE_TOKENS,
    MAX_RUN_OPERATIONS,
    NAMED_KEYS,
    Scenario,
    items,
    parse_change,
    resolve,
    run,
    timeline,
    with_change,
    work,
)

EPILOG = (
    """\
acceptance sources (--acceptance):
  default                 the trace shipped with the default profile (the study's Table 4.7 counts)
  trace:PATH | PATH.jsonl replay a recorded trace (specloop.trace/1)
  0.43                    i.i.d. per-token acceptance a
  0.8,0.6,0.5             per-position acceptance a_1..a_K (the last repeats)
  lengths:0=3,1=2,6=5     empirical distribution of accepted lengths (weights)
  a=0.43 | a=0.8,0.6,0.5  an acceptance control as the decoder reads it (contracts.acceptance): the
                          same numbers as 0.43 and 0.8,0.6,0.5
  curve:a=0.77            per head: the rates times the head's agreement per draft position from the
                          profile's heads section (what python -m validate --acceptance curve:... runs)

what-if keys (--what-if KEY=VALUE, repeatable; --sweep KEY=V1,V2,...):
  """
    + ", ".join(NAMED_KEYS)
    + """, or any numeric profile field by dotted path,
  set or scaled: draft.body_ms*=0.5, host.item_ms=0, target.forward_ms*=0.8 (--keys lists them all)
  placement=tpN runs the target tensor-parallel over N GPUs from the profile's tensor_parallel.tpN costs
  (each forward: one rank's compute plus two all-reduces per layer; the draft on rank 0's GPU);
  allreduce=x0.5 scales those all-reduces.
  A probes what-if changes the FlashHead head cost and, where the profile carries the agreement
  curve r(p), the draft's acceptance (scaled by r(p) / r(p_source)); the output says which applies.

limits: """
    + ", ".join(f"{k} <= {v:,}" for k, v in LIMITS.items() if k != "seed")
    + f""", at most {MAX_DECODE_TOKENS:,} decode tokens
  (prompts x max-new-tokens) per configuration, and at most {MAX_RUN_OPERATIONS:,} model operations per
  command, counted at their most: K draft steps and a verify per decode token of every speculative
  configuration (again for its head-only ceiling; --no-ceiling halves it), one forward per baseline
  token, over every what-if and sweep point. Every input is checked before anything runs. Progress shows
  on stderr when it is a terminal, never in a log.

"""
    + LEGEND
    + """
examples:
  python -m sim                                  every schedule x head on the default profile
  python -m sim --profile study                  the profile derived from the study's tables
  python -m sim --what-if probes=2               side by side with the default probes
  python -m sim --profile both.json --acceptance 0.77 --K 6 --what-if placement=tp2
                                                 one-GPU target against the same pair at TP=2
  python -m sim --sweep K=1,2,4,6,8 --out out/sweep --plot
  python -m sim --schedule pipelined-deferred --head flashhead --timeline out/sim-timeline.json
  python -m sim --trace run/deferred.trace.jsonl --drafter draft-model+prompt-lookup --policy all
                                                 every arm, policy and the oracle on a recorded run
  python -m sim --trace run/deferred.trace.jsonl --what-if drafter=prompt-lookup
  python -m sim --profile reports/heads/h200_heads_profile.json --sweep head=dense+flashhead:64+shortlist:8192
                                                 heads ranked by predicted tok/s (costs and agreement per draft
                                                 position from the profile's heads section: docs/design.md)

policies (--policy; deferred schedules only): fixed plays (first drafter, K); heuristic is Hugging
  Face's num_assistant_tokens schedule; ucb1 and thompson are bandits over every (drafter, K) arm with
  reward = tokens emitted per ms of the round; oracle plays, per generation, the fixed arm that was
  fastest on it. A trace replays the drafters whose match runs it recorded.

timeline (--timeline FILE): the simulated target-device, draft-device and host streams of ONE
  configuration, the scenario's first speculative one (the first --schedule with the first --head),
  over its first generation, as a Chrome/Perfetto trace (open it in https://ui.perfetto.dev); times
  from the decode start, the prefills before it; its otherData names the configuration.
"""
)


def parse_args(argv):
    p = OneLineParser(
        prog="python -m sim", description=__doc__, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add = p.add_argument
    add(
        "--profile",
        default="default",
        help="'default' (the measured profile shipped in sim/data), 'study', or a profile JSON path",
    )
    add("--acceptance", default=None, help="acceptance source (see below); default: the shipped trace")
    add("--trace", default=None, help="shorthand for --acceptance trace:PATH")
    add(
        "--schedule",
        default=None,
        help="schedules to run, joined by '+' or ',' (baseline always runs for speedups); default: all",
    )
    add(
        "--head",
        default=None,
        help="head specs joined by '+': dense, flashhead[:P], shortlist:N, router:C, KIND:B1,B2,... per draft "
        "position (default dense+flashhead; budgeted kinds need the profile's heads section)",
    )
    add("--K", default=None, help="draft tokens per round (default: the trace's K, else 6)")
    add("--probes", default=None, help="FlashHead probes (default: the profile's, c/16)")
    add("--placement", default=None, help="two-gpu, one-gpu, cpu or tpN (default: the profile's)")
    add(
        "--graphs",
        default=None,
        choices=["on", "off"],
        help="use the profile's graph-captured (on) or eager (off) costs (default: the profile's)",
    )
    add("--prompts", default=None, help="number of generations (synthetic acceptance: default 8)")
    add("--max-new-tokens", default=None, help="tokens per generation (synthetic acceptance: 64)")
    add("--prompt-len", default=None, help="prompt length (default: the profile's first)")
    add("--seed", default="0", help="seed of every random draw (default 0)")
    add(
        "--policy",
        default=None,
        help="what chooses each round's drafter and K: fixed (default), heuristic, ucb1, thompson, oracle, joined "
        "by '+', or all (every fixed arm, every policy and the oracle)",
    )
    add("--drafter", default=None, help="the arms' drafters joined by '+' (draft-model, prompt-lookup, early-exit)")
    add("--tree", default=None, help="draft tree each round (contracts.trees: chain, 2x2x1, paths:..., dynamic:M,N,D)")
    add("--arms-K", default=None, help="the arms' K values joined by '+' besides --K (default 1+2+4+6+8)")
    add(
        "--what-if",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a change to compare against the scenario (repeatable; applied together)",
    )
    add(
        "--sweep",
        action="append",
        default=[],
        metavar="KEY=V1,V2,...",
        help="run the scenario for each value (one sweep a command)",
    )
    add("--out", default=None, help="folder for results.json, results.csv and plots (created whole at the end)")
    add("--plot", action="store_true", help="write PNG figures into --out")
    add(
        "--timeline",
        default=None,
        metavar="FILE",
        help="write the streams of the first speculative configuration's first generation as a Chrome/Perfetto "
        "trace (JSON; see below)",
    )
    add("--no-ceiling", action="store_true", help="skip the head-only ceiling (halves the run time)")
    add("--wide", action="store_true", help="every column in the table (TTFT, TPOT, calls, every phase share)")
    add("--keys", action="store_true", help="list every what-if key of the profile and exit")
    return p.parse_args(argv)


OPTION_KEYS = {
    "acceptance": "--acceptance",
    "schedule": "--schedule",
    "head": "--head",
    "K": "--K",
    "probes": "--probes",
    "placement": "--placement",
    "graphs": "--graphs",
    "prompts": "--prompts",
    "max_new_tokens": "--max-new-tokens",
    "prompt_len": "--prompt-len",
    "seed": "--seed",
    "policy": "--policy",
    "drafter": "--drafter",
    "arms_K": "--arms-K",
    "tree": "--tree",
}


def check_options(args) -> None:
    """Options that contradict each other, or given empty (a typo, never 'not given')."""
    for name, value in vars(args).items():
        if isinstance(value, str) and not value.strip():
            raise UsageError(f"--{name.replace('_', '-')}: empty value (python -m sim --help lists its forms)")
    if args.trace is not None and args.acceptance is not None:
        raise UsageError(
            "--trace and --acceptance both set the acceptance (--trace F is --acceptance trace:F); give one"
        )


def build_scenario(args) -> Scenario:
    scenario = Scenario(profile=args.profile)
    given = dict(vars(args), acceptance=f"trace:{args.trace}" if args.trace else args.acceptance)
    for key, option in OPTION_KEYS.items():
        if given[key] is not None:
            scenario = with_change(scenario, key, "=", str(given[key]), label=option)
    return scenario


@dataclass
class Plan:
    """Every scenario a run will simulate, built and resolved before the first one runs."""

    base: Scenario
    what_if: Scenario | None = None
    sweep_key: str | None = None
    sweep: list[tuple[str, Scenario]] = field(default_factory=list)
    tokens: int = 0  # decode tokens to simulate, all scenarios together
    operations: int = 0  # model operations they take at most

    def add(self, work: tuple[int, int]) -> None:
        self.tokens += work[0]
        self.operations += work[1]


def plan(args) -> Plan:
    """The base scenario, its what-if and its sweep, each checked by resolving it (files read, keys and
    values validated) so that bad input fails before any simulation."""
    if args.plot and not args.out:
        raise UsageError("--plot writes PNG files and needs --out DIR")
    if args.out:
        check_output_folder(Path(args.out), "--out")
    if args.timeline:
        check_output_file(Path(args.timeline), "--timeline")
    ceiling = not args.no_ceiling
    base = build_scenario(args)
    result = Plan(base)
    result.add(work(resolve(base), ceiling))
    if args.what_if:
        changed, keys = base, set()
        for text in args.what_if:
            key, op, value = parse_change(text, "--what-if")
            if key in keys:
                raise UsageError(f"--what-if: key {key!r} given twice ({', '.join(args.what_if)}); give each key once")
            keys.add(key)
            changed = with_change(changed, key, op, value)
        result.add(work(resolve(changed), ceiling))
        result.what_if = changed
    if len(args.sweep) > 1:
        raise UsageError(f"--sweep: one sweep a command, got {len(args.sweep)} ({', '.join(args.sweep)})")
    if args.sweep:
        key, op, values = parse_change(args.sweep[0], "--sweep")
        result.sweep_key = key
        for value in _sweep_points(key, values):
            changed = with_change(base, key, op, value, label=f"--sweep {key}")
            result.add(work(resolve(changed), ceiling))
            result.sweep.append((f"{key}{op}{value}", changed))
    _check_applies(args, [base, *([result.what_if] if result.what_if else []), *(s for _, s in result.sweep)])
    if result.operations > MAX_RUN_OPERATIONS:
        raise UsageError(
            f"this run may simulate {result.operations:,} model operations ({result.tokens:,} decode tokens), over "
            f"the {MAX_RUN_OPERATIONS:,} of one command (use fewer prompts, tokens, schedules, heads, sweep values "
            "or a smaller K, or --no-ceiling)"
        )
    return result


def _check_applies(args, scenarios: list[Scenario]) -> None:
    """An option that changes no scenario of the run is a mistake (as --plot without --out is)."""
    if args.probes is not None and not any("flashhead" in s.heads for s in scenarios):
        raise UsageError("--probes sets the probes of the flashhead head: it needs --head flashhead (or the default)")
    if args.arms_K is not None and all(s.policies == ("fixed",) for s in scenarios):
        raise UsageError(
            "--arms-K sets the K values of a policy's arms: it needs --policy heuristic, ucb1, thompson, oracle or all"
        )


def _sweep_points(key: str, values: str) -> list[str]:
    """One sweep's values: tree and head specs have lists of their own; anything else is joined by ','."""
    if key == "tree":
        return [tree.label for tree in parse_trees(values, f"--sweep {key}")]
    if key == "head":
        return sweep_values(values, f"--sweep {key}")
    return items(f"--sweep {key}", values, separators=",")


def main(argv=None) -> int:
    return run_command(lambda: _run(parse_args(sys.argv[1:] if argv is None else argv)))


def _run(args) -> int:
    check_options(args)
    if args.keys:
        profile = resolve(build_scenario(args)).profile
        print("\n".join(NAMED_KEYS + tuple(editable_paths(profile.raw, profile.default_regime))))
        return 0
    todo = plan(args)
    ceiling = not args.no_ceiling
    with Progress(todo.tokens, "simulating", "tok") as progress:
        rows, resolved = run(todo.base, ceiling, progress, rounds=False)
        what_if = run(todo.what_if, ceiling, progress, rounds=False) if todo.what_if is not None else None
        swept = [(label, run(scenario, ceiling, progress, rounds=False)[0]) for label, scenario in todo.sweep]
    payload = {"scenario": todo.base.describe(), "notes": resolved.notes, "warnings": resolved.warnings}
    print("\n".join(f"# {n}" for n in resolved.notes))
    print(results_table(rows, wide=args.wide))
    if todo.base.policies != ("fixed",):
        print()
        print(policy_table(rows))
    out_rows = rows
    if what_if is not None:
        after, after_resolved = what_if
        label = ", ".join(args.what_if)
        print("\n".join(f"# what-if {n}" for n in after_resolved.notes if n not in resolved.notes))
        print()
        print(results_table(after, wide=args.wide))
        if todo.what_if.policies != ("fixed",):
            print()
            print(policy_table(after))
        print()
        print(comparison_table(rows, after, label))
        payload.update(
            what_if=args.what_if, what_if_notes=after_resolved.notes, what_if_warnings=after_resolved.warnings
        )
        for row in after:
            row["label"] = "what-if"
        for row in rows:
            row["label"] = "base"
        out_rows = rows + after
    sweep_rows = []
    for label, sweep_point_rows in swept:
        value = label.split("=", 1)[1]
        for row in sweep_point_rows:
            row["sweep_value"] = _number(value)
            row["label"] = label
            sweep_rows.append(row)
    if sweep_rows:
        print()
        print(results_table(sweep_rows, label="sweep", wide=args.wide))
        if todo.sweep_key == "head":
            print()
            print(ranking(sweep_rows))
        payload.update(sweep=args.sweep[0])
        out_rows = sweep_rows
    print()
    print(LEGEND.rstrip())
    if args.out:
        figures = {}
        if args.plot:
            figures["phase_shares.png"] = phase_share_figure(rows, resolved.profile.label())
            if sweep_rows:
                figures["sweep.png"] = sweep_figure(
                    sweep_rows, todo.sweep_key, f"sweep {todo.sweep_key} ({resolved.profile.label()})"
                )
        with staged(Path(args.out), merge=True) as folder:
            names = write_outputs(folder, payload, out_rows, figures)
        for name in names:
            print(f"wrote {Path(args.out) / name}")
    if args.timeline:
        intervals, meta = timeline(todo.base)
        write_timeline(args.timeline, intervals, meta)
        print(
            f"wrote {args.timeline} (timeline of {meta['configuration']['name']}, generation "
            f"{meta['generation']['prompt_id']})"
        )
    return 0


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
