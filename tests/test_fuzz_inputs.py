"""Property-based tests: mutated profiles, traces, prompt files and argument lists give a valid
result or one `error:` line with exit code 2; never a traceback, never a partial output."""

import json
import string

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contracts import UsageError
from contracts.profile import read_profile
from contracts.trace import read_trace
from sim.__main__ import main as sim_main
from sim.profile import Profile
from sim.scenario import Scenario, resolve, run
from tests.sim_fixtures import tiny_profile, trace_lines

EXAMPLES = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

# Values a mutation may put anywhere in a JSON document.
ODD_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**12), 10**12),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
    st.lists(st.integers(-3, 3), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)


def _paths(node, prefix=()):
    """Every path to a value inside a JSON document."""
    yield prefix
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _paths(value, prefix + (key,))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _paths(value, prefix + (index,))


def _mutated(document, data):
    """A copy of `document` with one value replaced or one key deleted, drawn by hypothesis."""
    document = json.loads(json.dumps(document))
    paths = [p for p in _paths(document) if p]
    path = data.draw(st.sampled_from(paths))
    parent = document
    for step in path[:-1]:
        parent = parent[step]
    if isinstance(parent, dict) and data.draw(st.booleans()):
        del parent[path[-1]]
    else:
        parent[path[-1]] = data.draw(ODD_VALUES)
    return document


def _one_line(error: UsageError) -> bool:
    return "\n" not in str(error) and str(error) != ""


@EXAMPLES
@given(data=st.data())
def test_mutated_profiles_are_read_or_refused_in_one_line(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("profile") / "p.json"
    path.write_text(json.dumps(_mutated(tiny_profile(), data), allow_nan=True))
    try:
        profile = Profile(read_profile(path), str(path))
        rows, _ = run(Scenario(profile=str(path), acceptance="0.5", prompts=2, max_new_tokens=8), ceiling=False)
    except UsageError as error:
        assert _one_line(error)
        return
    assert profile.clusters > 0 and all(row["decode_ms"] > 0 for row in rows)


@EXAMPLES
@given(data=st.data())
def test_mutated_traces_are_replayed_or_refused_in_one_line(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("trace") / "t.jsonl"
    lines = trace_lines([1, 0, 2])
    index = data.draw(st.integers(0, len(lines) - 1))
    lines[index] = _mutated(lines[index], data)
    path.write_text("".join(json.dumps(line, allow_nan=True) + "\n" for line in lines))
    try:
        read_trace(path)
        resolve(Scenario(profile="study", acceptance=f"trace:{path}"))
    except UsageError as error:
        assert _one_line(error)


@EXAMPLES
@given(raw=st.binary(max_size=200))
def test_arbitrary_bytes_as_a_profile_or_trace_are_refused_in_one_line(tmp_path_factory, raw):
    folder = tmp_path_factory.mktemp("bytes")
    for name, reader in (("p.json", read_profile), ("t.jsonl", read_trace)):
        (folder / name).write_bytes(raw)
        with pytest.raises(UsageError) as caught:
            reader(folder / name)
        assert _one_line(caught.value)


OPTIONS = [
    "--K",
    "--probes",
    "--prompts",
    "--max-new-tokens",
    "--prompt-len",
    "--seed",
    "--schedule",
    "--head",
    "--placement",
    "--graphs",
    "--acceptance",
    "--what-if",
    "--sweep",
    "--profile",
]
TOKENS = st.one_of(
    st.sampled_from(
        [
            "0",
            "1",
            "-1",
            "6",
            "1e9",
            "99999999",
            "nan",
            "",
            "all",
            "dense",
            "K=2,3",
            "probes=2",
            "x=1",
            "draft.body_ms*=2",
            "0.5",
            "1.5",
            "a,b",
            "study",
            "on",
        ]
    ),
    st.text(alphabet=string.ascii_letters + string.digits + "=*.,+-", max_size=6),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pairs=st.lists(st.tuples(st.sampled_from(OPTIONS), TOKENS), min_size=1, max_size=3))
def test_mutated_argument_lists_run_or_refuse_in_one_line(tmp_path_factory, capsys, pairs):
    out = tmp_path_factory.mktemp("argv") / "out"
    argv = [item for pair in pairs for item in pair] + ["--no-ceiling", "--prompts", "2", "--out", str(out)]
    code = sim_main(argv)
    captured = capsys.readouterr()
    if code == 0:
        assert (out / "results.json").is_file()
    else:
        assert code == 2 and captured.err.count("\n") == 1 and captured.err.startswith("error: ")
        assert "Traceback" not in captured.err and not out.exists()


def _summary():
    from model.trace import Generation, Round, summarize

    config = {
        "target": "t",
        "draft": "d",
        "weights": "synthetic",
        "head": "dense",
        "probes": None,
        "schedule": "deferred",
        "K": 2,
        "placement": "cpu",
        "graphs": False,
        "max_new_tokens": 4,
        "prompts": ["1"],
    }
    generation = Generation([1, 2, 3, 4], [Round(2, 2, 3, False, 9)], 5.0, 7.0, 1, 0)
    return summarize(config, [("1", generation)])


@EXAMPLES
@given(data=st.data())
def test_mutated_run_summaries_are_read_or_refused_in_one_line(tmp_path_factory, data):
    from contracts.trace import read_summary

    path = tmp_path_factory.mktemp("summary") / "s.json"
    path.write_text(json.dumps(_mutated(_summary(), data), allow_nan=True))
    try:
        summary = read_summary(path)
    except UsageError as error:
        assert _one_line(error)
        return
    assert summary["decode_tokens"] >= 0


QUESTION = {"question_id": 81, "category": "writing", "turns": ["Write a haiku.", "Again."]}


@EXAMPLES
@given(data=st.data())
def test_mutated_prompt_files_are_read_or_refused_in_one_line(tmp_path_factory, data):
    from model.prompts import select_prompts

    path = tmp_path_factory.mktemp("prompts") / "q.jsonl"
    path.write_text(json.dumps(_mutated(QUESTION, data), allow_nan=True) + "\n")
    try:
        prompts = select_prompts("first:1", path)
    except UsageError as error:
        assert _one_line(error)
        return
    assert len(prompts) == 1 and isinstance(prompts[0].text, str)
