"""Prompt lookup: the device's vectorized search equals Hugging Face's loop (lookup_reference), also
as the decoder runs it (LookupSearch: prompt and output gathered into a reused buffer), and the match
runs recorded for the trace are the leading agreements of each block."""

import random

import torch

from model.lookup_control import LookupControl
from model.prompt_lookup import LookupSearch, lookup, lookup_reference, match_runs
from model.prompts import Prompt


def test_device_lookup_equals_the_reference_loop():
    rng = random.Random(0)
    checked = 0
    for _ in range(300):
        vocab = rng.choice([2, 3, 5, 50])
        length = rng.randint(1, 40)
        context = [rng.randrange(vocab) for _ in range(length)]
        capacity = length + rng.randint(0, 8)
        buffer = torch.tensor(context + [rng.randrange(vocab) for _ in range(capacity - length)])
        K, G = rng.randint(1, 6), rng.randint(1, 4)
        got = lookup(buffer, torch.tensor([length]), K, G).tolist()
        assert got == lookup_reference(context, K, G), (context, K, G)
        checked += 1
    assert checked == 300


def test_the_decoders_search_over_its_reused_buffer_equals_the_reference_loop():
    """Contexts of every length one after another through one LookupSearch: what an earlier, longer
    context left in the buffer past the current length never reaches a proposal."""
    rng = random.Random(1)
    search = LookupSearch(58, 4, torch.device("cpu"), max_ngram=3, graphs=False)  # a buffer of 64
    for _ in range(200):
        vocab = rng.choice([2, 3, 5, 50])
        prompt = [rng.randrange(vocab) for _ in range(rng.randint(1, 30))]
        out = [rng.randrange(vocab) for _ in range(rng.randint(1, 30))]
        emitted = rng.randint(0, len(out))  # the output buffer holds more than has been emitted
        K = rng.randint(1, 6)
        length = torch.tensor([len(prompt) + emitted])
        got = search(torch.tensor(prompt), torch.tensor(out), length, K, length - 1).tolist()
        assert got == lookup_reference(prompt + out[:emitted], K, 3), (prompt, out, emitted, K)


def test_the_search_with_a_control_proposes_the_bound_categorys_tokens_after_the_last_position():
    """The control runs inside the search (one graph with graphs on): at rate 1 the proposals are the
    reference's tokens at the K positions after the context's last, at rate 0 none of them; one control's
    buffers serve both categories, bound one after the other."""
    control = LookupControl("summarization=1,*=0", vocab_size=50, capacity=64, device=torch.device("cpu"))
    search = LookupSearch(58, 4, torch.device("cpu"), max_ngram=2, graphs=False, control=control)
    prompt, reference = [7, 8, 9, 7, 8], [9, 7, 8, 11, 12, 13, 14, 15]
    length = torch.tensor([len(prompt) + 3])  # the first 3 reference tokens emitted
    args = (torch.tensor(prompt), torch.tensor(reference[:3]), length, 4, length - 1)
    control.bind(reference, len(prompt), Prompt("1", "summarization", ""))
    assert search(*args).tolist() == reference[3:7]
    control.bind(reference, len(prompt), Prompt("2", "math", ""))
    assert search(*args).tolist() == [(t + 1) % 50 for t in reference[3:7]]
    uncontrolled = LookupSearch(58, 4, torch.device("cpu"), max_ngram=2, graphs=False)
    assert uncontrolled(*args).tolist() == lookup_reference(prompt + reference[:3], 4, 2)


def test_reference_examples_by_hand():
    # the last 2-gram [1, 2] occurs first at 0: propose what followed it
    assert lookup_reference([1, 2, 3, 4, 1, 2], 3, 2) == [3, 4, 1]
    # no 2-gram recurs, the 1-gram [9] does: its first occurrence's continuation, cut at the end and filled
    assert lookup_reference([9, 7, 5, 9], 4, 2) == [7, 5, 9, 9]
    # nothing recurs: the last token repeated
    assert lookup_reference([1, 2, 3], 2, 3) == [3, 3]
    # negative control: a wrong rule (the most recent occurrence) differs here
    assert lookup_reference([1, 2, 5, 1, 2, 6, 1, 2], 1, 2) == [5]


def test_match_runs_count_leading_agreements():
    prompt = [1, 2, 3, 4]
    tokens = [1, 2, 3, 4, 7]  # copies the prompt, then departs
    runs = match_runs(prompt, tokens, max_ngram=2)
    # at q=1 the context ends ...4,1: [4, 1] never recurs, [1] first at 0 -> proposes 2, 3, 4, 1, ...
    assert runs[0] == 3  # 2, 3, 4 agree, then 7 != 1
    assert len(runs) == len(tokens) - 1
    assert runs[-1] == 0


def test_trace_lines_split_the_runs_by_round_and_the_simulator_replays_them(tmp_path):
    from contracts.trace import read_trace, write_trace
    from model.trace import Generation, Round, trace_lines
    from sim.acceptance import TraceReplay
    from sim.trace import rounds_by_prompt

    prompt, tokens = [5, 6, 7, 8], [5, 6, 7, 8, 9, 5, 6]
    rounds = [Round(2, 0, 1, False, 5), Round(2, 2, 3, False, 6), Round(2, 1, 2, False, 9)]
    runs = match_runs(prompt, tokens, max_ngram=2)
    lines = trace_lines(
        Generation(tokens, rounds, 1.0, 1.0, 3, 1),
        prompt_id="p",
        schedule="deferred",
        head="dense",
        K=2,
        runs={"prompt-lookup": runs},
    )
    assert [x for line in lines for x in line["runs"]["prompt-lookup"]] == runs
    write_trace(tmp_path / "t.jsonl", lines)
    assert read_trace(tmp_path / "t.jsonl") == lines
    source = TraceReplay(*rounds_by_prompt(tmp_path / "t.jsonl")[:1], "dense", None)
    assert source.drafters == ("draft-model", "prompt-lookup")
    block = source.stream(source.generations[0], 0)
    for pos, run in enumerate(runs):
        assert block(pos, 2, "prompt-lookup") == [j < run for j in range(3)]
