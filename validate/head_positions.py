"""python -m validate.head_positions: which agreement source predicts a head's acceptance per draft
position? Re-predicts a run recorded with the head from a run recorded with the dense head, both greedy
on the same real pair and prompts (a head's acceptance is the dense draft's times its agreement,
sim/heads.py), and scores each source against what the head's run measured.

    python -m validate.head_positions --profile reports/heads/h200_heads_profile.json \\
        --dense reports/gemma3-270m/run-dense/deferred.trace.jsonl \\
        --head-trace reports/gemma3-270m/run-flashhead-p64/deferred.trace.jsonl --head flashhead:64

Sources: the simulator's rule (pooled level times the curve's lift per position), the pooled rate alone
(the profile without curves: one flat rate) and the spec's own curve alone (the profile without pooled
rows). Per position j a round tests its proposal when it accepted every earlier one; the score is the
binomial log-likelihood of the head's accepted / tested counts at rate dense(j) x agreement(j), and a
bootstrap over prompts (both runs resampled together) says how often each source scores best.
"""

from __future__ import annotations

import argparse
import copy
import math
import random
import sys
from pathlib import Path

from contracts import UsageError
from contracts.cli import OneLineParser, run_command
from contracts.files import check_output_file, write_atomic
from contracts.heads import parse_head
from sim.heads import agreement_per_position
from sim.profile import load_profile
from sim.trace import rounds_by_prompt

COMMAND = "python -m validate.head_positions"
RESAMPLES = 2000


def tested_and_accepted(rounds: dict[str, list[dict]], prompts, K: int) -> tuple[list[int], list[int]]:
    """Per draft position 1..K: rounds that tested it (every earlier proposal accepted) and accepted it.
    A round whose verify was skipped tested position 1 (the standalone append rejected it)."""
    tested, accepted = [0] * K, [0] * K
    for prompt in prompts:
        for line in rounds[prompt]:
            for j in range(min(line["proposed"], K)):
                if line["accepted"] >= j:
                    tested[j] += 1
                    accepted[j] += line["accepted"] > j
    return tested, accepted


def sources(profile, head: str, probes: int, K: int) -> dict[str, tuple[list[float], str]]:
    """Agreement per position from each source; a source the profile cannot give is left out."""
    section = profile.raw["heads"]["agreement"]
    found = {"simulator's rule": agreement_per_position(profile, head, probes, K)}
    without = {"pooled rate alone (flat)": "curves"}
    if head in section.get("curves", {}):
        without["own curve alone"] = "pooled"
    for name, part in without.items():
        trimmed = copy.copy(profile)  # the profile with one part of its agreement emptied
        trimmed.raw = dict(profile.raw, heads={"agreement": {**section, part: {}}})
        try:
            found[name] = agreement_per_position(trimmed, head, probes, K)
        except UsageError:  # that part alone does not cover the head
            continue
    return found


def log_likelihood(rates: list[float], dense, measured) -> float:
    total = 0.0
    for rate, (d_tested, d_accepted), (tested, accepted) in zip(rates, zip(*dense), zip(*measured)):
        p = min(1 - 1e-9, max(1e-9, rate * (d_accepted / d_tested if d_tested else 0.0)))
        total += accepted * math.log(p) + (tested - accepted) * math.log(1 - p)
    return total


def _per_round(rates: list[float]) -> float:
    """Expected accepted proposals per round at these conditional rates per position."""
    total, reached = 0.0, 1.0
    for rate in rates:
        reached *= rate
        total += reached
    return total


def compare(dense_rounds, head_rounds, found: dict, K: int) -> tuple[list[str], dict]:
    """The markdown table per source, and per source the bootstrap share in which it scores best."""
    prompts = sorted(set(dense_rounds) & set(head_rounds))
    dense = tested_and_accepted(dense_rounds, prompts, K)
    measured = tested_and_accepted(head_rounds, prompts, K)
    header = " | ".join(f"pos {j + 1}" for j in range(K))
    lines = [f"| source | {header} | accepted / round | log-likelihood |", "|---|" + "---|" * (K + 2)]
    for name, (tested, accepted) in (("dense, measured", dense), ("head, measured", measured)):
        cells = " | ".join(f"{a / t:.3f} ({a}/{t})" if t else "-" for t, a in zip(tested, accepted))
        lines.append(f"| {name} (accepted / tested) | {cells} | {sum(accepted) / tested[0]:.3f} | |")
    for name, (rates, _) in found.items():
        predicted = [rate * (a / t if t else 0.0) for rate, t, a in zip(rates, *dense)]
        cells = " | ".join(f"{p:.3f} (x {r:.3f})" for p, r in zip(predicted, rates))
        score = log_likelihood(rates, dense, measured)
        lines.append(f"| {name} | {cells} | {_per_round(predicted):.3f} | {score:.2f} |")
    rng = random.Random(0)
    best = dict.fromkeys(found, 0)
    for _ in range(RESAMPLES):
        sample = [rng.choice(prompts) for _ in prompts]
        d, m = tested_and_accepted(dense_rounds, sample, K), tested_and_accepted(head_rounds, sample, K)
        scores = {name: log_likelihood(rates, d, m) for name, (rates, _) in found.items()}
        best[max(scores, key=scores.get)] += 1
    return lines, {name: count / RESAMPLES for name, count in best.items()}


def main(argv=None) -> int:
    def body():
        p = OneLineParser(prog=COMMAND, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
        p.add_argument("--profile", required=True, help="a profile whose heads section holds the agreement")
        p.add_argument("--dense", required=True, help="trace of a greedy run with the dense head")
        p.add_argument("--head-trace", required=True, help="trace of the same run with the head")
        p.add_argument("--head", required=True, help="the head spec the head trace ran (e.g. flashhead:64)")
        p.add_argument("--out", default=None, help="also write the markdown here")
        args = p.parse_args(argv)
        spec = parse_head(args.head, "--head")
        if args.out:
            check_output_file(Path(args.out), "--out")
        profile = load_profile(args.profile)
        if not (profile.raw.get("heads") or {}).get("agreement"):
            raise UsageError(f"--profile {args.profile}: no heads agreement (python -m measure.profile_heads adds it)")
        dense_rounds, dense_meta = rounds_by_prompt(args.dense)
        head_rounds, head_meta = rounds_by_prompt(args.head_trace)
        if dense_meta["head"] != "dense":
            raise UsageError(f"--dense {args.dense}: recorded with the {dense_meta['head']} head, not dense")
        if parse_head(head_meta["head"], "--head-trace").kind != spec.kind:  # a trace names budgets, or probes apart
            raise UsageError(
                f"--head-trace {args.head_trace}: recorded with the {head_meta['head']} head, not {spec.kind}"
            )
        K = max(line["K"] for rounds in dense_rounds.values() for line in rounds)
        if {line["K"] for rounds in head_rounds.values() for line in rounds} != {K}:
            raise UsageError(f"--head-trace {args.head_trace}: its K differs from the dense trace's ({K})")
        if not set(dense_rounds) & set(head_rounds):
            raise UsageError("--dense and --head-trace share no prompt")
        found = sources(profile, spec.label, head_meta["probes"] or profile.default_probes, K)
        lines, best = compare(dense_rounds, head_rounds, found, K)
        command = " ".join([COMMAND, *(argv if argv is not None else sys.argv[1:])])
        text = "\n".join(
            [
                f"`{command}`",
                "",
                f"Head {spec.label}, K = {K}; predicted = dense measured x agreement (in brackets).",
                "",
                *lines,
                "",
                *(
                    f"- {name}: {how}; best in {best[name]:.1%} of {RESAMPLES} prompt resamples"
                    for name, (_, how) in found.items()
                ),
            ]
        )
        print(text)
        if args.out:
            write_atomic(Path(args.out), text + "\n")

    return run_command(body)


if __name__ == "__main__":
    sys.exit(main())
