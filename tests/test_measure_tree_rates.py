"""python -m measure.tree_rates: per-depth top-k rates of an early-exit draft, conditioned on the path
so far being accepted, with intervals over prompts, as the profile's `trees` section."""

import json

import pytest
import torch

from contracts.profile import check_profile
from measure import tree_rates
from measure.recall import collect_states
from model.loading import load_model
from model.prompts import select_prompts
from tests.sim_fixtures import tiny_profile


def test_counts_follow_the_rounds_by_hand():
    # ranks of the target's token at positions 0..3; rounds begin at 0, 1, 2, 3
    accepted, tried = tree_rates.counts(torch.tensor([0, 1, 0, 5]), depths=2, top_k=2)
    # depth 1: every round tries; top-1 accepts ranks 0 at 0 and 2, top-2 also rank 1 at 1
    assert tried[0].tolist() == [4, 4] and accepted[0].tolist() == [2, 3]
    # depth 2 (rounds 0..2 reach it): top-1 after rank 0 at 0 (next 1: no) and at 2 (next 5: no);
    # top-2 after 0 (next 1: yes), 1 (next 0: yes), 2 (next 5: no)
    assert tried[1].tolist() == [2, 3] and accepted[1].tolist() == [0, 2]


def test_ranks_agree_with_top_k_membership():
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(200, 16, generator=generator)
    target, draft = torch.randn(90, 16, generator=generator), torch.randn(90, 16, generator=generator)
    ranks = tree_rates.target_ranks(weight, target, draft)
    chosen = (target @ weight.T).argmax(-1)
    for k in (1, 2, 5, 50):
        inside = ((draft @ weight.T).topk(k, dim=-1).indices == chosen[:, None]).any(-1)
        assert torch.equal(ranks < k, inside)


@pytest.fixture(scope="module")
def tiny_states():
    loaded = load_model("tiny-gemma3", max_seq_len=64)
    prompts = select_prompts("per-category:1", None)[:6]
    return loaded, collect_states(loaded, prompts, prompt_max=16, new_tokens=12, exit_layers=[1])


def test_on_a_tiny_model_the_rates_are_the_direct_top_k_fractions_and_go_into_a_profile(tiny_states):
    loaded, per_prompt = tiny_states
    weight = loaded.model.head_weight
    overall, per_category = tree_rates.rates(per_prompt, weight, 1, depths=3, top_k=4, seed=0)
    target = torch.cat([x["states"][x["start"] :] for x in per_prompt])
    draft = torch.cat([x["exit"][1][x["start"] :] for x in per_prompt])
    chosen = (target @ weight.T).argmax(-1)
    top = (draft @ weight.T).topk(4, dim=-1).indices
    for k in range(1, 5):  # depth 1 is unconditioned: the plain fraction of states
        direct = float((top[:, :k] == chosen[:, None]).any(-1).double().mean())
        assert overall["rate"][0][k - 1] == pytest.approx(direct, abs=1e-6)
        assert overall["low"][0][k - 1] <= overall["rate"][0][k - 1] <= overall["high"][0][k - 1]
    assert overall["n"][0] == [target.shape[0]] * 4
    result = {
        "weights": loaded.info["weights"],
        "model_label": "tiny",
        "draft_layers": 1,
        "top_k": 4,
        "depths": 3,
        "states": target.shape[0],
        "prompts": [x["id"] for x in per_prompt],
        "overall": overall,
        "per_category": per_category,
    }
    profile = tiny_profile()
    profile["trees"] = tree_rates.trees_section(result)
    check_profile(json.loads(json.dumps(profile)), "test")
    assert profile["trees"]["weights"] == "synthetic"


def test_a_draft_equal_to_the_target_has_every_rate_one_and_a_shifted_one_does_not(tiny_states):
    """Positive control (the draft is the target) and negative control (the draft sees the wrong state)."""
    loaded, per_prompt = tiny_states
    same = [dict(x, exit={1: x["states"]}) for x in per_prompt]
    overall, _ = tree_rates.rates(same, loaded.model.head_weight, 1, depths=3, top_k=2, seed=0)
    assert all(rate == 1.0 for row in overall["rate"] for rate in row)
    shifted = [dict(x, exit={1: x["states"].roll(1, dims=0)}) for x in per_prompt]
    overall, _ = tree_rates.rates(shifted, loaded.model.head_weight, 1, depths=3, top_k=2, seed=0)
    assert overall["rate"][0][0] < 0.9


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--depths", "0"], "--depths must be in 1..16"),
        (["--top-k", "17"], "--top-k must be in 1..16"),
        (["--threads", "100000"], "--threads must be in 1..1,024"),
        (["--seed", "-1"], "--seed must be in 0..4,294,967,295"),
        (["--model", "tiny-gemma3"], "not a checkpoint folder with config.json"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(argv, message, tmp_path, capsys):
    base = {"--model": str(tmp_path), "--draft-layers": "2", "--out": str(tmp_path / "out")}
    for key, value in zip(argv[::2], argv[1::2]):
        base[key] = value
    assert tree_rates.main([item for pair in base.items() for item in pair]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and message in err[0]
    assert not (tmp_path / "out").exists()
