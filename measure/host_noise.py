"""python -m measure.host_noise: how steady this CPU runs a fixed piece of work, before a CPU validation.

    python -m measure.host_noise --seconds 90 --out noise.json

Why: a CPU validation compares runs minutes apart, so it can meet its goals only on a host that holds its speed
to a few percent. The check is the same fixed work every time: a float32 GEMV of 65,536 x 640 (a quarter of the real
Gemma 3 270M head's size, streamed from memory like it), seeded, on --threads threads, timed by the wall clock in
chunks of CHUNK_REPS repetitions, back to back for --seconds. Each chunk's median says how fast the host was then;
their spread over the run says whether a measurement can be held to a few percent on it
(`reports/gemma3-270m/policies-idle/README.md` cites these checks). It reads no weights and needs no GPU.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

from contracts import UsageError
from contracts.cli import OneLineParser, run_command

from .profile import cpu_name
from .timing import check_out, spread, write_result

COMMAND = "python -m measure.host_noise"
ROWS, COLUMNS = 65_536, 640  # the GEMV's weight: 168 MB of float32, larger than a CPU's caches
CHUNK_REPS = 100  # repetitions a chunk: about half a second on a 2-core VM
WARMUP_REPS = 20
MAX_SECONDS = 3600.0
SEED = 0


def time_chunks(seconds: float, threads: int) -> list[float]:
    """The median milliseconds of one GEMV in each chunk of CHUNK_REPS, chunk after chunk for `seconds`."""
    torch.set_num_threads(threads)
    generator = torch.Generator().manual_seed(SEED)
    weight = torch.randn(ROWS, COLUMNS, generator=generator)
    vector = torch.randn(COLUMNS, generator=generator)
    for _ in range(WARMUP_REPS):
        weight @ vector
    medians = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end or not medians:
        times = []
        for _ in range(CHUNK_REPS):
            start = time.perf_counter()
            weight @ vector
            times.append((time.perf_counter() - start) * 1e3)
        medians.append(statistics.median(times))
    return medians


def summary(medians: list[float]) -> dict:
    """The chunks' median, p10, p90 and count as every timing of measure gives them (`timing.spread`), and how
    far apart they lie: the slowest chunk over the fastest, and the standard deviation over the median."""
    chunks = spread(medians)
    return {
        **chunks,
        "slowest_over_fastest": max(medians) / min(medians),
        "sd_over_median": statistics.pstdev(medians) / chunks["median_ms"],
    }


def parser() -> OneLineParser:
    p = OneLineParser(prog=COMMAND, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=90.0, help="how long to time, in seconds (default 90)")
    p.add_argument("--threads", type=int, default=2, help="torch threads for the GEMV (default 2)")
    p.add_argument("--out", help="also write the chunks and the summary to this JSON file")
    return p


def check_arguments(args) -> None:
    if not 0 < args.seconds <= MAX_SECONDS:
        raise UsageError(f"--seconds must be more than 0 and at most {MAX_SECONDS:.0f}, got {args.seconds}")
    cores = os.cpu_count() or 1
    if not 1 <= args.threads <= cores:
        raise UsageError(f"--threads must be from 1 to this host's {cores} cores, got {args.threads}")
    if args.out is not None:
        check_out(args.out)


def main(argv=None) -> int:
    def body():
        args = parser().parse_args(argv)
        check_arguments(args)
        medians = time_chunks(args.seconds, args.threads)
        result = {
            "env": {"cpu": cpu_name(), "torch": torch.__version__, "threads": args.threads},
            "work": f"float32 GEMV {ROWS} x {COLUMNS}, {CHUNK_REPS} repetitions a chunk",
            "summary": summary(medians),
            "chunk_medians_ms": medians,
        }
        stats = result["summary"]
        print(
            f"{COMMAND} on {result['env']['cpu']}, {args.threads} threads: {stats['n']} chunks, median "
            f"{stats['median_ms']:.2f} ms [p10 {stats['p10_ms']:.2f}, p90 {stats['p90_ms']:.2f}], slowest chunk "
            f"{stats['slowest_over_fastest']:.2f}x the fastest, SD {100 * stats['sd_over_median']:.1f}%"
        )
        print("chunk medians (ms): " + " ".join(f"{m:.1f}" for m in medians))
        if args.out is not None:
            write_result(Path(args.out), result)
            print(f"wrote {args.out}")

    return run_command(body)


if __name__ == "__main__":
    sys.exit(main())
