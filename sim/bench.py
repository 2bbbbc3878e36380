"""Simulator speed benchmark (not a test): rounds simulated per second on one core.

    python -m sim.bench [--out reports/sim_speed.md]

1. 560 generations of 64 tokens (the size of the study's Table 4.9) under each schedule, i.i.d.
   acceptance 0.6 at K = 6, on the study-derived profile, without and with the head-only ceiling.
2. A 100-point sweep (probes = 1..100) of the default comparison (baseline + 4 schedules x 2 heads,
   head-only ceilings included) on the default trace.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from dataclasses import replace
from pathlib import Path

from contracts import SCHEDULES
from contracts.cli import OneLineParser, run_command
from contracts.files import check_output_file, write_atomic

from .acceptance import Generation, IIDAcceptance
from .profile import load_profile
from .scenario import Scenario, run
from .schedules import Config
from .simulate import simulate


def _best_of(fn, repeats: int = 3):
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), min(times), max(times), result


def main(argv=None) -> int:
    return run_command(lambda: _bench(argv))


def _bench(argv) -> int:
    parser = OneLineParser(
        prog="python -m sim.bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", default=None, help="also write the table as Markdown here")
    args = parser.parse_args(argv)
    if args.out:
        check_output_file(Path(args.out), "--out", "Markdown file")
    profile = load_profile("study")
    costs = profile.costs[profile.default_regime]
    generations = [Generation(str(i), 128, 63) for i in range(560)]
    source = IIDAcceptance(0.6)
    lines = ["| case | rounds | median s | min s | max s | rounds/s |", "|---|---|---|---|---|---|"]
    for schedule in SCHEDULES:
        config = Config(schedule, "flashhead", 6, profile.default_probes, "two-gpu")
        median, low, high, result = _best_of(
            lambda config=config: simulate(costs, config, source, generations, 0, ceiling=False)
        )
        rounds = result["rounds"] or result["decode_tokens"]
        timing = f"{median:.3f} | {low:.3f} | {high:.3f}"
        lines.append(f"| 560 x 64 tokens, {schedule} | {rounds} | {timing} | {rounds / median:,.0f} |")
    config = Config("pipelined-deferred", "flashhead", 6, profile.default_probes, "two-gpu")
    median, low, high, result = _best_of(lambda: simulate(costs, config, source, generations, 0, ceiling=True))
    lines.append(
        f"| 560 x 64 tokens, pipelined-deferred + head-only ceiling (2 runs) | {result['rounds']} | "
        f"{median:.3f} | {low:.3f} | {high:.3f} | {2 * result['rounds'] / median:,.0f} |"
    )
    base = Scenario(profile="study")
    start = time.perf_counter()
    for probes in range(1, 101):
        run(replace(base, probes=probes))
    sweep = time.perf_counter() - start
    lines.append(f"| 100-point sweep (probes=1..100), 9 configurations + ceilings each | - | {sweep:.3f} | - | - | - |")
    header = (
        f"Simulator speed, `python -m sim.bench`, Python {platform.python_version()} on "
        f"{platform.processor() or platform.machine()}, one process (one core).\n"
    )
    text = header + "\n" + "\n".join(lines) + "\n"
    print(text)
    if args.out:
        write_atomic(args.out, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
