"""Split-KV attention (model/fused_ops.attention with split_slots): SDPA's result, each row's value independent
of the other rows' positions (what token-exact speculation needs), and greedy speculation still target
greedy across split boundaries (CPU: triton's interpreter; GPU: the kernels as they run)."""

import pytest
import torch

from model import fused_ops, triton_support
from model.decoder import Decoder
from model.heads import DenseHead
from model.loading import load_model
from tests.attention_reference import reference_attention

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
pytestmark = pytest.mark.skipif(
    not triton_support.runs_on(DEVICE), reason="needs triton (on the CPU, its interpreter runs the kernels)"
)
TOL = 1e-5 if DEVICE.type == "cpu" else 3e-3  # on a GPU tl.dot rounds float32 inputs to TF32


def _inputs(n, n_heads=4, n_kv=2, head_dim=16, slots=300, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(n, n_heads, head_dim, generator=g)
    k_cache, v_cache = (torch.randn(1, n_kv, slots, head_dim, generator=g) for _ in range(2))
    return q, k_cache, v_cache


@pytest.mark.parametrize("split_slots", [64, 128, None])
def test_split_attention_is_sdpa_and_reads_only_up_to_the_last_position(split_slots):
    q, k_cache, v_cache = _inputs(3)
    pos = torch.tensor([63, 64, 200])  # the last slot of a split, the first of the next, a later one
    k_cache[:, :, 201:], v_cache[:, :, 201:] = float("nan"), float("nan")  # never read
    got = fused_ops.attention(q.to(DEVICE), k_cache.to(DEVICE), v_cache.to(DEVICE), pos.to(DEVICE), 0.3, split_slots)
    got = got.view(3, 4, 16).cpu()
    reference = reference_attention(q, k_cache, v_cache, torch.arange(300)[None, :] <= pos[:, None], 0.3)
    for head in range(4):
        want = reference[:, head]
        assert (got[:, head] - want).abs().max() <= TOL * want.abs().max()


def test_a_rows_value_does_not_depend_on_the_other_rows():
    q, k_cache, v_cache = _inputs(3, seed=1)
    q, k_cache, v_cache = q.to(DEVICE), k_cache.to(DEVICE), v_cache.to(DEVICE)
    alone = fused_ops.attention(q[:1], k_cache, v_cache, torch.tensor([150], device=DEVICE), 0.3, 64)
    for others in ([40, 299], [151, 152], [0, 1]):
        pos = torch.tensor([150, *others], device=DEVICE)
        together = fused_ops.attention(q, k_cache, v_cache, pos, 0.3, 64)
        assert torch.equal(together[:1], alone)
    with pytest.raises(ValueError, match="multiple"):
        fused_ops.attention(q, k_cache, v_cache, torch.tensor([1, 2, 3], device=DEVICE), 0.3, 100)


def _same(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Bit for bit under the interpreter; on a GPU the two kernels' layouts may sum a head's squares in
    another order (one decoder runs one of them for every decode forward, so exactness does not rest on it)."""
    if DEVICE.type == "cpu":
        return torch.equal(got, want)
    return bool((got - want).abs().max() <= TOL * want.abs().max())


@pytest.mark.parametrize("norms", [True, False])  # Qwen3's q/k norms; Llama has none
def test_qkv_attention_is_the_two_kernels_and_writes_the_same_cache(norms):
    n_heads, n_kv, head_dim, slots = 4, 2, 16, 300
    g = torch.Generator().manual_seed(5)
    _, k_cache, v_cache = _inputs(1, slots=slots, seed=6)
    cos, sin = (torch.randn(slots, head_dim // 2, generator=g).repeat(1, 2) for _ in range(2))
    q_weight, k_weight = (torch.rand(head_dim, generator=g) + 0.5 if norms else None for _ in range(2))
    moved = [t if t is None else t.to(DEVICE) for t in (cos, sin, q_weight, k_weight)]
    cos, sin, q_weight, k_weight = moved
    for pos in ([150], [62, 63, 64, 65], list(range(120, 136))):  # one token; across a split; 16 tokens
        n = len(pos)
        qkv = torch.randn(n, (n_heads + 2 * n_kv) * head_dim, generator=g).to(DEVICE)
        where = torch.tensor(pos, device=DEVICE)
        two = (k_cache.clone().to(DEVICE), v_cache.clone().to(DEVICE))
        one = (k_cache.clone().to(DEVICE), v_cache.clone().to(DEVICE))
        q = fused_ops.qk_norm_rope_cache(qkv, q_weight, k_weight, cos, sin, where, *two, n_heads, 1e-6)
        split = 256 if pos[0] == 120 else 64  # 16 tokens across the short splits of 128 below 256
        want = fused_ops.attention(q, *two, where, 0.3, split)
        got = fused_ops.qkv_attention(qkv, q_weight, k_weight, cos, sin, where, *one, n_heads, 1e-6, 0.3, split)
        assert _same(got, want)
        assert _same(one[0], two[0]) and torch.equal(one[1], two[1])
        assert not torch.equal(one[0], k_cache.to(DEVICE))  # control: the new keys were written
    with pytest.raises(ValueError, match="split-route"):
        fused_ops.qkv_attention(qkv[:, :-1], q_weight, k_weight, cos, sin, where, *one, n_heads, 1e-6, 0.3, 64)


def test_a_decode_forward_is_the_same_with_the_q_k_preparation_inside_the_attention_or_not(monkeypatch):
    calls = []
    kernel = fused_ops.qkv_attention
    monkeypatch.setattr(fused_ops, "qkv_attention", lambda *args: calls.append(1) or kernel(*args))
    model = load_model("tiny-qwen3", DEVICE, "float32", seed=1, max_seq_len=160, kernels="fused").model
    model.attention_split_slots = 64
    prompt = torch.randint(0, 512, (1, 70), generator=torch.Generator().manual_seed(0)).to(DEVICE)
    step = (prompt[:, :4], torch.arange(70, 74, device=DEVICE))  # a decode width whose slots follow the prompt
    hidden = {}
    for inside in (True, False):
        model.qkv_in_attention = inside
        model.forward_hidden(prompt, torch.arange(70, device=DEVICE))  # a prefill: the separate kernel either way
        hidden[inside] = (model.forward_hidden(*step), model.kv_caches.clone())
        assert len(calls) == (model.config.n_layers if inside else 0)  # the decode forward's layers only
        calls.clear()
    assert _same(hidden[True][0], hidden[False][0]) and _same(hidden[True][1], hidden[False][1])


@pytest.mark.parametrize("schedule", ["pipelined-deferred"] + (["ordinary"] if DEVICE.type == "cuda" else []))
def test_speculative_output_is_target_greedy_across_split_boundaries(schedule):
    room = 112
    target = load_model("tiny-qwen3", DEVICE, "float32", seed=1, max_seq_len=room, kernels="fused").model
    draft = load_model("tiny-qwen3-draft", DEVICE, "float32", seed=2, max_seq_len=room, kernels="fused").model
    target.attention_split_slots = draft.attention_split_slots = 64
    prompt = torch.randint(0, 512, (58,), generator=torch.Generator().manual_seed(0)).tolist()  # decodes past 64
    want = Decoder(target, K=1, graphs=False).reference(prompt, 14)
    got = Decoder(target, draft, DenseHead(draft.head_weight), K=3, graphs=False).generate(prompt, 14, schedule)
    assert got.tokens == want


def test_a_models_split_is_longer_where_a_kv_head_serves_many_query_heads():
    """One constant per model (its decodes of every width then sum a row over the same splits): 512 slots
    for Qwen3-32B's 8 query heads per KV head, 128 for the drafts' 2; the split route reads 512-slot
    splits, their first 512 slots in splits of 128, as it reads others."""
    assert fused_ops.split_slots_for(64, 8) == fused_ops.WIDE_GROUP_SPLIT_SLOTS == 512
    assert fused_ops.split_slots_for(16, 8) == fused_ops.split_slots_for(4, 2) == fused_ops.SPLIT_SLOTS
    assert fused_ops.split_starts(512, 1100) == [0, 128, 256, 384, 512, 1024]
    assert fused_ops.split_starts(128, 300) == [0, 128, 256] and fused_ops.split_starts(64, 130) == [0, 64, 128]
    with pytest.raises(ValueError, match="not a multiple of 128"):
        fused_ops.split_starts(192, 300)
    model = load_model("tiny-qwen3", DEVICE, "float32", seed=1, max_seq_len=16, kernels="fused").model
    assert model.attention_split_slots == fused_ops.SPLIT_SLOTS
    q, k_cache, v_cache = _inputs(6, slots=1100)
    # the last slot of a short split and the first of the next, the last short split's, then the long ones'
    pos = torch.tensor([127, 128, 511, 512, 1023, 1000])
    k_cache[:, :, 1024:], v_cache[:, :, 1024:] = float("nan"), float("nan")  # never read
    got = fused_ops.attention(q.to(DEVICE), k_cache.to(DEVICE), v_cache.to(DEVICE), pos.to(DEVICE), 0.3, 512)
    reference = reference_attention(q, k_cache, v_cache, torch.arange(1100)[None, :] <= pos[:, None], 0.3)
    assert (got.view(6, 4, 16).cpu() - reference).abs().max() <= TOL * reference.abs().max()
    for row in (0, 2, 5):  # a row's value is its own, bit for bit, whatever the other rows' positions
        alone = fused_ops.attention(
            q[row : row + 1].to(DEVICE), k_cache.to(DEVICE), v_cache.to(DEVICE), pos[row : row + 1].to(DEVICE), 0.3, 512
        )
        assert torch.equal(alone, got[row : row + 1])
