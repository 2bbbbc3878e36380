"""An interrupted command cleans up its staged output and says so in one line (130 for SIGINT, 143 for
SIGTERM); options the audit found unchecked are refused in one line, exit 2, before any work."""

import contextlib
import importlib
import io
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from contracts.cli import run_command

ROOT = Path(__file__).resolve().parent.parent
TINY = ["--target", "tiny-qwen3", "--draft", "tiny-qwen3-draft", "--placement", "cpu"]

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


CASES = [
    (
        "validate.__main__",
        [*TINY, "--n-prompts", "1", "--max-new-tokens", "8", "--K", "2", "--measure"]
        + ["--measure-args", '"unterminated', "--out", "{out}"],
        "--measure-args '\"unterminated': No closing quotation",
    ),
    (
        "measure.__main__",
        [*TINY, "--reps", "100000000", "--out", "{out}/p.json"],
        "--reps must be 1 to 1000, got 100000000",
    ),
    ("measure.__main__", [*TINY, "--warmup", "101", "--out", "{out}/p.json"], "--warmup must be 0 to 100, got 101"),
    (
        "measure.profile_heads",
        ["--profile", str(ROOT / "sim/data/default_profile.json"), "--cost", "{cost}", "--out", "{out}/p.json"],
        "--cost {cost}: heads.cost.kinds.dense[0].median_ms",
    ),
    (
        "model.__main__",
        ["--placement", "cpu", "--early-exit-layers", "-3", "--out", "{out}"],
        "--early-exit-layers must be >= 1",
    ),
    (
        "model.__main__",
        ["--placement", "cpu", "--lookup-ngram", "0", "--out", "{out}"],
        "--lookup-ngram must be >= 1, got 0",
    ),
]


@pytest.mark.parametrize("module,argv,message", CASES, ids=[f"{m}-{i}" for i, (m, _, _) in enumerate(CASES)])
def test_a_bad_option_is_refused_in_one_line(tmp_path, monkeypatch, module, argv, message):
    cost = tmp_path / "cost.json"
    cost.write_text(json.dumps(_cost_record("fast")))
    monkeypatch.chdir(tmp_path)
    names = {"{out}": str(tmp_path / "out"), "{cost}": str(cost)}
    for name, value in names.items():
        argv = [a.replace(name, value) for a in argv]
        message = message.replace(name, value)
    main = importlib.import_module(module).main
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    assert code == 2, err.getvalue()
    assert err.getvalue().count("\n") == 1 and err.getvalue().startswith("error: "), err.getvalue()
    assert message in err.getvalue()
    assert out.getvalue() == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cost.json"], "the command wrote files"
