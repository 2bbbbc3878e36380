"""The simulator's maintenance commands (sim.derive_study, sim.derive_default, sim.study_replay, sim.bench): their
shipped outputs are what they derive today, and bad input gets one line and exit 2 before anything is written."""

import importlib
from pathlib import Path

import pytest

from sim.derive_study import DATA

TOOLS = {
    "sim.derive_study": ["--out-dir", "{out}"],
    "sim.derive_default": ["--out", "{out}/default_profile.json"],
    "sim.study_replay": ["--out", "{out}/study_replay.md"],
    "sim.bench": ["--out", "{out}/bench.md"],
}


def test_the_shipped_study_and_default_profiles_are_what_the_derivations_write(tmp_path):
    assert importlib.import_module("sim.derive_study").main(["--out-dir", str(tmp_path)]) == 0
    for name in ("study_trace.jsonl", "study_profile.json"):
        assert (tmp_path / name).read_bytes() == (DATA / name).read_bytes(), name
    assert importlib.import_module("sim.derive_default").main(["--out", str(tmp_path / "default.json")]) == 0
    assert (tmp_path / "default.json").read_bytes() == (DATA / "default_profile.json").read_bytes()


@pytest.mark.parametrize("tool", TOOLS)
def test_an_unknown_option_is_one_line_and_exit_2(tool, capsys):
    assert importlib.import_module(tool).main(["--bogus"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"error: unrecognized arguments: --bogus (see python -m {tool} --help)"
    ]


@pytest.mark.parametrize("tool", TOOLS)
def test_an_output_no_one_can_write_is_refused_before_the_work(tool, tmp_path, capsys):
    if not Path("/proc/self").is_dir():
        pytest.skip("needs /proc (Linux), where no one may make folders")
    argv = [arg.replace("{out}", "/proc/specloop") for arg in TOOLS[tool]]
    assert importlib.import_module(tool).main(argv) == 2
    captured = capsys.readouterr()
    assert captured.err.splitlines() == [
        f"error: {argv[0]} {argv[1]}: /proc is not writable (No such file or directory)"
    ]
    assert captured.out == ""


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--timeout", "0"], "error: --timeout must be a positive number of seconds, got 0.0"),
        (["--timeout", "nan"], "error: --timeout must be a positive number of seconds, got nan"),
        (["--only", "nothing"], "error: --only 'nothing' is in no case's name; valid: text from one of 'K at its"),
    ],
)
def test_limits_refuses_a_timeout_or_selection_that_runs_nothing(argv, message, tmp_path, capsys):
    assert importlib.import_module("sim.limits").main(["--out", str(tmp_path / "limits"), *argv]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(message), err
    assert not (tmp_path / "limits").exists()


def test_limits_reports_a_case_stopped_before_it_could_measure_itself(tmp_path, capsys):
    """A case killed at its timeout has no peak memory: it is reported, not a crash."""
    out = tmp_path / "limits"
    limits = importlib.import_module("sim.limits")
    assert limits.main(["--out", str(out), "--only", "K beyond", "--timeout", "0.01"]) == 1
    assert "timed out" in capsys.readouterr().out
    assert (out / "report.md").is_file() and (out / "limits.json").is_file()
