"""`python -m sim` from the outside: defaults, what-ifs, sweeps, files, and bad input."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sim.__main__ import main
from tests.sim_fixtures import tiny_profile, trace_lines, write


@pytest.mark.parametrize("argv,label", [([], "SYNTHETIC"), (["--profile", "study"], "study-derived")])
def test_default_run_compares_every_schedule_and_head(capsys, argv, label):
    assert main(argv) == 0
    out = capsys.readouterr().out
    for schedule in ("baseline", "ordinary", "pipelined", "deferred", "pipelined-deferred"):
        assert schedule in out
    assert out.count("flashhead") >= 4 and label in out


def test_what_if_shows_base_and_change_side_by_side(tmp_path, capsys):
    out_dir = tmp_path / "out"
    assert main(["--schedule", "deferred", "--what-if", "draft.body_ms*=0.5", "--out", str(out_dir)]) == 0
    out = capsys.readouterr().out
    assert "what-if: draft.body_ms*=0.5" in out and "delta %" in out
    payload = json.loads((out_dir / "results.json").read_text())
    base = [r for r in payload["rows"] if r["label"] == "base" and r["schedule"] == "deferred"]
    changed = [r for r in payload["rows"] if r["label"] == "what-if" and r["schedule"] == "deferred"]
    assert len(base) == len(changed) == 2
    assert all(c["decode_tok_s"] > b["decode_tok_s"] for b, c in zip(base, changed))


def test_probes_what_if_uses_agreement_when_profile_has_it(tmp_path, capsys):
    profile = tiny_profile()
    profile["flashhead"]["agreement"] = {
        "source": "test",
        "synthetic": False,
        "probes": [1, 4, 16],
        "r": [0.5, 0.9, 0.99],
        "n": 100,
    }
    (path,) = write(tmp_path, profile)
    assert (
        main(
            [
                "--profile",
                str(path),
                "--acceptance",
                "0.7",
                "--head",
                "flashhead",
                "--prompts",
                "20",
                "--what-if",
                "probes=1",
                "--out",
                str(tmp_path / "out"),
            ]
        )
        == 0
    )
    assert "scaled by agreement r(1)=0.5000 against r=0.9000" in capsys.readouterr().out
    rows = json.loads((tmp_path / "out" / "results.json").read_text())["rows"]
    for schedule in ("ordinary", "deferred"):
        base, changed = (
            next(r for r in rows if r["label"] == label and r["schedule"] == schedule) for label in ("base", "what-if")
        )

        # i.i.d. per-token acceptance a gives accepted/proposed = (a + a^2 + ... + a^K) / K;
        # fewer probes scale the per-token rate by r(1) / r(4) = 0.5 / 0.9.
        def closed_form(a):
            return sum(a**j for j in range(1, 7)) / 6

        assert base["acceptance"] == pytest.approx(closed_form(0.7), rel=0.1)
        assert changed["acceptance"] == pytest.approx(closed_form(0.7 * 0.5 / 0.9), rel=0.1)


def test_agreement_measured_on_synthetic_weights_is_ignored(tmp_path, capsys):
    profile = tiny_profile()
    profile["flashhead"]["agreement"] = {
        "source": "test",
        "synthetic": True,
        "probes": [1, 4],
        "r": [0.01, 0.02],
        "n": 9,
    }
    (path,) = write(tmp_path, profile)
    assert main(["--profile", str(path), "--acceptance", "0.7", "--what-if", "probes=1", "--no-ceiling"]) == 0
    assert "agreement curve was measured on synthetic weights" in capsys.readouterr().out


def test_sweep_writes_csv_and_plots(tmp_path, capsys):
    out_dir = tmp_path / "sweep"
    assert (
        main(
            [
                "--sweep",
                "K=1,2,4",
                "--acceptance",
                "0.6",
                "--prompts",
                "2",
                "--no-ceiling",
                "--out",
                str(out_dir),
                "--plot",
            ]
        )
        == 0
    )
    csv_text = (out_dir / "results.csv").read_text()
    assert csv_text.count("\n") == 1 + 3 * 9
    for name in ("sweep.png", "phase_shares.png"):
        assert (out_dir / name).read_bytes()[:4] == b"\x89PNG"


BAD = [
    (["--what-if", "nonsense.path=3"], "unknown what-if key 'nonsense.path'"),
    (["--what-if", "probes=99999"], "exceeds the 9496 FlashHead clusters"),
    (["--K", "0"], "--K: must be in 1..64, got 0"),
    (["--K", "100000"], "--K: must be in 1..64"),
    (["--prompts", "1000000"], "--prompts: must be in 1..10,000"),
    (["--prompts", "10000", "--max-new-tokens", "30000"], "decode tokens one configuration may simulate"),
    (["--what-if", "draft.body_ms*=-1"], "must be a number in 0..1e+06"),
    (["--sweep", "K=2,4,0"], "sweep K: must be in 1..64, got 0"),
    (["--sweep", "K=2", "--sweep", "probes=2,4"], "--sweep: one sweep a command, got 2 (K=2, probes=2,4)"),
    (["--what-if", "probes=two"], "what-if probes: expected an integer"),
    (["--acceptance", "1.5"], "acceptance must be in [0, 1]"),
    (["--acceptance=-0.1,0.5"], "acceptance[0]: acceptance must be in [0, 1]"),
    (["--no-such-flag"], "unrecognized arguments"),
    (["--schedule", "fastest"], "--schedule: 'fastest' is unknown"),
    (["--plot"], "--plot writes PNG files and needs --out"),
    (["--profile", "study", "--graphs", "on"], "carries only eager"),
    (["--what-if", "K*=2"], "use K=value"),
]


@pytest.mark.parametrize("argv,message", BAD)
def test_bad_input_one_line_exit_2_no_output(tmp_path, capsys, argv, message):
    """Checked before anything runs: nothing on stdout, one line on stderr, no output folder."""
    out_dir = tmp_path / "never"
    assert main(argv + (["--out", str(out_dir)] if "--plot" not in argv else [])) == 2
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1 and captured.err.startswith("error: ") and message in captured.err
    assert captured.out == "" and not out_dir.exists()


def test_output_path_problems_are_found_before_the_run(tmp_path, capsys):
    a_file = tmp_path / "file"
    a_file.write_text("x")
    assert main(["--no-ceiling", "--out", str(a_file)]) == 2
    assert "exists and is not a folder" in capsys.readouterr().err
    assert main(["--no-ceiling", "--out", str(a_file / "below")]) == 2
    assert "is a file, not a folder" in capsys.readouterr().err
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        if not __import__("os").access(locked, __import__("os").W_OK):  # root can write anywhere
            assert main(["--no-ceiling", "--out", str(locked / "out")]) == 2
            captured = capsys.readouterr()
            assert "is not writable" in captured.err and captured.out == ""
    finally:
        locked.chmod(0o700)
    if Path("/proc/self").is_dir():  # a folder no one may make folders in, root included (Linux)
        assert main(["--no-ceiling", "--out", "/proc/specloop-out"]) == 2
        captured = capsys.readouterr()
        assert "/proc is not writable" in captured.err and captured.out == ""


def test_a_failed_write_leaves_nothing(tmp_path, monkeypatch, capsys):
    """A full disk while writing: no partial results in --out, no temporary files beside it."""
    import sim.__main__ as cli

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(cli, "write_outputs", full_disk)
    with pytest.raises(OSError):
        main(["--no-ceiling", "--schedule", "deferred", "--out", str(tmp_path / "out")])
    assert list(tmp_path.iterdir()) == []


def _bad_profile_cases(tmp_path):
    wrong_version = tiny_profile()
    wrong_version["schema"] = "flashspec.profile/9"
    negative = tiny_profile()
    negative["regimes"]["eager"]["draft"]["body_ms"]["median_ms"] = -1
    missing = tiny_profile()
    del missing["regimes"]["eager"]["host"]
    not_grid = tiny_profile()
    not_grid["regimes"]["eager"]["target"]["forward_ms"]["points"].append(
        {"n_tokens": 2, "context": 99, "median_ms": 1.0}
    )
    return [
        (wrong_version, "unknown profile schema"),
        (negative, "must not be negative"),
        (missing, "host: missing section"),
        (not_grid, "full grid"),
    ]


def test_malformed_profiles_and_traces(tmp_path, capsys):
    for i, (profile, message) in enumerate(_bad_profile_cases(tmp_path)):
        folder = tmp_path / str(i)
        folder.mkdir()
        (path,) = write(folder, profile)
        assert main(["--profile", str(path), "--out", str(folder / "out")]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1
        assert not (folder / "out").exists()
    (tmp_path / "garbage.json").write_text("{not json")
    assert main(["--profile", str(tmp_path / "garbage.json")]) == 2
    assert "not valid JSON" in capsys.readouterr().err
    lines = trace_lines([1, 2])
    lines[1]["accepted"] = 5
    (trace,) = write(tmp_path, lines=lines)
    assert main(["--trace", str(trace)]) == 2
    assert "accepted <= proposed <= K" in capsys.readouterr().err
    lines = trace_lines([1])
    lines[0]["schema"] = "flashspec.trace/0"
    (trace,) = write(tmp_path, lines=lines)
    assert main(["--trace", str(trace)]) == 2
    assert "unknown trace schema" in capsys.readouterr().err


def test_sim_never_imports_torch_or_the_other_parts():
    code = (
        "import sys, sim.__main__ as m; m.main(['--no-ceiling', '--schedule', 'deferred']);"
        "bad = [n for n in sys.modules if n.split('.')[0] in ('torch', 'model', 'measure', 'validate')];"
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)


def test_schedule_all_is_every_schedule(capsys):
    """--help gives `all` as --schedule's default, as python -m model and validate take it."""
    argv = ["--acceptance", "0.5", "--prompts", "1", "--max-new-tokens", "4", "--head", "dense", "--no-ceiling"]
    assert main([*argv, "--schedule", "all"]) == 0
    every = capsys.readouterr().out
    assert main(argv) == 0
    assert every == capsys.readouterr().out
