"""The simulator under speculative sampling: `--what-if temperature=T` takes each head's expected
acceptance beta from the profile's sampling curves, and refuses where the profile has none."""

import json

import pytest

from contracts import UsageError
from contracts.profile import check_profile
from sim.__main__ import main
from sim.profile import Profile
from tests.sim_fixtures import tiny_profile, write


def sampled_profile() -> dict:
    """tiny_profile (64 clusters) with beta curves at T = 0.7 (dense 0.6; FlashHead 0.3 at p=1, 0.5 at
    p=4) and at T = 1 (FlashHead only)."""
    profile = tiny_profile()
    profile["sampling"] = {
        "weights": "real",
        "source": "test",
        "beta": {
            "0.7": {
                "dense": {"beta": 0.6, "n": 500},
                "flashhead": {"probes": [1, 4], "beta": [0.3, 0.5], "n": 500},
            },
            "1.0": {"flashhead": {"probes": [1, 4], "beta": [0.2, 0.4], "n": 500}},
        },
    }
    return profile


def test_beta_is_linear_in_log_probes_and_reaches_the_dense_value_at_every_cluster():
    profile = Profile(sampled_profile(), "test")
    assert profile.beta_at(0.7, "dense", 4) == 0.6
    assert profile.beta_at(0.7, "flashhead", 1) == 0.3
    assert profile.beta_at(0.7, "flashhead", 2) == pytest.approx(0.4)  # halfway in log2 between 1 and 4
    assert profile.beta_at(0.7, "flashhead", 16) == pytest.approx(0.5 + (0.6 - 0.5) * (4 - 2) / (6 - 2))
    assert profile.beta_at(0.7, "flashhead", 64) == 0.6  # every cluster probed: the dense head
    assert profile.beta_at(1.0, "flashhead", 4) == 0.4
    assert profile.beta_at(1.0, "flashhead", 8) is None  # past the curve with no dense value to end it at
    assert profile.beta_at(1.0, "dense", 4) is None
    assert profile.beta_at(0.3, "dense", 4) is None


def _rows(tmp_path, capsys, *argv):
    (path,) = write(tmp_path, sampled_profile())
    out = tmp_path / "out"
    common = ["--profile", str(path), "--schedule", "deferred", "--prompts", "40", "--out", str(out)]
    assert main([*common, *argv]) == 0
    return json.loads((out / "results.json").read_text())["rows"], capsys.readouterr().out


def test_temperature_what_if_simulates_iid_acceptance_at_each_heads_beta(tmp_path, capsys):
    rows, printed = _rows(tmp_path, capsys, "--acceptance", "0.9", "--what-if", "temperature=0.7")
    assert "i.i.d. beta=0.6000 from the profile's sampling curves (real weights)" in printed
    assert "(flashhead p=4): i.i.d. beta=0.5000" in printed
    sampled = {r["head"]: r for r in rows if r["label"] == "what-if" and r["schedule"] == "deferred"}
    for head, beta in (("dense", 0.6), ("flashhead", 0.5)):
        (tmp_path / head).mkdir()
        same, _ = _rows(tmp_path / head, capsys, "--acceptance", str(beta), "--head", head)
        given = next(r for r in same if r["schedule"] == "deferred")
        assert sampled[head]["decode_tok_s"] == pytest.approx(given["decode_tok_s"])


def test_a_temperature_without_a_curve_is_refused_in_one_line_naming_those_measured(tmp_path, capsys):
    (path,) = write(tmp_path, sampled_profile())
    assert main(["--profile", str(path), "--what-if", "temperature=0.3"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "error: temperature=0.3: the profile has no beta curve for the dense head at this temperature "
        "(temperatures measured: 0.7, 1); python -m measure.beta measures them"
    ]
    assert main(["--what-if", "temperature=0.7"]) == 2  # the default profile has no curves at all
    assert "(temperatures measured: none)" in capsys.readouterr().err


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda s: s.update(weights="imagined"), "sampling.weights must be one of"),
        (lambda s: s.update(beta={}), "needs a non-empty object 'beta'"),
        (lambda s: s["beta"].update({"-1": {"dense": {"beta": 0.5, "n": 1}}}), "temperature '-1' is not a number > 0"),
        (lambda s: s["beta"]["0.7"]["dense"].update(beta=1.5), "dense needs 'beta', a number in [0, 1]"),
        (lambda s: s["beta"]["0.7"]["flashhead"].update(probes=[4, 1]), "probes must be increasing"),
        (lambda s: s["beta"]["0.7"].update(router={}), "expected curves 'dense' and/or 'flashhead'"),
        (lambda s: s["beta"]["0.7"]["dense"].pop("n"), "each curve needs 'n'"),
    ],
)
def test_bad_sampling_sections_are_refused(change, message):
    profile = sampled_profile()
    change(profile["sampling"])
    with pytest.raises(UsageError, match=message.replace("[", r"\[").replace("]", r"\]").replace("(", r"\(")):
        check_profile(profile, "p.json")
