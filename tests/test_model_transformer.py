"""Our decoder against Hugging Face's on tiny random checkpoints, and the static-cache contract.

The reference is Hugging Face's full forward over the whole sequence (no cache); ours runs a
prefill, single-token steps, multi-token verify-like chunks, and rewinds over stale slots.
"""

import gc

import pytest
import torch

from model.graphs import GraphedCall, garbage_collected_first
from model.loading import load_model

VOCAB = 320  # the synthetic byte tokenizer stands in for missing tokenizer files: >= 256
transformers = pytest.importorskip("transformers")


def _randomize(hf_model, seed: int) -> None:
    """Weights of std 0.1 and norm weights away from their init, so a mismatch cannot hide."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in hf_model.parameters():
            if param.dim() == 1:
                param.add_(0.2 * torch.randn(param.shape, generator=generator))
            else:
                param.copy_(0.1 * torch.randn(param.shape, generator=generator))


def _save(config, folder, seed: int, **save_kwargs):
    hf_model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    _randomize(hf_model, seed)
    hf_model.eval().save_pretrained(folder, **save_kwargs)
    return hf_model


@pytest.fixture(scope="module")
def qwen3_checkpoint(tmp_path_factory):
    """Untied Qwen3 with GQA, saved in 3+ shards with an index json."""
    config = transformers.Qwen3Config(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=64,
        tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10_000.0},
    )
    folder = tmp_path_factory.mktemp("qwen3")
    return _save(config, folder, seed=1, max_shard_size="100KB"), folder


@pytest.fixture(scope="module")
def gemma3_checkpoint(tmp_path_factory):
    """Tied Gemma3 with sliding-window layers (window 6) and a full layer, distinct RoPE bases and
    a query_pre_attn_scalar unlike head_dim."""
    config = transformers.Gemma3TextConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=3,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        sliding_window=6,
        layer_types=["sliding_attention", "sliding_attention", "full_attention"],
        query_pre_attn_scalar=24,
        max_position_embeddings=64,
        rope_parameters={
            "full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
        },
    )
    folder = tmp_path_factory.mktemp("gemma3")
    return _save(config, folder, seed=2), folder


def _llama_config(tied: bool):
    """Llama 3 with GQA and llama3 RoPE scaling whose original context (64) puts the 16-dim heads'
    frequencies in all three bands: kept (wavelength < 16), interpolated, and divided by the factor (> 64)."""
    return transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=256,
        rms_norm_eps=1e-5,
        tie_word_embeddings=tied,
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 500_000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
    )


@pytest.fixture(scope="module")
def llama_checkpoint(tmp_path_factory):
    """Untied Llama 3 (3.1 / 3.3 style), saved in shards with an index json."""
    folder = tmp_path_factory.mktemp("llama")
    return _save(_llama_config(tied=False), folder, seed=8, max_shard_size="100KB"), folder


@pytest.fixture(scope="module")
def llama_tied_checkpoint(tmp_path_factory):
    """Tied Llama 3 (3.2 1B / 3B style)."""
    folder = tmp_path_factory.mktemp("llama_tied")
    return _save(_llama_config(tied=True), folder, seed=9), folder


def test_llama3_rope_scaling_changes_the_frequencies_in_every_band():
    """A control: the scaled table differs from plain RoPE (so the logits test sees the scaling),
    and equals Hugging Face's llama3 frequencies."""
    from model.config import Llama3RopeScaling
    from model.transformer import rope_tables

    config = _llama_config(tied=False)
    rotary = transformers.models.llama.modeling_llama.LlamaRotaryEmbedding(config)
    scaling = Llama3RopeScaling(8.0, 1.0, 4.0, 64)
    cos, _ = rope_tables(500_000.0, 16, 200, scaling)
    plain, _ = rope_tables(500_000.0, 16, 200)
    want = torch.arange(200).float()[:, None] * rotary.inv_freq[None, :]
    torch.testing.assert_close(cos[:, :8], want.cos(), rtol=0, atol=0)
    changed = (cos != plain).any(0)[:8]
    assert not changed[0] and changed[1:].all()  # the highest frequency is kept, the others scaled


def _reference_logits(hf_model, tokens):
    with torch.no_grad():
        return hf_model(tokens).logits[0]


def _step(model, tokens, start, end):
    """Our logits for tokens[start:end] written at positions start..end-1."""
    return model(tokens[:, start:end], torch.arange(start, end))[0]


def _close(got, want):
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert torch.equal(got.argmax(-1), want.argmax(-1))


@pytest.mark.parametrize(
    "checkpoint", ["qwen3_checkpoint", "gemma3_checkpoint", "llama_checkpoint", "llama_tied_checkpoint"]
)
def test_prefill_decode_and_verify_chunks_match_hugging_face(checkpoint, request):
    hf_model, folder = request.getfixturevalue(checkpoint)
    tokens = torch.randint(0, VOCAB, (1, 24), generator=torch.Generator().manual_seed(3))
    want = _reference_logits(hf_model, tokens)
    model = load_model(str(folder), max_seq_len=32).model

    _close(_step(model, tokens, 0, 10), want[:10])  # prefill, longer than Gemma's window
    for p in range(10, 14):  # one token at a time
        _close(_step(model, tokens, p, p + 1), want[p : p + 1])
    _close(_step(model, tokens, 14, 19), want[14:19])  # a verify-like chunk
    _close(_step(model, tokens, 19, 24), want[19:24])


@pytest.mark.parametrize("checkpoint", ["qwen3_checkpoint", "gemma3_checkpoint", "llama_checkpoint"])
def test_rewind_over_stale_slots_equals_a_fresh_run(checkpoint, request):
    """After a rejected speculation the caller just writes the right tokens at the right positions;
    stale slots beyond them are masked by position, so results are bit-identical to a clean run."""
    hf_model, folder = request.getfixturevalue(checkpoint)
    tokens = torch.randint(0, VOCAB, (1, 20), generator=torch.Generator().manual_seed(4))
    rejected = torch.randint(0, VOCAB, (1, 20), generator=torch.Generator().manual_seed(5))
    want = _reference_logits(hf_model, tokens)

    fresh = load_model(str(folder), max_seq_len=32).model
    _step(fresh, tokens, 0, 12)
    fresh_logits = [_step(fresh, tokens, 12, 13), _step(fresh, tokens, 13, 16)]

    model = load_model(str(folder), max_seq_len=32).model
    _step(model, tokens, 0, 12)
    _step(model, rejected, 12, 18)  # a speculation, all of it rejected later: slots 12..17 now stale
    rewound_logits = [_step(model, tokens, 12, 13), _step(model, tokens, 13, 16)]  # slots 16, 17 stay stale

    for got, clean in zip(rewound_logits, fresh_logits):
        assert torch.equal(got, clean)
    _close(torch.cat(rewound_logits), want[12:16])


def test_sliding_window_limits_what_a_gemma3_local_layer_sees(gemma3_checkpoint):
    """Changing a token further back than every window changes only what the full layer sees; a
    model whose full layer is dropped must then be blind to it."""
    _, folder = gemma3_checkpoint
    model = load_model(str(folder), max_seq_len=32).model
    model.layers = model.layers[:2]  # only the two sliding-window layers (window 6)
    tokens = torch.randint(0, VOCAB, (1, 16), generator=torch.Generator().manual_seed(6))
    edited = tokens.clone()
    edited[0, 0] = (tokens[0, 0] + 1) % VOCAB
    last = _step(model, tokens, 0, 16)[-1]
    assert torch.equal(_step(model, edited, 0, 16)[-1], last)  # position 15 sees 10..15 only
    assert not torch.equal(_step(model, edited, 0, 16)[5], _step(model, tokens, 0, 16)[5])


def test_positions_are_device_tensors_and_any_order_of_calls_is_position_exact():
    """The same tokens at the same positions give the same logits however the calls are cut."""
    model = load_model("tiny-qwen3", max_seq_len=16).model
    tokens = torch.randint(0, 512, (1, 12), generator=torch.Generator().manual_seed(7))
    whole = _step(model, tokens, 0, 12)
    _step(model, tokens, 0, 5)
    pieces = torch.cat([_step(model, tokens, 5, 8), _step(model, tokens, 8, 9), _step(model, tokens, 9, 12)])
    torch.testing.assert_close(pieces, whole[5:], rtol=1e-5, atol=1e-5)


def test_head_and_body_byte_counts():
    model = load_model("tiny-qwen3", max_seq_len=8).model
    config = model.config
    assert model.head_weight.shape == (config.vocab_size, config.hidden_size)
    assert model.head_bytes() == config.vocab_size * config.hidden_size * 4
    layer_params = sum(p.numel() for p in model.layers.parameters()) + config.hidden_size
    assert model.body_parameters_bytes() == layer_params * 4  # float32, caches not counted
    tied = load_model("tiny-qwen3-draft", max_seq_len=8).model
    assert tied.head_weight is tied.embed_tokens.weight


def test_forward_hidden_rejects_bad_shapes_and_missing_cache():
    model = load_model("tiny-qwen3", max_seq_len=8).model
    with pytest.raises(ValueError):
        model.forward_hidden(torch.zeros(1, 3, dtype=torch.long), torch.arange(2))
    from model.presets import PRESETS
    from model.transformer import Transformer

    with pytest.raises(RuntimeError, match="setup_cache"):
        Transformer(PRESETS["tiny-qwen3"]).forward_hidden(torch.zeros(1, 1, dtype=torch.long), torch.arange(1))


def test_graphed_call_is_eager_on_cpu():
    calls = []

    def double(x):
        calls.append(x)
        return 2 * x

    graphed = GraphedCall(double)
    assert torch.equal(graphed(torch.ones(3)), 2 * torch.ones(3))
    assert len(calls) == 1 and graphed.captured == 0


def test_no_garbage_is_collected_inside_a_capture():
    """A decoder dropped before a capture is freed before it starts, and nothing is freed by the
    collector inside it (destroying a CUDA graph there would invalidate the capture)."""
    freed = []

    class Cycle:
        def __init__(self):
            self.me = self

        def __del__(self):
            freed.append(1)

    Cycle()  # unreachable, but only the cyclic collector frees it
    with garbage_collected_first():
        assert freed == [1] and not gc.isenabled()
        Cycle()
        containers = [[] for _ in range(100_000)]  # allocations that would trigger an automatic collection
        assert len(containers) == 100_000
        assert freed == [1]
    assert gc.isenabled()
    gc.collect()
    assert freed == [1, 1]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_graphed_forward_equals_eager_on_cuda():
    eager = load_model("tiny-qwen3", device="cuda", dtype="float32", max_seq_len=32).model
    graphed_model = load_model("tiny-qwen3", device="cuda", dtype="float32", max_seq_len=32).model
    graphed = GraphedCall(graphed_model.forward)
    tokens = torch.randint(0, 512, (1, 20), device="cuda", generator=torch.Generator("cuda").manual_seed(8))
    positions = torch.arange(20, device="cuda")
    for start, end in [(0, 8), (8, 9), (9, 12), (12, 13), (13, 16), (16, 17)]:
        want = eager(tokens[:, start:end], positions[start:end])
        got = graphed(tokens[:, start:end], positions[start:end]).clone()
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert graphed.captured == 3  # shapes n = 8, 1, 3


def test_cpu_attention_reads_the_cache_only_up_to_the_last_visible_slot():
    """On the CPU a step's attention stops at the last slot any query sees, so its cost follows the
    context and not the cache's size: NaN in every slot past it (were they read, 0 x NaN would reach
    the output) leaves the hidden states exactly as zeros there do."""
    model = load_model("tiny-qwen3", "cpu", "float32", seed=0, max_seq_len=64).model
    tokens = torch.arange(1, 13).view(1, -1)
    model.forward_hidden(tokens[:, :10], torch.arange(10))
    want = model.forward_hidden(tokens[:, 10:], torch.arange(10, 12))
    for layer in model.layers:
        for cache in (layer.self_attn.k_cache, layer.self_attn.v_cache):
            cache[:, :, 12:] = float("nan")
    got = model.forward_hidden(tokens[:, 10:], torch.arange(10, 12))
    assert torch.equal(got, want)
