"""The whole measure path on CPU with tiny models: contract, sane costs, bad input."""

import json
import math

import pytest

from contracts.policies import CATCH_UP_WIDTHS
from measure.__main__ import main
from model import fused_ops
from sim.profile import Profile

TINY = [
    "--target",
    "tiny-qwen3",
    "--draft",
    "tiny-qwen3-draft",
    "--placement",
    "cpu",
    "--contexts",
    "16,48",
    "--prompt-lengths",
    "8,24",
    "--K-max",
    "3",
    "--reps",
    "3",
    "--warmup",
    "1",
    "--prompts",
    "per-category:1",
    "--agreement-max-len",
    "24",
    "--probes",
    "1,2,8,32",
    "--early-exit-layers",
    "1",
    "--tree-widths",
    "3,7",
]


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    out = tmp_path_factory.mktemp("profile") / "tiny.json"
    assert main(TINY + ["--out", str(out)]) == 0
    return out


def _timings(node):
    if isinstance(node, dict):
        if "median_ms" in node:
            yield node
        for value in node.values():
            yield from _timings(value)
    elif isinstance(node, list):
        for value in node:
            yield from _timings(value)


def test_profile_meets_the_contract_sim_reads(measured):
    raw = json.loads(measured.read_text())
    profile = Profile(raw, str(measured))  # the simulator's own validation
    assert profile.placement == "cpu" and set(profile.costs) == {"eager"}
    assert raw["setup"]["target"]["weights"] == "synthetic" and "SYNTHETIC" in raw["notes"][0]
    forward = raw["regimes"]["eager"]["target"]["forward_ms"]["points"]
    assert sorted({p["n_tokens"] for p in forward}) == [1, 2, 3, 4, 5, 7]  # K_max + 2 = 5, and the tree widths
    body = raw["regimes"]["eager"]["draft"]["body_ms"]["points"]
    assert sorted({p["n_tokens"] for p in body}) == [1, 2, 3, 4, 7, 8, 16, 32, 64]  # and the catch-up widths
    # under the tree rule: every target forward of a tree decoder, and the draft's frontiers of the tree widths
    tree_forward = raw["regimes"]["eager"]["target"]["tree_forward_ms"]["points"]
    assert sorted((p["n_tokens"], p["context"]) for p in tree_forward) == sorted(
        (p["n_tokens"], p["context"]) for p in forward
    )
    tree_body = raw["regimes"]["eager"]["draft"]["tree_body_ms"]["points"]
    assert sorted((p["n_tokens"], p["context"]) for p in tree_body) == [(3, 16), (3, 48), (7, 16), (7, 48)]
    assert all(p["median_ms"] > 0 for p in tree_forward + tree_body)
    assert [p["probes"] for p in raw["regimes"]["eager"]["draft"]["head_flashhead_ms"]["points"]] == [1, 2, 8, 32]
    agreement = raw["flashhead"]["agreement"]
    assert agreement["probes"] == [1, 2, 8, 32] and agreement["synthetic"] is True
    assert agreement["r"][-1] == 1.0  # 32 probes of 32 clusters is the dense head
    assert agreement["n"] > 0 and len(agreement["per_category"]) == 13


def test_every_cost_is_positive_and_finite(measured):
    raw = json.loads(measured.read_text())
    timings = list(_timings(raw["regimes"]))
    assert len(timings) > 20
    for t in timings:
        for key in ("median_ms", "p10_ms", "p90_ms"):
            assert math.isfinite(t[key]) and t[key] > 0
        assert t["p10_ms"] <= t["median_ms"] <= t["p90_ms"] and t["n"] >= 3


def test_summary_beside_the_profile(measured):
    summary = measured.with_suffix(".md").read_text()
    assert "python -m measure" in summary and "SYNTHETIC" in summary and "agreement r(p)" in summary


def test_sim_runs_on_the_measured_profile(measured, capsys):
    from sim.__main__ import main as sim_main

    assert sim_main(["--profile", str(measured), "--acceptance", "0.5", "--no-ceiling", "--what-if", "probes=2"]) == 0
    assert "tiny-qwen3 (synthetic)" in capsys.readouterr().out


def test_the_drafters_costs_are_measured_and_the_simulator_plays_them(measured, capsys):
    from sim.__main__ import main as sim_main

    draft = json.loads(measured.read_text())["regimes"]["eager"]["draft"]
    assert [p["context"] for p in draft["lookup_ms"]["points"]] == [16, 48]
    early_body = draft["early_exit_body_ms"]["points"]
    assert sorted({(p["n_tokens"], p["context"]) for p in early_body}) == [
        (n, context) for n in (1, 2, *CATCH_UP_WIDTHS) for context in (16, 48)
    ]
    assert draft["early_exit_head_ms"]["median_ms"] > 0
    argv = ["--profile", str(measured), "--acceptance", "0.5", "--no-ceiling", "--schedule", "deferred"]
    assert sim_main([*argv, "--drafter", "draft-model+prompt-lookup+early-exit", "--policy", "all", "--K", "3"]) == 0
    out = capsys.readouterr().out
    assert "fixed early-exit:K3" in out and "oracle draft-model+prompt-lookup+early-exit" in out


def test_a_tree_runs_on_the_measured_verify_widths_and_is_refused_beyond_them(measured, tmp_path, capsys):
    from sim.__main__ import main as sim_main
    from tests.test_sim_trees import tree_profile

    raw = json.loads(measured.read_text())
    raw["trees"] = tree_profile()["trees"]
    path = tmp_path / "with_trees.json"
    path.write_text(json.dumps(raw))
    argv = ["--profile", str(path), "--no-ceiling", "--schedule", "deferred", "--head", "dense", "--acceptance", "0.5"]
    assert sim_main([*argv, "--tree", "2x2"]) == 0  # 6 nodes + 1: measured at 7
    assert "2x2" in capsys.readouterr().out
    assert sim_main([*argv, "--tree", "3x2"]) == 2  # 9 nodes + 1 = 10 > 7
    assert "its verify covers 10 tokens, the profile's target.forward_ms is measured up to 7" in capsys.readouterr().err


@pytest.mark.parametrize(
    "extra,message",
    [
        (["--K-max", "0"], "--K-max must be at least 1"),
        (["--tree-widths", "3,66"], "--tree-widths must be token counts in 1..65"),
        (["--probes", "1,999"], "exceed the 32 clusters"),
        (["--placement", "two-gpu"], "no GPU"),
        (["--target", "no-such-model"], "not found"),
        (["--graphs", "on"], "needs a GPU"),
        (["--passes", "0"], "--passes must be at least 1, got 0"),
        (["--passes", "10"], "--passes must be 1 to 9, got 10"),
    ],
)
def test_bad_input_exit_2_and_nothing_written(tmp_path, capsys, extra, message):
    out = tmp_path / "p.json"
    assert main(TINY + extra + ["--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.strip().count("\n") == 0
    assert not out.exists() and not out.with_suffix(".md").exists()


def test_the_draft_prefill_is_timed_without_a_first_token_choice(monkeypatch):
    """The decoder's draft prefill only fills the draft's cache; the target's also picks the first
    token. Timing a head in the draft's prefill charged the real Gemma 3 270M's 60 ms dense head (262k
    vocabulary, CPU) to every generation that the decoder never paid."""
    import torch

    from measure import benchmarks
    from model.prefill import GraphedPrefill, decoding_widths

    chosen = []

    class CountingHead:
        def __init__(self, weight):
            pass

        def argmax(self, hidden):
            chosen.append(hidden.shape)
            return hidden

    class Model:
        head_weight = torch.zeros(1)
        config = type("Config", (), {"vocab_size": 10})
        max_seq_len = 16

        def forward_hidden(self, tokens, positions):
            return torch.zeros(1, tokens.shape[-1], 4)

    class Bench:
        prompt_lengths = [4, 8]

        def tokens(self, n, device, vocab, variants=4):
            return [torch.zeros(1, n, dtype=torch.long)] * variants

        def time(self, fn, inputs, device):
            fn(*inputs[0])
            return {"median_ms": 1.0}

        def tick(self, what):
            pass

    monkeypatch.setattr(benchmarks, "DenseHead", CountingHead)
    loaded = type("Loaded", (), {"model": Model(), "info": {"name": "m"}})
    cpu = torch.device("cpu")
    benchmarks._prefill(Bench(), loaded, cpu, GraphedPrefill(loaded.model, cpu, decoding_widths(cpu, True)))
    assert chosen == []  # the draft's, as the decoder runs it
    benchmarks._prefill(Bench(), loaded, cpu, benchmarks._target_prefill(loaded.model))
    assert len(chosen) == 2  # the target's prefill picks its first token at each prompt length


def test_the_target_is_timed_either_side_of_each_split_step_of_its_attention():
    """With split attention of 512 slots (its first 512 in splits of 128) and 16 rows, the forward at
    context c reaches a new split where c + 16 passes a split's start: each step inside the range gets a
    point below it and one above, both within STEP_MARGIN; the profile's own contexts stay. Without split
    attention the contexts are the profile's."""
    from types import SimpleNamespace

    from measure.benchmarks import STEP_MARGIN, split_step_contexts

    fused = SimpleNamespace(kernels="fused", attention_split_slots=512)
    points = split_step_contexts([100, 1024, 2048, 3072, 3584], fused, 16)
    assert {100, 1024, 2048, 3072, 3584} <= set(points) and points == sorted(points)
    starts = [128, 256, 384, *range(512, 3600, 512)]
    assert fused_ops.split_starts(512, 3600) == [0, *starts]
    for start in starts:
        below = [c for c in points if c + 16 <= start]
        above = [c for c in points if c + 16 > start]
        assert start - 16 - below[-1] < STEP_MARGIN and above[0] - (start - 16) <= STEP_MARGIN, start
    assert max(points) == 3584 and min(points) == 100
    unfused = SimpleNamespace(kernels="torch", attention_split_slots=512)
    assert split_step_contexts([256, 1024], unfused, 16) == [256, 1024]
    assert split_step_contexts([256, 1024], fused, 17) == [256, 1024]  # wider forwards take the one-pass kernel


def test_passes_merge_each_timing_as_the_median_of_its_passes():
    """A point timed during a slow spell in one of three passes is outvoted; repetitions add up; a
    table's axes and the grid's shape are kept."""
    from measure.timing import merged_passes

    def point(context, ms):
        return {"context": context, "median_ms": ms, "p10_ms": ms - 0.1, "p90_ms": ms + 0.1, "n": 8, "host_ms": 0.05}

    passes = [{"body_ms": {"points": [point(256, 1.0), point(3072, ms)]}} for ms in (1.1, 1.53, 1.12)]
    merged = merged_passes(passes)["body_ms"]["points"]
    assert [p["context"] for p in merged] == [256, 3072]
    assert merged[1]["median_ms"] == pytest.approx(1.12) and merged[1]["p10_ms"] == pytest.approx(1.02)
    assert merged[0]["median_ms"] == 1.0 and merged[1]["n"] == 24
    assert merged_passes([{"a": 1.0, "median_ms": 2.0, "n": 3}]) == {"a": 1.0, "median_ms": 2.0, "n": 3}


def _counted_progress(monkeypatch) -> dict:
    """measure_profile's progress line, counted: its total and the points it was told of."""
    import measure.profiling

    counted = {}

    class Counted(measure.profiling.Progress):
        def __init__(self, total, *args, **kwargs):
            counted.update(total=total, done=0)
            super().__init__(total, *args, **kwargs)

        def update(self, count=1):
            counted["done"] += count
            super().update(count)

    monkeypatch.setattr(measure.profiling, "Progress", Counted)
    return counted


def test_a_profile_in_passes_counts_every_pass_repetitions(tmp_path, monkeypatch):
    """--passes 2 times the grid twice: each target and draft point has twice --reps repetitions, and
    the profile says so; host costs, timed once, keep theirs. The progress bar ends at its total."""
    counted = _counted_progress(monkeypatch)
    out = tmp_path / "two.json"
    argv = [*TINY, "--passes", "2", "--graphs", "off", "--tree-widths", "3", "--probes", "1,2"]
    assert main([*argv, "--out", str(out)]) == 0
    assert counted["done"] == counted["total"]
    profile = json.loads(out.read_text())
    regime = profile["regimes"]["eager"]
    assert {t["n"] for t in _timings(regime["target"])} | {t["n"] for t in _timings(regime["draft"])} == {6}
    assert any("median of 2 passes" in note for note in profile["notes"])


def test_the_progress_line_ends_at_its_total_with_sampling_and_heads(tmp_path, monkeypatch):
    """Sampled costs and a heads section add their own points (`progress_points`): the line still ends
    exactly at its total."""
    counted = _counted_progress(monkeypatch)
    argv = [*TINY, "--graphs", "off", "--tree-widths", "3", "--probes", "1,2", "--temperature", "0.7"]
    assert main([*argv, "--heads", "dense+flashhead:2", "--out", str(tmp_path / "sampled.json")]) == 0
    assert counted["total"] > 0 and counted["done"] == counted["total"]


def test_a_grid_is_timed_one_repetition_of_each_point_in_turn():
    """After every point's warm-up, repetition i of each point runs before repetition i + 1 of any, each
    with its own inputs rotated; each point keeps its own timing, in the points' order."""
    import torch

    from measure.benchmarks import Bench

    calls = []
    ticks = []

    def op(name):
        return lambda value: calls.append((name, value))

    bench = Bench(*[None] * 9, reps=3, warmup=1, tick=ticks.append)
    points = [{"n_tokens": 1, "context": 64}, {"n_tokens": 5, "context": 64}]
    operations = [(op("a"), [(0,), (1,)]), (op("b"), [(10,), (11,)])]
    timed = bench.time_grid(points, operations, torch.device("cpu"), "target forward")
    assert calls == [("a", 0), ("b", 10), ("a", 1), ("b", 11), ("a", 0), ("b", 10), ("a", 1), ("b", 11)]
    assert [(t["n_tokens"], t["n"]) for t in timed] == [(1, 3), (5, 3)]
    assert ticks == ["target forward n_tokens=1 context=64", "target forward n_tokens=5 context=64"]
