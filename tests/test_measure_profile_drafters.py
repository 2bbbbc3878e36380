"""python -m measure.profile_drafters on the CPU: prompt lookup timed into every regime of a profile that
`python -m measure` wrote, the early-exit drafter copied from the draft only where the draft is the
target's first layers."""

import json

import pytest

from measure import profile_drafters
from measure.__main__ import main as measure_main


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    """Profiles of tiny-qwen3 as `python -m measure` writes them, by draft name."""

    def profile(draft: str):
        out = tmp_path_factory.mktemp("profile") / "profile.json"
        argv = [
            *("--target", "tiny-qwen3", "--draft", draft, "--placement", "cpu", "--contexts", "16,32"),
            *("--prompt-lengths", "8", "--K-max", "2", "--reps", "1", "--warmup", "0", "--probes", "1"),
            *("--prompts", "per-category:1", "--agreement-max-len", "8", "--out", str(out)),
        ]
        assert measure_main(argv) == 0
        return out

    return profile


def test_lookup_is_timed_into_every_regime_and_the_early_exit_copied_from_the_draft(measured, tmp_path):
    source, out = measured("tiny-qwen3#layers=1"), tmp_path / "with_drafters.json"
    before_text = source.read_text()
    argv = ["--profile", str(source), "--out", str(out), "--early-exit-from-draft", "--reps", "2"]
    assert profile_drafters.main(argv) == 0
    written, before = json.loads(out.read_text()), json.loads(before_text)
    for name, regime in written["regimes"].items():
        draft = regime["draft"]
        assert [point["context"] for point in draft["lookup_ms"]["points"]] == [16, 32]
        assert all(point["median_ms"] > 0 and point["n"] == 2 for point in draft["lookup_ms"]["points"])
        assert draft["early_exit_body_ms"] == before["regimes"][name]["draft"]["body_ms"]
        assert draft["early_exit_head_ms"] == before["regimes"][name]["draft"]["head_dense_ms"]
    assert source.read_text() == before_text  # the source profile is left as it was
    assert "timed by python -m measure.profile_drafters (n-gram 2, 2 reps)" in written["notes"][-1]


def test_a_profile_written_before_the_restructure_names_its_proposals_k_max(measured, tmp_path):
    old = json.loads(measured("tiny-qwen3#layers=1").read_text())
    old["setup"]["k_max"] = old["setup"].pop("K_max")
    source, out = tmp_path / "old.json", tmp_path / "with_drafters.json"
    source.write_text(json.dumps(old))
    assert profile_drafters.main(["--profile", str(source), "--out", str(out), "--reps", "1"]) == 0
    del old["setup"]["k_max"]
    source.write_text(json.dumps(old))
    assert profile_drafters.main(["--profile", str(source), "--out", str(tmp_path / "none.json")]) == 2


def test_a_draft_that_is_not_the_targets_first_layers_is_refused_in_one_line(measured, tmp_path, capsys):
    source, out = measured("tiny-qwen3-draft"), tmp_path / "with_drafters.json"
    capsys.readouterr()  # what measure printed
    assert profile_drafters.main(["--profile", str(source), "--out", str(out), "--early-exit-from-draft"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "is not its target's first layers (tiny-qwen3#layers=L)" in err[0]
    assert not out.exists()
