"""python -m model: bad input is one line and exit code 2 with no output; a smoke run writes traces and
summaries that pass the contract's checks and that the simulator replays round for round."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from contracts.trace import read_summary, read_trace
from model import gemma_gguf
from model.__main__ import main
from model.config import ModelConfig
from model.transformer import Transformer

FAST = ["--placement", "cpu", "--prompts", "first:2", "--max-new-tokens", "12", "--K", "3", "--warmup", "0"]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A tiny 'real' checkpoint folder (no tokenizer files) whose vocabulary (300) differs from the presets'."""
    from safetensors.torch import save_file

    folder = tmp_path_factory.mktemp("ckpt")
    hf = {
        "model_type": "qwen3",
        "vocab_size": 300,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 16,
        "rope_theta": 1e6,
        "tie_word_embeddings": True,
    }
    model = Transformer(ModelConfig.from_hf(hf))
    torch.nn.init.normal_(model.embed_tokens.weight, generator=torch.Generator().manual_seed(0))  # built uninitialized
    save_file({f"model.{k}": v.contiguous() for k, v in model.state_dict().items()}, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(hf))
    return folder


def _run(args, capsys):
    rc = main(args)
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


BAD = [
    (["--K", "0"], "--K must be in 1..64"),
    (["--K", "65"], "--K must be in 1..64 (draft tokens per round), got 65"),
    (["--K", "two"], "invalid int value"),
    (["--target", "no-such-model"], "checkpoint not found"),
    (["--draft", "/nonexistent/folder"], "checkpoint not found"),
    (["--head", "flashhead", "--probes", "999"], "probes must be in"),
    (["--head", "sparse"], "unknown head"),
    (["--schedule", "eager"], "unknown schedule"),
    (["--prompts", "poetry"], "unknown prompt selection"),
    (["--placement", "two-gpu"], "no GPU"),
    (["--placement", "moon"], "unknown placement"),
    (["--acceptance", "a=1.5"], "bad acceptance control"),
    (["--max-new-tokens", "0"], "--max-new-tokens must be >= 1"),
    (["--clustering", "/nonexistent", "--head", "flashhead"], "no FlashHead assets"),
    (["--frobnicate"], "unrecognized arguments"),
]


@pytest.mark.parametrize("extra, message", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_input_is_one_line_exit_2_and_no_output(tmp_path, capsys, extra, message):
    if "two-gpu" in extra and torch.cuda.device_count() >= 2:
        pytest.skip("this machine has two GPUs")
    out = tmp_path / "out"
    rc, stdout, stderr = _run(FAST + extra + ["--out", str(out)], capsys)
    assert rc == 2
    assert stderr.count("\n") == 1 and stderr.startswith("error: ") and message in stderr
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_checkpoint_mismatches_are_usage_errors(tmp_path, capsys, checkpoint):
    rc, _, stderr = _run(FAST + ["--draft", str(checkpoint), "--out", str(tmp_path / "o")], capsys)
    assert rc == 2 and "vocabularies differ: 512 vs 300" in stderr and stderr.count("\n") == 1
    real_pair = ["--target", str(checkpoint), "--draft", str(checkpoint), "--acceptance", "a=0.5"]
    rc, _, stderr = _run(FAST + real_pair, capsys)
    assert rc == 2 and "synthetic weights only" in stderr
    assert list(tmp_path.iterdir()) == []


def test_real_entry_point_reports_one_line(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "model", "--K", "0", "--out", str(tmp_path / "o")],
        capture_output=True,
        text=True,
        cwd=str(__import__("pathlib").Path(__file__).parents[1]),
    )
    assert proc.returncode == 2 and proc.stderr == "error: --K must be in 1..64 (draft tokens per round), got 0\n"
    assert not (tmp_path / "o").exists()


def test_help_explains_every_option(capsys):
    assert main(["--help"]) == 0
    text = capsys.readouterr().out
    for option in (
        "--target",
        "--draft",
        "--head",
        "--probes",
        "--clustering",
        "--schedule",
        "--K",
        "--max-new-tokens",
        "--prompts",
        "--placement",
        "--graphs",
        "--acceptance",
        "--seed",
        "--out",
        "--check-exact",
        "--stop-at-eos",
        "--warmup",
        "--phases",
        "--dtype",
    ):
        assert option in text


def test_smoke_run_writes_contract_files_the_simulator_replays(tmp_path, capsys):
    from sim.acceptance import TraceReplay
    from sim.profile import load_profile
    from sim.schedules import Config
    from sim.simulate import simulate
    from sim.trace import rounds_by_prompt

    out = tmp_path / "run"
    rc, stdout, stderr = _run(FAST + ["--acceptance", "a=0.6", "--check-exact", "--out", str(out)], capsys)
    assert rc == 0, stderr
    assert "weights: synthetic" in stdout and "pipelined-deferred" in stdout and "NO" not in stdout
    names = sorted(p.name for p in out.iterdir())
    schedules = ("baseline", "ordinary", "pipelined", "deferred", "pipelined-deferred")
    assert names == sorted(f"{s}.{kind}" for s in schedules for kind in ("trace.jsonl", "summary.json"))
    profile = load_profile("study")
    costs = profile.costs[profile.default_regime]
    for schedule in schedules:
        lines = read_trace(out / f"{schedule}.trace.jsonl")
        summary = read_summary(out / f"{schedule}.summary.json")
        assert summary["config"]["weights"] == "synthetic"
        assert summary["config"]["acceptance_control"] == {"kind": "iid", "a": 0.6, "seed": 0}
        assert summary["decode_tokens"] == sum(line["emitted"] for line in lines) == 2 * 11
        if schedule == "baseline":
            assert (summary["verify_calls"], summary["append_calls"]) == (0, 22)
            continue
        by_prompt, meta = rounds_by_prompt(out / f"{schedule}.trace.jsonl")
        source = TraceReplay(by_prompt, meta["head"], None)
        sim = simulate(costs, Config(schedule, "dense", 3, 1, "cpu"), source, source.generations, ceiling=False)
        keys = (
            "prompt_id",
            "round",
            "K",
            "proposed",
            "accepted",
            "emitted",
            "verify_skipped",
            "context",
            "lookahead_used",
        )
        assert [{k: r[k] for k in keys} for r in sim["rounds_detail"]] == [{k: x[k] for k in keys} for x in lines]
        assert (sim["verify_calls"], sim["append_calls"]) == (summary["verify_calls"], summary["append_calls"])


def test_flashhead_run_into_an_existing_folder(tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    args = FAST + [
        "--head",
        "flashhead",
        "--probes",
        "4",
        "--schedule",
        "deferred,ordinary",
        "--check-exact",
        "--out",
        str(out),
    ]
    rc, stdout, _ = _run(args, capsys)
    assert rc == 0 and "flashhead p=4" in stdout
    assert sorted(p.name for p in out.iterdir()) == [
        "deferred.summary.json",
        "deferred.trace.jsonl",
        "keep.txt",
        "ordinary.summary.json",
        "ordinary.trace.jsonl",
    ]
    assert read_summary(out / "deferred.summary.json")["config"]["probes"] == 4
    assert {line["probes"] for line in read_trace(out / "ordinary.trace.jsonl")} == {4}
    assert [p.name for p in tmp_path.iterdir()] == ["run"]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--bogus"], "error: unrecognized arguments: --bogus (see python -m model.gemma_gguf --help)"),
        (["--folder", "/proc/specloop/gemma"], "error: --folder /proc/specloop/gemma: /proc is not writable"),
    ],
)
def test_the_gemma_conversion_refuses_bad_input_in_one_line(argv, message, capsys):
    """Before looking for the package or converting anything (the folder: a place no one may make folders)."""
    if "/proc" in argv[-1] and not Path("/proc/self").is_dir():
        pytest.skip("needs /proc (Linux)")
    assert gemma_gguf.main(argv) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(message)
