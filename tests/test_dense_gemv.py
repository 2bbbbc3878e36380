"""The dense GEMV (model/dense_gemv.py) against F.linear, its bits across rows, and the draft's route to it:
on the GPU where there is one, else on the CPU under triton's interpreter (float32: its bfloat16 dot is wrong)."""

import pytest
import torch
import torch.nn.functional as F

from model import dense_gemv, fused_ops, triton_support
from model.decoder import Decoder
from model.heads import DenseHead
from model.loading import load_model
from model.pair import load_pair

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
pytestmark = pytest.mark.skipif(
    not triton_support.runs_on(DEVICE), reason="needs triton (on the CPU, its interpreter runs the kernels)"
)
TOL = 1e-5 if DEVICE.type == "cpu" else 3e-3  # relative to the largest value (tl.dot rounds float32 to TF32 on a GPU)
SMALL = {"BLOCK_N": 32, "BLOCK_K": 64, "num_warps": 4, "num_stages": 2}


def _operands(rows: int, in_features: int, out_features: int, seed: int = 0, silu: bool = False):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, 2 * in_features if silu else in_features, generator=g)
    weight = torch.randn(out_features, in_features, generator=g) / in_features**0.5
    return x.to(DEVICE), weight.to(DEVICE)


@pytest.mark.parametrize("silu", [False, True])
@pytest.mark.parametrize(("in_features", "out_features"), [(256, 96), (200, 72)])  # whole tiles; partial ones
def test_gemv_matches_f_linear_at_every_row_count_and_split(in_features, out_features, silu):
    for rows in (1, 5, 16, 17):
        x, weight = _operands(rows, in_features, out_features, seed=rows, silu=silu)
        want = F.linear(fused_ops.silu_mul(x) if silu else x, weight)
        for splits in (1, 2):
            got = dense_gemv.gemv(x, weight, silu=silu, launch={**SMALL, "splits": splits})
            assert got.shape == want.shape and got.dtype == x.dtype
            assert (got - want).abs().max() <= TOL * want.abs().max()


@pytest.mark.skipif(DEVICE.type != "cuda", reason="the interpreter's bfloat16 dot is wrong")
@pytest.mark.parametrize("silu", [False, True])
def test_bfloat16_gemv_is_f_linear_to_bfloat16_rounding_with_the_default_launch(silu):
    for rows in (1, 4, 16):
        x, weight = _operands(rows, 1024, 4096 if not silu else 1024, seed=rows, silu=silu)
        x, weight = x.bfloat16(), weight.bfloat16()
        want = F.linear((fused_ops.silu_mul(x) if silu else x).float(), weight.float())
        got = dense_gemv.gemv(x, weight, silu=silu)
        assert got.dtype == torch.bfloat16 and (got.float() - want).abs().max() <= 1e-2 * want.abs().max()


def test_swiglu_fused_into_the_load_is_bit_for_bit_silu_mul_then_gemv():
    x, weight = _operands(3, 256, 64, silu=True)
    launch = {**SMALL, "splits": 2}
    assert torch.equal(
        dense_gemv.gemv(x, weight, silu=True, launch=launch),
        dense_gemv.gemv(fused_ops.silu_mul(x), weight, launch=launch),
    )


def test_a_row_depends_only_on_its_own_input_bitwise_and_split_k_leaves_tickets_zero():
    x, weight = _operands(16, 256, 96, seed=3)
    other, _ = _operands(16, 256, 96, seed=4)
    other[3] = x[3]
    tickets = torch.zeros(8, dtype=torch.int32, device=DEVICE)
    for splits in (1, 4):
        launch = {**SMALL, "splits": splits}
        full = dense_gemv.gemv(x, weight, launch=launch, tickets=tickets)
        assert not tickets.any()
        assert torch.equal(full[3], dense_gemv.gemv(other, weight, launch=launch, tickets=tickets)[3])
        assert torch.equal(full[:5], dense_gemv.gemv(x[:5].clone(), weight, launch=launch))  # not on the row count
        assert torch.equal(full[3:4], dense_gemv.gemv(x[3:4].clone(), weight, launch=launch))
        assert torch.equal(full, dense_gemv.gemv(x, weight, launch=launch, tickets=tickets))  # reproducible
    # control: another split changes the summation order, so the bits may move but only within rounding
    two = dense_gemv.gemv(x, weight, launch={**SMALL, "splits": 2})
    assert (two - full).abs().max() <= TOL * full.abs().max()


def test_gemv_refuses_what_it_cannot_run():
    x, weight = _operands(2, 256, 64)
    with pytest.raises(ValueError, match="splits 3"):
        dense_gemv.gemv(x, weight, launch={**SMALL, "splits": 3})  # 4 steps of 64 inputs
    with pytest.raises(ValueError, match="does not fit"):
        dense_gemv.gemv(x[:, :128], weight)
    with pytest.raises(ValueError, match="does not fit"):
        dense_gemv.gemv(x, weight, silu=True)  # gate and up need 2 x 256 inputs
    with pytest.raises(ValueError, match="float16"):
        dense_gemv.gemv(x.double(), weight.double())


def test_route_sends_few_rows_to_the_kernel_and_the_prompt_to_f_linear(monkeypatch):
    model = load_model("tiny-qwen3", DEVICE, "float32", seed=1, max_seq_len=40, kernels="fused").model
    prompt = torch.randint(0, 512, (1, 17), generator=torch.Generator().manual_seed(0)).to(DEVICE)
    pos = torch.arange(17, device=DEVICE)
    step = (prompt[:, :3], torch.arange(17, 20, device=DEVICE))
    off = [model.forward_hidden(prompt, pos), model.forward_hidden(*step)]
    calls = []
    kernel = dense_gemv.gemv
    monkeypatch.setattr(dense_gemv, "gemv", lambda x, *args, **kw: calls.append(x.shape[0]) or kernel(x, *args, **kw))
    dense_gemv.attach(model, 16)
    assert model.gemv_route.rows == 16
    on = model.forward_hidden(prompt, pos)
    assert calls == [] and torch.equal(on, off[0])  # 17 rows: F.linear, the same bits
    on = model.forward_hidden(*step)
    assert calls == [3] * 4 * model.config.n_layers  # qkv, o, gate/up, down (SwiGLU fused) per layer
    assert (on - off[1]).abs().max() <= 100 * TOL * off[1].abs().max()
    dense_gemv.attach(model, None)
    assert model.gemv_route is dense_gemv.OFF
    with pytest.raises(ValueError, match="rows 17"):
        dense_gemv.attach(model, 17)
    other = load_model("tiny-qwen3-awq", DEVICE, "float32", seed=1, max_seq_len=8, kernels="torch").model
    dense_gemv.attach(other, 16)
    assert other.gemv_route is dense_gemv.OFF  # the torch path and int4 layers keep their own kernels


def test_draft_on_the_route_keeps_speculative_output_target_greedy(monkeypatch):
    monkeypatch.setattr(dense_gemv, "DRAFT_ROWS", 16)
    placement = "one-gpu" if DEVICE.type == "cuda" else "cpu"
    pair = load_pair("tiny-qwen3", "tiny-qwen3-draft", placement, "float32", seed=1, kernels="fused", max_seq_len=48)
    target, draft = pair.target.model, pair.draft.model
    assert target.gemv_route is dense_gemv.OFF and draft.gemv_route.rows == 16
    prompt = list(b"Hi")
    want = Decoder(target, K=1, graphs=False).reference(prompt, 5)
    got = Decoder(target, draft, DenseHead(draft.head_weight), K=2, graphs=False).generate(prompt, 5, "deferred")
    assert got.tokens == want
