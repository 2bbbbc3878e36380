"""Evidence for the documented limits (not a test): each command run at and just beyond each limit.

    python -m sim.limits --out reports/limits [--only TEXT] [--timeout SECONDS]

Every case is one command line run in its own process, so its peak resident memory (the child's
ru_maxrss, from os.wait4) is its own. For each case: the input, the limit, whether it was accepted or
refused (exit code and the error line), the wall time and the peak memory. The simulator's cases run
anywhere; the decoder's and measure's (their readers and their refusals before any allocation) run
where torch is installed, and are listed as skipped elsewhere. Input files are made in a temporary
folder. Writes report.md and limits.json into --out, all at once.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import platform
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from contracts import UsageError
from contracts.cli import OneLineParser, run_command
from contracts.files import MAX_INPUT_BYTES, check_output_folder, staged, write_atomic
from contracts.progress import Progress

from .profile import DATA
from .scenario import LIMITS, MAX_DECODE_TOKENS, MAX_RUN_OPERATIONS

ROOT = Path(__file__).resolve().parent.parent
# Runs a case's module as `python -m` would, and records its peak resident memory (VmHWM) at exit: the
# high-water mark of its own address space, not of the parent it was forked from (ru_maxrss would be).
WRAPPER = """import atexit, runpy, sys
peak_file, module, args = sys.argv[1], sys.argv[3], sys.argv[4:]
def record():
    with open('/proc/self/status') as status, open(peak_file, 'w') as out:
        out.write(next(line.split()[1] for line in status if line.startswith('VmHWM:')))
atexit.register(record)
sys.argv = [module, *args]
runpy.run_module(module, run_name='__main__', alter_sys=True)
"""


@dataclass
class Case:
    """One command line at or beyond one limit. `files` makes its inputs in a folder (the `{dir}` of
    its arguments); `expect` is what the limit says should happen."""

    name: str
    limit: str
    expect: str  # accepted | refused
    command: list[str]
    files: Callable[[Path], None] | None = None
    needs_torch: bool = False
    result: dict = field(default_factory=dict)


def _trace_line(prompt: str, index: int, context: int, K: int = 6, accepted: int = 0) -> str:
    return json.dumps(
        {
            "schema": "specloop.trace/1",
            "prompt_id": prompt,
            "round": index,
            "schedule": "deferred",
            "head": "dense",
            "K": K,
            "proposed": K,
            "accepted": accepted,
            "emitted": accepted + 1,
            "verify_skipped": False,
            "context": context,
            "lookahead_used": None,
        }
    )


def _filled_trace(path: Path, size: int) -> int:
    """A valid trace of `size` bytes exactly: prompts of 500 one-token rounds each, the rest blank lines
    (which readers skip); its decode tokens."""
    lines, used, rounds = [], 0, 0
    while True:
        line = _trace_line(f"p{rounds // 500}", rounds % 500, 128 + rounds % 500) + "\n"
        if used + len(line) > size:
            break
        lines.append(line)
        used += len(line)
        rounds += 1
    path.write_text("".join(lines) + "\n" * (size - used))
    return rounds


def _trace_of(prompts: int, rounds: int, context: int = 128, accepted: int = 0):
    def make(folder: Path) -> None:
        lines = (
            _trace_line(f"p{p}", r, context + r * (accepted + 1), accepted=accepted)
            for p in range(prompts)
            for r in range(rounds)
        )
        (folder / "trace.jsonl").write_text("\n".join(lines) + "\n")

    return make


def _profile_of(size: int):
    """The default profile padded to `size` bytes with notes (a valid profile of that size)."""

    def make(folder: Path) -> None:
        raw = json.loads((DATA / "default_profile.json").read_text())
        text = json.dumps(raw)
        raw["notes"] = list(raw.get("notes", [])) + ["padding " + "x" * (size - len(text) - 20)]
        text = json.dumps(raw)
        text = text[:-1] + " " * (size - len(text)) + text[-1]
        (folder / "profile.json").write_text(text)

    return make


def _prompts_file_of(size: int):
    def make(folder: Path) -> None:
        template = '{{"question_id": {}, "category": "writing", "turns": ["{}"]}}\n'
        lines, used, number = [], 0, 0
        while True:
            line = template.format(number, "Write a short poem about the sea. " * 8)
            if used + len(line) > size:
                break
            lines.append(line)
            used += len(line)
            number += 1
        (folder / "question.jsonl").write_text("".join(lines) + "\n" * (size - used))

    return make


def cases() -> list[Case]:
    sim = ["-m", "sim", "--acceptance", "0.6"]
    small = ["--schedule", "deferred", "--head", "dense"]
    operations = f"model operations per command <= {MAX_RUN_OPERATIONS:,}"
    max_new = LIMITS["max_new_tokens"]
    mib = MAX_INPUT_BYTES // 2**20
    return [
        Case("K at its limit", f"K <= {LIMITS['K']}", "accepted", [*sim, "--K", str(LIMITS["K"])]),
        Case("K beyond", f"K <= {LIMITS['K']}", "refused", [*sim, "--K", str(LIMITS["K"] + 1)]),
        Case(
            "prompts at their limit",
            f"prompts <= {LIMITS['prompts']:,}",
            "accepted",
            [*sim, *small, "--no-ceiling", "--prompts", str(LIMITS["prompts"]), "--max-new-tokens", "20"],
        ),
        Case(
            "prompts beyond",
            f"prompts <= {LIMITS['prompts']:,}",
            "refused",
            [*sim, *small, "--prompts", str(LIMITS["prompts"] + 1), "--max-new-tokens", "2"],
        ),
        Case(
            "max-new-tokens at its limit",
            f"max-new-tokens <= {max_new:,}",
            "accepted",
            [
                *sim,
                *small,
                "--no-ceiling",
                "--prompts",
                str(MAX_DECODE_TOKENS // max_new),
                "--max-new-tokens",
                str(max_new),
            ],
        ),
        Case(
            "max-new-tokens beyond",
            f"max-new-tokens <= {max_new:,}",
            "refused",
            [*sim, *small, "--prompts", "1", "--max-new-tokens", str(max_new + 1)],
        ),
        Case(
            "decode tokens of one configuration at the limit",
            f"prompts x max-new-tokens <= {MAX_DECODE_TOKENS:,}",
            "accepted",
            [*sim, *small, "--no-ceiling", "--prompts", str(MAX_DECODE_TOKENS // 1000), "--max-new-tokens", "1000"],
        ),
        Case(
            "decode tokens of one configuration beyond",
            f"prompts x max-new-tokens <= {MAX_DECODE_TOKENS:,}",
            "refused",
            [*sim, *small, "--prompts", str(MAX_DECODE_TOKENS // 1000 + 1), "--max-new-tokens", "1000"],
        ),
        Case(
            "every schedule x head with ceilings at K=6, a=0.6, at the run's limit",
            operations,
            "accepted",
            [*sim, "--prompts", "280", "--max-new-tokens", "64"],
        ),
        Case(
            "the same with every draft token rejected (a=0)",
            operations,
            "accepted",
            ["-m", "sim", "--acceptance", "0", "--prompts", "280", "--max-new-tokens", "64"],
        ),
        Case(
            "every schedule x head with ceilings, one prompt more",
            operations,
            "refused",
            [*sim, "--prompts", "281", "--max-new-tokens", "64"],
        ),
        Case(
            "K=64 with every draft token rejected, with the ceiling, at the run's limit",
            operations,
            "accepted",
            ["-m", "sim", "--acceptance", "0", "--K", "64", *small, "--prompts", "242", "--max-new-tokens", "64"],
        ),
        Case(
            "K=64 with every draft token rejected, one prompt more",
            operations,
            "refused",
            ["-m", "sim", "--acceptance", "0", "--K", "64", *small, "--prompts", "243", "--max-new-tokens", "64"],
        ),
        Case(
            "a sweep K=1..8 of every schedule x head, at the run's limit",
            operations,
            "accepted",
            [*sim, "--sweep", "K=1,2,3,4,5,6,7,8", "--prompts", "38"],
        ),
        Case(
            "the same sweep, one prompt more",
            operations,
            "refused",
            [*sim, "--sweep", "K=1,2,3,4,5,6,7,8", "--prompts", "39"],
        ),
        Case(
            "prompt-len at its limit",
            f"prompt-len <= {LIMITS['prompt_len']:,}",
            "accepted",
            [*sim, "--prompt-len", str(LIMITS["prompt_len"])],
        ),
        Case(
            "prompt-len beyond",
            f"prompt-len <= {LIMITS['prompt_len']:,}",
            "refused",
            [*sim, "--prompt-len", str(LIMITS["prompt_len"] + 1)],
        ),
        Case(
            "probes at the clusters", "probes <= the profile's clusters (9,496)", "accepted", [*sim, "--probes", "9496"]
        ),
        Case("probes beyond", "probes <= the profile's clusters (9,496)", "refused", [*sim, "--probes", "9497"]),
        Case(
            "a what-if factor at its limit",
            "what-if values and factors <= 1e6",
            "accepted",
            [*sim, "--what-if", "draft.body_ms*=1000000"],
        ),
        Case(
            "a what-if factor beyond",
            "what-if values and factors <= 1e6",
            "refused",
            [*sim, "--what-if", "draft.body_ms*=1000001"],
        ),
        Case(
            f"a trace of {mib} MiB (the input size limit)",
            f"input files <= {mib} MiB",
            "accepted",
            ["-m", "sim", "--trace", "{dir}/trace.jsonl", *small, "--no-ceiling"],
            lambda folder: _filled_trace(folder / "trace.jsonl", MAX_INPUT_BYTES),
        ),
        Case(
            f"a trace of {mib} MiB + 1 byte",
            f"input files <= {mib} MiB",
            "refused",
            ["-m", "sim", "--trace", "{dir}/trace.jsonl"],
            lambda folder: _filled_trace(folder / "trace.jsonl", MAX_INPUT_BYTES + 1),
        ),
        Case(
            "a trace over the decode tokens of one configuration",
            f"prompts x max-new-tokens <= {MAX_DECODE_TOKENS:,}, from a trace too",
            "refused",
            ["-m", "sim", "--trace", "{dir}/trace.jsonl"],
            _trace_of(prompts=200, rounds=150, accepted=6),
        ),
        Case(
            "a trace with a context of 1e11",
            f"prompt-len <= {LIMITS['prompt_len']:,}, from a trace too",
            "refused",
            ["-m", "sim", "--trace", "{dir}/trace.jsonl"],
            _trace_of(prompts=1, rounds=4, context=10**11),
        ),
        Case(
            f"a profile of {mib} MiB",
            f"input files <= {mib} MiB",
            "accepted",
            [*sim, *small, "--profile", "{dir}/profile.json"],
            _profile_of(MAX_INPUT_BYTES),
        ),
        Case(
            f"a profile of {mib} MiB + 1 byte",
            f"input files <= {mib} MiB",
            "refused",
            [*sim, *small, "--profile", "{dir}/profile.json"],
            _profile_of(MAX_INPUT_BYTES + 1),
        ),
        Case(
            f"model: a prompts file of {mib} MiB",
            f"input files <= {mib} MiB",
            "accepted",
            [
                "-m",
                "model",
                "--placement",
                "cpu",
                "--prompts-file",
                "{dir}/question.jsonl",
                "--prompts",
                "first:1",
                "--max-new-tokens",
                "8",
                "--schedule",
                "baseline",
            ],
            _prompts_file_of(MAX_INPUT_BYTES),
            needs_torch=True,
        ),
        Case(
            f"model: a prompts file of {mib} MiB + 1 byte",
            f"input files <= {mib} MiB",
            "refused",
            ["-m", "model", "--placement", "cpu", "--prompts-file", "{dir}/question.jsonl"],
            _prompts_file_of(MAX_INPUT_BYTES + 1),
            needs_torch=True,
        ),
        Case(
            "model: max-new-tokens 1e9",
            "a cache within the model's maximum positions (40,960 for tiny-qwen3)",
            "refused",
            ["-m", "model", "--placement", "cpu", "--max-new-tokens", "1000000000"],
            needs_torch=True,
        ),
        Case(
            "model: the 32B preset on this host",
            "the weights fit the free device or host memory",
            "refused",
            ["-m", "model", "--placement", "cpu", "--target", "qwen3-32b", "--draft", "qwen3-0.6b"],
            needs_torch=True,
        ),
        Case(
            "measure: contexts 1e8",
            "contexts within the model's maximum positions",
            "refused",
            [
                "-m",
                "measure",
                "--target",
                "tiny-qwen3",
                "--draft",
                "tiny-qwen3-draft",
                "--placement",
                "cpu",
                "--contexts",
                "100000000",
                "--out",
                "{dir}/p.json",
            ],
            needs_torch=True,
        ),
    ]


def run_case(case: Case, folder: Path, timeout: float) -> dict:
    """The case run in a fresh Python process: its exit code, last error line, wall time and peak RSS."""
    if case.files is not None:
        case.files(folder)
    argv = [arg.replace("{dir}", str(folder)) for arg in case.command]
    peak = folder / "peak_kib"
    load = os.getloadavg()[0]
    with open(folder / "stdout", "wb") as out, open(folder / "stderr", "wb") as err:
        start = time.perf_counter()
        child = subprocess.Popen(
            [sys.executable, "-c", WRAPPER, str(peak), *argv], cwd=ROOT, stdout=out, stderr=err, start_new_session=True
        )
        timed_out = False
        while True:
            pid, status, _ = os.wait4(child.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() - start > timeout:
                os.killpg(child.pid, signal.SIGKILL)
                timed_out = True
            time.sleep(0.02)
        wall = time.perf_counter() - start
    child.returncode = os.waitstatus_to_exitcode(status)  # reaped by wait4: Popen must not wait again
    errors = (folder / "stderr").read_text(errors="replace").splitlines()
    outcome = "accepted" if child.returncode == 0 else "refused" if child.returncode == 2 else "failed"
    return {
        "command": "python " + shlex.join(a.replace(str(folder), "DIR") for a in argv),
        "exit_code": child.returncode,
        "outcome": "timed out" if timed_out else outcome,
        "message": next((line for line in reversed(errors) if line.startswith("error:")), ""),
        "stderr_lines": len(errors),
        "wall_s": round(wall, 2),
        "load_average": round(load, 1),  # the 1-minute load when the case started: others sharing the cores
        "peak_rss_mib": round(int(peak.read_text()) / 1024, 1) if peak.exists() else None,
        "input_bytes": sum(
            p.stat().st_size for p in folder.iterdir() if p.name not in ("stdout", "stderr", "peak_kib")
        ),
    }


def report(results: list[dict], header: dict) -> str:
    lines = [
        "# The documented limits, measured",
        "",
        f"`{header['command']}` at commit `{header['commit']}`, {header['machine']}, Python "
        f"{header['python']}, {header['date']}. Each case is its own process; peak RSS is that process's "
        "maximum resident memory (Python, SimPy and, for model/measure, torch included). Every input is "
        "checked before any work, so a refused case costs only the start-up and the check. `load` is the "
        "machine's 1-minute load average when the case started: above the core count, other processes shared "
        "the cores and the wall time is longer than on an idle machine.",
        "",
        "| case | limit | expected | outcome | exit | wall s | load | peak RSS MiB | message |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        message = r.get("message", "").replace("|", "\\|")
        lines.append(
            f"| {r['name']} | {r['limit']} | {r['expect']} | {r['outcome']} | {r.get('exit_code', '-')} | "
            f"{r.get('wall_s', '-')} | {r.get('load_average', '-')} | {r.get('peak_rss_mib', '-')} | {message} |"
        )
    lines += ["", "Commands (DIR: the case's temporary folder with its generated input):", ""]
    lines += [f"- {r['name']}: `{r.get('command', '-')}`" for r in results]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = OneLineParser(
        prog="python -m sim.limits", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", required=True, help="folder for report.md and limits.json")
    parser.add_argument("--only", default=None, help="run only the cases whose name contains this text")
    parser.add_argument("--timeout", type=float, default=900, help="seconds before a case is stopped (default 900)")
    args = parser.parse_args(argv)
    return run_command(lambda: _run(args, argv))


def _run(args, argv) -> int:
    if not 0 < args.timeout < math.inf:
        raise UsageError(f"--timeout must be a positive number of seconds, got {args.timeout}")
    check_output_folder(Path(args.out), "--out")
    chosen = [c for c in cases() if args.only is None or args.only in c.name]
    if not chosen:
        names = ", ".join(repr(c.name) for c in cases())
        raise UsageError(f"--only {args.only!r} is in no case's name; valid: text from one of {names}")
    torch = importlib.util.find_spec("torch") is not None
    results = []
    with Progress(len(chosen), "limits", "case") as progress:
        for case in chosen:
            progress.note(case.name)
            entry = {"name": case.name, "limit": case.limit, "expect": case.expect}
            if case.needs_torch and not torch:
                entry["outcome"] = "skipped (torch not installed)"
            else:
                with tempfile.TemporaryDirectory(prefix="limits-") as folder:
                    entry.update(run_case(case, Path(folder), args.timeout))
            results.append(entry)
            progress.update()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    header = {
        "command": "python -m sim.limits " + shlex.join(sys.argv[1:] if argv is None else argv),
        "commit": commit.stdout.strip() or "unknown",
        "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores",
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    with staged(Path(args.out), merge=True) as folder:
        write_atomic(folder / "limits.json", json.dumps({**header, "cases": results}, indent=2) + "\n")
        write_atomic(folder / "report.md", report(results, header))
    unexpected = [r["name"] for r in results if not r["outcome"].startswith(("skipped", r["expect"]))]
    for r in results:
        peak = r.get("peak_rss_mib") or "-"  # none for a skipped case, or one stopped before it could say
        print(f"{r['outcome']:>9}  {r.get('wall_s', '-'):>7} s  {peak:>7} MiB  {r['name']}")
    print(f"wrote {Path(args.out) / 'report.md'} and limits.json")
    if unexpected:
        print(f"error: not as the limits say: {', '.join(unexpected)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
