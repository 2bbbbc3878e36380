"""The draft's q in three launches (model/draft_q_triton.py) against draft_q.probabilities, its torch
reference: the same q bit for bit from the scored logits of every head kind (dense, FlashHead, shortlist,
router) at T = 0.3, 0.7, 1.0 and 1.3 with and without top-k and top-p, on rows built to tie at top-k's
k-th value and across top-p's boundary (where the lowest token id decides, and -0.0 meets +0.0), and
through the decoder the same sampled generations. Controls show the rows exercise the tie-breaks and
the compile check can fail. On a GPU-less machine the kernels run under triton's interpreter (against
torch's CPU arithmetic); on a GPU against torch's GPU arithmetic."""

import pytest
import torch

from contracts import UsageError
from model import draft_q, draft_q_triton, triton_support
from model.decoder import Decoder
from model.draft_q_triton import DraftQ
from model.flashhead import build_clustering
from model.heads import DenseHead, FlashHead, PositionalHead, RouterHead, ShortlistHead
from model.sampling import SamplingSettings
from tests.nvidia_ptx import nvidia_compile_output
from tests.sampling_fixtures import small_router, tiny_pair

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
pytestmark = pytest.mark.skipif(
    not triton_support.runs_on(DEVICE), reason="needs triton (on the CPU, its interpreter runs the kernels)"
)
SETTINGS = (
    SamplingSettings(temperature=0.3),
    SamplingSettings(temperature=0.7, top_k=40),
    SamplingSettings(temperature=1.0, top_p=0.9),
    SamplingSettings(temperature=1.3, top_k=200, top_p=0.8),
    SamplingSettings(temperature=0.7, top_k=5, top_p=0.5),
)
SMALL = {"BLOCK": 256, "num_warps": 1}  # several blocks per row: the kernels' loops over a row are exercised


def _same(settings, logits, tokens, launch=None) -> torch.Tensor:
    want = draft_q.probabilities(logits, settings, tokens)
    got = DraftQ(DEVICE, settings, backend="triton")(logits, tokens, launch=launch)
    assert got.dtype == torch.float32 and torch.equal(got, want), (settings, int((got != want).sum()))
    return want


def _head(kind: str, generator):
    weight = torch.randn(2500, 32, generator=generator)
    if kind == "dense":
        return DenseHead(weight.to(DEVICE))
    if kind == "flashhead":
        return FlashHead(weight.to(DEVICE), build_clustering(weight, cluster_size=16, iters=2, seed=0), probes=8)
    if kind == "shortlist":
        return ShortlistHead(weight.to(DEVICE), torch.randperm(2500, generator=generator)[:300].to(DEVICE))
    embedding = torch.randn(2500, 32, generator=generator)
    router = small_router(weight, embedding, clusters=24, cap=200)
    return RouterHead(weight.to(DEVICE), embedding.to(DEVICE), router, router.clusters // 3)


def test_rows_wider_than_the_kernels_bound_take_torch(monkeypatch):
    logits = torch.randn(2, 9, generator=torch.Generator().manual_seed(5)).to(DEVICE)
    fused = DraftQ(DEVICE, SETTINGS[1], backend="triton")
    monkeypatch.setattr(draft_q_triton, "_shift_kernel", None)  # a kernel launch would now fail
    monkeypatch.setattr(draft_q_triton, "KERNEL_MAX_WIDTH", 8)
    assert torch.equal(fused(logits), draft_q.probabilities(logits, SETTINGS[1]))
    monkeypatch.setattr(draft_q_triton, "KERNEL_MAX_WIDTH", 9)  # control: at the bound the kernels run
    with pytest.raises(TypeError):
        fused(logits)


@pytest.mark.parametrize("kind", ["dense", "flashhead", "shortlist", "router"])
def test_every_head_kinds_q_bit_for_bit(kind):
    generator = torch.Generator().manual_seed(len(kind))
    head = _head(kind, generator)
    fed = torch.tensor([[5]], device=DEVICE)
    spread = last_bits = 0
    for settings in SETTINGS:
        other = _other_temperature_arithmetic(settings)
        for _ in range(2):
            hidden = (torch.randn(1, 32, generator=generator) * 0.4).to(DEVICE)
            tokens, logits = head.scored_logits(hidden, fed)
            q = _same(settings, logits, tokens)
            assert abs(float(q.sum()) - 1) < 1e-5
            spread += int((q > 0).sum()) > 5
            last_bits += settings.top_p == 1 and not torch.equal(other(logits, tokens), q)
    assert spread >= 6  # most rows spread their mass: the transform's every step matters
    assert last_bits >= 3  # the control: the other device's temperature arithmetic differs in last bits


def _other_temperature_arithmetic(settings) -> DraftQ:
    """A wrong q for the control: the temperature applied as the other device's torch does it."""
    other = DraftQ(DEVICE, settings, backend="triton")
    other.reciprocal = not other.reciprocal
    divisor = torch.tensor([settings.temperature], dtype=torch.float32, device=DEVICE)
    other.scale = 1 / divisor if other.reciprocal else divisor
    return other


def _tied_rows(generator, rows: int = 2, width: int = 700, vocab: int = 5000):
    """Logits from few values (-0.0 and +0.0 among them) over shuffled token ids, so that top-k's k-th
    value and top-p's boundary fall inside groups of equal weights."""
    values = torch.tensor([-0.0, 0.0, 0.5, 1.0, 1.5, 2.0, float("-inf")])
    logits = values[torch.randint(0, len(values), (rows, width), generator=generator)]
    tokens = torch.stack([torch.randperm(vocab, generator=generator)[:width] for _ in range(rows)])
    return logits.to(DEVICE), tokens.to(DEVICE)


def test_ties_at_the_kth_value_and_the_top_p_boundary():
    generator = torch.Generator().manual_seed(3)
    logits, tokens = _tied_rows(generator)
    by_slot_differs = kept_past_k = 0
    for top_p in (0.05, 0.37, 0.95):
        for top_k in (0, 3, 160):
            settings = SamplingSettings(temperature=0.7, top_k=top_k, top_p=top_p)
            q = _same(settings, logits, tokens, launch=SMALL if top_k == 160 else None)
            if top_k == 3:
                _same(settings, logits, None)  # the vocabulary layout: token id = slot
            # the controls: ranked by slot, not token id, top-p keeps other tokens; ties keep more than k
            by_slot_differs += not torch.equal(q, draft_q.probabilities(logits, settings, None))
            kept_past_k += bool(top_k and top_p > 0.9 and ((q > 0).sum(dim=1) > top_k).any())
    assert by_slot_differs >= 5
    assert kept_past_k >= 2


def test_a_row_of_one_token_and_bad_inputs():
    settings = SamplingSettings(temperature=0.7, top_k=1, top_p=0.5)
    logits = torch.tensor([[float("-inf"), 1.0, float("-inf")]], device=DEVICE)
    assert _same(settings, logits, torch.tensor([[9, 4, 7]], device=DEVICE)).tolist() == [[0.0, 1.0, 0.0]]
    with pytest.raises(UsageError, match="temperature > 0"):
        DraftQ(DEVICE, SamplingSettings())
    with pytest.raises(UsageError, match="backend 'cuda'"):
        DraftQ(DEVICE, settings, backend="cuda")
    with pytest.raises(UsageError, match="tokens of the same shape"):
        DraftQ(DEVICE, settings, backend="triton")(logits, torch.tensor([[1, 2]], device=DEVICE))


@pytest.fixture(scope="module")
def pair():
    return tiny_pair()


@pytest.mark.skipif(DEVICE.type != "cpu", reason="the decoder comparison runs both backends on the CPU")
def test_decoder_generations_equal_the_torch_q(pair):
    """Each head kind through the decoder: the kernels (interpreted) emit the torch q's tokens."""
    target, draft = pair
    weight = draft.head_weight
    clustering = build_clustering(weight, cluster_size=24, seed=0)
    heads = {
        "dense": DenseHead(weight),
        "flashhead:6,3": PositionalHead([FlashHead(weight, clustering, probes=p) for p in (6, 3)]),
        "shortlist": ShortlistHead(weight, torch.randperm(512, generator=torch.Generator().manual_seed(0))[:256]),
        "router": RouterHead(weight, draft.embed_tokens.weight, small_router(weight, draft.embed_tokens.weight), 8),
    }
    settings = SamplingSettings(temperature=0.8, top_k=60, top_p=0.9, seed=2)
    for name, head in heads.items():
        decoder = Decoder(target, draft, head, K=3, graphs=False, phases=False, sampling=settings)
        assert decoder.draft_q.backend == "torch"
        want = decoder.generate([7, 9], 8, "deferred", sample=1).tokens
        decoder.draft_q = DraftQ("cpu", settings, backend="triton")
        assert decoder.generate([7, 9], 8, "deferred", sample=1).tokens == want, name


# Compiles both kernels for an H100/H200 (sm_90) without a GPU and prints their float instructions.
_PTX_FLOAT_OPS = """
from model import draft_q_triton
fusion = sys.argv[1] == "on"
kernels = (
    (draft_q_triton._shift_kernel, {"logits_ptr": "*fp32", "scale_ptr": "*fp32", "out_ptr": "*fp32"},
     {"RECIPROCAL": True, "TOP_K": True, "PASSES": draft_q_triton._K_PASSES}),
    (draft_q_triton._normalize_kernel, {"weights_ptr": "*fp32", "ids_ptr": "*i64", "top_p_ptr": "*fp64"},
     {"GATHERED": True, "TOP_P": True, "PASSES": draft_q_triton._P_PASSES}),
)
for kernel, pointers, flags in kernels:
    signature = {**pointers, "N": "i32", **({"top_k": "i32"} if "TOP_K" in flags else {})}
    constexprs = {**flags, "BLOCK": 1024}
    signature.update({name: "constexpr" for name in constexprs})
    options = {"num_warps": 8, "enable_fp_fusion": fusion}
    ptx = triton.compile(ASTSource(kernel, signature, constexprs=constexprs), target=GPUTarget("cuda", 90, 32),
                         options=options).asm["ptx"]
    print(sorted(set(re.findall(r"\\b(?:add|sub|mul|div|fma|rcp|ex2)\\.[a-z0-9.]*f(?:32|64)\\b", ptx))))
"""


def _float_ops(fusion: str) -> list[str]:
    return nvidia_compile_output(_PTX_FLOAT_OPS, fusion).splitlines()


def test_the_gpu_build_rounds_every_operation_as_torch():
    """With contraction off (the launch's option) every float operation rounds on its own (`.rn`: no
    multiply fused into an add) and divisions are IEEE; the control: with it on, plain ones appear."""
    shift, normalize = _float_ops("off")
    assert shift == "['mul.rn.f32', 'sub.rn.f32']"
    assert normalize == "['add.rn.f32', 'div.rn.f32', 'mul.rn.f32', 'mul.rn.f64']"
    assert "'mul.f32'" in _float_ops("on")[0]


@pytest.mark.skipif(DEVICE.type != "cuda", reason="the Qwen3 vocabulary and CUDA graphs need a GPU")
def test_wide_rows_inside_a_cuda_graph(monkeypatch):
    """The dense head's vocabulary (151,936) and the widest shortlist (65,536), inside a CUDA graph, through
    the kernels (the decoder sends rows wider than KERNEL_MAX_WIDTH to torch)."""
    monkeypatch.setattr(draft_q_triton, "KERNEL_MAX_WIDTH", 151_936)
    generator = torch.Generator(device=DEVICE).manual_seed(4)
    for width in (151_936, 65_536, 8_192):
        tokens = torch.randperm(151_936, device=DEVICE, generator=generator)[:width].view(1, -1)
        for settings in SETTINGS:
            rows = [(torch.randn(1, width, device=DEVICE, generator=generator) * 3).bfloat16() for _ in range(3)]
            fused = DraftQ(DEVICE, settings)
            assert fused.backend == "triton"
            logits = rows[0].clone()
            fused(logits, tokens)  # compiles outside capture
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                q = fused(logits, tokens)
            for row in rows:
                logits.copy_(row)
                graph.replay()
                assert torch.equal(q, draft_q.probabilities(row, settings, tokens)), (width, settings)
