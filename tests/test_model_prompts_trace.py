"""Spec-Bench prompt selection, acceptance-control patterns, and the trace/summary files."""

import json

import pytest
import torch

from contracts import UsageError
from contracts.files import write_atomic
from contracts.trace import check_summary, check_trace_line, read_trace, write_summary, write_trace
from model.acceptance_control import AcceptanceControl
from model.prompts import DEFAULT_PATH, select_prompts
from model.trace import Generation, Round, summarize, trace_lines


def test_default_file_is_the_spec_bench_shipped_in_the_package():
    assert DEFAULT_PATH.is_file()
    everything = select_prompts("first:1000")
    assert len(everything) == 480 and everything[0].id == "81"


def test_first_and_per_category():
    first = select_prompts("first:3")
    assert [p.id for p in first] == ["81", "82", "83"] and first[0].text.startswith("Compose an engaging travel")
    per = select_prompts("per-category:2")
    categories = {p.category for p in per}
    assert len(per) == 2 * len(categories) == 26
    assert all(sum(p.category == c for p in per) == 2 for c in categories)


def test_categories_and_ids_keep_file_order_without_repeats():
    chosen = select_prompts("math,81,writing")
    assert [p.id for p in chosen][:3] == ["81", "82", "83"]
    assert {p.category for p in chosen} == {"writing", "math"} and len(chosen) == 20


@pytest.mark.parametrize(
    "spec, message",
    [
        ("poetry", "unknown prompt selection poetry; valid: first:N, per-category:N, categories writing"),
        ("81,9999", "question ids 81..560"),
        ("first:0", "expected a positive count"),
        ("per-category:x", "expected a positive count"),
        ("", "unknown prompt selection"),
    ],
)
def test_unknown_selections_list_the_valid_ones(spec, message):
    with pytest.raises(UsageError, match=message):
        select_prompts(spec)


def test_explicit_path_and_bad_files(tmp_path):
    path = tmp_path / "q.jsonl"
    path.write_text(json.dumps({"question_id": 7, "category": "x", "turns": ["hello", "again"]}) + "\n")
    assert [(p.id, p.category, p.text) for p in select_prompts("x", path)] == [("7", "x", "hello")]
    with pytest.raises(UsageError, match="cannot read prompts file"):
        select_prompts("first:1", tmp_path / "missing.jsonl")
    path.write_text("{not json\n")
    with pytest.raises(UsageError, match="not a Spec-Bench question file"):
        select_prompts("first:1", path)


def test_acceptance_specs():
    cpu = torch.device("cpu")
    assert AcceptanceControl("a=0.43", 10, 4, cpu).describe() == {"kind": "iid", "a": 0.43, "seed": 0}
    assert AcceptanceControl("pattern=1,0,1", 10, 4, cpu).describe() == {"kind": "pattern", "pattern": [1, 0, 1]}
    assert AcceptanceControl("a=0.9,0.5", 10, 4, cpu).describe() == {"kind": "per-position", "a": [0.9, 0.5], "seed": 0}
    for bad in ("0.5", "a=", "a=-0.1", "pattern=1,2", "pattern=", "b=1"):
        with pytest.raises(UsageError, match="bad acceptance control"):
            AcceptanceControl(bad, 10, 4, cpu)


def test_control_proposes_the_reference_or_a_different_token():
    control = AcceptanceControl("pattern=1,0", vocab_size=10, capacity=20, device=torch.device("cpu"))
    control.bind([4, 9, 9, 3, 5], prompt_len=3, key="p")
    proposals = [control.propose(torch.tensor([0]), torch.tensor([q])).item() for q in range(4, 8)]
    assert proposals == [9, 0, 3, 6]  # positions 4..7: accept, reject (9+1 mod 10), accept, reject
    iid = AcceptanceControl("a=0.5", vocab_size=10, capacity=200, device=torch.device("cpu"), seed=1)
    iid.bind([1] * 100, prompt_len=0, key="p")
    first = iid.accept.clone()
    iid.bind([1] * 100, prompt_len=0, key="q")
    assert 60 < int(first.sum()) < 140 and not torch.equal(first, iid.accept)
    with pytest.raises(UsageError, match="holds 200 positions"):
        iid.bind([1] * 200, prompt_len=10, key="p")


def _generation():
    rounds = [
        Round(3, 3, 4, False, 11, True, None),
        Round(3, 0, 1, False, 15, False, None),
        Round(3, 2, 2, False, 16, False, None),
    ]
    return Generation(tokens=list(range(8)), rounds=rounds, ttft_ms=5.0, decode_ms=70.0, verify_calls=3, append_calls=1)


CONFIG = {
    "target": "t",
    "draft": "d",
    "weights": "synthetic",
    "head": "dense",
    "probes": None,
    "schedule": "pipelined-deferred",
    "K": 3,
    "placement": "cpu",
    "graphs": False,
    "max_new_tokens": 8,
    "prompts": ["1", "2"],
}


def test_summary_arithmetic():
    s = summarize(CONFIG, [("1", _generation()), ("2", _generation())])
    check_summary(s)
    assert s["decode_tokens"] == 14 and s["decode_ms"] == 140.0 and s["decode_tok_s"] == 100.0
    assert s["acceptance"] == 10 / 18 and s["mean_emitted"] == 14 / 6
    assert (s["verify_calls"], s["append_calls"], s["phases_ms"]) == (6, 2, None)
    assert s["per_prompt"][1] == {"prompt_id": "2", "ttft_ms": 5.0, "decode_tokens": 7, "decode_ms": 70.0, "rounds": 3}


def test_trace_lines_follow_the_contract(tmp_path):
    lines = trace_lines(_generation(), prompt_id="1", schedule="pipelined-deferred", head="flashhead", K=3, probes=4)
    assert [line["round"] for line in lines] == [0, 1, 2] and "phases_ms" not in lines[0]
    assert list(lines[0])[:7] == ["schema", "prompt_id", "round", "schedule", "head", "probes", "K"]
    assert lines[0]["probes"] == 4
    write_trace(tmp_path / "t.jsonl", lines)
    assert read_trace(tmp_path / "t.jsonl") == lines
    for change, message in [
        ({"schema": "specloop.trace/2"}, "unknown trace schema"),
        ({"emitted": 5}, "emitted must be in"),
        ({"accepted": 4}, "accepted <= proposed"),
        ({"verify_skipped": 0}, "verify_skipped"),
        ({"lookahead_used": "yes"}, "lookahead_used"),
        ({"phases_ms": {"verify": 1.0}}, "phases_ms must have"),
        ({"probes": 0}, "probes must be"),
        ({"probes": "4"}, "probes must be"),
    ]:
        with pytest.raises(ValueError, match=message):
            check_trace_line({**lines[0], **change})


def test_writes_are_atomic(tmp_path, monkeypatch):
    write_summary(tmp_path / "s.json", summarize(CONFIG, [("1", _generation())]))
    assert [p.name for p in tmp_path.iterdir()] == ["s.json"]

    def broken(*args):
        raise OSError("disk full")

    monkeypatch.setattr("os.replace", broken)
    with pytest.raises(OSError):
        write_atomic(tmp_path / "s.json", "half")
    assert [p.name for p in tmp_path.iterdir()] == ["s.json"]
    assert json.loads((tmp_path / "s.json").read_text())["schema"] == "specloop.summary/1"


def test_a_write_makes_the_folder_the_output_checks_promised(tmp_path):
    """check_output_file accepts a path whose folders can be made; the write makes them."""
    write_atomic(tmp_path / "new" / "deeper" / "notes.md", "text\n")
    assert (tmp_path / "new" / "deeper" / "notes.md").read_text() == "text\n"
    assert [p.name for p in (tmp_path / "new" / "deeper").iterdir()] == ["notes.md"]
