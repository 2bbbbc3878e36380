"""The trace and profile checkers refuse a bad value on any line or key, not only on the first line or in a
summary the simulator derives: each case edits one value of a shipped file and expects one error naming
the file and the line or key."""

import json

import pytest

from contracts import UsageError
from contracts.profile import MAX_TIMING_MS, read_profile
from contracts.trace import read_trace
from sim.__main__ import main
from sim.profile import DATA, load_profile

TRACE = DATA / "study_trace.jsonl"
PROFILE = DATA / "default_profile.json"
POINT = ("regimes", "graphs", "target", "forward_ms", "points", 0)
POINT_KEY = r"regimes\.graphs\.target\.forward_ms\.points\[0\]"  # as the checker names it


def edited_trace(folder, changes: dict, line: int = 3):
    """The study trace with `changes` made to its `line` (1-based): line 3 is its first prompt's third round."""
    lines = TRACE.read_text().splitlines()
    lines[line - 1] = json.dumps({**json.loads(lines[line - 1]), **changes})
    path = folder / "trace.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def edited_profile(folder, where: tuple, value):
    """The default profile with the value at the keys and indices `where` replaced."""
    raw = json.loads(PROFILE.read_text())
    parent = raw
    for key in where[:-1]:
        parent = parent[key]
    parent[where[-1]] = value
    path = folder / "profile.json"
    path.write_text(json.dumps(raw))
    return path


def sampled_trace(folder):
    """The study trace's first prompt twice, as samples 0 and 1 of a sampled run: each counts its rounds from 0."""
    lines = [json.loads(raw) for raw in TRACE.read_text().splitlines()]
    first = [line for line in lines if line["prompt_id"] == lines[0]["prompt_id"]]
    path = folder / "sampled.jsonl"
    path.write_text("".join(json.dumps({**line, "sample": sample}) + "\n" for sample in (0, 1) for line in first))
    return path


@pytest.mark.parametrize(
    "make, reader",
    [
        (lambda folder: TRACE, read_trace),
        (lambda folder: PROFILE, read_profile),
        (sampled_trace, read_trace),
    ],
    ids=["shipped trace", "shipped profile", "samples of one prompt"],
)
def test_the_shipped_files_pass(tmp_path, make, reader):
    reader(make(tmp_path))


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"K": 100}, r"trace\.jsonl:3: K must be in 0\.\.64 \(0 for baseline\), got 100"),
        ({"K": 65, "proposed": 65, "accepted": 65, "emitted": 66}, r"trace\.jsonl:3: K must be in 0\.\.64"),
        ({"context": 10**11}, r"trace\.jsonl:3: context must be in 1\.\.1,000,000 tokens, got 100,000,000,000"),
        ({"context": 0}, r"trace\.jsonl:3: context must be in 1\.\.1,000,000"),
        ({"schedule": "warp"}, r"trace\.jsonl:3: unknown schedule 'warp'; valid: baseline, ordinary, pipelined,"),
        ({"head": "sparse"}, r"trace\.jsonl:3: head: unknown head 'sparse'; valid: dense, flashhead,"),
        ({"round": 1}, r"trace\.jsonl:3: round 1 of prompt 'study-1' should be 2: .* each once"),
        ({"round": 5}, r"trace\.jsonl:3: round 5 of prompt 'study-1' should be 2"),
        ({"sample": "two"}, r"trace\.jsonl:3: field 'sample' must be a non-negative integer"),
    ],
    ids=["K 100", "K 65", "context 1e11", "context 0", "schedule", "head", "repeated round", "skipped round", "sample"],
)
def test_a_bad_trace_line_is_refused_naming_its_line(tmp_path, changes, message):
    with pytest.raises(UsageError, match=message):
        read_trace(edited_trace(tmp_path, changes))


@pytest.mark.parametrize(
    "where, value, message",
    [
        ((*POINT, "median_ms"), 1e300, POINT_KEY + r"\.median_ms: must be at most 3,600,000 ms"),
        ((*POINT, "p90_ms"), "slow", POINT_KEY + r"\.p90_ms: expected a finite number, got 'slow'"),
        (("setup", "K_max"), 0, r"setup\.K_max must be an integer in 1\.\.64 .*, got 0"),
        (("setup", "K_max"), 65, r"setup\.K_max must be an integer in 1\.\.64"),
        (("setup", "prompt_lengths"), [], r"setup\.prompt_lengths must be a list of positive integers, not empty"),
    ],
    ids=["timing over an hour", "p90 not a number", "K_max 0", "K_max 65", "no prompt lengths"],
)
def test_a_bad_profile_value_is_refused_naming_its_key(tmp_path, where, value, message):
    with pytest.raises(UsageError, match=r"profile\.json: " + message):
        read_profile(edited_profile(tmp_path, where, value))


def test_a_what_if_may_scale_a_cost_past_the_files_bound():
    """The one-hour bound is a measured file's: a what-if factor (up to 1e6) may take a cost past it."""
    edited = load_profile(str(PROFILE)).edited([("target.forward_ms", "*=", 1e6)], "graphs")
    assert edited.raw["regimes"]["graphs"]["target"]["forward_ms"]["points"][0]["median_ms"] > MAX_TIMING_MS


@pytest.mark.parametrize(
    "option, make, message",
    [
        ("--trace", lambda folder: edited_trace(folder, {"K": 100}), "trace.jsonl:3: K must be in 0..64"),
        (
            "--profile",
            lambda folder: edited_profile(folder, (*POINT, "median_ms"), 1e300),
            "median_ms: must be at most 3,600,000 ms",
        ),
    ],
    ids=["trace", "profile"],
)
def test_the_simulator_exits_2_with_one_error_line(tmp_path, capsys, option, make, message):
    out = tmp_path / "out"
    assert main([option, str(make(tmp_path)), "--out", str(out)]) == 2
    printed = capsys.readouterr()
    assert printed.out == "" and not out.exists()
    assert printed.err.startswith("error: ") and message in printed.err and printed.err.count("\n") == 1
