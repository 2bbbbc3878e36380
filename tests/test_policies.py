"""Policies (contracts.policies) and their replay in the simulator: bookkeeping on scripted streams,
the oracle against every fixed arm, and per-drafter match runs from a trace."""

import json
import math
from dataclasses import replace

import pytest

from contracts import UsageError
from contracts.policies import UCB1, Arm, Heuristic, Thompson, arms, make_policy, reward
from contracts.trace import check_trace_line
from sim.scenario import Scenario, resolve, run, with_change
from sim.simulate import simulate
from tests.sim_fixtures import tiny_profile, trace_lines, write

A, B = Arm("draft-model", 2), Arm("prompt-lookup", 4)


def test_ucb1_bookkeeping_on_a_scripted_stream():
    """Every arm once, then the largest mean + scale * sqrt(2 ln t / n), scale the largest reward seen."""
    policy = UCB1((A, B))
    emitted = {A: [3, 3, 3, 3, 3, 3], B: [1, 5, 1, 5, 1, 5]}  # per arm, tokens of its successive rounds
    round_ms = {A: 2.0, B: 1.0}
    played = []
    for _ in range(8):
        arm = policy.choose()
        tokens = emitted[arm][policy.pulls[arm]]
        policy.update(arm, tokens - 1, tokens, round_ms[arm])
        played.append(arm)
    assert played[:2] == [A, B]
    assert sum(policy.pulls.values()) == 8 and policy.pulls[A] + policy.pulls[B] == 8
    for arm in (A, B):
        rewards = [e / ms for a, e, ms in policy.history if a == arm]
        assert policy.pulls[arm] == len(rewards)
        assert policy.rewards[arm] == pytest.approx(sum(rewards))
    # replay the choices by hand
    pulls, sums, history = {A: 0, B: 0}, {A: 0.0, B: 0.0}, []
    for arm in played:
        if all(pulls.values()):
            total, scale = sum(pulls.values()), max(history)
            index = {x: sums[x] / pulls[x] + scale * math.sqrt(2 * math.log(total) / pulls[x]) for x in (A, B)}
            assert arm == max((A, B), key=index.__getitem__)
        tokens = emitted[arm][pulls[arm]]
        pulls[arm] += 1
        sums[arm] += tokens / round_ms[arm]
        history.append(tokens / round_ms[arm])


def test_ucb1_prefers_the_better_arm_and_a_flat_stream_keeps_exploring():
    better = UCB1((A, B))
    for _ in range(200):
        arm = better.choose()
        better.update(arm, 0, 4 if arm == B else 1, 1.0)
    assert better.pulls[B] > 150
    flat = UCB1((A, B))  # negative control: equal rewards give no preference
    for _ in range(200):
        arm = flat.choose()
        flat.update(arm, 0, 2, 1.0)
    assert abs(flat.pulls[A] - flat.pulls[B]) <= 1


def test_heuristic_is_hugging_faces_schedule():
    """+2 after a fully accepted block, -1 otherwise, at least 1, at most the largest arm K."""
    policy = Heuristic((Arm("draft-model", 3), *arms(("draft-model",), (1, 8))))
    seen = []
    for full in (True, True, True, False, False, False, False, False, False):
        arm = policy.choose()
        seen.append(arm.K)
        policy.update(arm, arm.K if full else 0, 1, 1.0)
    assert seen == [3, 5, 7, 8, 7, 6, 5, 4, 3]
    for _ in range(5):
        arm = policy.choose()
        policy.update(arm, 0, 1, 1.0)
    assert policy.choose().K == 1
    assert sum(policy.pulls.values()) == 14


def test_thompson_bookkeeping_and_seed():
    def play(seed):
        policy = Thompson((A, B), seed)
        for _ in range(50):
            arm = policy.choose()
            policy.update(arm, 0, 3 if arm == A else 1, 1.0)
        return policy

    one, again = play(0), play(0)
    assert one.pulls == again.pulls and one.history == again.history
    assert sum(one.pulls.values()) == 50 and one.pulls[A] > one.pulls[B]
    assert one.rewards[A] == pytest.approx(3.0 * one.pulls[A])


def test_reward_is_tokens_per_ms_and_unknown_policy_is_refused():
    assert reward(6, 3.0) == 2.0
    with pytest.raises(UsageError, match="valid: fixed, heuristic, ucb1, thompson"):
        make_policy("greedy", (A,))


def _runs_trace(tmp_path):
    """Two prompts: prompt 0 copies its prompt (prompt lookup long runs), prompt 1 does not."""
    lines = []
    for pid, (model_runs, lookup_runs) in {
        "0": ([1, 0, 2, 1] * 8, [5] * 32),
        "1": ([2, 1, 0, 3] * 8, [0] * 32),
    }.items():
        decode = len(model_runs)
        accepted, pos = [], 0
        while pos < decode:
            a = min(2, model_runs[pos])
            accepted.append(a)
            pos += a + 1
        rounds = trace_lines(accepted, K=2, decode=decode, prompt_id=pid)
        pos = 0
        for line in rounds:
            span = range(pos, pos + line["emitted"])
            line["schedule"], line["drafter"] = "deferred", "draft-model"
            line["runs"] = {
                "draft-model": [model_runs[i] for i in span],
                "prompt-lookup": [lookup_runs[i] for i in span],
            }
            check_trace_line(line)
            pos += line["emitted"]
        lines += rounds
    profile = tiny_profile()
    profile["regimes"]["eager"]["draft"]["lookup_ms"] = {"median_ms": 0.5, "p10_ms": 0.5, "p90_ms": 0.5, "n": 1}
    return write(tmp_path, profile, lines)


def test_replay_follows_each_drafters_runs_and_the_oracle_beats_every_fixed_arm(tmp_path):
    profile, trace = _runs_trace(tmp_path)
    scenario = Scenario(profile=str(profile), acceptance=f"trace:{trace}", schedules=("deferred",), heads=("dense",))
    scenario = with_change(scenario, "drafter", "=", "draft-model+prompt-lookup")
    scenario = with_change(scenario, "arms_K", "=", "1+2")
    scenario = with_change(scenario, "K", "=", "4")
    scenario = with_change(scenario, "policy", "=", "all")
    rows, _ = run(scenario, ceiling=False)
    by = {(r["policy"], r["arm"]): r for r in rows if r["schedule"] == "deferred"}
    fixed = [r for (policy, _), r in by.items() if policy == "fixed"]
    assert len(fixed) == 6
    oracle = by[("oracle", "draft-model+prompt-lookup")]
    assert all(oracle["decode_tok_s"] >= r["decode_tok_s"] - 1e-9 for r in fixed)
    # per generation the oracle is as fast as the fastest fixed arm on it
    for i in range(2):
        assert oracle["generation_ms"][i] == pytest.approx(min(r["generation_ms"][i] for r in fixed))
    # prompt lookup at K=4 on prompt 0: every round accepts all 4 (runs of 5), on prompt 1 none
    lookup = [d for d in by[("fixed", "prompt-lookup:K4")]["rounds_detail"]]
    assert {d["accepted"] for d in lookup if d["prompt_id"] == "0"} == {4}
    assert {d["accepted"] for d in lookup if d["prompt_id"] == "1"} == {0}
    assert {d["drafter"] for d in lookup} == {"prompt-lookup"}


def test_a_trace_without_runs_replays_its_own_drafter_only(tmp_path):
    profile, trace = write(tmp_path, tiny_profile(), trace_lines([1, 2, 0, 2]))
    scenario = Scenario(profile=str(profile), acceptance=f"trace:{trace}", schedules=("deferred",))
    with pytest.raises(UsageError, match="records outcomes for draft-model only"):
        resolve(with_change(scenario, "drafter", "=", "early-exit"))
    assert json.loads(json.dumps(resolve(with_change(scenario, "policy", "=", "ucb1")).notes))


def test_timing_noise_moves_what_a_policy_observes_and_not_the_clock(tmp_path):
    """The noise multiplies each round time a policy is told by exp(r), r drawn from the given log ratios:
    the simulated clock stays as without it, the times told differ from the true ones by exactly those
    ratios, both are drawn, and the seed fixes the draws, so a noisy replay of ucb1 is reproducible."""
    profile, trace = _runs_trace(tmp_path)
    scenario = Scenario(profile=str(profile), acceptance=f"trace:{trace}", schedules=("deferred",), heads=("dense",))
    scenario = with_change(scenario, "drafter", "=", "draft-model+prompt-lookup")
    resolved = resolve(scenario)
    config = resolved.configs[1]
    costs, source = resolved.profile.costs[resolved.regime], resolved.sources[config.head]

    def told(noise: tuple) -> tuple[list[float], float]:
        policy = make_policy("fixed", config.arms(), 0)
        row = simulate(costs, config, source, resolved.generations, policy=policy, ceiling=False, noise=noise)
        return [ms for _, _, ms in policy.history], row["decode_ms"]

    true_ms, clock = told(((), 0))
    noisy_ms, noisy_clock = told(((0.2, -0.1), 3))
    assert noisy_clock == clock and len(noisy_ms) == len(true_ms) >= 30
    logs = [math.log(n / t) for n, t in zip(noisy_ms, true_ms)]
    assert all(min(abs(x - 0.2), abs(x + 0.1)) < 1e-9 for x in logs)
    assert any(x > 0 for x in logs) and any(x < 0 for x in logs)
    assert told(((0.2, -0.1), 3))[0] == noisy_ms and told(((0.2, -0.1), 4))[0] != noisy_ms
    ucb1 = with_change(scenario, "policy", "=", "ucb1")
    noise = ((0.2, -0.1), 3)
    assert run(replace(ucb1, noise=noise), ceiling=False)[0] == run(replace(ucb1, noise=noise), ceiling=False)[0]
