"""AWQ prefill through dequantization and torch.matmul (model/awq_prefill.py): the dequantization kernel is
AWQLinear.dequantize() bit for bit, layers take the route from PREFILL_ROWS rows only, load_model gives a
model one buffer and counts it, and speculative output stays target-only greedy with a prompt long enough
to take the route (CPU: triton's interpreter; GPU: the kernel as it runs)."""

import pytest
import torch
import torch.nn.functional as F

from model import awq_prefill, loading, triton_support
from model.awq import AWQLinear
from model.decoder import Decoder
from model.heads import DenseHead
from model.loading import load_model
from model.presets import PRESETS

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
needs_triton = pytest.mark.skipif(
    not triton_support.runs_on(DEVICE), reason="needs triton (on the CPU, its interpreter runs the kernels)"
)
# The interpreter rounds float32 to bfloat16 by truncation, the GPU to nearest even (as torch does).
DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if DEVICE.type == "cuda" else [])


def _layer(in_features, out_features, group_size, seed=0):
    layer = AWQLinear(in_features, out_features, group_size)
    layer.randomize_(torch.Generator().manual_seed(seed))
    return layer.to(DEVICE)


@needs_triton
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(256, 128, 64), (96, 40, 32), (160, 264, 32), (128, 512, 128)])
def test_dequantization_kernel_is_the_reference_bit_for_bit(shape, dtype):
    layer = _layer(*shape)
    want = layer.dequantize().t().to(dtype)  # [in, out], float32 values rounded once
    got = torch.full((shape[0], shape[1]), float("nan"), dtype=dtype, device=DEVICE)
    awq_prefill.dequantize_into(layer.qweight, layer.qzeros, layer.scales, layer.group_size, got)
    assert torch.equal(got, want)


def test_torch_dequantization_is_the_reference_bit_for_bit(monkeypatch):
    monkeypatch.setattr(triton_support, "runs_on", lambda device: False)
    layer = _layer(96, 40, 32).cpu()
    got = torch.empty(96, 40)
    awq_prefill.dequantize_into(layer.qweight, layer.qzeros, layer.scales, layer.group_size, got)
    assert torch.equal(got, layer.dequantize().t())
    with pytest.raises(ValueError, match="contiguous"):
        awq_prefill.dequantize_into(layer.qweight, layer.qzeros, layer.scales, layer.group_size, got.t())


@needs_triton
def test_layers_take_the_dequantized_route_from_the_threshold_on(monkeypatch):
    layer = _layer(128, 64, 32)
    layer.select_kernel(dtype=torch.float32)
    model = torch.nn.Sequential(layer)
    awq_prefill.attach(model, torch.float32, rows=20)
    assert layer.prefill_buffer.numel() == 128 * 64
    calls = []
    route = awq_prefill.dense_matmul
    monkeypatch.setattr(awq_prefill, "dense_matmul", lambda lay, x: calls.append(x.shape) or route(lay, x))
    g = torch.Generator().manual_seed(1)
    for rows, routed in ((19, False), (20, True), (33, True)):
        x = torch.randn(1, rows, 128, generator=g).to(DEVICE)
        got = layer(x)
        assert (len(calls) > 0) == routed
        calls.clear()
        want = F.linear(x, layer.dequantize())
        assert got.shape == want.shape and (got - want).abs().max() <= 1e-5 * want.abs().max()
    awq_prefill.set_rows(model, None)  # the route off: the selected kernel at every row count
    layer(torch.randn(1, 40, 128, generator=g).to(DEVICE))
    assert not calls


def test_load_model_shares_one_buffer_and_counts_it(monkeypatch):
    asked = []
    monkeypatch.setattr(loading, "check_fits", lambda what, need, device, advice: asked.append((what, need)))
    model = load_model("tiny-qwen3-awq", "cpu", "float32", seed=1, max_seq_len=8).model
    layers = [m for m in model.modules() if isinstance(m, AWQLinear)]
    assert len({id(layer.prefill_buffer) for layer in layers}) == 1
    assert all(layer.prefill_rows == awq_prefill.PREFILL_ROWS for layer in layers)
    config = PRESETS["tiny-qwen3-awq"]
    largest = max(layer.in_features * layer.out_features for layer in layers)
    assert layers[0].prefill_buffer.numel() == largest  # unmerged (torch kernels): 64 x 128 or 128 x 64
    assert largest < awq_prefill.largest_linear_elements(config) == 64 * 2 * 128  # merged gate/up: the bound
    assert awq_prefill.buffer_bytes(config, torch.float32) == 4 * 64 * 2 * 128
    with_buffer = dict(asked)["tiny-qwen3-awq in float32"]
    asked.clear()
    monkeypatch.setattr(awq_prefill, "buffer_bytes", lambda config, dtype: 0)
    load_model("tiny-qwen3-awq", "cpu", "float32", seed=1, max_seq_len=8)
    assert with_buffer - dict(asked)["tiny-qwen3-awq in float32"] == 4 * 64 * 2 * 128
    assert awq_prefill.buffer_bytes(PRESETS["tiny-qwen3"], torch.float32) == 0


@needs_triton
@pytest.mark.parametrize("kernels", ["torch"] + (["fused"] if DEVICE.type == "cuda" else []))  # fused: slow interpreted
def test_speculative_output_is_target_greedy_with_a_prefill_that_takes_the_route(kernels, monkeypatch):
    prompt_len, new = awq_prefill.PREFILL_ROWS + 9, 10
    room = prompt_len + 48
    target = load_model("tiny-qwen3-awq", DEVICE, "float32", seed=1, max_seq_len=room, kernels=kernels).model
    draft = load_model("tiny-qwen3-draft", DEVICE, "float32", seed=2, max_seq_len=room, kernels=kernels).model
    calls = []
    route = awq_prefill.dense_matmul
    monkeypatch.setattr(awq_prefill, "dense_matmul", lambda lay, x: calls.append(x.shape) or route(lay, x))
    prompt = torch.randint(0, 512, (prompt_len,), generator=torch.Generator().manual_seed(0)).tolist()
    want = Decoder(target, K=1, graphs=False).reference(prompt, new)
    assert calls and all(shape[-2] >= awq_prefill.PREFILL_ROWS for shape in calls)  # only the prompt's rows
    decoder = Decoder(target, draft, DenseHead(draft.head_weight), K=3, graphs=False)
    for schedule in ("baseline", "ordinary", "pipelined", "deferred", "pipelined-deferred"):
        assert decoder.generate(prompt, new, schedule).tokens == want, schedule
