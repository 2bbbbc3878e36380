"""python -m measure.host_noise: the CPU's steadiness on a fixed GEMV, chunk by chunk, and its refusals."""

import json

import pytest

from measure import host_noise


def test_the_summary_reads_the_chunks_medians():
    medians = [4.0, 6.0, 3.0, 5.0, 4.5, 3.5, 7.0, 4.0, 3.8, 6.2]
    stats = host_noise.summary(medians)
    assert stats["n"] == 10
    assert stats["median_ms"] == pytest.approx(4.25)
    assert stats["p10_ms"] == pytest.approx(3.45) and stats["p90_ms"] == pytest.approx(6.28)  # as timing.spread
    assert stats["slowest_over_fastest"] == pytest.approx(7.0 / 3.0)
    mean = sum(medians) / len(medians)
    sd = (sum((m - mean) ** 2 for m in medians) / len(medians)) ** 0.5
    assert stats["sd_over_median"] == pytest.approx(sd / 4.25)


def test_a_short_run_writes_its_chunks_and_their_summary(tmp_path, capsys):
    out = tmp_path / "checks" / "noise.json"
    assert host_noise.main(["--seconds", "0.2", "--threads", "1", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    medians = result["chunk_medians_ms"]
    assert medians and all(m > 0 for m in medians)
    assert result["summary"] == host_noise.summary(medians)
    assert result["env"]["threads"] == 1 and "cores" in result["env"]["cpu"]
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].startswith(f"{host_noise.COMMAND} on ") and f"{len(medians)} chunks" in printed[0]
    assert printed[-1] == f"wrote {out}"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--seconds", "0"], "--seconds must be more than 0 and at most 3600, got 0.0"),
        (["--seconds", "nan"], "--seconds must be more than 0 and at most 3600, got nan"),
        (["--seconds", "3601"], "--seconds must be more than 0 and at most 3600, got 3601.0"),
        (["--threads", "0"], "--threads must be from 1 to this host's"),
    ],
)
def test_bad_values_are_one_line_and_exit_2_before_any_work(argv, message, tmp_path, capsys):
    out = tmp_path / "noise.json"
    assert host_noise.main([*argv, "--out", str(out)]) == 2
    captured = capsys.readouterr()
    assert len(captured.err.splitlines()) == 1 and captured.err.startswith(f"error: {message}")
    assert captured.out == "" and list(tmp_path.iterdir()) == []


def test_an_existing_folder_as_out_is_refused(tmp_path, capsys):
    assert host_noise.main(["--seconds", "0.1", "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"error: --out {tmp_path} is a folder; give the name of the JSON file to write"
    ]
