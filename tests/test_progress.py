"""Progress shows on a terminal and stays out of logs: the shared helper (contracts.progress), and the
simulator's command line run once with stderr on a pseudo-terminal and once on a pipe."""

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from contracts.progress import Progress

ROOT = Path(__file__).resolve().parent.parent
SMALL_RUN = ["--acceptance", "0.6", "--prompts", "2", "--max-new-tokens", "32", "--schedule", "deferred"]


class Terminal(io.StringIO):
    """A stream that says it is a terminal."""

    def isatty(self):
        return True


def _count_to(stream, total=5, **kwargs) -> str:
    with Progress(total, "counting", "step", stream=stream, **kwargs) as progress:
        for step in range(total):
            progress.note(f"step {step}")
            progress.update()
    return stream.getvalue()


def test_silent_when_the_stream_is_not_a_terminal():
    assert _count_to(io.StringIO()) == ""


def test_drawn_when_the_stream_is_a_terminal():
    text = _count_to(Terminal())
    assert "counting: 0/5 step" in text and "counting: 5/5 step  100%" in text
    assert text.endswith("\r") and text.rstrip("\r").endswith(" "), "the line is erased at the end"


@pytest.mark.parametrize(("stream", "shown", "drawn"), [(io.StringIO(), True, True), (Terminal(), False, False)])
def test_the_decision_can_be_forced(stream, shown, drawn):
    assert bool(_count_to(stream, shown=shown)) == drawn


def test_the_line_says_how_far_and_how_long():
    progress = Progress(200, "simulating", "tok", stream=io.StringIO())
    progress.update(50)
    progress.note("deferred dense")
    line = progress.line()
    assert line.startswith("simulating: 50/200 tok  25%")
    assert "elapsed" in line and "left" in line and line.endswith("deferred dense")


def _sim_stderr(on_terminal: bool) -> tuple[int, bytes, bytes]:
    """(exit code, stdout, stderr) of a small simulator run whose stderr is a pseudo-terminal or a pipe."""
    command = [sys.executable, "-m", "sim", *SMALL_RUN]
    if not on_terminal:
        done = subprocess.run(command, cwd=ROOT, capture_output=True, timeout=120)
        return done.returncode, done.stdout, done.stderr
    leader, follower = os.openpty()
    child = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=follower)
    os.close(follower)
    received = b""
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # the terminal is closed once the child has exited
            break
        if not chunk:
            break
        received += chunk
    os.close(leader)
    stdout = child.stdout.read()
    child.stdout.close()
    return child.wait(timeout=120), stdout, received


def test_the_simulator_shows_progress_on_a_terminal_only():
    code, stdout, stderr = _sim_stderr(on_terminal=True)
    assert code == 0 and b"simulating: " in stderr and b" tok " in stderr
    assert b"simulating" not in stdout
    code, piped_stdout, piped_stderr = _sim_stderr(on_terminal=False)
    assert code == 0 and piped_stderr == b""
    assert piped_stdout == stdout, "the results are the same either way"


def test_each_yields_every_item_in_order_and_stays_quiet_off_a_terminal(capsys):
    from contracts.progress import each

    assert list(each(["a", "b", "c"], "items", "item")) == ["a", "b", "c"]
    assert capsys.readouterr().err == ""
