"""The simulator's tensor-parallel target (sim/tensor_parallel.py) and the profile section it reads, on a
hand-checkable profile: compute per rank plus two all-reduces per layer at the forward's message size."""

import copy
import re

import pytest

from contracts import UsageError
from contracts.profile import check_profile
from sim.__main__ import main as sim_main
from sim.scenario import Scenario, resolve, run, with_change
from tests.sim_fixtures import tensor_parallel_section, tiny_profile, trace_lines, write


def _profile(tmp_path, **section):
    raw = tiny_profile()
    raw["tensor_parallel"] = {"tp2": tensor_parallel_section(**section)}
    return str(write(tmp_path, raw)[0])


def _forward(path, *changes):
    scenario = Scenario(profile=path, acceptance="0.5", prompts=1, max_new_tokens=8)
    for key, value in changes:
        scenario = with_change(scenario, key, "=", value)
    r = resolve(scenario)
    return r, r.profile.costs[r.regime].verify


def test_forward_is_compute_plus_two_all_reduces_per_layer_at_its_message_size(tmp_path):
    r, forward = _forward(_profile(tmp_path), ("placement", "tp2"))
    assert forward.device_ms(n_tokens=1, context=8) == pytest.approx(5.0 + 4 * 0.5)  # 8-byte messages
    assert forward.device_ms(n_tokens=2, context=8) == pytest.approx(6.0 + 4 * (0.5 + 0.5 * 8 / 56))
    assert r.profile.costs[r.regime].target_prefill.device_ms(prompt_len=8) == pytest.approx(20.0 + 4 * 1.0)
    assert any("model check: compute + all-reduces is +0.0% off" in note for note in r.notes)
    _, halved = _forward(_profile(tmp_path), ("placement", "tp2"), ("allreduce", "x0.5"))
    assert halved.device_ms(n_tokens=1, context=8) == pytest.approx(5.0 + 2 * 0.5)
    _, one_gpu = _forward(_profile(tmp_path))
    assert one_gpu.device_ms(n_tokens=1, context=8) == pytest.approx(11.0)  # the profile's own target


@pytest.mark.parametrize("regime, host", [("eager", 1.0 + 4 * 0.1), ("graphs", 1.0)])
def test_the_host_issues_the_compute_and_eager_all_reduces(tmp_path, regime, host):
    raw = tiny_profile()
    section = tensor_parallel_section()
    section["regime"] = regime
    for point in section["forward_ms"]["points"]:
        point["host_ms"] = 1.0
    for point in section["all_reduce_ms"]["points"]:
        point["host_ms"] = 0.1
    raw["tensor_parallel"] = {"tp2": section}
    _, forward = _forward(str(write(tmp_path, raw)[0]), ("placement", "tp2"))
    assert forward.host_ms(n_tokens=1, context=8) == pytest.approx(host)


def test_fixed_width_forwards_send_fixed_width_messages(tmp_path):
    _, forward = _forward(_profile(tmp_path, fixed_width=3), ("placement", "tp2"))
    wide = 0.5 + 0.5 * 16 / 56  # 3 rows of 8 bytes
    assert forward.device_ms(n_tokens=1, context=8) == pytest.approx(5.0 + 4 * wide)


def test_the_simulated_baseline_pays_the_tensor_parallel_forward_per_token(tmp_path):
    """The draft shares rank 0's device: one stream, as on one GPU; each baseline token is one forward."""
    path = _profile(tmp_path)
    base = Scenario(profile=path, acceptance="0.5", prompts=1, max_new_tokens=8, schedules=("deferred",))
    one_gpu, _ = run(base, ceiling=False)
    tp2, _ = run(with_change(base, "placement", "=", "tp2"), ceiling=False)
    tokens = 7
    assert one_gpu[0]["decode_ms"] - tp2[0]["decode_ms"] == pytest.approx(tokens * (11.0 - 7.0))
    assert tp2[1]["decode_tok_s"] > one_gpu[1]["decode_tok_s"]


def test_what_ifs_compare_placements_and_scaled_all_reduces(tmp_path, capsys):
    path = _profile(tmp_path)
    argv = ["--profile", path, "--acceptance", "0.77", "--K", "6", "--prompts", "2", "--no-ceiling"]
    assert sim_main([*argv, "--what-if", "placement=tp2"]) == 0
    out = capsys.readouterr().out
    assert "what-if: placement=tp2" in out and "t-bf16 (synthetic) over 2 ranks" in out
    assert sim_main([*argv, "--placement", "tp2", "--what-if", "allreduce=x0.5"]) == 0
    assert "scaled x0.5" in capsys.readouterr().out


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda s: s.update(ranks=4), "ranks must be 2"),
        (lambda s: s.pop("all_reduce_ms"), "all_reduce_ms: missing cost"),
        (lambda s: s.update(regime="cuda"), "regime must be one of"),
        (lambda s: s.update(layers=0), "layers must be a positive integer"),
        (lambda s: s.update(prefill_ms=s["forward_ms"]), "prefill_ms: expected a table over ['prompt_len']"),
        (lambda s: s["target"].pop("weights"), "target needs"),
    ],
)
def test_the_section_checker_names_what_is_wrong(change, message):
    raw = tiny_profile()
    check_profile(raw, "old")  # a profile without the section stays valid
    raw["tensor_parallel"] = {"tp2": tensor_parallel_section()}
    check_profile(copy.deepcopy(raw), "good")
    change(raw["tensor_parallel"]["tp2"])
    with pytest.raises(UsageError, match=r"^p: tensor_parallel\.tp2\." + re.escape(message)):
        check_profile(raw, "p")
    raw["tensor_parallel"] = {"tp1": tensor_parallel_section()}
    with pytest.raises(UsageError, match="'tp1' is not a placement tpN"):
        check_profile(raw, "p")


def test_validate_predicts_tensor_parallel_runs_from_the_section(tmp_path):
    """A recorded tp2 run (baseline and deferred) is predicted with the TP target's costs."""
    from validate.plan import Config, check_profile
    from validate.predict import predict

    path = _profile(tmp_path)
    assert check_profile(path, "tp2", False).placement == "one-gpu"
    with pytest.raises(UsageError, match="measured on placement one-gpu, this run uses tp4"):
        check_profile(path, "tp4", False)
    lines = trace_lines([1, 2, 0, 2], K=2)
    trace = write(tmp_path, lines=lines)[0]
    baseline = [dict(line, schedule="baseline") for line in lines]
    one_gpu, _ = predict(path, trace, baseline, Config("baseline", "dense", 0), None, "one-gpu", False)
    tp2, _ = predict(path, trace, baseline, Config("baseline", "dense", 0), None, "tp2", False)
    assert one_gpu["decode_ms"] - tp2["decode_ms"] == pytest.approx(one_gpu["decode_tokens"] * (11.0 - 7.0))
    deferred = [dict(line, schedule="deferred") for line in lines]
    rows = [
        predict(path, trace, deferred, Config("deferred", "dense", 2), None, p, False)[0] for p in ("one-gpu", "tp2")
    ]
    assert rows[1]["decode_ms"] < rows[0]["decode_ms"]
