"""The GPU benchmark commands (python -m measure.speed, measure.head_speed, measure.awq_sweep,
measure.verify_speed, measure.device_copies, ...) on CPU:
--help works anywhere; without a GPU each refuses in one line with exit code 2 and writes nothing; a
bad --out is refused before any work; and their pure helpers (floors, byte counts, sweep grids,
estimates, printed lines) compute what they say."""

import json
import subprocess
import sys

import pytest
import torch

from contracts import UsageError
from measure import (
    awq_sweep,
    device_copies,
    head_speed,
    hf_eager,
    routes,
    speed,
    speed_file,
    step_kernels,
    verify_speed,
)
from measure.timing import check_out, environment_header, floor_ms, require_cuda, spread, summarize
from model import flashhead_triton
from model.flashhead import build_clustering
from model.heads import DenseHead
from model.loading import load_model
from model.sampling import verify_block_reference

NO_GPU = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a GPU")

# module, command, words its --help must contain (what it measures)
COMMANDS = [
    (speed, "python -m measure.speed", ["bandwidth floor", "draft body step", "target step", "Hugging Face"]),
    (head_speed, "python -m measure.head_speed", ["FlashHead", "launch", "dense head", "profile"]),
    (awq_sweep, "python -m measure.awq_sweep", ["w4a16", "int4pack", "--budget-s", "floor"]),
    (speed_file, "python -m measure.speed_file", ["draft_step_ms", "floor", "prefill_tflops", "Hugging Face"]),
    (verify_speed, "python -m measure.verify_speed", ["sampling verify", "greedy settle", "floor", "launch"]),
    (routes, "python -m measure.routes", ["awq-gemm", "awq-prefill", "draft-attention", "--routes"]),
    (step_kernels, "python -m measure.step_kernels", ["kernel by kernel", "span", "busy", "SPECLOOP_OVERLAP=0"]),
    (device_copies, "python -m measure.device_copies", ["peer", "pinned host", "two CUDA GPUs", "hand-over"]),
    (hf_eager, "python -m measure.hf_eager", ["Hugging Face", "DynamicCache", "--model", "--n-tokens"]),
]
IDS = [command for _, command, _ in COMMANDS]


@pytest.mark.parametrize("module, command, words", COMMANDS, ids=IDS)
def test_help_says_what_it_measures(module, command, words, capsys):
    assert module.main(["--help"]) == 0
    text = capsys.readouterr().out
    assert text.startswith(f"usage: {command}")
    assert "--out" in text and "--reps" in text and "SYNTHETIC" in text and "CUDA GPU" in text
    for word in words:
        assert word in text


@NO_GPU
@pytest.mark.parametrize("module, command, words", COMMANDS, ids=IDS)
def test_without_a_gpu_the_command_refuses_in_one_line(module, command, words, tmp_path):
    out = tmp_path / "results" / "bench.json"
    process = subprocess.run(
        [sys.executable, "-m", module.__name__, "--out", str(out), "--reps", "2"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert process.returncode == 2
    assert process.stderr.splitlines() == [f"error: {command} needs a CUDA GPU (found none)"]
    assert process.stdout == ""
    assert list(tmp_path.iterdir()) == []  # not even the --out folder


@pytest.mark.parametrize("module, command, words", COMMANDS, ids=IDS)
def test_an_existing_folder_as_out_is_refused(module, command, words, tmp_path, capsys):
    assert module.main(["--out", str(tmp_path)]) == 2
    captured = capsys.readouterr()
    refusal = f"error: --out {tmp_path} is a folder; give the name of the JSON file to write"
    assert captured.err.splitlines() == [refusal]
    assert captured.out == "" and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("module, command, words", COMMANDS, ids=IDS)
def test_bad_options_are_one_line_and_exit_2(module, command, words, tmp_path, capsys):
    assert module.main(["--out", str(tmp_path / "bench.json"), "--reps", "0"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"error: argument --reps: must be at least 1, got 0 (see {command} --help)"
    ]
    assert module.main(["--reps", "3"]) == 2  # --out is required
    assert "--out" in capsys.readouterr().err


def test_awq_sweep_needs_a_positive_budget(tmp_path, capsys):
    assert awq_sweep.main(["--out", str(tmp_path / "sweep.json"), "--budget-s", "0"]) == 2
    assert capsys.readouterr().err.splitlines() == ["error: --budget-s must be positive, got 0.0"]


def test_check_out_accepts_a_new_file_in_a_new_folder_and_creates_nothing(tmp_path):
    out = tmp_path / "a" / "b" / "bench.json"
    assert check_out(str(out)) == out
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "old.json").write_text("{}")
    assert check_out(tmp_path / "old.json") == tmp_path / "old.json"  # an existing file is replaced at the end


def test_check_out_refuses_a_path_under_a_file(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(UsageError, match="is not a folder"):
        check_out(tmp_path / "file" / "bench.json")


@NO_GPU
def test_require_cuda_names_the_command():
    with pytest.raises(UsageError, match=r"^python -m measure\.speed needs a CUDA GPU \(found none\)$"):
        require_cuda("python -m measure.speed", "cuda:0")


def test_floor_is_bytes_over_the_copy_rate():
    assert floor_ms(4e9, 4000.0) == pytest.approx(1.0)  # 4 GB at 4,000 GB/s: 1 ms
    assert floor_ms(0, 4000.0) == 0
    # Qwen3-32B's qkv GEMM at the decoder's 8 rows, at H200's 4,246 GB/s: 27,484,160 bytes, 6.47 us
    assert floor_ms(awq_sweep.gemm_bytes(5120, 10240), 4246.0) * 1e3 == pytest.approx(6.473, abs=1e-3)


def test_environment_header_labels_the_weights_synthetic():
    environment = {
        "gpu": "NVIDIA H200",
        "torch": "2.11.0",
        "triton": "3.6.0",
        "bandwidth_gbs": 4246.2,
        "weights": "synthetic",
        "weights_detail": "seeded random values, real shapes",
    }
    header = environment_header("python -m measure.speed", environment)
    assert header == (
        "python -m measure.speed on NVIDIA H200 (torch 2.11.0, triton 3.6.0), copy rate 4246 GB/s; "
        "weights: SYNTHETIC (seeded random values, real shapes)"
    )


def test_speed_row_line_shows_the_timing_and_its_ratio_to_the_floor():
    row = {
        "op": "draft body step",
        "kernels": "fused",
        "graphs": True,
        "floor_ms": 0.2,
        "median_ms": 1.2,
        "p10_ms": 1.1,
        "p90_ms": 1.3,
    }
    line = speed.format_row(row)
    assert line.startswith("draft body step ")
    assert "graphs=on " in line and "   1.200 ms [1.100, 1.300]" in line and line.endswith("floor 0.200 (6.00x)")
    hugging_face = {
        "op": "HF eager qwen3-32b n=1",
        "kernels": "transformers",
        "graphs": False,
        "floor_ms": None,
        "median_ms": 60.5,
        "p10_ms": 60.0,
        "p90_ms": 61.0,
    }
    line = speed.format_row(hugging_face)
    assert "graphs=off" in line and "floor" not in line and line.rstrip().endswith("[60.000, 61.000]")
    assert "graphs=in graph" in speed.format_row({**row, "graphs": "in graph"})


def test_speed_compares_the_dense_head_with_flashhead_at_c_over_16_and_2():
    pytest.importorskip("triton")
    device = "cuda" if torch.cuda.is_available() else "cpu"  # the Triton backend runs on CPU under the interpreter
    weight = torch.randn(1024, 32, generator=torch.Generator().manual_seed(0)).to(device)
    clustering = build_clustering(weight, seed=0)  # 64 clusters of 16
    assert speed.compared_probes(clustering) == (4, 2)
    heads = speed.compared_heads(weight, clustering)
    assert list(heads) == [
        "dense",
        "flashhead p=4 triton",
        "flashhead p=4 torch",
        "flashhead p=2 triton",
        "flashhead p=2 torch",
    ]
    assert [getattr(head, "probes", None) for head in heads.values()] == [None, 4, 4, 2, 2]
    assert heads["dense"].bytes_per_call() > heads["flashhead p=4 torch"].bytes_per_call()


def test_speed_draft_step_is_the_body_then_the_head():
    model = load_model("tiny-qwen3-draft", "cpu").model
    tokens, position = torch.tensor([[5]]), torch.tensor([3])
    head = DenseHead(model.head_weight)
    hidden = speed.draft_step(model)(tokens, position)
    assert hidden.shape == (1, 1, model.config.hidden_size)
    assert torch.equal(speed.draft_step(model, head)(tokens, position), head.argmax(hidden[0, -1:]))


def test_head_speed_sweep_grid_and_launch_shapes():
    grid = head_speed.every_combination(BLOCK_D=[128, 256], num_warps=[2, 4, 8])
    assert len(grid) == 6
    assert grid[0] == {"BLOCK_D": 128, "num_warps": 2} and grid[-1] == {"BLOCK_D": 256, "num_warps": 8}
    assert [len(shapes) for _, _, shapes, _ in head_speed.SWEEPS] == [36, 12, 12]

    before = flashhead_triton.STAGE2_LAUNCH
    with pytest.raises(RuntimeError), head_speed.launch_shape("STAGE2_LAUNCH", {"BLOCK_D": 512, "num_warps": 8}):
        assert flashhead_triton.STAGE2_LAUNCH == {"BLOCK_D": 512, "num_warps": 8}
        raise RuntimeError("a shape that does not compile")
    assert flashhead_triton.STAGE2_LAUNCH is before  # restored, also after a failure


def test_head_speed_keeps_the_fastest_shape_and_compares_with_dense():
    rows = [{"launch": json.dumps({"BLOCK_D": 256}), "median_ms": 0.01}, {"launch": "{}", "median_ms": 0.02}]
    assert head_speed.best_shape(rows, {"BLOCK_D": 128}) == {"BLOCK_D": 256}
    assert head_speed.best_shape([], {"BLOCK_D": 128}) == {"BLOCK_D": 128}  # every shape failed: keep the current
    head_rows = [
        {"head": "dense", "in_graph": {"median_ms": 0.09}},
        {"head": "flashhead p=593 triton", "in_graph": {"median_ms": 0.03}},
    ]
    assert head_speed.dense_over_each(head_rows) == pytest.approx({"dense": 1.0, "flashhead p=593 triton": 3.0})


def test_awq_sweep_bytes_and_split_choices():
    groups = 5120 // 128
    assert (
        awq_sweep.gemm_bytes(5120, 10240)
        == (5120 * 10240 // 2 + groups * 10240 * 2 + groups * 10240 // 2 + 8 * (5120 + 10240) * 2)
        == 27_484_160
    )
    assert awq_sweep.ROWS == 8  # the rows every target decode forward of the decoder runs at K = 6
    assert awq_sweep.split_choices(5120, 10240, 128) == [1, 2, 4, 8]  # 40 steps: 16 does not divide them
    assert awq_sweep.split_choices(8192, 5120, 128) == [2, 4, 8, 16]  # 40 column blocks: 1 split is too few programs
    assert awq_sweep.split_choices(25600, 5120, 64) == [1, 2, 4, 8]


def test_awq_sweep_step_estimate_and_best():
    shapes = {
        "qkv": {
            "floor_ms": 0.005,
            "int4pack_ms": 0.05,
            "default": {"ms": 0.02},
            "best": {"ms": 0.01, "max_rel_err": 1e-3, "config": {"block_n": 128, "splits": 4}},
        },
        "down": {
            "floor_ms": 0.015,
            "int4pack_ms": 0.15,
            "default": {"ms": 0.03},
            "best": {"ms": 0.03, "max_rel_err": 2e-3, "config": {"block_n": 64, "splits": 8}},
        },
    }
    estimate = awq_sweep.step_estimate(shapes)
    assert estimate == pytest.approx({"floor_ms": 1.28, "int4pack_ms": 12.8, "default_ms": 3.2, "best_ms": 2.56})
    assert awq_sweep.format_estimate(estimate) == (
        "step estimate, 64 layers x 4 GEMMs: floor_ms 1.280, "
        "int4pack_ms 12.800 (10.00x floor), default_ms 3.200 (2.50x floor), "
        "best_ms 2.560 (2.00x floor)"
    )
    assert awq_sweep.best_per_shape(shapes)["qkv"] == {
        "ms": 0.01,
        "x_floor": 2.0,
        "int4pack_ms": 0.05,
        "max_rel_err": 1e-3,
        "config": {"block_n": 128, "splits": 4},
    }
    del shapes["down"]["best"]  # a shape whose every configuration failed or ran out of time
    assert awq_sweep.step_estimate(shapes)["best_ms"] is None
    assert "best_ms" not in awq_sweep.format_estimate(awq_sweep.step_estimate(shapes))
    assert list(awq_sweep.best_per_shape(shapes)) == ["qkv"]


def _timing(median: float) -> dict:
    return {"median_ms": median, "p10_ms": median * 0.9, "p90_ms": median * 1.1, "n": 5, "host_ms": 0.01}


def test_speed_file_has_every_field_the_goals_name_and_a_table_with_the_spread():
    measured = {
        "draft_step": _timing(0.8),
        "draft_step_flashhead": _timing(0.7),
        "draft_step_long": _timing(1.6),
        "draft_step_flashhead_long": _timing(1.5),
        "draft_floor_ms": 0.4,
        "draft_floor_flashhead_ms": 0.3,
        "draft_floor_long_ms": 0.5,
        "draft_floor_flashhead_long_ms": 0.4,
        "target_awq_step": _timing(9.6),
        "target_awq_floor_ms": 4.2,
        "prefill_awq": _timing(300.0),
        "prefill_awq_tflops": 250.0,
        "target_bf16_step": _timing(17.0),
        "target_bf16_floor_ms": 15.0,
        "prefill_bf16": _timing(200.0),
        "prefill_bf16_tflops": 400.0,
        "peak_gemm": _timing(1.5),
        "peak_tflops": 800.0,
        "hf_eager_draft": _timing(24.0),
        "hf_eager_target": _timing(60.0),
    }
    record = speed_file.speed_record(measured, "NVIDIA H200", "abc1234", 4300.0)
    assert set(speed_file.FIELDS) <= set(record)
    assert (record["draft_step_ms"], record["draft_floor_long_ms"], record["gpu"]) == (0.8, 0.5, "NVIDIA H200")
    assert record["share_of_bandwidth"]["target_awq_step"] == pytest.approx(4.2 / 9.6)
    assert record["prefill_share_of_peak"] == {"bf16": 0.5, "awq": 0.3125}
    assert record["weights"] == "synthetic"
    table = speed_file.markdown(record, "python -m measure.speed_file --out h200.json")
    assert "SYNTHETIC" in table and "abc1234" in table
    assert "| target 32B AWQ step, 1 token | 9.600 | 8.640 | 10.560 | 4.200 | 44% |" in table
    assert "| Hugging Face eager 32B bf16, 1 token, context 300 | 60.000 |" in table


def test_speed_file_floors_count_the_key_value_cache_and_prefill_counts_every_projection():
    model = load_model("tiny-qwen3", "cpu", seed=0, max_seq_len=64).model
    config = model.config
    assert speed_file.kv_cache_bytes(config, 300, 2) == 2 * config.n_layers * config.n_kv_heads * config.head_dim * 600
    projections = sum(m.weight.numel() for m in model.layers.modules() if isinstance(m, torch.nn.Linear))
    tokens = 10
    attention = 2 * config.n_layers * config.n_heads * config.head_dim * tokens * tokens
    head = 2 * config.vocab_size * config.hidden_size
    assert speed_file.prefill_flops(config, tokens) == 2 * projections * tokens + attention + head


def test_verify_speed_greedy_settle_accepts_the_leading_matches():
    drafts = torch.tensor([4, 7, 9])
    assert [t.tolist() for t in verify_speed.greedy_settle(drafts, torch.tensor([4, 7, 1, 5]))] == [[2], [1]]
    assert [t.tolist() for t in verify_speed.greedy_settle(drafts, torch.tensor([4, 7, 9, 5]))] == [[3], [5]]
    assert [t.tolist() for t in verify_speed.greedy_settle(drafts, torch.tensor([3, 7, 9, 5]))] == [[0], [3]]


def test_verify_speed_rounds_reject_where_asked_and_tie_when_asked():
    generator = torch.Generator().manual_seed(0)
    for K in (1, 4, 8):
        for reject_at in range(K + 1):
            p, q, drafts, uniforms, noise = verify_speed.synthetic_round(generator, K, 300, "cpu", reject_at=reject_at)
            assert p.shape == (K + 1, 300) and q.shape == (K, 300) and drafts.shape == uniforms.shape == (K,)
            assert (q > 0).float().mean() < 0.3 and torch.all(q[torch.arange(K), drafts] > 0)  # drawn from a shortlist
            assert verify_block_reference(p, q, drafts, uniforms, noise)[0].item() == reject_at
    p, _, _, _, noise = verify_speed.synthetic_round(generator, 4, 300, "cpu", ties=True)
    assert set(p.unique().tolist()) <= {0.0, 1.0, 2.0, 3.0, 4.0} and torch.all(noise == 1.0)


def test_verify_speed_row_line_shows_microseconds_and_the_floor_ratio():
    row = {"op": "sampling verify triton", "vocab": 262144, "K": 8, "graphs": "in graph", "floor_ms": 0.001}
    line = verify_speed.format_row({**row, "median_ms": 0.004, "p10_ms": 0.0035, "p90_ms": 0.005})
    assert line.startswith("sampling verify triton   V=262144  K=8  in graph")
    assert "4.00 us [3.50, 5.00]" in line and line.endswith("floor 1.00 us (4.0x)")
    assert "eager" in verify_speed.format_row(
        {**row, "graphs": False, "floor_ms": None, "median_ms": 0.01, "p10_ms": 0.01, "p90_ms": 0.01}
    )


def test_step_kernels_breaks_each_step_down_by_kernel_name_over_the_replays():
    long_name = "nvjet_sm90_" + "x" * 80
    replays = [
        [("norm", 0.0, 2.0), ("gemv", 1.5, 6.5), ("gemv", 7.0, 11.0), (long_name, 11.5, 20.0)],
        [("norm", 100.0, 103.0), ("gemv", 103.0, 107.0), ("gemv", 108.0, 110.0), (long_name, 110.0, 118.0)],
        [("norm", 200.0, 202.0), ("gemv", 202.5, 205.5), ("gemv", 206.0, 212.0), (long_name, 212.0, 230.0)],
    ]
    step, rows = step_kernels.step_breakdown(replays)
    assert step == {"span_us": 20.0, "busy_us": 19.5, "kernels": 4}  # spans 20, 18, 30; busy 19.5, 17, 29
    assert [row["kernel"] for row in rows] == ["gemv", long_name[: step_kernels.NAME_WIDTH], "norm"]  # by total
    gemv, head, norm = rows
    assert head["calls"] == 1 and head["median_us"] == 8.5 and head["total_us"] == 8.5
    assert gemv["calls"] == 2 and gemv["median_us"] == 4.0 and gemv["total_us"] == 9.0  # totals 9, 6, 9
    assert norm == {"kernel": "norm", "calls": 1, "median_us": 2.0, "total_us": 2.0}
    text = step_kernels.format_step({"step": "draft", "context": 300, **step}, rows, top=2)
    assert text.splitlines()[0] == "draft, context 300: 4 kernels, span 20.0 us, busy 19.5 us"
    assert len(text.splitlines()) == 3 and "gemv" in text.splitlines()[1]


def test_step_kernels_cuts_a_profile_into_its_calls_and_refuses_calls_that_differ():
    call = [("norm", 0.0, 1.0), ("gemv", 1.0, 3.0)]
    kernels = [(name, start + 10 * i, end + 10 * i) for i in range(3) for name, start, end in call]
    calls = step_kernels.split_calls(kernels, 3)
    assert [len(c) for c in calls] == [2, 2, 2] and calls[2][1] == ("gemv", 21.0, 23.0)
    with pytest.raises(RuntimeError, match="did not run the same kernels"):
        step_kernels.split_calls(kernels[:-1], 3)
    with pytest.raises(RuntimeError, match="did not run the same kernels"):
        step_kernels.split_calls([*kernels[:4], ("other", 20.0, 21.0), kernels[5]], 3)


def test_device_copies_needs_two_gpus_and_another_peer(monkeypatch):
    """Checked before any work: fewer than two GPUs, or --peer the same GPU as --device, or not a GPU."""
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(UsageError, match=r"^python -m measure\.device_copies needs two CUDA GPUs \(found 1\)$"):
        device_copies.require_peer(device_copies.COMMAND, torch.device("cuda", 0), "cuda:1")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    for peer in ("cuda:0", "cpu", "cuda"):
        with pytest.raises(UsageError, match=r"^--peer .*: give another CUDA GPU than --device, as cuda:N \(N < 2\)$"):
            device_copies.require_peer(device_copies.COMMAND, torch.device("cuda", 0), peer)
    assert device_copies.require_peer(device_copies.COMMAND, torch.device("cuda", 0), "cuda:1") == torch.device(
        "cuda", 1
    )


def test_device_copies_rows_print_their_table_mode_and_hand_over():
    timing = spread([0.2, 0.1, 0.3, 0.4, 0.5])
    assert timing == {"median_ms": 0.3, "p10_ms": pytest.approx(0.14), "p90_ms": pytest.approx(0.46), "n": 5}
    assert summarize([0.2, 0.1, 0.3], [1.0, 3.0, 2.0]) == {**spread([0.1, 0.2, 0.3]), "host_ms": 2.0}
    wait = device_copies.format_row({"table": "wait", "mode": "peer", "destination": "busy", **timing})
    assert " ".join(wait.split()) == "wait peer busy 0.300 ms [p10 0.140, p90 0.460]"
    hop = {"table": "hop", "mode": "pinned relay", "hops": 20, **timing, "hand_over_ms": 0.011}
    assert " ".join(device_copies.format_row(hop).split()) == (
        "hop pinned relay 20 hops 0.300 ms [p10 0.140, p90 0.460], a hand-over 0.011 ms"
    )


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--model", "qwen3-32b-awq"], "argument --model: invalid choice: 'qwen3-32b-awq'"),
        (["--n-tokens", "1,x"], "argument --n-tokens: expected an integer, got 'x'"),
        (["--n-tokens", "0"], "argument --n-tokens: must be at least 1, got 0"),
        (["--context", "4090", "--n-tokens", "1,8"], "--context 4090 plus 8 new tokens exceed 4096 positions"),
    ],
)
def test_the_hugging_face_reference_refuses_what_it_cannot_measure(argv, message, tmp_path, capsys):
    """Presets it cannot build (quantized, other architectures), token counts and contexts past its positions:
    one line, before any GPU is asked for."""
    assert hf_eager.main(["--out", str(tmp_path / "hf.json"), *argv]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0]
    assert list(tmp_path.iterdir()) == []
