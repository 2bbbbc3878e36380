"""Timelines (contracts.timeline): the format's round trip and its refusals, the simulator's timeline
(`python -m sim --timeline`) against its own accounting, the decoder's (`python -m model --timeline`)
with the simulator's stream and event names, and PhaseClock unchanged when the timeline is off.
No timing is asserted: only structure, names and the simulator's arithmetic."""

import json
import types
from collections import defaultdict

import pytest

from contracts import UsageError
from contracts.timeline import (
    TIMELINE_NAMES,
    TIMELINE_STREAMS,
    category,
    read_timeline,
    timeline_object,
    write_timeline,
)
from tests.sim_fixtures import tiny_profile, write

INTERVALS = [
    ("target-device", "prefill", -5.0, -1.0, {}),
    ("host", "prefill", -5.0, -4.5, {}),
    ("draft-device", "draft_body", 0.25, 1.5, {}),
    ("draft-device", "draft_head", 1.5, 1.75, {}),
    ("draft-device", "copy_tokens", 1.75, 1.8, {"tokens": 3}),
    ("host", "sync", 2.0, 2.1, {}),
    ("host", "host_gap", 2.1, 2.4, {}),
    ("target-device", "verify", 2.4, 12.4, {}),
]
META = {"source": "simulator", "weights": "synthetic", "configuration": {"name": "deferred-dense-K3"}}


def test_round_trip_keeps_every_interval_and_labels_synthetic_weights(tmp_path):
    path = tmp_path / "t.json"
    write_timeline(path, INTERVALS, META)
    intervals, meta = read_timeline(path)
    order = lambda x: (x[2], x[0])  # noqa: E731
    assert len(intervals) == len(INTERVALS)
    for got, want in zip(sorted(intervals, key=order), sorted(INTERVALS, key=order)):
        assert (got[0], got[1], got[4]) == (want[0], want[1], want[4])
        assert got[2:4] == pytest.approx(want[2:4], rel=1e-12)
    assert meta["source"] == "simulator" and meta["configuration"] == META["configuration"]
    assert meta["schema"] == "specloop.timeline/1" and "SYNTHETIC" in meta["label"]
    raw = json.loads(path.read_text())
    assert raw["displayTimeUnit"] == "ms"
    threads = {e["tid"]: e["args"]["name"] for e in raw["traceEvents"] if e["name"] == "thread_name"}
    assert sorted(threads.values()) == sorted(TIMELINE_STREAMS)
    verify = next(e for e in raw["traceEvents"] if e["name"] == "verify")
    assert (verify["ph"], verify["ts"], verify["dur"], verify["cat"]) == ("X", 2400.0, 10000.0, "device")
    assert threads[verify["tid"]] == "target-device"
    assert [category("host", n) for n in ("sync", "host_gap", "verify")] == ["read", "gap", "issue"]


def _bad_files():
    good = timeline_object(INTERVALS, META)

    def edit(change):
        obj = json.loads(json.dumps(good))
        change(obj)
        return json.dumps(obj)

    def first_x(obj):
        return next(e for e in obj["traceEvents"] if e["ph"] == "X")

    return [
        ("{not json", "not valid JSON"),
        ("[]", "traceEvents"),
        (edit(lambda o: o.update(displayTimeUnit="ns")), "displayTimeUnit"),
        (edit(lambda o: o["otherData"].update(schema="specloop.timeline/9")), "unknown timeline schema"),
        (edit(lambda o: o["otherData"].update(source="guess")), "otherData.source"),
        (edit(lambda o: o["otherData"].pop("weights")), "otherData.weights"),
        (edit(lambda o: first_x(o).update(name="teleport")), "unknown event name 'teleport'"),
        (edit(lambda o: first_x(o).update(dur=-1)), "dur >= 0"),
        (edit(lambda o: first_x(o).update(ts="soon")), "finite numbers"),
        (edit(lambda o: first_x(o).update(ph="B")), "ph must be"),
        (edit(lambda o: first_x(o).update(tid=99)), "not a named stream"),
        (edit(lambda o: first_x(o).pop("cat")), "needs 'cat'"),
        (edit(lambda o: first_x(o).update(cat="issue")), "cat must be"),
        (
            edit(lambda o: o.update(traceEvents=[e for e in o["traceEvents"] if e["name"] != "thread_name"])),
            "thread_name metadata",
        ),
        (
            edit(lambda o: next(e for e in o["traceEvents"] if e["name"] == "thread_name")["args"].update(name="gpu7")),
            "thread_name must name a stream",
        ),
    ]


@pytest.mark.parametrize("text, message", _bad_files(), ids=[m for _, m in _bad_files()])
def test_a_bad_file_is_refused_in_one_line(tmp_path, text, message):
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(UsageError) as error:
        read_timeline(path)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_the_writer_checks_what_it_writes(tmp_path):
    for bad, message in [
        (("gpu", "verify", 0.0, 1.0, {}), "unknown stream"),
        (("host", "lunch", 0.0, 1.0, {}), "unknown event name"),
        (("host", "sync", 2.0, 1.0, {}), "start <= end"),
        (("host", "sync", 0.0, float("nan"), {}), "finite"),
    ]:
        with pytest.raises(UsageError, match=message):
            write_timeline(tmp_path / "t.json", INTERVALS + [bad], META)
    with pytest.raises(UsageError, match="otherData.source"):
        write_timeline(tmp_path / "t.json", INTERVALS, {"weights": "real"})
    assert list(tmp_path.iterdir()) == []


# --- the simulator -----------------------------------------------------------------------------


def _launch_bound(profile: dict) -> dict:
    """Every timing of a profile with host_ms equal to its device time (eager PyTorch on the CPU)."""

    def walk(node):
        if isinstance(node, dict):
            if "median_ms" in node:
                node["host_ms"] = node["median_ms"]
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(profile["regimes"])
    return profile


def _by_stream(intervals):
    streams = defaultdict(list)
    for stream, name, start, end, _ in intervals:
        streams[stream].append((start, end, name))
    return streams


def _sim_case(tmp_path, case):
    """(python -m sim arguments, the configuration and scenario they choose) for one test case."""
    from sim.scenario import Scenario

    if case == "default":  # two GPUs, graphs, measured host costs: copies and cross-device waits
        return [], Scenario()
    if case == "study-pipelined":
        return (
            ["--profile", "study", "--schedule", "pipelined", "--head", "flashhead"],
            Scenario(profile="study", schedules=("pipelined",), heads=("flashhead",)),
        )
    (path,) = write(tmp_path, _launch_bound(tiny_profile("one-gpu", round_bookkeeping_ms=0.3)))
    return (
        [
            "--profile",
            str(path),
            "--acceptance",
            "0.6",
            "--schedule",
            "pipelined-deferred",
            "--head",
            "flashhead",
            "--K",
            "3",
            "--prompts",
            "2",
            "--max-new-tokens",
            "20",
        ],
        Scenario(
            profile=str(path),
            acceptance="0.6",
            schedules=("pipelined-deferred",),
            heads=("flashhead",),
            K=3,
            prompts=2,
            max_new_tokens=20,
        ),
    )


@pytest.mark.parametrize("case", ["default", "study-pipelined", "launch-bound-one-gpu"])
def test_sim_timeline_is_the_simulators_own_accounting(tmp_path, capsys, case):
    """The file is valid; within a stream nothing overlaps; per phase, the intervals add up to the
    simulator's phase_ms of that configuration's generation (devices' work, host reads and gaps)."""
    from sim.__main__ import main
    from sim.scenario import resolve
    from sim.simulate import simulate

    argv, scenario = _sim_case(tmp_path, case)
    path = tmp_path / "timeline.json"
    assert main(argv + ["--no-ceiling", "--timeline", str(path)]) == 0
    assert f"wrote {path}" in capsys.readouterr().out
    intervals, meta = read_timeline(path)
    raw = json.loads(path.read_text())
    assert sorted(e["args"]["name"] for e in raw["traceEvents"] if e["name"] == "thread_name") == sorted(
        TIMELINE_STREAMS
    )
    assert {s for s, *_ in intervals} <= set(TIMELINE_STREAMS) and {n for _, n, *_ in intervals} <= set(TIMELINE_NAMES)

    resolved = resolve(scenario)
    config = resolved.configs[1]  # the first speculative configuration
    assert meta["configuration"]["schedule"] == config.schedule and meta["configuration"]["head"] == config.head
    assert meta["source"] == "simulator" and meta["generation"]["prompt_id"] == resolved.generations[0].prompt_id
    assert "first speculative" in meta["chosen"]
    row = simulate(
        resolved.profile.costs[resolved.regime],
        config,
        resolved.sources[config.head],
        resolved.generations[:1],
        scenario.seed,
        ceiling=False,
    )

    for stream, spans in _by_stream(intervals).items():
        spans.sort()
        for (a0, a1, a), (b0, b1, b) in zip(spans, spans[1:]):
            assert b0 >= a1 - 1e-9, (stream, a, (a0, a1), b, (b0, b1))
    total = defaultdict(float)
    for stream, name, start, end, _ in intervals:
        if stream != "host" or name in ("sync", "host_gap"):  # host issue time is no phase
            total[{"copy_tokens": "other", "host_gap": "other"}.get(name, name)] += end - start
    for phase in ("initial", "draft_body", "draft_head", "verify", "finalize", "sync", "other"):
        assert total[phase] == pytest.approx(row["phase_ms"][phase], rel=1e-9, abs=1e-9), phase
    assert all(start >= 0 for _, name, start, *_ in intervals if name not in ("prefill", "initial"))
    decode_end = max(end for *_, end, _ in intervals)
    assert decode_end == pytest.approx(row["decode_ms"]) and meta["decode_ms"] == pytest.approx(row["decode_ms"])
    if case == "default":  # two devices: the draft's own stream, and copies between them
        assert {n for s, n, *_ in intervals if s == "draft-device"} >= {"draft_body", "draft_head", "copy_tokens"}
    if case == "launch-bound-one-gpu":  # one device; the host issues every launch
        assert not [i for i in intervals if i[0] == "draft-device"]
        assert {n for s, n, *_ in intervals if s == "host"} >= {
            "draft_body",
            "draft_head",
            "verify",
            "sync",
            "host_gap",
        }


def test_sim_timeline_off_by_default_and_a_bad_path_refused_before_any_work(tmp_path, capsys):
    from sim.__main__ import main
    from sim.acceptance import Generation, IIDAcceptance
    from sim.profile import Profile
    from sim.schedules import Config
    from sim.simulate import simulate

    costs = Profile(tiny_profile(), "test").costs["eager"]
    row = simulate(
        costs, Config("deferred", "dense", 2, 4, "one-gpu"), IIDAcceptance(0.5), [Generation("p", 8, 9)], ceiling=False
    )
    assert "timeline" not in row
    assert main(["--no-ceiling", "--timeline", str(tmp_path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1 and "is a folder" in captured.err


# --- the decoder -------------------------------------------------------------------------------

FAST = [
    "--placement",
    "cpu",
    "--target",
    "tiny-qwen3",
    "--draft",
    "tiny-qwen3-draft",
    "--prompts",
    "first:2",
    "--max-new-tokens",
    "12",
    "--K",
    "3",
    "--warmup",
    "1",
    "--acceptance",
    "a=0.6",
]


def test_model_timeline_has_the_simulators_streams_and_names(tmp_path, capsys):
    from model.__main__ import main
    from sim.acceptance import TraceReplay
    from sim.profile import Profile
    from sim.schedules import Config
    from sim.simulate import simulate
    from sim.trace import rounds_by_prompt

    path, out = tmp_path / "timeline.json", tmp_path / "run"
    assert main(FAST + ["--schedule", "baseline,deferred", "--timeline", str(path), "--out", str(out)]) == 0
    assert f"wrote {path} (timeline of deferred-dense-K3, prompt 81)" in capsys.readouterr().out
    intervals, meta = read_timeline(path)
    assert meta["source"] == "decoder" and meta["weights"] == "synthetic" and "SYNTHETIC" in meta["label"]
    assert meta["configuration"]["name"] == "deferred-dense-K3" and meta["generation"]["prompt_id"] == "81"
    assert "first recorded" in meta["chosen"] and "perf_counter" in meta["clock"]
    raw = json.loads(path.read_text())
    assert sorted(e["args"]["name"] for e in raw["traceEvents"] if e["name"] == "thread_name") == sorted(
        TIMELINE_STREAMS
    )
    for stream, spans in _by_stream(intervals).items():
        if stream != "host":
            spans.sort()
            assert all(b0 >= a1 for (_, a1, _), (b0, _, _) in zip(spans, spans[1:])), stream
    assert [n for s, n, a, b, _ in intervals if b <= 0] and all(
        n in ("prefill",) for _, n, a, b, _ in intervals if a < 0
    )

    # the simulator replaying this run's trace on a CPU profile names the same streams and events
    profile = Profile(_launch_bound(tiny_profile("cpu", round_bookkeeping_ms=0.3)), "test")
    by_prompt, _ = rounds_by_prompt(out / "deferred.trace.jsonl")
    source = TraceReplay(by_prompt, "dense", None)
    simulated = simulate(
        profile.costs["eager"],
        Config("deferred", "dense", 3, 4, "cpu"),
        source,
        source.generations[:1],
        ceiling=False,
        timeline=True,
    )["timeline"]
    names = lambda xs: {(s, n) for s, n, *_ in xs}  # noqa: E731
    assert names(intervals) == names(simulated)
    assert {n for s, n in names(intervals) if s == "target-device"} == {
        "prefill",
        "initial",
        "draft_body",
        "draft_head",
        "verify",
        "finalize",
    }


def test_model_timeline_needs_phase_times(tmp_path, capsys):
    from model.__main__ import main

    assert main(FAST + ["--phases", "off", "--timeline", str(tmp_path / "t.json")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--timeline needs the phase times" in err and not list(tmp_path.iterdir())


def _drive(clock, torch):
    """Two rounds as the decoder times them: phases, a read, its gap, another round and read."""
    cpu = torch.device("cpu")
    if clock.timeline:
        clock.begin()
    clock.reset(clock_time())
    clock.next_round()
    for name in ("draft_body", "draft_head", "verify"):
        with clock.phase(name, cpu):
            pass
    clock.read(torch.tensor([1, 2]))
    clock.next_round()
    with clock.phase("draft_body", cpu):
        pass
    clock.read(torch.tensor([3]))
    return clock.results(clock_time())


def clock_time():
    import model.decoder as decoder

    return decoder.time.perf_counter()


def test_phase_clock_outputs_are_the_same_with_the_timeline_off_or_on(monkeypatch):
    """A clock that advances 2^-10 s per reading (exact in binary): with the timeline off the clock's
    results are exactly the hand-computed ones and nothing else is recorded; on, they are identical."""
    torch = pytest.importorskip("torch")
    import model.decoder as decoder

    ticks = iter(range(10_000))
    monkeypatch.setattr(decoder, "time", types.SimpleNamespace(perf_counter=lambda: next(ticks) * 2**-10))
    step = 2**-10 * 1e3  # ms per reading
    off = decoder.PhaseClock(True, streams={torch.device("cpu"): "target-device"})
    results_off = _drive(off, torch)
    expected = [
        (
            {
                "draft_body": step,
                "draft_head": step,
                "verify": step,
                "finalize": 0.0,
                "sync": step,
                "other": 9 * step - 4 * step,
            },
            2 * step,
            1,
        ),
        (
            {
                "draft_body": step,
                "draft_head": 0.0,
                "verify": 0.0,
                "finalize": 0.0,
                "sync": step,
                "other": 6 * step - 2 * step,
            },
            0,
            0,
        ),
    ]
    assert results_off == expected
    assert off.spans == [] and off.intervals() is None and not off.timeline
    on = decoder.PhaseClock(True, timeline=True, streams={torch.device("cpu"): "target-device"})
    assert _drive(on, torch) == results_off
    spans = on.intervals()
    assert [(s, n) for s, n, *_ in spans if s == "host" and n in ("sync", "host_gap")] == [
        ("host", "sync"),
        ("host", "host_gap"),
        ("host", "sync"),
    ]
    assert [(n, a, b) for s, n, a, b, _ in spans if s == "target-device"] == [
        ("draft_body", 1 * step, 2 * step),
        ("draft_head", 3 * step, 4 * step),
        ("verify", 5 * step, 6 * step),
        ("draft_body", 11 * step, 12 * step),
    ]
    with pytest.raises(UsageError):
        decoder.PhaseClock(False, timeline=True)


def test_decoder_without_the_timeline_records_none():
    pytest.importorskip("torch")
    from model.decoder import Decoder
    from model.heads import DenseHead
    from model.loading import load_model

    target = load_model("tiny-qwen3", "cpu", "float32", seed=1, max_seq_len=64).model
    draft = load_model("tiny-qwen3-draft", "cpu", "float32", seed=2, max_seq_len=64).model
    dec = Decoder(target, draft, DenseHead(draft.head_weight), K=2, graphs=False)
    prompt = list(b"Hello")
    plain = dec.generate(prompt, 8, "deferred")
    assert plain.timeline is None and dec.clock.spans == []
    dec.clock.timeline = True
    timed = dec.generate(prompt, 8, "deferred")
    assert timed.tokens == plain.tokens and timed.timeline
    assert [r.phases_ms.keys() for r in timed.rounds] == [r.phases_ms.keys() for r in plain.rounds]
    assert [(r.host_gaps, r.accepted) for r in timed.rounds] == [(r.host_gaps, r.accepted) for r in plain.rounds]
