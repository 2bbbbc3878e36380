"""An interrupted command cleans up its staged output and says so in one line (130 for SIGINT, 143 for
SIGTERM); a bad input file is named as the input it is. (The options the audit found unchecked are cases
of tests/test_bad_inputs.py.)"""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from contracts.cli import run_command
from measure import profile_heads

ROOT = Path(__file__).resolve().parent.parent

# Stages a folder, says it is ready, then sleeps until a signal ends it.
STAGING_COMMAND = """
import signal, sys, time
from contracts.cli import run_command
from contracts.files import staged
signal.signal(signal.SIGINT, signal.default_int_handler)  # a shell's background job starts with SIGINT ignored

def body():
    with staged(sys.argv[1]) as folder:
        (folder / "part.json").write_text("{}")
        print("ready", flush=True)
        time.sleep(60)

sys.exit(run_command(body))
"""


@pytest.mark.parametrize("signum,code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_an_interrupt_removes_the_staged_folder_in_one_line(tmp_path, signum, code):
    out = tmp_path / "out"
    child = subprocess.Popen(
        [sys.executable, "-c", STAGING_COMMAND, str(out)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout.readline() == "ready\n"
        child.send_signal(signum)
        _, err = child.communicate(timeout=30)
    finally:
        child.kill()
    assert child.returncode == code, err
    assert err == f"error: interrupted ({signal.Signals(signum).name})\n"
    assert list(tmp_path.iterdir()) == [], "the staged folder was left behind"


def test_sigterm_ends_the_body_and_the_earlier_handler_is_back(capsys):
    def earlier(signum, frame):
        pass

    previous = signal.signal(signal.SIGTERM, earlier)
    try:
        assert run_command(lambda: os.kill(os.getpid(), signal.SIGTERM)) == 143
        assert signal.getsignal(signal.SIGTERM) is earlier
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert capsys.readouterr().err == "error: interrupted (SIGTERM)\n"


def _cost_record(median_ms) -> dict:
    """A python -m measure.head_cost record of the dense head alone."""
    timing = {"median_ms": median_ms, "p10_ms": 0.1, "p90_ms": 0.1, "n": 20, "host_ms": 0.0}
    return {"rows": [{"head": "dense", "budget": None, "in_graph": timing, "draft_step": timing}]}


def test_a_bad_cost_file_is_named_as_the_input_it_is(tmp_path, capsys):
    """measure.profile_heads names the --cost file it read, not the profile it would write."""
    cost = tmp_path / "cost.json"
    cost.write_text(json.dumps(_cost_record("fast")))
    out = tmp_path / "out" / "p.json"
    argv = ["--profile", str(ROOT / "sim/data/default_profile.json"), "--cost", str(cost), "--out", str(out)]
    assert profile_heads.main(argv) == 2
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1, captured.err
    assert captured.err.startswith(f"error: --cost {cost}: heads.cost.kinds.dense[0].median_ms")
    assert captured.out == "" and not out.parent.exists()
