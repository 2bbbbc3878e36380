"""python -m measure.beta: the overlap beta = sum min(p, q) of the target's and the draft's sampling
distributions, per temperature, for the dense draft head and FlashHead per probe count."""

import json

import pytest
import torch

from contracts.profile import check_profile
from measure import beta, beta_plot
from model.flashhead import build_clustering
from tests.sim_fixtures import tiny_profile


def test_overlap_is_one_for_equal_distributions_and_zero_for_disjoint_ones():
    p = torch.tensor([[0.5, 0.5, 0.0, 0.0], [0.1, 0.2, 0.3, 0.4]])
    q = torch.tensor([[0.0, 0.0, 0.5, 0.5], [0.1, 0.2, 0.3, 0.4]])
    assert beta.overlap(p, q).tolist() == pytest.approx([0.0, 1.0])


def test_overlap_is_the_acceptance_rate_of_the_sampling_rule():
    """Draw d ~ q and accept with probability min(1, p(d)/q(d)): the rate is sum min(p, q)."""
    generator = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(50, generator=generator) * 2, dim=0)
    q = torch.softmax(torch.randn(50, generator=generator) * 2, dim=0)
    draws = torch.multinomial(q, 200_000, replacement=True, generator=generator)
    accepted = torch.rand(200_000, generator=generator) * q[draws] < p[draws]
    expected = float(beta.overlap(p[None], q[None]))
    assert abs(float(accepted.float().mean()) - expected) < 5 * (expected * (1 - expected) / 200_000) ** 0.5


def test_flashhead_probing_every_cluster_has_the_dense_heads_beta():
    generator = torch.Generator().manual_seed(1)
    weight = torch.randn(64, 8, generator=generator)
    clustering = build_clustering(weight, cluster_size=4, iters=2, seed=0)
    target, draft = torch.randn(40, 8, generator=generator), torch.randn(40, 8, generator=generator)
    result = beta.beta_per_state(weight, clustering, target, draft, [0.7, 1.0], [1, 4, 16])
    for t in (0.7, 1.0):
        assert torch.allclose(result[t][16], result[t]["dense"], atol=1e-6)
        assert not torch.allclose(result[t][1], result[t]["dense"], atol=1e-3)  # a shortlist changes q
        q = torch.softmax(torch.nn.functional.linear(draft, weight) / t, dim=-1)
        p = torch.softmax(torch.nn.functional.linear(target, weight) / t, dim=-1)
        assert torch.allclose(result[t]["dense"], torch.minimum(p, q).sum(-1), atol=1e-6)


def test_summary_means_over_states_with_an_interval_over_prompts_and_goes_into_a_profile():
    values = torch.tensor([0.2, 0.4, 0.6, 0.8])
    prompts = torch.tensor([0, 0, 1, 1])
    summary = beta.summarize(values, prompts, seed=0)
    assert summary["beta"] == pytest.approx(0.5) and (summary["n"], summary["prompts"]) == (4, 2)
    tolerance = 1e-6  # float32 values
    assert 0.3 - tolerance <= summary["low"] <= 0.5 <= summary["high"] <= 0.7 + tolerance  # prompt means 0.3, 0.7
    per_state = {0.7: {"dense": values, 1: values / 2, 4: values}}
    result = {
        "weights": "real",
        "model_label": "test",
        "draft_layers": 2,
        "clusters": 64,
        "states": 4,
        "prompts": ["a", "b"],
        "overall": beta.curves(per_state, prompts, [1, 4], seed=0),
    }
    profile = tiny_profile()
    profile["sampling"] = beta.sampling_section(result)
    check_profile(json.loads(json.dumps(profile)), "test")
    assert profile["sampling"]["beta"]["0.7"]["flashhead"]["beta"] == pytest.approx([0.25, 0.5])


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--temperatures", "0,0.7"], "--temperatures: expected numbers > 0"),
        (["--probes", "a"], "--probes: expected comma-separated numbers"),
        (["--model", "tiny-gemma3"], "not a checkpoint folder with config.json"),
        (["--threads", "0"], "argument --threads: must be at least 1, got 0"),
        (["--new-tokens", "0"], "argument --new-tokens: must be at least 1, got 0"),
        (["--new-tokens", "100000000"], "--new-tokens must be in 1..4,096"),
        (["--threads", "100000"], "--threads must be in 1..1,024"),
        (["--seed", str(2**64)], "--seed must be in 0..4,294,967,295"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(argv, message, tmp_path, capsys):
    base = {"--model": str(tmp_path), "--draft-layers": "2", "--out": str(tmp_path / "out")}
    for key, value in zip(argv[::2], argv[1::2]):
        base[key] = value
    assert beta.main([item for pair in base.items() for item in pair]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and message in err[0]
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "content",
    ["[1, 2]", json.dumps(tiny_profile()), json.dumps({"per_category": {}})],
    ids=["a list", "a profile", "no categories"],
)
def test_beta_plot_refuses_a_json_file_that_is_not_a_beta_result(content, tmp_path, capsys):
    path = tmp_path / "beta.json"
    path.write_text(content)
    assert beta_plot.main([str(path)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {path}: not a beta.json of python -m measure.beta"), err
    assert not (tmp_path / beta_plot.FILE).exists()
