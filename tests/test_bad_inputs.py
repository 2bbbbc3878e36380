"""Bad input across the four commands: every case exits 2 with one `error:` line that names the input,
prints nothing on stdout, and writes nothing. `python tests/test_bad_inputs.py` prints the cases as a
Markdown table (command, input, exit code, message, files written)."""

import contextlib
import io
import json
import os
import re
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from contracts.files import MAX_INPUT_BYTES  # noqa: E402
from model.head_assets import Router, Shortlist, save_router, save_shortlist  # noqa: E402
from model.router import split_clusters  # noqa: E402
from sim.scenario import DEFAULT_TRACE  # noqa: E402
from tests.sim_fixtures import (  # noqa: E402
    sampled_costs_profile,
    tensor_parallel_section,
    timing,
    tiny_heads_profile,
    tiny_profile,
    trace_lines,
)
from tests.test_sim_trees import tree_profile  # noqa: E402

TINY = ["--target", "tiny-qwen3", "--draft", "tiny-qwen3-draft", "--placement", "cpu"]
VALIDATE = [*TINY, "--n-prompts", "1", "--max-new-tokens", "8", "--K", "2"]
GPU = torch.cuda.is_available()


def make_files(folder: Path) -> dict[str, Path]:
    """Malformed and valid input files the cases refer to by name ({name} in an argument)."""
    files = {}

    def put(name, content):
        path = folder / name
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
        files[name] = path

    put("binary.json", b"\x00\xff\xfe\x89PNG")
    put("latin1.jsonl", "caf\xe9".encode("latin-1"))
    put("not_json.json", "{profile: yes}")
    put("empty.jsonl", "")
    profile = tiny_profile()
    put("good_profile.json", json.dumps(profile))
    put("heads_profile.json", json.dumps(tiny_heads_profile()))
    put("cpu_profile.json", json.dumps(tiny_profile("cpu")))
    put("cpu_heads_profile.json", json.dumps(dict(tiny_profile("cpu"), heads=tiny_heads_profile()["heads"])))
    negative = tiny_profile()
    negative["flashhead"]["default_probes"] = -3
    put("negative_probes.json", json.dumps(negative))
    lengths = tiny_profile()
    lengths["setup"]["prompt_lengths"] = [8.5]
    put("float_lengths.json", json.dumps(lengths))
    version = tiny_profile()
    version["schema"] = "specloop.profile/9"
    put("future_profile.json", json.dumps(version))
    misspelled = tiny_profile()
    misspelled["flash_head"] = misspelled["flashhead"]
    put("misspelled_profile.json", json.dumps(misspelled))
    lines = trace_lines([1, 2])
    lines[0]["probes"] = "four"
    put("string_probes.jsonl", "".join(json.dumps(x) + "\n" for x in lines))
    lines = trace_lines([1, 2])
    lines[1]["acceptd"] = 1
    put("misspelled_key.jsonl", "".join(json.dumps(x) + "\n" for x in lines))
    lines = trace_lines([1, 2])
    lines[1]["context"] = -5
    put("negative_context.jsonl", "".join(json.dumps(x) + "\n" for x in lines))
    lines = trace_lines([1, 2])
    for line in lines:
        line["context"] = 10**11
    put("huge_context.jsonl", "".join(json.dumps(x) + "\n" for x in lines))
    with open(folder / "oversized.json", "wb") as f:  # sparse: its size is checked before it is read
        f.truncate(MAX_INPUT_BYTES + 1)
    files["oversized.json"] = folder / "oversized.json"
    put("no_turns.jsonl", json.dumps({"question_id": 1, "category": "qa"}) + "\n")
    put("a_file", "not a folder")
    with_tp2 = tiny_profile()
    with_tp2["tensor_parallel"] = {"tp2": tensor_parallel_section()}
    put("tp2_profile.json", json.dumps(with_tp2))
    put("trees_profile.json", json.dumps(tree_profile()))
    with_tp2["tensor_parallel"]["tp2"]["ranks"] = 3
    put("bad_tp2_profile.json", json.dumps(with_tp2))
    sampled_heads = sampled_costs_profile(profile=dict(tiny_profile("cpu"), heads=tiny_heads_profile()["heads"]))
    sampled_heads["sampling"]["costs"]["regimes"]["eager"]["head_kinds_ms"] = {
        "shortlist": [dict(timing(0.7), budget=100), dict(timing(0.9), budget=300)]
    }
    put("cpu_sampled_heads_profile.json", json.dumps(sampled_heads))
    sampled_heads["sampling"]["costs"]["regimes"]["eager"]["head_kinds_ms"]["shortlist"].reverse()
    put("bad_sampled_heads_profile.json", json.dumps(sampled_heads))
    (folder / "runs" / "traces").mkdir(parents=True)
    (folder / "runs" / "traces" / "x.summary.json").write_text("{}")
    files["runs"] = folder / "runs"
    (folder / "policy_runs" / "traces" / "calibration").mkdir(parents=True)  # a policy report without results
    files["policy_runs"] = folder / "policy_runs"
    heads = folder / "heads"  # a shortlist and a 4-cluster router for the tiny presets' 512 tokens
    save_shortlist(Shortlist(torch.arange(512), torch.zeros(512, dtype=torch.long)), heads)
    assignments, members = split_clusters(torch.arange(512) % 4, cap=128)
    layers = [torch.zeros(8, 64), torch.zeros(8), torch.zeros(4, 8), torch.zeros(4)]
    save_router(Router(assignments, members, layers, 32), heads)
    files["heads"] = heads
    (folder / "report").mkdir()
    (folder / "report" / "report.md").write_text("an earlier report")
    files["report"] = folder / "report"
    files["study_trace.jsonl"] = DEFAULT_TRACE
    return files


# (command, arguments, what the message must contain); {name} is a file from make_files, {out} the
# output path a run would write.
CASES = [
    # sim: options, what-ifs, sweeps, files, outputs, sizes
    ("sim", ["--tree", "2x1", "--acceptance", "pattern=1,0"], "a pattern is a decoder test control"),
    ("sim", ["--acceptance", "a=1.5"], "bad acceptance control"),
    ("sim", ["--K", "0"], "--K: must be in 1..64"),
    ("sim", ["--K", "100000"], "--K: must be in 1..64"),
    ("sim", ["--K", "six"], "--K: expected an integer"),
    ("sim", ["--probes", "0"], "--probes: must be in"),
    ("sim", ["--probes", "99999"], "exceeds the 9496 FlashHead clusters"),
    ("sim", ["--prompts", "1e6"], "--prompts: expected an integer"),
    ("sim", ["--prompts", "1000000"], "--prompts: must be in 1..10,000"),
    ("sim", ["--max-new-tokens", "1000000000"], "--max-new-tokens: must be in 2..32,768"),
    ("sim", ["--prompt-len", "1000000000"], "--prompt-len: must be in 1..1,000,000"),
    ("sim", ["--acceptance", "1.5"], "acceptance must be in [0, 1]"),
    ("sim", ["--acceptance", "lengths:x=1"], "expected lengths:L=weight"),
    ("sim", ["--acceptance", "a=0.5,1.5"], "bad acceptance control 'a=0.5,1.5'; valid: a=RATE"),
    ("sim", ["--acceptance", "pattern=1,0"], "a pattern is a decoder test control"),
    (
        "sim",
        ["--profile", "{heads_profile.json}", "--acceptance", "curve:a=0.8", "--head", "flashhead:100"],
        "probes 100 exceeds the 64 FlashHead clusters",
    ),
    (
        "sim",
        ["--schedule", "fastest"],
        "--schedule: 'fastest' is unknown; valid: baseline, ordinary, pipelined, deferred, pipelined-deferred, or all",
    ),
    # found by an audit of every command line (session 37)
    # FlashHead budgets past the default profile's 9496 clusters, however they are asked
    (
        "sim",
        ["--head", "flashhead:99999999"],
        "--head: head 'flashhead:99999999': probes 99999999 exceeds the 9496 FlashHead",
    ),
    (
        "sim",
        ["--head", "flashhead:9497"],
        "--head: head 'flashhead:9497': probes 9497 exceeds the 9496 FlashHead clusters",
    ),
    ("sim", ["--head", "flashhead:64,99999"], "--head: head 'flashhead:64,99999': probes 99999 exceeds the 9496"),
    ("sim", ["--what-if", "head=flashhead:100000"], "--what-if head: head 'flashhead:100000': probes 100000 exceeds"),
    ("sim", ["--sweep", "head=dense+flashhead:100000"], "--sweep head: head 'flashhead:100000': probes 100000 exceeds"),
    ("sim", ["--probes", "99999"], "--probes: probes 99999 exceeds the 9496 FlashHead clusters (valid: 1..9496)"),
    # two acceptance sources
    (
        "sim",
        ["--trace", "{study_trace.jsonl}", "--acceptance", "0.5"],
        "--trace and --acceptance both set the acceptance",
    ),
    # a what-if key twice
    ("sim", ["--what-if", "K=4", "--what-if", "K=5"], "--what-if: key 'K' given twice (K=4, K=5)"),
    # sweep errors name --sweep
    ("sim", ["--sweep", "K="], "--sweep 'K=': expected key=value"),
    ("sim", ["--sweep", "K"], "--sweep 'K': expected key=value"),
    ("sim", ["--sweep", "=1,2"], "--sweep '=1,2': expected key=value"),
    ("sim", ["--sweep", "tree="], "--sweep 'tree=': expected key=value"),
    ("sim", ["--sweep", "head="], "--sweep 'head=': expected key=value"),
    # a what-if over the size limit is named as given
    (
        "sim",
        ["--acceptance", "0.5", "--what-if", "prompts=10000"],
        "--what-if prompts x default max_new_tokens: 630,000",
    ),
    # an unknown key before its value
    ("sim", ["--what-if", "x==1"], "unknown what-if key 'x'; valid: probes, K, schedule"),
    # empty values
    ("sim", ["--profile", ""], "--profile: empty value"),
    ("sim", ["--trace", ""], "--trace: empty value"),
    ("sim", ["--acceptance", "trace:"], "--acceptance 'trace:': no trace path given"),
    ("sim", ["--out", ""], "--out: empty value"),
    ("sim", ["--timeline", ""], "--timeline: empty value"),
    # empty list items
    ("sim", ["--sweep", "K=1,,2"], "--sweep K: empty item in '1,,2'"),
    ("sim", ["--schedule", "deferred+"], "--schedule: empty item in 'deferred+'"),
    ("sim", ["--arms-K", "2++4", "--policy", "ucb1"], "--arms-K: empty item in '2++4'"),
    ("sim", ["--head", "flashhead:1,,2"], "--head: empty item in 'flashhead:1,,2'; valid: dense, flashhead"),
    ("sim", ["--head", "dense+"], "--head: empty item in 'dense+'"),
    ("sim", ["--sweep", "tree=chain+"], "--sweep tree: empty item in 'chain+'; valid: chain"),
    ("sim", ["--sweep", "tree=chain++2x1"], "--sweep tree: empty item in 'chain++2x1'"),
    # options that change nothing
    ("sim", ["--arms-K", "2+4"], "--arms-K sets the K values of a policy's arms: it needs --policy"),
    (
        "sim",
        ["--head", "dense", "--probes", "3"],
        "--probes sets the probes of the flashhead head: it needs --head flashhead",
    ),
    ("sim", ["--head", "sparse"], "--head: unknown head 'sparse'"),
    ("sim", ["--head", "shortlist:8192"], "the profile has no cost for shortlist heads"),
    ("sim", ["--profile", "{heads_profile.json}", "--head", "shortlist:5000"], "outside the 100..1000"),
    ("sim", ["--profile", "{heads_profile.json}", "--head", "router"], "needs a budget (router:N)"),
    ("sim", ["--profile", "{heads_profile.json}", "--sweep", "head=dense+router:64"], "outside the 8..32 the profile"),
    (
        "sim",
        ["--profile", "{heads_profile.json}", "--head", "shortlist:100", "--what-if", "temperature=0.7"],
        "sampling is modeled for the heads dense and flashhead only",
    ),
    (
        "sim",
        ["--profile", "{bad_sampled_heads_profile.json}"],
        "sampling.costs.regimes.eager.head_kinds_ms.shortlist: budgets must be increasing",
    ),
    ("sim", ["--what-if", "placement=tp2"], "the profile has no tensor_parallel.tp2 costs (measured: none)"),
    ("sim", ["--profile", "{tp2_profile.json}", "--placement", "tp4"], "no tensor_parallel.tp4 costs (measured: tp2)"),
    ("sim", ["--what-if", "allreduce=x0.5"], "what-if allreduce scales a tensor-parallel target's all-reduces"),
    ("sim", ["--profile", "{tp2_profile.json}", "--what-if", "allreduce=0.5"], "what-if allreduce: expected xF"),
    ("sim", ["--profile", "{bad_tp2_profile.json}"], "tensor_parallel.tp2.ranks must be 2"),
    (
        "sim",
        ["--profile", "{tp2_profile.json}", "--placement", "tp2", "--schedule", "deferred", "--drafter", "early-exit"],
        "placement=tp2: the early-exit drafter's costs were measured on one GPU's target",
    ),
    ("sim", ["--placement", "tpu"], "--placement: 'tpu' is unknown"),
    ("sim", ["--what-if", "nonsense.path=3"], "unknown what-if key 'nonsense.path'"),
    ("sim", ["--what-if", "draft.body=3"], "did you mean"),
    ("sim", ["--what-if", "K*=2"], "use K=value"),
    ("sim", ["--what-if", "probes"], "expected key=value"),
    ("sim", ["--what-if", "draft.body_ms*=1e9"], "must be a number in 0..1e+06"),
    ("sim", ["--what-if", "temperature=-0.5"], "expected a number in 0..100 (0 is greedy)"),
    ("sim", ["--what-if", "temperature=0.7"], "the profile has no beta curve"),
    ("sim", ["--sweep", "K=2,4,0"], "sweep K: must be in 1..64"),
    ("sim", ["--sweep", "head=dense,sparse"], "sweep head: unknown head 'sparse'"),
    ("sim", ["--profile", "{binary.json}"], "is not UTF-8 text"),
    ("sim", ["--profile", "{not_json.json}"], "not valid JSON"),
    ("sim", ["--profile", "{negative_probes.json}"], "default_probes must be a positive integer"),
    ("sim", ["--profile", "{float_lengths.json}"], "prompt_lengths must be a list of positive integers"),
    ("sim", ["--profile", "{future_profile.json}"], "unknown profile schema"),
    ("sim", ["--profile", "{misspelled_profile.json}"], "unknown profile section 'flash_head'; valid: schema, created"),
    ("sim", ["--trace", "{misspelled_key.jsonl}"], "misspelled_key.jsonl:2: unknown trace key 'acceptd'; valid:"),
    ("validate", [*VALIDATE, "--profile", "{misspelled_profile.json}"], "unknown profile section 'flash_head'"),
    ("sim", ["--profile", "no/such/profile.json"], "cannot read profile"),
    ("sim", ["--trace", "{latin1.jsonl}"], "is not UTF-8 text"),
    ("sim", ["--trace", "{empty.jsonl}"], "trace has no rounds"),
    ("sim", ["--trace", "{string_probes.jsonl}"], "probes must be a positive integer or null"),
    ("sim", ["--trace", "{negative_context.jsonl}"], "'context' must be a non-negative integer"),
    ("sim", ["--trace", "{huge_context.jsonl}"], "huge_context.jsonl:1: context must be in 1..1,000,000 tokens"),
    ("sim", ["--profile", "{oversized.json}"], "over the 16 MiB an input may have"),
    ("sim", ["--acceptance", "0.6", "--prompts", "281"], "over the 2,000,000 of one command"),
    ("sim", ["--sweep", "K=" + ",".join(map(str, range(1, 65))), "--prompts", "16"], "of one command"),
    ("sim", ["--out", "{a_file}"], "exists and is not a folder"),
    ("sim", ["--out", "{a_file}/below"], "is a file, not a folder"),
    ("sim", ["--out", "/proc/specloop/out"], "/proc is not writable"),
    ("sim", ["--plot", "{no-out}"], "--plot writes PNG files and needs --out"),
    ("sim", ["--graphs", "on", "--profile", "study"], "carries only eager"),
    ("sim", ["--policy", "greedy"], "--policy: 'greedy' is unknown; valid: fixed, heuristic, ucb1, thompson, oracle"),
    ("sim", ["--drafter", "medusa"], "--drafter: 'medusa' is unknown; valid: draft-model, prompt-lookup"),
    ("sim", ["--what-if", "policy=greedy"], "what-if policy: 'greedy' is unknown"),
    ("sim", ["--what-if", "drafter=prompt-lookup"], "records outcomes for draft-model only"),
    ("sim", ["--drafter", "early-exit", "--acceptance", "0.5"], "the profile has no draft.early_exit_body_ms"),
    ("sim", ["--policy", "ucb1", "--schedule", "ordinary"], "run on deferred and pipelined-deferred only"),
    ("sim", ["--arms-K", "2+0"], "--arms-K: must be in 1..64"),
    ("sim", ["--tree", "2x0x1"], "--tree: tree '2x0x1': every number must be a positive integer; valid: chain, AxBxC"),
    ("sim", ["--tree", "dynamic:4,16"], "a dynamic tree takes M,N,D"),
    ("sim", ["--tree", "2x2x1"], "tree 2x2x1: the profile has no per-depth top-k rates (no 'trees' section)"),
    ("sim", ["--sweep", "tree=chain+paths:1.0"], "sweep tree: tree 'paths:1.0': path 1.0 has no parent path"),
    ("sim", ["--what-if", "tree=9x9"], "what-if tree: tree '9x9': more than 64 nodes"),
    (
        "sim",
        ["--profile", "{trees_profile.json}", "--tree", "2x1", "--what-if", "temperature=0.7"],
        "tree 2x1: under sampling a tree's acceptance comes from acceptance control (--acceptance a=RATE) or a trace",
    ),
    # model: choices, numbers, files, sizes, devices, checkpoints
    ("model", ["--schedule", "fastest"], "unknown schedule 'fastest'"),
    ("model", ["--head", "sparse"], "unknown head 'sparse'"),
    ("model", ["--head", "flashhead:1x"], "budgets must be positive integers; valid: dense, flashhead"),
    ("model", ["--head", "dense:2"], "'dense' takes no budget"),
    ("model", ["--head", "flashhead:64,8"], "budget 64 exceeds the 32 FlashHead clusters"),
    ("model", ["--head", "shortlist:8"], "needs built assets: pass --head-assets DIR"),
    ("model", ["--head", "router:2", "--head-assets", "{report}"], "no router asset at"),
    ("model", ["--head", "shortlist:600", "--head-assets", "{heads}"], "exceeds the 512 tokens of the vocabulary"),
    ("model", ["--head", "router:2,9", "--head-assets", "{heads}"], "budget 9 exceeds the 4 router clusters"),
    ("model", ["--head", "flashhead:4", "--probes", "4"], "--probes repeats the budget"),
    ("model", ["--K", "0"], "--K must be in 1..64"),
    ("model", ["--max-new-tokens", "0"], "--max-new-tokens must be >= 1"),
    ("model", ["--warmup", "-1"], "--warmup must be >= 0"),
    ("model", ["--record-lookup-runs", "0"], "--record-lookup-runs must be >= 1"),
    ("model", ["--policy", "greedy"], "--policy: 'greedy' is unknown; valid: fixed, heuristic, ucb1, thompson"),
    ("model", ["--drafter", "medusa"], "--drafter: 'medusa' is unknown; valid: draft-model, prompt-lookup"),
    ("model", ["--policy", "ucb1", "--schedule", "ordinary"], "run on deferred and pipelined-deferred only"),
    ("model", ["--drafter", "early-exit", "--schedule", "deferred"], "needs --early-exit-layers L"),
    ("model", ["--policy", "ucb1", "--schedule", "deferred", "--arms-K", "2+9"], "--arms-K: every K must be in 1..6"),
    ("model", ["--arms-K", "0"], "--arms-K sets the arms a policy chooses among: give it with --policy or --drafter"),
    ("model", ["--probes", "3"], "apply to --head flashhead only"),
    ("model", ["--head", "flashhead", "--probes", "999"], "probes must be in [1, 32]"),
    ("model", ["--acceptance", "a=2"], "bad acceptance control"),
    ("model", ["--acceptance", "curve:a=0.8"], "a curve is scaled per head from a profile's agreement"),
    ("model", ["--router-stream", "parallel"], "--router-stream: invalid choice: 'parallel' (choose from 'side'"),
    (
        "model",
        ["--acceptance", "a=0.9,0.5", "--tree", "2x1"],
        "a rate per draft position runs greedy chain rounds only",
    ),
    ("model", ["--acceptance", "a=0.9,0.5", "--temperature", "0.7"], "a rate per draft position runs greedy chain"),
    ("model", ["--tree", "2y2"], "--tree: tree '2y2': unknown tree kind; valid: chain, AxBxC"),
    ("model", ["--tree", "8x8x8"], "more than 64 nodes"),
    ("model", ["--tree", "paths:0;1.0"], "path 1.0 has no parent path"),
    (
        "model",
        ["--tree", "dynamic:8,64,8", "--schedule", "pipelined-deferred"],
        "with pipelined-deferred: its fed nodes and the look-ahead's 9 tokens need 65 draft-cache slots",
    ),
    ("model", ["--tree", "dynamic:16,64,6", "--schedule", "deferred"], "feeds (D - 1) x M nodes to the draft"),
    ("model", ["--tree", "2x2", "--schedule", "deferred", "--policy", "ucb1"], "no policy, drafter or tpN"),
    ("model", ["--prompts", "poetry"], "unknown prompt selection"),
    ("model", ["--prompts", "first:0"], "expected a positive count"),
    ("model", ["--prompts-file", "{binary.json}"], "is not UTF-8 text"),
    ("model", ["--prompts-file", "{empty.jsonl}"], "no questions"),
    ("model", ["--prompts-file", "{no_turns.jsonl}"], "is not a Spec-Bench question file"),
    ("model", ["--prompts-file", "{oversized.json}"], "over the 16 MiB an input may have"),
    ("model", ["--out", "{a_file}"], "exists and is not a folder"),
    ("model", ["--out", "/proc/specloop/out"], "/proc is not writable"),
    ("model", ["--target", "no-such-model"], "checkpoint not found"),
    ("model", ["--target", "{report}"], "has no config.json"),
    ("model", ["--dtype", "float8"], "unsupported dtype"),
    ("model", ["--max-new-tokens", "1000000000"], "exceeds the model's 40,960 positions"),
    ("model", ["--target", "qwen3-32b", "--schedule", "baseline", "--placement", "cpu"], "it needs a GPU"),
    ("model", ["--placement", "two-gpu"], "no GPU"),
    ("model", ["--placement", "tp1"], "unknown placement 'tp1'; valid: two-gpu, one-gpu, cpu, tpN"),
    (
        "model",
        ["--placement", "tp2"],
        "placement tp2 runs one process per GPU: launch with torchrun --nproc-per-node 2",
    ),
    ("model", ["--temperature", "-1"], "--temperature must be a finite number >= 0"),
    ("model", ["--temperature", "nan"], "--temperature must be a finite number >= 0"),
    ("model", ["--temperature", "0.7", "--top-k", "-2"], "--top-k must be >= 0"),
    ("model", ["--temperature", "0.7", "--top-p", "0"], "--top-p must be in (0, 1]"),
    ("model", ["--top-k", "5"], "--top-k and --top-p apply when sampling"),
    ("model", ["--temperature", "0.7", "--samples", "0"], "--samples must be >= 1"),
    ("model", ["--samples", "3"], "--samples needs --temperature > 0"),
    ("model", ["--seed", "-1"], "--seed must be in 0..4,294,967,295, got -1"),
    ("model", ["--seed", str(2**64)], "--seed must be in 0..4,294,967,295"),
    ("measure", [*TINY, "--seed", str(2**64)], "--seed must be in 0..4,294,967,295"),
    ("model", ["--temperature", "0.7", "--check-exact"], "--check-exact compares with greedy decoding"),
    ("model", ["--temperature", "0.7", "--schedule", "deferred", "--policy", "ucb1"], "--temperature > 0 runs with"),
    ("model", ["--temperature", "0.7", "--top-p", "0.9", "--acceptance", "a=0.5"], "--acceptance under sampling needs"),
    # measure: numbers, lists, devices, sizes, outputs
    ("measure", [*TINY, "--reps", "0"], "--reps must be at least 1"),
    ("measure", [*TINY, "--warmup", "-1"], "--warmup must be >= 0"),
    ("measure", [*TINY, "--reps", "100000000"], "--reps must be 1 to 1000, got 100000000"),
    ("measure", [*TINY, "--warmup", "101"], "--warmup must be 0 to 100, got 101"),
    ("validate", [*VALIDATE, "--measure", "--measure-args", '"unterminated'], "No closing quotation"),
    ("model", ["--placement", "cpu", "--early-exit-layers", "-3"], "--early-exit-layers must be >= 1"),
    ("model", ["--placement", "cpu", "--lookup-ngram", "0"], "--lookup-ngram must be >= 1, got 0"),
    ("measure", [*TINY, "--K-max", "0"], "--K-max must be at least 1"),
    ("measure", [*TINY, "--K-max", "65"], "--K-max must be in 1..64 (the largest K a round drafts), got 65"),
    ("measure", [*TINY, "--tree-widths", "0,65"], "--tree-widths must be token counts in 1..65"),
    ("measure", [*TINY, "--agreement-max-len", "0"], "--agreement-max-len must be at least 1"),
    ("measure", [*TINY, "--contexts", "a,b"], "--contexts: expected comma-separated integers"),
    ("measure", [*TINY, "--contexts", "100000000"], "exceeds the model's 40,960 positions"),
    ("measure", [*TINY, "--prompt-lengths", "0"], "--prompt-lengths must be at least 1"),
    ("measure", [*TINY, "--graphs", "sometimes"], "--graphs takes on, off or on,off"),
    ("measure", [*TINY, "--graphs", "on"], "needs a GPU"),
    ("measure", [*TINY, "--probes", "1,999"], "exceed the 32 clusters"),
    ("measure", [*TINY, "--placement", "two-gpu"], "no GPU"),
    ("measure", [*TINY, "--out", "{a_file}/p.json"], "a_file exists and is not a folder"),
    ("measure", [*TINY, "--out", "/proc/specloop/p.json"], "--out /proc/specloop/p.json: /proc is not writable"),
    ("measure", ["--target", "qwen3-32b-awq", "--placement", "cpu"], "it needs a GPU"),
    ("measure", ["--target", "tiny-llama", "--placement", "tp2"], "give --add-to PROFILE"),
    ("measure", [*TINY, "--add-to", "{good_profile.json}"], "--add-to adds a tensor-parallel section"),
    (
        "measure",
        ["--placement", "tp2", "--draft", "tiny-llama-draft", "--add-to", "{good_profile.json}"],
        "--draft: a tp2 measurement times the target only",
    ),
    ("measure", ["--placement", "tp2", "--add-to", "{future_profile.json}"], "unknown profile schema"),
    ("measure", ["--placement", "tp2", "--add-to", "{good_profile.json}", "--reps", "0"], "--reps must be at least 1"),
    (
        "measure",
        ["--placement", "tp2", "--target", "tiny-llama", "--add-to", "{good_profile.json}"],
        "launch with torchrun --nproc-per-node 2 -m measure",
    ),
    ("measure", [*TINY, "--temperature", "-1"], "--temperature must be a finite number >= 0"),
    ("measure", [*TINY, "--temperature", "0.7", "--top-p", "1.5"], "--top-p must be in (0, 1]"),
    ("measure", [*TINY, "--top-k", "5"], "--top-k and --top-p apply when sampling"),
    # validate: choices, numbers, profiles, runs, outputs
    ("validate", [*VALIDATE, "--schedules", "eager", "--measure"], "unknown schedule 'eager'"),
    ("validate", [*VALIDATE, "--heads", "sparse", "--measure"], "unknown head 'sparse'"),
    ("validate", [*VALIDATE, "--K", "0", "--measure"], "--K must be in 1..64"),
    ("validate", [*VALIDATE, "--heads", "dense+shortlist:64", "--measure"], "needs built assets: pass --head-assets"),
    ("validate", [*VALIDATE, "--heads", "shortlist:9999", "--head-assets", "{heads}", "--measure"], "exceeds the 512"),
    ("validate", [*VALIDATE, "--measure", "--acceptance", "a=2"], "bad acceptance control"),
    ("validate", [*VALIDATE, "--measure", "--acceptance", "curve:a=0.8"], "a curve needs --profile"),
    (
        "validate",
        [*VALIDATE, "--profile", "{cpu_heads_profile.json}", "--heads", "flashhead:100", "--acceptance", "curve:a=0.8"],
        "measured at budgets 1..64 only",
    ),
    ("validate", [*VALIDATE, "--peers", "--acceptance", "curve:a=0.8"], "a curve is scaled per head"),
    ("validate", [*VALIDATE, "--measure", "--measure-args", "--reps 0"], "--reps must be at least 1"),
    ("validate", [*VALIDATE, "--measure", "--measure-args", "--frobnicate 1"], "unrecognized arguments"),
    ("validate", [*VALIDATE], "give a cost profile"),
    (
        "validate",
        [*VALIDATE, "--profile", "{good_profile.json}", "--placement", "cpu"],
        "measured on placement one-gpu",
    ),
    ("validate", [*VALIDATE, "--profile", "{binary.json}"], "is not UTF-8 text"),
    ("validate", [*VALIDATE, "--measure", "--out", "{report}"], "already holds a report"),
    ("validate", [*VALIDATE, "--measure", "--out", "{a_file}"], "exists and is not a folder"),
    ("validate", [*VALIDATE, "--measure", "--out", "/proc/specloop/out"], "/proc is not writable"),
    ("validate", ["--from-runs", "{runs}", "--profile", "{good_profile.json}"], "unknown summary schema"),
    ("validate", ["--from-runs", "{report}", "--profile", "{good_profile.json}"], "no recorded runs"),
    ("validate", ["--from-runs", "{policy_runs}", "--profile", "{good_profile.json}"], "has no results.json"),
    ("validate", [*VALIDATE, "--measure", "--graphs", "on"], "needs a GPU placement"),
    ("validate", [*VALIDATE, "--measure", "--placement", "tp2"], "placement tp2: record the runs with torchrun"),
    ("validate", [*VALIDATE, "--measure", "--temperature", "nan"], "--temperature must be a finite number >= 0"),
    ("validate", [*VALIDATE, "--measure", "--top-p", "0.9"], "--top-k and --top-p apply when sampling"),
    (
        "validate",
        [*VALIDATE, "--measure", "--temperature", "0.7", "--top-k", "5", "--acceptance", "a=0.5"],
        "--acceptance under sampling needs --top-k 0 and --top-p 1",
    ),
    (
        "validate",
        [*VALIDATE, "--profile", "{cpu_profile.json}", "--temperature", "0.7"],
        "has no sampling costs for the eager regime",
    ),
    (
        "validate",
        [*VALIDATE, "--profile", "{cpu_sampled_heads_profile.json}", "--heads", "shortlist:400"]
        + ["--head-assets", "{heads}", "--temperature", "0.7"],
        "budget 400 is outside the 100..300 the profile costs for shortlist heads; python -m measure --temperature",
    ),
    ("validate", [*VALIDATE, "--peers", "--temperature", "0.7"], "--peers compares greedy generation"),
    # validate --trees (validate/trees.py)
    ("validate", [*VALIDATE, "--measure", "--trees", "3x3x3x3"], "more than 64 nodes"),
    ("validate", [*VALIDATE, "--measure", "--trees", "chain,dynamic:4,16"], "a dynamic tree takes M,N,D"),
    (
        "validate",
        [*VALIDATE, "--measure", "--trees", "2x2x1", "--schedules", "baseline"],
        "trees run with --schedules",
    ),
    ("validate", [*VALIDATE, "--measure", "--trees", "2x2x1", "--heads", "flashhead"], "with the dense head"),
    (
        "validate",
        [*VALIDATE, "--measure", "--trees", "2x2x1", "--temperature", "0.7", "--schedules", "pipelined-deferred"],
        "--trees under sampling: pipelined-deferred is not validated",
    ),
    ("validate", [*VALIDATE, "--peers", "--trees", "2x2x1"], "--trees: trees run in the default validation"),
    # validate --drafter/--policy (validate/policies.py)
    ("validate", [*VALIDATE, "--policy", "greedy"], "--policy: 'greedy' is unknown; valid: fixed, heuristic"),
    ("validate", [*VALIDATE, "--drafter", "medusa"], "--drafter: 'medusa' is unknown; valid: draft-model"),
    ("validate", [*VALIDATE, "--drafter", "early-exit"], "needs --early-exit-layers L"),
    ("validate", [*VALIDATE, "--policy", "ucb1", "--schedules", "ordinary"], "validate the deferred schedule only"),
    ("validate", [*VALIDATE, "--policy", "ucb1", "--lookup-ngram", "0"], "--lookup-ngram must be >= 1"),
    ("validate", [*VALIDATE, "--policy", "ucb1", "--measure"], "need --profile PATH with the drafters' costs"),
    (
        "validate",
        [*VALIDATE, "--drafter", "draft-model", "--lookup-acceptance", "rag=0.9"],
        "--lookup-acceptance controls prompt lookup",
    ),
    (
        "validate",
        [*VALIDATE, "--policy", "ucb1", "--lookup-acceptance", "poetry=0.9"],
        "expected CATEGORY=RATE items",
    ),
    ("validate", [*VALIDATE, "--policy", "ucb1", "--lookup-acceptance", "rag=1.5"], "with RATE in [0, 1]"),
    (
        "validate",
        [*VALIDATE, "--policy", "ucb1", "--profile", "{good_profile.json}", "--placement", "cpu"],
        "measured on placement one-gpu",
    ),
]
NEEDS_NO_GPU = ("no GPU", "needs a GPU", "it needs a GPU", "needs a GPU placement")


def run(command: str, argv: list[str]) -> tuple[int, str, str]:
    """The command's main in this process: (exit code, stdout, stderr)."""
    import importlib

    main = importlib.import_module(f"{command}.__main__").main
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


def resolved(argv: list[str], files: dict[str, Path], out: Path) -> list[str]:
    """The case's arguments with its files filled in, and an --out unless it names one (or `{no-out}`)."""
    text = [re.sub(r"\{([^}]+)\}", lambda m: str(files.get(m.group(1), m.group(0))), a) for a in argv]
    if "{no-out}" in text:
        return [a for a in text if a != "{no-out}"]
    return text + ([] if "--out" in argv else ["--out", str(out)])


def _snapshot(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*")}


@pytest.mark.parametrize("command,argv,message", CASES, ids=[f"{c}-{i}" for i, (c, _, _) in enumerate(CASES)])
def test_bad_input_is_refused_in_one_line(tmp_path, monkeypatch, command, argv, message):
    if GPU and any(m in message for m in NEEDS_NO_GPU):
        pytest.skip("this machine has the GPU the case lacks")
    files = make_files(tmp_path)
    monkeypatch.chdir(tmp_path)
    before = _snapshot(tmp_path)
    code, out, err = run(command, resolved(argv, files, tmp_path / "out" / "result.json"))
    assert code == 2, err
    assert err.count("\n") == 1 and err.startswith("error: "), err
    assert message in err, err
    assert out == ""
    assert _snapshot(tmp_path) == before, "the command wrote files"


def test_there_are_at_least_sixty_cases_over_four_commands():
    assert len(CASES) >= 60 and {c for c, _, _ in CASES} == {"sim", "model", "measure", "validate"}


def markdown_table() -> str:
    """The cases as run here: command, input, exit code, the message, what was written."""
    import tempfile

    rows = ["| # | command | input | exit | message | written |", "|---|---|---|---|---|---|"]
    for index, (command, argv, _) in enumerate(CASES):
        with tempfile.TemporaryDirectory() as folder:
            folder = Path(folder)
            files = make_files(folder)
            previous = os.getcwd()
            os.chdir(folder)
            try:
                before = _snapshot(folder)
                code, _, err = run(command, resolved(argv, files, folder / "out" / "result.json"))
                written = sorted(_snapshot(folder) - before)
            finally:
                os.chdir(previous)
        shown = " ".join(a for a in argv if a != "{no-out}")
        message = err.strip().replace(str(folder), "…").replace("|", "\\|")
        rows.append(f"| {index + 1} | {command} | `{shown}` | {code} | {message} | {', '.join(written) or 'nothing'} |")
    return "\n".join(rows)


if __name__ == "__main__":
    os.environ.setdefault("TRITON_INTERPRET", "1")
    torch.set_num_threads(1)
    print(markdown_table())
