"""AWQ layout and kernels: packing matches AutoAWQ's, every kernel that runs here matches the
dequantized reference, and a whole AWQ model agrees across kernels."""

import pytest
import torch
from torch import nn

from model.awq import AWQ_PACK_ORDER, KERNELS, AWQLinear, KernelUnavailable, pack_int4, unpack_int4
from model.loading import load_model


def _autoawq_pack(codes: torch.Tensor) -> torch.Tensor:
    """AutoAWQ's WQLinear_GEMM packing loop, transcribed: the layout checkpoints hold."""
    packed = torch.zeros(codes.shape[0], codes.shape[1] // 8, dtype=torch.int32)
    for col in range(codes.shape[1] // 8):
        for i in range(8):
            packed[:, col] |= codes[:, col * 8 + AWQ_PACK_ORDER[i]].to(torch.int32) << (i * 4)
    return packed


def test_packing_is_autoawq_layout_and_round_trips():
    codes = torch.randint(0, 16, (6, 24), generator=torch.Generator().manual_seed(0))
    packed = pack_int4(codes)
    assert packed.dtype == torch.int32 and packed.shape == (6, 3)
    assert torch.equal(packed, _autoawq_pack(codes))
    assert torch.equal(unpack_int4(packed), codes.to(torch.int32))


def test_from_float_quantizes_within_half_a_step():
    linear = nn.Linear(64, 32, bias=False)
    layer = AWQLinear.from_float(linear, group_size=32)
    assert layer.qweight.shape == (64, 4) and layer.qzeros.shape == (2, 4) and layer.scales.shape == (2, 32)
    step = layer.scales.float().repeat_interleave(32, dim=0).t()  # [out, in]
    assert ((layer.dequantize() - linear.weight).abs() <= 0.51 * step + 1e-6).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kernel", KERNELS)
def test_every_available_kernel_matches_the_dequantized_reference(kernel, dtype):
    device = "cuda" if kernel in ("awq_ext", "int4pack_cuda") else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    generator = torch.Generator().manual_seed(1)
    linear = nn.Linear(128, 48, bias=False)
    nn.init.normal_(linear.weight, std=0.05, generator=generator)
    layer = AWQLinear.from_float(linear.to(device), group_size=64)
    try:
        layer.select_kernel(kernel, dtype=dtype)
    except KernelUnavailable as why:
        pytest.skip(str(why))
    assert layer.kernel == kernel
    x = torch.randn(2, 5, 128, generator=generator).to(device=device, dtype=dtype)
    want = torch.nn.functional.linear(x.float(), layer.dequantize())
    got = layer(x)
    assert got.shape == (2, 5, 48) and got.dtype == dtype
    tolerance = 1e-4 if dtype == torch.float32 and kernel == "dequant" else 0.02
    torch.testing.assert_close(got.float(), want, rtol=tolerance, atol=tolerance * want.abs().max().item())


def test_kernel_selection_prefers_fast_paths_and_rejects_unknown_names():
    layer = AWQLinear.from_float(nn.Linear(64, 32, bias=False), group_size=32)
    assert layer(torch.randn(1, 64)).shape == (1, 32)  # the first forward selects
    assert layer.kernel in ("int4pack_cpu", "dequant")
    with pytest.raises(ValueError):
        layer.select_kernel("marlin")
    with pytest.raises(KernelUnavailable):
        layer.select_kernel("int4pack_cuda")


def test_awq_model_agrees_across_kernels():
    loaded = load_model("tiny-qwen3-awq", max_seq_len=16)
    model = loaded.model
    assert loaded.info["quantization"] == "awq-int4-g32" and loaded.info["kernel"] == "int4pack_cpu"
    tokens = torch.randint(0, 512, (1, 10), generator=torch.Generator().manual_seed(2))
    fast = model(tokens, torch.arange(10))
    for module in model.modules():
        if isinstance(module, AWQLinear):
            module.select_kernel("dequant")
    reference = model(tokens, torch.arange(10))
    torch.testing.assert_close(fast, reference, rtol=1e-3, atol=1e-3)


def test_a_kernel_that_disagrees_is_never_selected(monkeypatch):
    layer = AWQLinear.from_float(nn.Linear(64, 32, bias=False), group_size=32)
    monkeypatch.setattr(layer, "_prepare_int4pack_cpu", lambda dtype: lambda x: torch.zeros(*x.shape[:-1], 32))
    with pytest.warns(RuntimeWarning, match="int4pack_cpu"):
        assert layer.select_kernel() == "dequant"
    with pytest.raises(RuntimeError, match="disagrees"):
        layer.select_kernel("int4pack_cpu")
