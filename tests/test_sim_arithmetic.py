"""The simulator's arithmetic: closed forms, hand-computed timelines, schedule invariants."""

import random

import pytest

from sim.acceptance import Generation, IIDAcceptance, PerPositionAcceptance
from sim.profile import Profile
from sim.scenario import Scenario, run
from sim.schedules import Config
from sim.simulate import simulate
from tests.sim_fixtures import tiny_profile, trace_lines, write


def costs(placement="one-gpu", **host):
    return Profile(tiny_profile(placement, **host), "test").costs["eager"]


@pytest.mark.parametrize("a,K", [(0.3, 2), (0.6, 4), (0.8, 6), (0.95, 3)])
def test_iid_tokens_per_round_match_closed_form(a, K):
    expected = (1 - a ** (K + 1)) / (1 - a)
    generation = Generation("g", 8, int(51_000 * expected))
    result = simulate(
        costs(), Config("deferred", "dense", K, 4, "one-gpu"), IIDAcceptance(a), [generation], seed=1, ceiling=False
    )
    rounds = result["rounds_detail"][:-1]  # the last round is cut by the token budget
    assert len(rounds) >= 50_000
    mean = sum(r["accepted"] + 1 for r in rounds) / len(rounds)
    assert mean == pytest.approx(expected, rel=0.01)


# A trace of one prompt, K = 2, accepted 2, 0, 1 (6 decode tokens), on the tiny profile:
# T(n) = 10 + n, draft step 2 + 1 = 3 (K steps: 6), item 0.1, copy 0.2, cross-device wait 0.05,
# target prefill 50, draft prefill 5. TTFT = 50 + 0.1; decode starts at 50.1. The event order is
# the decoder's (docs/contracts.md): a read waits for the whole target stream; a copy runs on its
# source's stream after the destination's queued work (0.2 + 0.05), and the destination waits for
# it. Ordinary and pipelined read the counter once more after round 3: it left the host unsure
# whether the 7 tokens were reached (6 <= n <= 8; Decoder.resolve).
HAND = {
    # one GPU: everything in one stream. The draft prefill is issued after the first token, as the
    # decoder issues it there: it takes the decode's first 5 ms.
    ("one-gpu", "ordinary"): 5 + 11 + (6 + 0.1 + 12 + 11) + (6 + 0.1 + 11) + (6 + 0.1 + 12 + 11) + 0.1 + 0.1,
    ("one-gpu", "pipelined"): 5 + 11 + (6 + 0.1 + 12 + 11) + (6 + 0.1 + 11) + (6 + 0.1 + 12 + 11) + 0.1 + 0.1,
    ("one-gpu", "deferred"): 5 + 3 * (6 + 13 + 0.1) + 11 + 0.1,
    # each read waits for the verify and the whole look-ahead (3 steps): round 1's look-ahead is
    # used, so round 2 drafts nothing; rounds 2 and 3 waste theirs.
    ("one-gpu", "pipelined-deferred"): 5 + (6 + 13 + 9 + 0.1) + (13 + 9 + 0.1) + (6 + 13 + 9 + 0.1) + 11 + 0.1,
    # two GPUs. ordinary: initial append 50.1-61.1; R1 draft 50.1-56.1, its copy waits for the
    # append 61.1-61.35, read 61.45, verify -73.45, append -84.45, copy of f -84.7; R2 draft after
    # it -90.7, copy -90.95, read 91.05, append -102.05, copy -102.3; R3 draft -108.3, copy -108.55,
    # read 108.65, verify -120.65, append -131.65, copy -131.9, resolve's read 132.0, final read 132.1.
    ("two-gpu", "ordinary"): 132.1 - 50.1,
    # pipelined: f goes to the draft before the append. R1 as ordinary up to the verify -73.45,
    # copy of f -73.7, append -84.7; R2 draft 73.7-79.7, its copy waits for the append -84.95, read
    # 85.05, copy of f -85.3, append -96.3; R3 draft 85.3-91.3, copy waits for the append -96.55,
    # read 96.65, verify -108.65, copy of f -108.9, append -119.9, resolve's read 120.0, final 120.1.
    ("two-gpu", "pipelined"): 120.1 - 50.1,
    # deferred: R1 draft 50.1-56.1, copy -56.35, verify(3) -69.35, read 69.45, copy of f -69.7; R2
    # draft -75.7, copy -75.95, verify -88.95, read 89.05, copy -89.3; R3 draft -95.3, copy -95.55,
    # verify -108.55, read 108.65, copy -108.9; tail append -119.9, final read 120.0.
    ("two-gpu", "deferred"): 120.0 - 50.1,
    # pipelined-deferred: R1 draft 50.1-56.1, copy -56.35, verify -69.35 beside the look-ahead
    # 56.35-65.35, whose copy waits for the verify -69.6; f copied before the read, after that copy
    # (the draft's queue) -69.85, read 69.95 (used: the copy of f goes unused); R2 verify -82.95 beside
    # the look-ahead 69.95-78.95, copy -83.2, copy of f -83.45, read 83.55; R3 draft 83.55-89.55, copy
    # -89.8, verify -102.8, look-ahead -98.8, copy -103.05, copy of f -103.3, read 103.4; tail append
    # -114.4, final read 114.5.
    ("two-gpu", "pipelined-deferred"): 114.5 - 50.1,
}


@pytest.mark.parametrize("placement,schedule", sorted(HAND))
def test_hand_computed_trace(tmp_path, placement, schedule):
    lookahead = [True, False, False] if schedule == "pipelined-deferred" else None
    profile, trace = write(tmp_path, tiny_profile(placement), trace_lines([2, 0, 1], lookahead=lookahead))
    rows, _ = run(
        Scenario(profile=str(profile), acceptance=f"trace:{trace}", schedules=(schedule,), heads=("dense",)),
        ceiling=False,
    )
    row = rows[1]
    assert row["ttft_ms"] == pytest.approx(50.1, abs=1e-9)
    assert row["decode_ms"] == pytest.approx(HAND[(placement, schedule)], abs=1e-9)
    assert [r["accepted"] for r in row["rounds_detail"]] == [2, 0, 1]
    assert row["decode_tokens"] == 6


@pytest.mark.parametrize("placement", ["one-gpu", "two-gpu"])
def test_baseline_is_n_forwards_plus_prefill(tmp_path, placement):
    (profile,) = write(tmp_path, tiny_profile(placement))
    rows, _ = run(
        Scenario(profile=str(profile), acceptance="0.5", prompts=3, max_new_tokens=20, schedules=()), ceiling=False
    )
    base = rows[0]
    assert base["schedule"] == "baseline"
    assert base["ttft_ms"] == pytest.approx(50.0 + 0.1)  # prefill + reading the first token
    assert base["decode_ms"] == pytest.approx(3 * (19 * 11.0 + 0.1))  # n * T(1) + the final read
    assert base["append_calls"] == 3 * 19 and base["verify_calls"] == 0


def _random_case(seed):
    rng = random.Random(seed)
    placement = rng.choice(["one-gpu", "two-gpu"])
    host = {"item_ms": rng.uniform(0, 1), "round_bookkeeping_ms": rng.uniform(0, 1)}
    source = PerPositionAcceptance([rng.random() for _ in range(rng.randint(1, 4))])
    K = rng.randint(1, 8)
    gens = [Generation(str(i), 8, rng.randint(5, 80)) for i in range(3)]
    return costs(placement, **host), placement, source, K, gens


@pytest.mark.parametrize("seed", range(12))
def test_pipelined_never_slower_than_ordinary(seed):
    c, placement, source, K, gens = _random_case(seed)
    ordinary = simulate(c, Config("ordinary", "flashhead", K, 4, placement), source, gens, seed, ceiling=False)
    pipelined = simulate(c, Config("pipelined", "flashhead", K, 4, placement), source, gens, seed, ceiling=False)
    assert pipelined["decode_ms"] <= ordinary["decode_ms"] + 1e-9
    assert [r["accepted"] for r in pipelined["rounds_detail"]] == [r["accepted"] for r in ordinary["rounds_detail"]]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("schedule", ["deferred", "pipelined-deferred"])
def test_deferred_one_append_per_generation_and_no_skips(seed, schedule):
    c, placement, source, K, gens = _random_case(seed)
    result = simulate(c, Config(schedule, "dense", K, 4, placement), source, gens, seed, ceiling=False)
    assert result["append_calls"] == len(gens)
    assert not any(r["verify_skipped"] for r in result["rounds_detail"])
    assert result["verify_calls"] == result["rounds"]


@pytest.mark.parametrize("seed", range(6))
def test_ordinary_skips_exactly_the_rounds_with_nothing_accepted(seed):
    c, placement, source, K, gens = _random_case(seed)
    result = simulate(c, Config("ordinary", "dense", K, 4, placement), source, gens, seed, ceiling=False)
    rounds = result["rounds_detail"]
    assert all(r["verify_skipped"] == (r["accepted"] == 0) for r in rounds)
    assert result["verify_calls"] == sum(1 for r in rounds if r["accepted"] > 0)
    assert result["append_calls"] == len(rounds) + len(gens)  # one per round + the initial one
    assert sum(r["emitted"] for r in rounds) == sum(g.decode_tokens for g in gens)


def test_same_seed_same_result_and_trace_replay_is_exact(tmp_path):
    accepted = [1, 2, 0, 2, 2, 1, 0]
    profile, trace = write(tmp_path, tiny_profile(), trace_lines(accepted))
    scenario = Scenario(profile=str(profile), acceptance=f"trace:{trace}")
    first, _ = run(scenario, ceiling=False)
    second, _ = run(scenario, ceiling=False)
    assert [r["decode_ms"] for r in first] == [r["decode_ms"] for r in second]
    for row in first[1:]:
        assert [r["accepted"] for r in row["rounds_detail"]] == accepted


def test_head_only_ceiling_and_flashhead_cost():
    c = costs("two-gpu")
    source, gens = IIDAcceptance(0.6), [Generation("g", 8, 200)]
    dense = simulate(c, Config("ordinary", "dense", 4, 4, "one-gpu"), source, gens)
    flash = simulate(c, Config("ordinary", "flashhead", 4, 4, "one-gpu"), source, gens)
    # one GPU, serial: every draft step saves 1 - 0.29 ms with FlashHead at 4 probes.
    saved = dense["draft_steps"] * (1.0 - 0.29)
    assert dense["decode_ms"] - flash["decode_ms"] == pytest.approx(saved)
    assert dense["head_only_tok_s"] == pytest.approx(flash["head_only_tok_s"])
    assert dense["head_only_ratio"] > flash["head_only_ratio"] > 1.0


@pytest.mark.parametrize("schedule", ["ordinary", "pipelined", "deferred"])
def test_phase_times_add_up_on_one_device(tmp_path, schedule):
    """On one GPU these schedules sync only when the device is idle, so nothing overlaps and the
    phases add up to the decode wall time (pipelined-deferred overlaps the host's read with the
    look-ahead, so its phases add up to more)."""
    profile, trace = write(tmp_path, tiny_profile("one-gpu"), trace_lines([2, 0, 1, 2, 2], lookahead=[True] * 5))
    rows, _ = run(
        Scenario(profile=str(profile), acceptance=f"trace:{trace}", schedules=(schedule,), heads=("dense",)),
        ceiling=False,
    )
    row = rows[1]
    assert row["phase_ms"]["initial"] == 5.0  # the draft prefill, the decode's first work on one device
    assert sum(row["phase_ms"].values()) == pytest.approx(row["decode_ms"])


@pytest.mark.parametrize("placement", ["one-gpu", "two-gpu"])
def test_the_draft_prefill_lies_where_the_decoder_runs_it(tmp_path, placement):
    """Launch-bound prefills (the host issues them as long as the device runs them): on one device the
    decoder issues the draft's prefill after the first token, so all of it is decode time even where the
    target's prefill could hide its issue; on two it runs beside the target's, within TTFT."""
    raw = tiny_profile(placement)
    raw["regimes"]["eager"]["target"]["prefill_ms"]["host_ms"] = 50.0
    raw["regimes"]["eager"]["draft"]["prefill_ms"]["host_ms"] = 5.0
    profile, trace = write(tmp_path, raw, trace_lines([2, 0, 1]))
    rows, _ = run(
        Scenario(profile=str(profile), acceptance=f"trace:{trace}", schedules=("deferred",), heads=("dense",)),
        ceiling=False,
    )
    # the decode as hand-computed above, where the prefills' device time alone mattered
    assert rows[1]["decode_ms"] == pytest.approx(HAND[(placement, "deferred")])
    assert rows[1]["ttft_ms"] == pytest.approx(50.1 if placement == "one-gpu" else 55.1)


@pytest.mark.parametrize("schedule", ["ordinary", "deferred"])
def test_the_host_gap_after_each_read_is_on_the_critical_path(schedule):
    """On one device nothing overlaps the host's Python after a read: a 1 ms read gap adds exactly
    1 ms per read that is not a generation's last (one per round in deferred, the skip-test read
    and any end-of-generation read in ordinary)."""
    from sim.acceptance import TraceReplay

    lines = trace_lines([1, 2, 0, 2], K=2)
    source = TraceReplay({"p0": lines}, "dense", None)

    def run(gap):
        raw = tiny_profile("one-gpu")
        raw["regimes"]["eager"]["host"]["read_gap_ms"] = {"median_ms": gap, "p10_ms": gap, "p90_ms": gap, "n": 1}
        costs = Profile(raw, "test").costs["eager"]
        result = simulate(
            costs, Config(schedule, "dense", 2, 4, "one-gpu"), source, source.generations, events=True, ceiling=False
        )
        reads = sum(1 for name, *_ in result["events"] if name == "sync")
        return result["decode_ms"], reads

    (without, reads), (with_gap, _) = run(0.0), run(1.0)
    assert with_gap - without == pytest.approx(reads - 1)  # every read but the final one


def test_extrapolation_never_falls_past_the_measured_range():
    """A launch-bound draft prefill measured a little cheaper at 1024 tokens than at 128 (host noise)
    stays at its 1024 value past it, where a line through the two would fall (the H200 policy profile's
    draft prefill: 8.6 ms at 2662 tokens, where the decoder took 16); a rising cost still extrapolates."""
    from sim.costs import Cost

    def cost(values: dict) -> Cost:
        points = [{"prompt_len": x, "median_ms": y, "p10_ms": y, "p90_ms": y, "n": 1} for x, y in values.items()]
        return Cost.parse({"points": points}, "test", "draft.prefill_ms")

    falling = cost({128: 11.74, 1024: 10.62})
    assert falling.device_ms(prompt_len=2662) == pytest.approx(10.62)
    assert falling.device_ms(prompt_len=64) == pytest.approx(11.74)  # nor rises before the first point
    assert falling.device_ms(prompt_len=576) == pytest.approx((11.74 + 10.62) / 2)  # inside: interpolated
    rising = cost({128: 10.0, 1024: 19.0})
    assert rising.device_ms(prompt_len=2048) == pytest.approx(10.0 + 9.0 * (2048 - 128) / 896)
    assert rising.device_ms(prompt_len=64) == pytest.approx(10.0 - 9.0 * 64 / 896)


def test_a_noisy_cost_that_a_prediction_uses_is_named_in_its_warnings(tmp_path):
    """A point timed in a burst of host activity (p90 10x its p10) moves every prediction that uses it:
    the run says which cost and where. A tight spread, or a noisy cost the run never asks, says nothing."""

    def warnings(placement, copy_token):
        raw = tiny_profile(placement)
        raw["regimes"]["eager"]["host"]["copy_token_ms"] = copy_token
        (profile,) = write(tmp_path, raw)
        scenario = Scenario(profile=str(profile), acceptance="0.5", prompts=2, max_new_tokens=12, heads=("dense",))
        return run(scenario, ceiling=False)[1].warnings

    noisy = {"median_ms": 1.362, "p10_ms": 0.305, "p90_ms": 3.005, "n": 8}
    lines = [line for line in warnings("two-gpu", noisy) if "noisy" in line]
    assert lines == [
        "host.copy_token_ms: noisy measurement: p10 0.305 ms, median 1.362, p90 3.005 (9.9x): measure it again"
    ]
    assert not [line for line in warnings("two-gpu", {**noisy, "p10_ms": 1.0, "p90_ms": 1.9}) if "noisy" in line]
    assert not [line for line in warnings("one-gpu", noisy) if "noisy" in line]  # one GPU copies no token
