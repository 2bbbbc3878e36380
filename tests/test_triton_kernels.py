"""Our Triton kernels against the torch path, in float32: on the GPU where there is one (where tl.dot
rounds float32 inputs to TF32, hence the looser tolerance), else on the CPU under triton's
interpreter (whose bfloat16 matmul is not exact)."""

import pytest
import torch
import torch.nn.functional as F

from model import awq_triton, flashhead_triton, fused_ops, triton_support
from model.awq import AWQLinear, KernelUnavailable, unpack_int4
from model.decoder import Decoder, width
from model.flashhead import build_clustering
from model.heads import DenseHead, FlashHead
from model.loading import load_model
from tests.attention_reference import reference_attention

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
pytestmark = pytest.mark.skipif(
    not triton_support.runs_on(DEVICE), reason="needs triton (on the CPU, its interpreter runs the kernels)"
)
ROOM = 48
TOL = 1e-4 if DEVICE.type == "cpu" else 3e-3  # relative to the largest value


def _pair(spec):
    reference = load_model(spec, DEVICE, "float32", seed=1, max_seq_len=ROOM, kernels="torch").model
    fused = load_model(spec, DEVICE, "float32", seed=1, max_seq_len=ROOM, kernels="fused").model
    return reference, fused


@pytest.mark.parametrize("spec", ["tiny-qwen3", "tiny-qwen3-awq", "tiny-llama", "tiny-llama-awq"])
def test_fused_forward_matches_the_torch_path(spec):
    reference, fused = _pair(spec)
    attention, mlp = fused.layers[0].self_attn, fused.layers[0].mlp
    assert fused.kernels == "fused" and not hasattr(attention, "q_proj")
    if spec.endswith("-awq"):  # every int4 GEMM but o launches early (awq_triton: o measured slower)
        early = [
            layer.launch_early for layer in (attention.qkv_proj, mlp.gate_up_proj, attention.o_proj, mlp.down_proj)
        ]
        assert early == [True, True, False, True]
    prompt = torch.randint(0, 512, (1, 17), generator=torch.Generator().manual_seed(0))
    step = torch.tensor([[5, 9, 200]])
    for tokens, pos in ((prompt, torch.arange(17)), (step, torch.arange(17, 20)), (step[:, :1], torch.tensor([18]))):
        tokens, pos = tokens.to(DEVICE), pos.to(DEVICE)
        want, got = reference.forward_hidden(tokens, pos), fused.forward_hidden(tokens, pos)
        assert (want - got).abs().max() < TOL * want.abs().max()


@pytest.mark.parametrize(
    "tokens, split_slots",
    [(3, fused_ops.SPLIT_SLOTS), (3, None), (fused_ops.SPLIT_MAX_TOKENS + 4, fused_ops.SPLIT_SLOTS)],
    ids=["split", "path-ordered", "stacked"],
)
def test_attention_reads_only_slots_up_to_the_last_position(tokens, split_slots):
    g = torch.Generator().manual_seed(0)
    n_heads, n_kv, head_dim, slots = 4, 2, 16, 200
    q = torch.randn(tokens, n_heads, head_dim, generator=g)
    k_cache, v_cache = (torch.randn(1, n_kv, slots, head_dim, generator=g) for _ in range(2))
    pos = torch.arange(73 - tokens, 73)
    k_cache[:, :, 73:], v_cache[:, :, 73:] = float("nan"), float("nan")  # never read
    got = fused_ops.attention(q.to(DEVICE), k_cache.to(DEVICE), v_cache.to(DEVICE), pos.to(DEVICE), 0.3, split_slots)
    got = got.view(tokens, n_heads, head_dim).cpu()
    want = reference_attention(q, k_cache, v_cache, torch.arange(slots)[None, :] <= pos[:, None], 0.3)
    for head in range(n_heads):
        assert torch.allclose(got[:, head], want[:, head], atol=TOL)


def test_cluster_selection_is_the_top_p_and_breaks_ties_by_lowest_id():
    g = torch.Generator().manual_seed(0)
    # Small integers: every score is exact in any order of summation, and distinct here.
    centroids = torch.randint(-50, 50, (300, 24), generator=g).float()
    hidden = torch.randint(-3, 4, (3, 24), generator=g).float()
    scores = hidden @ centroids.t()
    for probes in (1, 7, 300):
        got = flashhead_triton.select_clusters(hidden.to(DEVICE), centroids.to(DEVICE), probes).cpu()
        threshold = torch.topk(scores, probes, dim=-1).values[:, -1:]
        assert got.shape == (3, probes) and torch.all(got[:, 1:] > got[:, :-1])
        assert torch.all(scores.gather(1, got) >= threshold)  # the top p (ties at the threshold aside)
    tied = torch.zeros(10, 4)
    tied[[2, 6]] = 1.0  # two clear winners, then eight ties at 0
    got = flashhead_triton.select_clusters(torch.ones(1, 4, device=DEVICE), tied.to(DEVICE), 5).cpu()
    assert got.tolist() == [[0, 1, 2, 3, 6]]


def test_cluster_selection_ranks_ties_across_slices():
    # More ties at the threshold than places, spread over several select programs: each must count
    # the ties before its slice so that exactly the lowest-index ones are taken.
    slice_ = flashhead_triton._launch(flashhead_triton.SELECT_LAUNCH, torch.device(DEVICE))["SLICE"]
    c = 2 * slice_ + 100
    tied = torch.zeros(c, 4)
    winners = [2, 6, slice_ + 5, c - 1]
    tied[winners] = 1.0
    probes = slice_ + 50
    got = flashhead_triton.select_clusters(torch.ones(1, 4, device=DEVICE), tied.to(DEVICE), probes).cpu()
    ties = [i for i in range(c) if i not in winners][: probes - len(winners)]
    assert got.tolist() == [sorted(winners + ties)]


def test_flashhead_triton_workspace_alternates_counter_sets_and_leaves_the_next_one_zero():
    w = torch.randn(2048, 32, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    always = range(7, 2048, 101)  # 21 always-scored tokens: two stage-2 programs of 16
    head = FlashHead(w, build_clustering(w, seed=0), probes=5, always_tokens=always, backend="triton")
    slow = FlashHead(w, build_clustering(w, seed=0), probes=5, always_tokens=always, backend="torch")
    for calls, seed in enumerate((2, 3, 4), start=1):  # later calls reuse the first's workspace
        hidden = torch.randn(4, 32, generator=torch.Generator().manual_seed(seed)).to(DEVICE)
        assert torch.equal(head.argmax(hidden), slow.argmax(hidden))
        work = head._workspaces[4]
        assert work.calls.item() == calls
        assert not work.counters[calls % 2].any() and torch.all(work.best[calls % 2] == flashhead_triton.NO_KEY)


def test_flashhead_triton_backend_picks_the_torch_backends_tokens():
    w = torch.randn(2048, 32, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    clustering = build_clustering(w, seed=0)
    hidden = torch.randn(6, 32, generator=torch.Generator().manual_seed(2)).to(DEVICE)
    for probes in (1, 4, clustering.clusters):
        fast = FlashHead(w, clustering, probes=probes, backend="triton")
        slow = FlashHead(w, clustering, probes=probes, backend="torch")
        assert torch.equal(fast.argmax(hidden), slow.argmax(hidden))
    assert torch.equal(
        FlashHead(w, clustering, probes=clustering.clusters, backend="triton").argmax(hidden),
        DenseHead(w).argmax(hidden),
    )


@pytest.mark.parametrize("schedule", ["ordinary", "pipelined", "deferred", "pipelined-deferred"])
def test_speculative_output_is_target_greedy_with_fused_kernels(schedule):
    target = load_model("tiny-qwen3", DEVICE, "float32", seed=1, max_seq_len=ROOM, kernels="fused").model
    draft = load_model("tiny-qwen3-draft", DEVICE, "float32", seed=2, max_seq_len=ROOM, kernels="fused").model
    w = draft.head_weight
    head = FlashHead(w, build_clustering(w, seed=0), probes=4, backend="triton")
    prompt = list(b"Hi there")
    want = Decoder(target, K=1, graphs=False).reference(prompt, 10)
    assert Decoder(target, draft, head, K=3, graphs=False).generate(prompt, 10, schedule).tokens == want


@pytest.mark.parametrize("spec", ["tiny-qwen3", "tiny-qwen3-awq", "tiny-llama"])
def test_checkpoint_state_dict_splits_merged_projections_back(spec):
    reference, fused = _pair(spec)
    want, got = reference.state_dict(), fused.checkpoint_state_dict()
    assert sorted(want) == sorted(got)
    assert all(torch.equal(want[name].cpu(), got[name].cpu()) for name in want)


def _awq_layer(in_features, out_features, group_size, seed=0):
    layer = AWQLinear(in_features, out_features, group_size)
    layer.randomize_(torch.Generator().manual_seed(seed))
    return layer.to(DEVICE)


def _planes(layer, block_n=awq_triton.BLOCK_N, swiglu=False):
    return awq_triton.pack_planes(
        unpack_int4(layer.qweight), unpack_int4(layer.qzeros), layer.scales, layer.group_size, block_n, swiglu
    )


def _awq_matmul(layer, x, block_n=awq_triton.BLOCK_N, **config):
    return awq_triton.w4a16_matmul(x, _planes(layer, block_n), **config)


def test_awq_planes_hold_each_code_at_its_row_and_nibble():
    # Row 128 s + 32 i + 2 j + h of column n is nibble i + 4 h of word (n // block_n, s, n % block_n, j);
    # K and N are padded with zero codes and scales.
    layer = _awq_layer(160, 40, 32)
    codes, zeros = unpack_int4(layer.qweight), unpack_int4(layer.qzeros)
    planes = _planes(layer, 16)
    assert planes.codes.shape == (3, 2, 16, 16) and planes.groups.shape == (3, 8, 16)
    zero_points = planes.groups & 0xF
    scales = (planes.groups >> 16).to(torch.int16).view(torch.float16)
    words = planes.codes.cpu().to(torch.int64) & 0xFFFFFFFF
    for k, n in ((0, 0), (17, 5), (45, 39), (128 + 20, 20), (159, 33)):
        s, r = divmod(k, 128)
        i, j, h = r // 32, r % 32 // 2, r % 2
        assert (words[n // 16, s, n % 16, j] >> (4 * (i + 4 * h))) & 0xF == codes[k, n]
        assert zero_points[n // 16, k // 32, n % 16] == zeros[k // 32, n]
        assert scales[n // 16, k // 32, n % 16] == layer.scales[k // 32, n]
    assert not (words[:, 1] & 0xFFF0FFF0).any()  # rows 160..255 (all but pair 0 of step 1): zero codes
    assert not planes.groups[2, :, 8:].any() and not planes.groups[:, 5:].any()  # columns 40..47, groups 5..7


@pytest.mark.parametrize("shape", [(256, 128, 64), (256, 128, 128), (128, 48, 32), (96, 40, 32), (512, 64, 256)])
def test_awq_triton_matmul_matches_the_dequantized_reference(shape):
    layer = _awq_layer(*shape)
    weight = layer.dequantize()
    g = torch.Generator().manual_seed(1)
    for m in (1, 5, 16, 17, 65):  # 65: two row blocks of 64 (awq_triton.block_m)
        x = torch.randn(m, shape[0], generator=g).to(DEVICE)
        want = F.linear(x, weight)
        for config in ({}, {"splits": 1, "block_n": 32}):
            got = _awq_matmul(layer, x, **config)
            assert got.shape == want.shape and got.dtype == x.dtype
            assert (got - want).abs().max() <= 1e-5 * want.abs().max()


def test_awq_triton_split_k_is_deterministic_and_only_reorders_sums():
    layer = _awq_layer(1024, 64, 64)
    planes = _planes(layer, 64)
    x = torch.randn(16, 1024, generator=torch.Generator().manual_seed(2)).to(DEVICE)
    one = awq_triton.w4a16_matmul(x, planes, splits=1)
    tickets = torch.zeros(1, dtype=torch.int32, device=DEVICE)  # kept across calls, as a layer keeps them
    for splits in (2, 4, 8):
        got = awq_triton.w4a16_matmul(x, planes, splits=splits, tickets=tickets)
        assert torch.equal(got, awq_triton.w4a16_matmul(x, planes, splits=splits, tickets=tickets))  # bitwise
        assert torch.equal(got, awq_triton.w4a16_matmul(x, planes, splits=splits, tickets=tickets, early=True))
        assert not tickets.any()  # the last split of each tile reset its ticket
        assert (got - one).abs().max() <= 1e-5 * one.abs().max()
    with pytest.raises(ValueError):
        awq_triton.w4a16_matmul(x, planes, splits=3)  # must divide the 8 steps
    with pytest.raises(ValueError):
        awq_triton.w4a16_matmul(x[:, :512], planes)  # x must have the planes' input width
    with pytest.raises(ValueError):
        awq_triton.pack_planes(
            torch.zeros(64, 8, dtype=torch.int32), torch.zeros(4, 8, dtype=torch.int32), torch.ones(4, 8), 16
        )  # groups of 16 would split a pair of planes


def test_awq_triton_row_depends_only_on_its_own_input_row():
    layer = _awq_layer(512, 64, 64)
    planes = _planes(layer)
    g = torch.Generator().manual_seed(3)
    for m in (16, 17, 65):
        x = torch.randn(m, 512, generator=g).to(DEVICE)
        other = torch.randn(m, 512, generator=g).to(DEVICE)
        other[3] = x[3]
        for splits in (1, 4):
            assert torch.equal(
                awq_triton.w4a16_matmul(x, planes, splits=splits)[3],
                awq_triton.w4a16_matmul(other, planes, splits=splits)[3],
            )
    for rows, fewer in ((8, 5), (16, 12), (64, 40)):  # nor, within one row-block size, on how many rows there are
        assert awq_triton.block_m(rows) == awq_triton.block_m(fewer)
        x = torch.randn(rows, 512, generator=g).to(DEVICE)
        assert torch.equal(
            awq_triton.w4a16_matmul(x, planes)[:fewer], awq_triton.w4a16_matmul(x[:fewer].clone(), planes)
        )


@pytest.mark.parametrize("dtype", [torch.float16] + ([torch.bfloat16] if DEVICE.type == "cuda" else []))
@pytest.mark.parametrize("shape", [(256, 128, 128), (128, 48, 32), (96, 40, 32)])
def test_awq_triton_half_activations_use_the_pairs_path(shape, dtype):
    """The 16-bit path (PTX on a GPU, the same bits in Triton operations under the interpreter: the
    masked pairs as OFFSET + q, minus OFFSET + z), partial column blocks and steps included.
    bfloat16 on GPU only: the interpreter's bfloat16 dot is wrong."""
    layer = _awq_layer(*shape)
    x = torch.randn(16, shape[0], generator=torch.Generator().manual_seed(4)).to(DEVICE, dtype)
    want = F.linear(x.float(), layer.dequantize())
    for splits in (1, 2):
        if _planes(layer).codes.shape[1] % splits:
            continue
        got = _awq_matmul(layer, x, splits=splits)
        assert got.dtype == dtype  # within the output's rounding (bf16 keeps 8 bits)
        assert (got.float() - want).abs().max() <= (2e-3 if dtype == torch.float16 else 8e-3) * want.abs().max()


def test_awq_triton_default_split_k_gives_two_programs_per_sm_from_four_to_eight_splits():
    cpu = torch.device("cpu")  # counted as 132 SMs, as on H100 / H200
    meta = torch.device("meta")
    for (K, N), measured in {(5120, 10240): 4, (8192, 5120): 8, (5120, 51200): 4, (25600, 5120): 8}.items():
        planes = awq_triton.Planes(torch.empty(N // 128, K // 128, 128, 16, device=meta), None, K, N, 128)
        assert awq_triton.default_splits(8, planes, cpu) == measured  # Qwen3-32B's shapes: what won on H200
    tiny = awq_triton.Planes(torch.empty(1, 2, 128, 16, device=meta), None, 256, 64, 128)
    assert awq_triton.default_splits(1, tiny, cpu) == 2  # 2 steps


def test_awq_layer_selects_the_triton_kernel_by_name_and_on_cuda_by_default():
    layer = _awq_layer(256, 64, 64)
    x = torch.randn(2, 3, 256, generator=torch.Generator().manual_seed(5)).to(DEVICE)
    assert layer.select_kernel("triton") == "triton"
    torch.testing.assert_close(layer(x), F.linear(x, layer.dequantize()), rtol=1e-5, atol=1e-5)
    automatic = layer.select_kernel()
    if DEVICE.type == "cuda":
        assert automatic == "triton"
    else:  # off CUDA the interpreter is for tests: never chosen automatically
        assert automatic in ("int4pack_cpu", "dequant")
        with pytest.raises(KernelUnavailable):
            layer.select_kernel("triton", dtype=torch.bfloat16)
    with pytest.raises(KernelUnavailable):  # the kernel steps through K in powers of two
        _awq_layer(96, 16, 48).select_kernel("triton")


@pytest.mark.parametrize("dtype", [torch.float32] + ([torch.bfloat16] if DEVICE.type == "cuda" else []))
def test_awq_gate_up_gemm_forms_swiglu_with_the_bits_of_silu_mul(dtype):
    """A gate/up layer's planes pair its columns (swiglu_order); its GEMM's last split then writes
    silu(gate) * up, bit for bit fused_ops.silu_mul of the same GEMM's sums, with one split or several,
    and the layer's plain forward still gives gate then up. On a GPU a column's sums do not depend on
    where its tile puts it, so those are the unpaired GEMM's bits too; the interpreter's float32 dot
    (numpy) may round a column by its place."""
    layer = _awq_layer(256, 256, 64, seed=6)  # two gate/up column blocks of 64 + 64
    order = awq_triton.swiglu_order(256)
    assert order[:130].tolist() == [*range(64), *range(128, 192), 64, 65]
    with pytest.raises(ValueError, match="halves"):
        awq_triton.swiglu_order(192)  # 96 outputs are not blocks of 64
    unfit = _awq_layer(256, 192, 64)
    unfit.gate_up = True  # its planes stay unpaired, and swiglu is silu_mul after the GEMM
    unfit.select_kernel("triton", dtype=torch.float32)
    probe = torch.randn(3, 256, generator=torch.Generator().manual_seed(8)).to(DEVICE)
    assert torch.equal(unfit.swiglu(probe), fused_ops.silu_mul(_awq_matmul(unfit, probe)))
    in_order = torch.argsort(order).to(DEVICE)
    paired = _planes(layer, swiglu=True)
    x = torch.randn(16, 256, generator=torch.Generator().manual_seed(7)).to(DEVICE, dtype)
    for splits in (1, 2):
        sums = awq_triton.w4a16_matmul(x, paired._replace(swiglu=False), splits=splits)[:, in_order]
        got = awq_triton.w4a16_matmul(x, paired, splits=splits)
        assert got.shape == (16, 128) and torch.equal(got, fused_ops.silu_mul(sums))
        unpaired = _awq_matmul(layer, x, splits=splits)
        assert torch.equal(sums, unpaired) if DEVICE.type == "cuda" else torch.allclose(sums, unpaired, atol=1e-6)
    layer.gate_up = True
    layer.select_kernel("triton", dtype=dtype)
    assert torch.equal(layer(x), awq_triton.w4a16_matmul(x, paired._replace(swiglu=False))[:, in_order])
    assert torch.equal(layer.swiglu(x), fused_ops.silu_mul(layer(x)))


HALF = [torch.float16] + ([torch.bfloat16] if DEVICE.type == "cuda" else [])


@pytest.mark.parametrize("dtype", [torch.float32] + HALF)
def test_awq_triton_onto_adds_the_residual_and_weights_rows_as_the_norm_kernel_does(dtype):
    """o_proj and down_proj of a model whose norms are folded (Transformer._folds_norms): the residual add
    with fused_ops.rms_norm's bits, the rows times the next norm's weight, and their sums of squares by
    column block."""
    layer = _awq_layer(256, 256, 64, seed=9)
    planes = _planes(layer, 64)  # four column blocks
    g = torch.Generator().manual_seed(10)
    x, residual = (torch.randn(5, 256, generator=g).to(DEVICE, dtype) for _ in range(2))
    weight = (torch.rand(256, generator=g) + 0.5).to(DEVICE, dtype)
    for splits in (1, 2):
        h, weighted, squares = awq_triton.w4a16_matmul_onto(x, planes, residual, weight, splits=splits)
        product = awq_triton.w4a16_matmul(x, planes, splits=splits)
        assert torch.equal(h, fused_ops.rms_norm(residual, weight, 1e-6, product)[0])
        assert torch.equal(weighted, (h.float() * weight.float()).to(dtype))
        assert squares.shape == (4, 5) and squares.dtype == torch.float32
        by_block = (h.float() ** 2).view(5, 4, 64).sum(2).T
        torch.testing.assert_close(squares, by_block, rtol=1e-5, atol=0)
    paired = _planes(layer, 64, swiglu=True)
    for bad in ((x, paired, residual, weight), (x, planes, residual[:4], weight), (x, planes, residual, weight[:8])):
        with pytest.raises(ValueError):
            awq_triton.w4a16_matmul_onto(*bad)


@pytest.mark.parametrize("dtype", [torch.float32] + HALF)
def test_awq_triton_folded_norm_gives_the_norm_kernel_then_the_gemm(dtype):
    """q/k/v and gate/up of a model whose norms are folded: the rows times the norm's weight, each row's
    sums scaled by its 1 / RMS, against fused_ops.rms_norm's output through the same GEMM (the roundings
    differ: the norm rounds x / RMS before the weight)."""
    before, after = _awq_layer(256, 256, 64, seed=11), _awq_layer(256, 256, 64, seed=12)
    g = torch.Generator().manual_seed(13)
    x, residual = (torch.randn(5, 256, generator=g).to(DEVICE, dtype) for _ in range(2))
    weight = (torch.rand(256, generator=g) + 0.5).to(DEVICE, dtype)
    h, weighted, squares = awq_triton.w4a16_matmul_onto(x, _planes(before, 64), residual, weight)
    normed = fused_ops.rms_norm(h, weight, 1e-6)[1]
    tolerance = {torch.float32: 1e-5, torch.float16: 4e-3, torch.bfloat16: 2e-2}[dtype]
    for planes in (_planes(after), _planes(after, swiglu=True)):
        want = awq_triton.w4a16_matmul(normed, planes).float()
        got = awq_triton.w4a16_matmul(weighted, planes, norm=awq_triton.FoldedNorm(1e-6, squares)).float()
        assert got.shape == want.shape and (got - want).abs().max() <= tolerance * want.abs().max()


@pytest.mark.parametrize("spec", ["tiny-qwen3-awq", "tiny-llama-awq"])
def test_fused_awq_forward_folds_its_norms_into_our_int4_kernel(spec, monkeypatch):
    """With every projection on the Triton GEMM, a fused forward runs two RMSNorm kernels (the first layer's
    input norm and the last norm) and matches the torch path; any projection on another kernel, at prefill
    rows, or all-reduced (tensor parallel) keeps every norm a kernel."""
    reference, fused = _pair(spec)
    projections = [module for module in fused.modules() if isinstance(module, AWQLinear)]
    for module in projections:
        module.select_kernel("triton", dtype=torch.float32)
    norms = []
    kernel = fused_ops.rms_norm
    monkeypatch.setattr(fused_ops, "rms_norm", lambda *args: norms.append(1) or kernel(*args))
    tokens, pos = torch.tensor([[5, 9, 200]], device=DEVICE), torch.arange(3, device=DEVICE)
    want = reference.forward_hidden(tokens, pos)
    for folded in (True, False):
        fused.norms_in_gemms, norms[:] = folded, []
        got = fused.forward_hidden(tokens, pos)
        assert len(norms) == (2 if folded else 2 * fused.config.n_layers + 1)
        assert (want - got).abs().max() < TOL * want.abs().max()
    fused.norms_in_gemms = True
    assert fused._folds_norms(3)
    projections[-1].prefill_rows = 3
    assert fused._folds_norms(2) and not fused._folds_norms(3)
    projections[-1].prefill_rows = None
    projections[1].reduces_output = True
    assert not fused._folds_norms(3)
    projections[1].reduces_output = False
    projections[2].select_kernel("dequant")
    assert not fused._folds_norms(3)
    with pytest.raises(ValueError, match="Triton"):
        projections[2](torch.zeros(1, projections[2].in_features, device=DEVICE), awq_triton.FoldedNorm(1e-6, None))


@pytest.fixture(scope="module")
def folded_target():
    """An int4 target on our Triton GEMM, so that its fused forwards fold the RMSNorms in, and its greedy
    reference."""
    target = load_model("tiny-qwen3-awq", DEVICE, "float32", seed=1, max_seq_len=ROOM, kernels="fused").model
    for module in target.modules():
        if isinstance(module, AWQLinear):
            module.select_kernel("triton", dtype=torch.float32)
    assert target._folds_norms(width(3))  # the rows of every decode forward
    return target, Decoder(target, K=1, graphs=False).reference(list(b"Hi there"), 10)


@pytest.mark.parametrize("schedule", ["ordinary", "pipelined", "deferred", "pipelined-deferred"])
def test_speculative_output_is_target_greedy_with_the_norms_folded(folded_target, schedule):
    target, want = folded_target
    draft = load_model("tiny-qwen3-draft", DEVICE, "float32", seed=2, max_seq_len=ROOM, kernels="fused").model
    decoder = Decoder(target, draft, DenseHead(draft.head_weight), K=3, graphs=False)
    assert decoder.generate(list(b"Hi there"), 10, schedule).tokens == want
