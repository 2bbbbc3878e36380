"""python -m measure.routes on CPU: its --routes argument and row formatting (the GPU run itself is the
lead's; tests/test_measure_commands.py checks --help, --out, --reps and the refusal without a GPU)."""

from argparse import ArgumentTypeError
from types import SimpleNamespace

import pytest
import torch

from measure import routes
from model import awq_prefill, awq_triton, decoder, dense_gemv, fused_ops
from model.heads import DenseHead
from model.loading import load_model
from model.presets import PRESETS


def test_routes_parse_in_their_fixed_order():
    assert routes.parse_routes("all") == routes.ROUTES
    assert routes.parse_routes("draft-attention,awq-gemm") == ("awq-gemm", "draft-attention")
    assert routes.parse_routes(" awq-prefill ") == ("awq-prefill",)
    assert routes.parse_routes("draft-gemv,draft-layer") == ("draft-layer", "draft-gemv")
    assert routes.parse_routes("awq-prefill,awq-fixed-cost") == ("awq-fixed-cost", "awq-prefill")
    with pytest.raises(
        ArgumentTypeError,
        match=r"^unknown route prefil \(choices: awq-dequant, awq-gemm, awq-fixed-cost, awq-prefill, target-attention, "
        r"target-kernels, target-width, target-ablation, draft-attention, draft-layer, draft-gemv, draft-persistent, "
        r"draft-chain, draft-prefill or all\)$",
    ):
        routes.parse_routes("awq-gemm,prefil")


def test_bad_routes_are_one_line_and_exit_2(tmp_path, capsys):
    assert routes.main(["--out", str(tmp_path / "r.json"), "--routes", "fast"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "error: argument --routes: unknown route fast (choices: awq-dequant, awq-gemm, awq-fixed-cost, awq-prefill, "
        "target-attention, target-kernels, target-width, target-ablation, draft-attention, draft-layer, draft-gemv, "
        "draft-persistent, draft-chain, draft-prefill or all) "
        "(see python -m measure.routes --help)"
    ]
    assert list(tmp_path.iterdir()) == []


def test_target_width_settings_set_the_decoders_width_and_the_int4_programs_rows(monkeypatch):
    """target-width runs the old decoder first and the default last: each setting changes what a Decoder
    made after it runs (width) and the rows of an int4 GEMM program."""
    monkeypatch.setattr(decoder, "EXACT_WIDTH", decoder.EXACT_WIDTH)
    monkeypatch.setattr(awq_triton, "BLOCK_M", awq_triton.BLOCK_M)
    settings = list(routes.TARGET_WIDTHS.values())
    assert settings[0] == (16, 16) and settings[-1] == (decoder.EXACT_WIDTH, awq_triton.BLOCK_M)
    for width, rows in settings:
        routes.set_target_width(width, rows)
        assert decoder.width(6) == width and awq_triton.block_m(5) == rows and decoder.width(20) == 21


def test_target_ablation_takes_each_class_out_and_puts_every_kernel_back(monkeypatch):
    """target-ablation's first setting is the real step; each later one takes its classes out (a norm returns
    its input, the attention the q slice, a GEMM an empty output with or without a one-element launch), and
    the next setting puts every other kernel back."""
    for name in ("rms_norm", "qkv_attention"):
        monkeypatch.setattr(fused_ops, name, getattr(fused_ops, name))
    config = SimpleNamespace(n_heads=2, head_dim=4, hidden_size=6)
    model = SimpleNamespace(gemv_route=dense_gemv.Route(), config=config)
    real = (fused_ops.rms_norm, fused_ops.qkv_attention, model.gemv_route.project, model.gemv_route.mlp)
    assert list(routes.TARGET_ABLATIONS.values())[0] == ()
    h, qkv = torch.randn(3, 6), torch.randn(3, 16)
    linear = torch.nn.Linear(6, 5, bias=False)
    for taken_out in routes.TARGET_ABLATIONS.values():
        routes.set_target_ablation(model, taken_out)
        route = model.gemv_route
        assert (fused_ops.rms_norm is real[0]) == ("norms" not in taken_out)
        if "norms" in taken_out:
            assert all(part is h for part in fused_ops.rms_norm(h, None, 1e-6))
        assert (fused_ops.qkv_attention is real[1]) == ("attention" not in taken_out)
        if "attention" in taken_out:
            assert torch.equal(fused_ops.qkv_attention(qkv, None, 0.5), qkv[:, :8])
        assert (route.project == real[2] and route.mlp == real[3]) == ("gemms" not in taken_out)
        if "gemms" in taken_out:
            out, mlp_out = route.project(linear, h), route.mlp(None, h)
            assert out.shape == (3, 5) and mlp_out.shape == (3, 6)
            if "gemm launches" in taken_out:  # one launch a GEMM: the MLP's two
                assert out[0, 0] == 1 and (mlp_out[0, :2] == 1).all()
    routes.set_target_ablation(model, ())
    assert (fused_ops.rms_norm, fused_ops.qkv_attention, model.gemv_route.project) == real[:3]


def test_a_rounds_chained_draft_steps_propose_alike_in_every_graph_setting():
    """draft-chain times one computation three ways: each step fed the token the last one proposed, at the next
    position, whichever graphs replay it (on the CPU a graph is the plain call)."""
    model = load_model("tiny-qwen3-draft", "cpu", None, seed=2, max_seq_len=64).model
    # a head of its own: the tiny draft's tied head proposes the token it was fed
    head = DenseHead(torch.randn(model.head_weight.shape, generator=torch.Generator().manual_seed(0)))
    start = (torch.tensor([[5]]), torch.tensor([10]))
    tokens, position, want = start[0], start[1], []
    for _ in range(4):
        tokens = head.argmax(model.forward_hidden(tokens, position)[0, -1:]).view(1, 1)
        position = position + 1
        want.append(tokens.item())
    for setting in routes.CHAIN_GRAPHS:
        assert routes.chained_steps(setting, model, head, 4)(*start).tolist() == want, setting
    assert len(set(want)) > 1  # the steps did not all propose one token


def test_target_attention_settings_start_at_the_default_and_size_the_tickets_for_their_row_blocks(monkeypatch):
    """target-attention's first setting is what the 32B target runs, its second the uniform splits before
    session 27; each sets the split on the model and the short split, the program's rows and slots in
    fused_ops, with a ticket for every row block its widest forward has."""
    for name in ("SHORT_SPLIT_SLOTS", "ATTENTION_BLOCK_M", "ATTENTION_BLOCK_N"):
        monkeypatch.setattr(fused_ops, name, getattr(fused_ops, name))
    config = PRESETS["qwen3-32b-awq"]
    default_split = fused_ops.split_slots_for(config.n_heads, config.n_kv_heads)
    program = (fused_ops.SHORT_SPLIT_SLOTS, fused_ops.ATTENTION_BLOCK_M, fused_ops.ATTENTION_BLOCK_N)
    assert routes.TARGET_ATTENTION_CHOICES[0] == (default_split, *program)
    model = SimpleNamespace(config=config, head_weight=torch.zeros(1), attention_split_slots=default_split)
    group = config.n_heads // config.n_kv_heads
    for slots, short, rows, step in routes.TARGET_ATTENTION_CHOICES:
        routes.set_target_attention(model, slots, short, rows, step)
        program = (fused_ops.SHORT_SPLIT_SLOTS, fused_ops.ATTENTION_BLOCK_M, fused_ops.ATTENTION_BLOCK_N)
        assert (model.attention_split_slots, *program) == (slots, short, rows, step)
        row_blocks = -(-group * fused_ops.SPLIT_MAX_TOKENS // rows)
        assert model.attention_tickets.shape == (config.n_kv_heads * row_blocks,)
        assert not model.attention_tickets.any()
    names = [routes.attention_setting_name(*choice) for choice in routes.TARGET_ATTENTION_CHOICES]
    assert names[:3] == [
        "split 512 (128 below), 16 rows, 64 slots",
        "split 512, 16 rows, 64 slots",
        "off, 16 rows, 64 slots",
    ]
    assert len(set(names)) == len(names)


def test_target_kernel_settings_turn_on_one_after_another_and_repack_gate_up_only_on_a_change(monkeypatch):
    assert routes.target_kernel_choices() == {
        "all off": (False, False, False, False, False, False),
        "signal next": (True, False, False, False, False, False),
        "swiglu in gemm": (True, True, False, False, False, False),
        "early after norms": (True, True, True, False, False, False),
        "early after gemms": (True, True, True, True, False, False),
        "norms in gemms": (True, True, True, True, True, False),
        "early after attention": (True, True, True, True, True, True),
    }
    repacked = []

    class GateUp:
        gate_up = True
        launch_early = False

        def select_kernel(self, kernel, dtype):
            repacked.append((kernel, dtype, self.gate_up))

    def layer():
        attention = SimpleNamespace(
            qkv_proj=SimpleNamespace(launch_early=False), o_proj=SimpleNamespace(launch_early=False)
        )
        return SimpleNamespace(
            self_attn=attention, mlp=SimpleNamespace(gate_up_proj=GateUp(), down_proj=SimpleNamespace())
        )

    def early(model):  # (q/k/v, o, gate/up, down) of each layer
        return {
            (layer.self_attn.qkv_proj.launch_early, layer.self_attn.o_proj.launch_early,
             layer.mlp.gate_up_proj.launch_early, layer.mlp.down_proj.launch_early)
            for layer in model.layers
        }  # fmt: skip

    model = SimpleNamespace(layers=[layer() for _ in range(2)])
    monkeypatch.setattr(awq_triton, "SIGNAL_NEXT", True)
    routes.set_target_kernels(model, True, True)
    assert (awq_triton.SIGNAL_NEXT, repacked, early(model)) == (True, [], {(False, False, False, False)})
    routes.set_target_kernels(model, True, True, True)
    assert early(model) == {(True, False, True, False)}
    routes.set_target_kernels(model, True, True, False, True)
    assert early(model) == {(False, False, False, True)}
    routes.set_target_kernels(model, True, True, False, False, True)
    assert (early(model), model.norms_in_gemms) == ({(False, False, False, False)}, True)
    routes.set_target_kernels(model, True, True, False, False, False, True)
    assert (early(model), model.norms_in_gemms) == ({(False, True, False, False)}, False)
    routes.set_target_kernels(model, True, True, True, True, True, True)
    assert early(model) == {(True, True, True, True)}
    assert routes.target_kernel_state(model) == (True,) * 6
    routes.set_target_kernels(model, False, False)
    assert awq_triton.SIGNAL_NEXT is False
    assert repacked == [("triton", torch.bfloat16, False)] * 2
    assert (early(model), model.norms_in_gemms) == ({(False, False, False, False)}, False)


def test_awq_shapes_are_the_merged_projections_of_qwen3_32b():
    shapes = routes.awq_shapes(PRESETS["qwen3-32b-awq"])
    assert shapes == {"qkv": (5120, 10240), "o": (8192, 5120), "gate_up": (5120, 51200), "down": (25600, 5120)}
    largest = max(i * o for i, o in shapes.values())
    assert awq_prefill.largest_linear_elements(PRESETS["qwen3-32b-awq"]) == largest  # the buffer fits every one


def test_rows_format_with_their_units():
    timing = {"median_ms": 2.0, "p10_ms": 1.9, "p90_ms": 2.2}
    gemm = {"route": "awq-gemm", "setting": "triton", "shape": "qkv", "rows": 128, **timing, "tflops": 53.7}
    assert " ".join(routes.format_row(gemm).split()) == (
        "awq-gemm triton shape qkv x 128 rows 2.000 ms [p10 1.900, p90 2.200], 54 TFLOPS"
    )
    step = {"route": "draft-attention", "setting": "split 128", "context": 4000, **timing, "floor_ms": 0.5}
    assert routes.format_row(step).endswith("floor 0.500 ms (25% of bandwidth)")
    counted = routes.format_row({**step, "kernels_per_step": 290, "layers": 28})
    assert counted.endswith("(25% of bandwidth), 290 kernels a step (28 layers)")
    phases = {"q/k/v": {"work_us": 2.0, "wait_us": 0.8}, "attention": {"work_us": 7.44, "wait_us": 0.75}}
    traced = routes.format_row({**step, "max_abs_diff": 0.156, "phases_us": phases}).splitlines()
    assert traced[0].endswith("(25% of bandwidth), hidden max |diff| 0.156")
    assert (
        traced[1]
        == "    a layer's phases, work + barrier (us, medians over layers): q/k/v 2.0 + 0.8; attention 7.4 + 0.8"
    )
    prefill = {
        "route": "awq-prefill",
        "setting": "on",
        "tokens": 2048,
        **timing,
        "tflops": 400.0,
        "share_of_peak": 0.54,
    }
    assert routes.format_row(prefill).endswith("400 TFLOPS (54% of peak)")
    dequant = {"route": "awq-dequant", "setting": "32x256 w4", "shape": "gate_up", **timing, "gbs": 327.7}
    assert routes.format_row(dequant).endswith("[p10 1.900, p90 2.200], 328 GB/s")


def test_fixed_cost_line_parts_the_time_at_zero_bytes_from_the_rate():
    rate_gbs, fixed_us = 2500.0, 6.0
    points = [(n, fixed_us / 1e3 + n / rate_gbs / 1e6) for n in (5_600_000, 11_100_000, 22_300_000, 89_100_000)]
    fixed, rate = routes.fixed_cost_line(points)
    assert fixed == pytest.approx(fixed_us) and rate == pytest.approx(rate_gbs)
    planes = routes.random_planes(512, 256, torch.Generator().manual_seed(0))  # the route's weights
    assert planes.codes.shape == (2, 4, 128, 16) and planes.groups.shape == (2, 4, 128)
    with pytest.raises(ValueError, match="two or more distinct byte counts"):
        routes.fixed_cost_line([(100, 0.1), (100, 0.2)])
    fit = {"route": "awq-fixed-cost", "setting": "split-K", "fixed_us": 6.1, "streaming_gbs": 2689.4}
    assert " ".join(routes.format_row({**fit, "share_of_bandwidth": 0.66}).split()) == (
        "awq-fixed-cost split-K fit 6.1 us fixed + the bytes at 2689 GB/s (66% of copy)"
    )


def test_gemv_sweep_keeps_dividing_splits_and_picks_one_launch_per_shape_over_all_rows():
    launches = routes.gemv_launches(3072, 1024)  # Qwen3-0.6B's down: 24 steps of 128 inputs, 12 of 256
    assert launches and all(-(-3072 // launch["BLOCK_K"]) % launch["splits"] == 0 for launch in launches)
    assert all(64 <= -(-1024 // launch["BLOCK_N"]) * launch["splits"] <= 1024 for launch in launches)
    timing = {"p10_ms": 0.0, "p90_ms": 0.0}
    rows = [
        {"setting": "cublas", "rows": 1, "median_ms": 0.001, **timing},
        {"setting": "64x128 s2 w4 p3", "rows": 1, "median_ms": 0.002, **timing},
        {"setting": "64x128 s2 w4 p3", "rows": 16, "median_ms": 0.009, **timing},
        {"setting": "32x256 s4 w8 p4", "rows": 1, "median_ms": 0.004, **timing},
        {"setting": "32x256 s4 w8 p4", "rows": 16, "median_ms": 0.005, **timing},
    ]
    assert routes.fastest_gemv_launch(rows) == {  # least summed time, cuBLAS never chosen
        "BLOCK_N": 32,
        "BLOCK_K": 256,
        "splits": 4,
        "num_warps": 8,
        "num_stages": 4,
    }
    assert routes.gemv_setting(routes.fastest_gemv_launch(rows)) == "32x256 s4 w8 p4"
    row = {"route": "draft-gemv", "setting": "cublas", "draft": "qwen3-0.6b", "shape": "o 2048x1024", "rows": 4}
    line = routes.format_row({**row, "median_ms": 0.004, **timing, "gbs": 1048.6, "share_of_bandwidth": 0.25})
    assert " ".join(line.split()).startswith("draft-gemv cublas qwen3-0.6b o 2048x1024 x 4 rows 0.004 ms")
    assert line.endswith("1049 GB/s (25% of copy)")


def test_draft_prefill_times_every_setting_at_every_prompt_length(monkeypatch):
    """draft-prefill on the CPU with the tiny draft (SYNTHETIC weights): a row per prompt length and setting,
    eager first and the decoder's widths last, each with its timing and TFLOPS; the line names the length."""
    tiny = load_model("tiny-qwen3-draft", "cpu", None, seed=2, max_seq_len=64)
    monkeypatch.setattr(routes, "load_model", lambda *args, **kwargs: tiny)
    monkeypatch.setattr(routes, "PREFILL_PROMPTS", (5, 21))
    monkeypatch.setattr(routes, "PREFILL_CHUNKS", (4, 8))
    monkeypatch.setattr(routes, "CHUNK_WIDTHS", (4, 16))
    rows = routes.draft_prefill_rows(torch.device("cpu"), reps=2)
    settings = ["eager", "chunks of 4", "chunks of 8", "decoder's widths"]
    assert [(row["prompt_len"], row["setting"]) for row in rows] == [(n, s) for n in (5, 21) for s in settings]
    assert all(row["median_ms"] > 0 and row["tflops"] > 0 for row in rows)
    assert " ".join(routes.format_row(rows[-1]).split()).startswith("draft-prefill decoder's widths prompt_len 21 ")
