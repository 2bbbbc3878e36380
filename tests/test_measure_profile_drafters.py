"""python -m measure.profile_drafters on the CPU: prompt lookup timed into every regime of a profile, the
early-exit drafter copied from the draft only where the draft is the target's first layers."""

import json

from measure import profile_drafters
from tests.sim_fixtures import tiny_profile


def _profile(tmp_path, draft: str):
    profile = tiny_profile("cpu")
    profile["setup"].update(
        target={"name": "tiny-qwen3", "weights": "synthetic"},
        draft={"name": draft, "weights": "synthetic"},
        context_lengths=[16, 32],
        k_max=2,
    )
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(profile))
    return path


def test_lookup_is_timed_into_every_regime_and_the_early_exit_copied_from_the_draft(tmp_path):
    source, out = _profile(tmp_path, "tiny-qwen3#layers=1"), tmp_path / "with_drafters.json"
    argv = ["--profile", str(source), "--out", str(out), "--early-exit-from-draft", "--reps", "2"]
    assert profile_drafters.main(argv) == 0
    written, before = json.loads(out.read_text()), json.loads(source.read_text())
    for name, regime in written["regimes"].items():
        draft = regime["draft"]
        assert [point["context"] for point in draft["lookup_ms"]["points"]] == [16, 32]
        assert all(point["median_ms"] > 0 and point["n"] == 2 for point in draft["lookup_ms"]["points"])
        assert draft["early_exit_body_ms"] == before["regimes"][name]["draft"]["body_ms"]
        assert draft["early_exit_head_ms"] == before["regimes"][name]["draft"]["head_dense_ms"]
    assert "lookup_ms" not in before["regimes"]["eager"]["draft"]  # the source profile is left as it was
    assert "timed by python -m measure.profile_drafters (n-gram 2, 2 reps)" in written["notes"][-1]


def test_a_draft_that_is_not_the_targets_first_layers_is_refused_in_one_line(tmp_path, capsys):
    out = tmp_path / "with_drafters.json"
    argv = ["--profile", str(_profile(tmp_path, "tiny-qwen3-draft")), "--out", str(out), "--early-exit-from-draft"]
    assert profile_drafters.main(argv) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "is not its target's first layers (tiny-qwen3#layers=L)" in err[0]
    assert not out.exists()
