"""The residual add and RMSNorm fused into the GEMMs around it (model/gemm_norms.py): against the norm kernel
between two projections, row by row, and in whole forwards and speculative runs (dense route and AWQ int4);
on the GPU where there is one, else on the CPU under triton's interpreter (float32)."""

import pytest
import torch

from model import awq_triton, dense_gemv, fused_ops, gemm_norms, triton_support
from model.awq import AWQLinear, unpack_int4
from model.decoder import Decoder
from model.heads import DenseHead
from model.loading import load_model

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
pytestmark = pytest.mark.skipif(
    not triton_support.runs_on(DEVICE), reason="needs triton (on the CPU, its interpreter runs the kernels)"
)
TOL = 1e-5 if DEVICE.type == "cpu" else 3e-3  # relative to the largest value (TF32 dots on a GPU)
EPS = 1e-6
SMALL = {"BLOCK_N": 32, "BLOCK_K": 64, "num_warps": 4, "num_stages": 2}


def _dense(in_features, out_features, seed):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(out_features, in_features, generator=g) / in_features**0.5).to(DEVICE)


def _awq_planes(in_features, out_features, seed):
    layer = AWQLinear(in_features, out_features, 64)
    layer.randomize_(torch.Generator().manual_seed(seed))
    return awq_triton.pack_planes(
        unpack_int4(layer.qweight), unpack_int4(layer.qzeros), layer.scales, layer.group_size, 32
    )


def _kernels(kind, splits):
    """(project(x, which, residual=None), widths): two projections 256 -> 96 (AWQ: 256) -> 64 of one kernel."""
    if kind == "dense":
        weights = [_dense(256, 96, 1), _dense(96, 64, 2)]

        def project(x, which, residual=None):
            return dense_gemv.gemv(x, weights[which], launch={**SMALL, "splits": splits}, residual=residual)

        return project
    planes = [_awq_planes(256, 256, 1), _awq_planes(256, 64, 2)]

    def project(x, which, residual=None):
        return awq_triton.w4a16_matmul(x, planes[which], splits=splits, residual=residual)

    return project


def _inputs(rows, width, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(rows, n, generator=g).to(DEVICE) for n in (256, width, width)]  # x, residual, norm weight


@pytest.mark.parametrize("splits", [1, 2])
@pytest.mark.parametrize("kind", ["dense", "awq"])
def test_the_fused_pair_is_the_norm_kernel_between_the_two_projections(kind, splits):
    project = _kernels(kind, splits)
    width = 96 if kind == "dense" else 256
    for rows in (1, 5, 16):
        x, residual, weight = _inputs(rows, width, seed=rows)
        weight = weight[0]
        want_hidden, want_x = fused_ops.rms_norm(residual, weight, EPS, project(x, 0))
        want = project(want_x, 1)
        hidden, squares = project(x, 0, residual=residual)
        assert torch.equal(hidden, want_hidden)  # the add is elementwise: the same bits
        assert squares.shape == (width // 32, rows)
        assert torch.allclose(squares.sum(0), (hidden * hidden).sum(1), rtol=1e-5)
        got = project(gemm_norms.PendingNorm(hidden, squares, weight, EPS), 1)
        assert (got - want).abs().max() <= TOL * want.abs().max()
        # control: without the norm weight the consumer computes something else
        wrong = project(gemm_norms.PendingNorm(hidden, squares, torch.ones_like(weight), EPS), 1)
        assert (wrong - want).abs().max() > 100 * TOL * want.abs().max()


@pytest.mark.parametrize("kind", ["dense", "awq"])
def test_a_fused_row_depends_only_on_its_own_row_bitwise(kind):
    project = _kernels(kind, 2)
    width = 96 if kind == "dense" else 256
    x, residual, weight = _inputs(16, width, seed=7)

    def chain(x, residual):
        return project(gemm_norms.PendingNorm(*project(x, 0, residual=residual), weight[0], EPS), 1)

    full = chain(x, residual)
    other_x, other_residual, _ = _inputs(16, width, seed=8)
    other_x[3], other_residual[3] = x[3], residual[3]
    assert torch.equal(full[3], chain(other_x, other_residual)[3])
    assert torch.equal(full[3:4], chain(x[3:4].clone(), residual[3:4].clone()))  # not on the row count
    assert torch.equal(full, chain(x, residual))  # reproducible


def _fused_model(spec):
    model = load_model(spec, DEVICE, "float32", seed=1, max_seq_len=48, kernels="fused").model
    if model.config.quant == "awq":
        for layer in model.modules():
            if isinstance(layer, AWQLinear):
                layer.select_kernel("triton", torch.float32)
    else:
        dense_gemv.attach(model, 16)
    return model


@pytest.mark.parametrize("spec", ["tiny-qwen3", "tiny-qwen3-awq"])
def test_a_forward_fuses_every_norm_but_the_last_and_matches_the_unfused_one(spec, monkeypatch):
    model = _fused_model(spec)
    prompt = torch.randint(0, 512, (1, 20), generator=torch.Generator().manual_seed(0)).to(DEVICE)
    step = (prompt[:, :3], torch.arange(20, 23, device=DEVICE))
    model.forward_hidden(prompt, torch.arange(20, device=DEVICE))
    norms = []
    norm_kernel = fused_ops.rms_norm
    monkeypatch.setattr(fused_ops, "rms_norm", lambda *args: norms.append(1) or norm_kernel(*args))
    assert model.gemv_route.fuses_norms(model.layers[0], 3)
    fused = model.forward_hidden(*step)
    assert len(norms) == 2  # the first layer's input and the final norm
    monkeypatch.setattr(dense_gemv.Route, "fuses_norms", lambda *args: False)
    unfused = model.forward_hidden(*step)
    assert len(norms) == 2 + 2 * model.config.n_layers + 1
    assert (fused - unfused).abs().max() <= 100 * TOL * unfused.abs().max()


def test_a_tensor_parallel_hook_or_a_prompt_keeps_the_norm_kernel():
    model = _fused_model("tiny-qwen3")
    assert not model.gemv_route.fuses_norms(model.layers[0], 17)  # past the route's rows: F.linear
    handle = model.layers[0].self_attn.o_proj.register_forward_hook(lambda *args: None)
    assert not model.gemv_route.fuses_norms(model.layers[0], 3)
    handle.remove()
    assert model.gemv_route.fuses_norms(model.layers[0], 3)


@pytest.mark.parametrize("schedule", ["ordinary", "deferred"])
def test_speculative_output_stays_target_greedy_with_fused_norms(schedule):
    target, draft = _fused_model("tiny-qwen3-awq"), _fused_model("tiny-qwen3-draft")
    prompt = list(b"Hello")
    want = Decoder(target, K=1, graphs=False).reference(prompt, 6)
    got = Decoder(target, draft, DenseHead(draft.head_weight), K=3, graphs=False).generate(prompt, 6, schedule)
    assert got.tokens == want
