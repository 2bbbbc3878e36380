"""Synthetic presets: the exact architectures of the models we study, built with random weights.

Timing depends on shapes, not values, so a preset's costs are real costs. The real configs
(Qwen/Qwen3-32B, Qwen/Qwen3-32B-AWQ, Qwen/Qwen3-0.6B, Qwen/Qwen3-1.7B, google/gemma-3-270m,
meta-llama/Llama-3.2-1B, meta-llama/Llama-3.2-3B, meta-llama/Llama-3.1-8B, meta-llama/Llama-3.3-70B-Instruct
and its AWQ GEMM int4 form, group size 128) are copied field for field; the tiny presets keep the same
structure at test size.
"""

from __future__ import annotations

from model.config import FULL, SLIDING, Llama3RopeScaling, ModelConfig


def _gemma_layer_types(n_layers: int, pattern: int = 6) -> tuple[str, ...]:
    """Gemma3's pattern: (pattern - 1) sliding-window layers, then one full-attention layer."""
    return tuple(SLIDING if (i + 1) % pattern else FULL for i in range(n_layers))


_QWEN3_32B = ModelConfig(
    arch="qwen3",
    vocab_size=151936,
    hidden_size=5120,
    intermediate_size=25600,
    n_layers=64,
    n_heads=64,
    n_kv_heads=8,
    head_dim=128,
    rope_theta=1_000_000.0,
    tie_word_embeddings=False,
)
_TINY_QWEN3 = ModelConfig(
    arch="qwen3",
    vocab_size=512,
    hidden_size=64,
    intermediate_size=128,
    n_layers=4,
    n_heads=4,
    n_kv_heads=2,
    head_dim=16,
    rope_theta=1_000_000.0,
    tie_word_embeddings=False,
)


def _llama3(**shape) -> ModelConfig:
    """A Llama 3.1 / 3.2 / 3.3 architecture: 128k vocabulary, RoPE base 500000 with llama3 scaling
    (factor 8 for 3.1 and 3.3, 32 for 3.2), 128k positions."""
    factor = shape.pop("rope_factor")
    return ModelConfig(
        arch="llama",
        vocab_size=128256,
        rope_theta=500_000.0,
        rms_norm_eps=1e-5,
        max_positions=131072,
        rope_scaling=Llama3RopeScaling(factor, 1.0, 4.0, 8192),
        **shape,
    )


_LLAMA_33_70B = _llama3(
    hidden_size=8192,
    intermediate_size=28672,
    n_layers=80,
    n_heads=64,
    n_kv_heads=8,
    head_dim=128,
    tie_word_embeddings=False,
    rope_factor=8.0,
)
_TINY_LLAMA = ModelConfig(
    arch="llama",
    vocab_size=512,
    hidden_size=64,
    intermediate_size=128,
    n_layers=4,
    n_heads=4,
    n_kv_heads=2,
    head_dim=16,
    rope_theta=500_000.0,
    rms_norm_eps=1e-5,
    tie_word_embeddings=False,
    max_positions=4096,
    rope_scaling=Llama3RopeScaling(8.0, 1.0, 4.0, 64),  # a short original context: every band is exercised
)

PRESETS: dict[str, ModelConfig] = {
    "qwen3-32b": _QWEN3_32B,
    "qwen3-32b-awq": ModelConfig(**{**_QWEN3_32B.__dict__, "quant": "awq", "awq_group_size": 128}),
    "qwen3-0.6b": ModelConfig(
        arch="qwen3",
        vocab_size=151936,
        hidden_size=1024,
        intermediate_size=3072,
        n_layers=28,
        n_heads=16,
        n_kv_heads=8,
        head_dim=128,
        rope_theta=1_000_000.0,
        tie_word_embeddings=True,
    ),
    "qwen3-1.7b": ModelConfig(
        arch="qwen3",
        vocab_size=151936,
        hidden_size=2048,
        intermediate_size=6144,
        n_layers=28,
        n_heads=16,
        n_kv_heads=8,
        head_dim=128,
        rope_theta=1_000_000.0,
        tie_word_embeddings=True,
    ),
    "gemma3-270m": ModelConfig(
        arch="gemma3",
        vocab_size=262144,
        hidden_size=640,
        intermediate_size=2048,
        n_layers=18,
        n_heads=4,
        n_kv_heads=1,
        head_dim=256,
        rope_theta=1_000_000.0,
        tie_word_embeddings=True,
        hidden_activation="gelu_pytorch_tanh",
        layer_types=_gemma_layer_types(18),
        sliding_window=512,
        rope_local_base_freq=10_000.0,
        query_pre_attn_scalar=256,
        max_positions=32768,
    ),
    "llama-3.2-1b": _llama3(
        hidden_size=2048,
        intermediate_size=8192,
        n_layers=16,
        n_heads=32,
        n_kv_heads=8,
        head_dim=64,
        tie_word_embeddings=True,
        rope_factor=32.0,
    ),
    "llama-3.2-3b": _llama3(
        hidden_size=3072,
        intermediate_size=8192,
        n_layers=28,
        n_heads=24,
        n_kv_heads=8,
        head_dim=128,
        tie_word_embeddings=True,
        rope_factor=32.0,
    ),
    "llama-3.1-8b": _llama3(
        hidden_size=4096,
        intermediate_size=14336,
        n_layers=32,
        n_heads=32,
        n_kv_heads=8,
        head_dim=128,
        tie_word_embeddings=False,
        rope_factor=8.0,
    ),
    "llama-3.3-70b": _LLAMA_33_70B,
    "llama-3.3-70b-awq": ModelConfig(**{**_LLAMA_33_70B.__dict__, "quant": "awq", "awq_group_size": 128}),
    "tiny-qwen3": _TINY_QWEN3,
    "tiny-qwen3-draft": ModelConfig(
        arch="qwen3",
        vocab_size=512,
        hidden_size=32,
        intermediate_size=64,
        n_layers=2,
        n_heads=2,
        n_kv_heads=1,
        head_dim=16,
        rope_theta=1_000_000.0,
        tie_word_embeddings=True,
    ),
    "tiny-qwen3-awq": ModelConfig(**{**_TINY_QWEN3.__dict__, "quant": "awq", "awq_group_size": 32}),
    "tiny-llama": _TINY_LLAMA,
    "tiny-llama-draft": ModelConfig(
        **{
            **_TINY_LLAMA.__dict__,
            "hidden_size": 32,
            "intermediate_size": 64,
            "n_layers": 2,
            "layer_types": (FULL, FULL),
            "n_heads": 2,
            "n_kv_heads": 1,
            "tie_word_embeddings": True,
        }
    ),
    "tiny-llama-awq": ModelConfig(**{**_TINY_LLAMA.__dict__, "quant": "awq", "awq_group_size": 32}),
    "tiny-gemma3": ModelConfig(
        arch="gemma3",
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        n_layers=3,
        n_heads=2,
        n_kv_heads=1,
        head_dim=32,
        rope_theta=1_000_000.0,
        tie_word_embeddings=True,
        hidden_activation="gelu_pytorch_tanh",
        layer_types=_gemma_layer_types(3, pattern=3),
        sliding_window=8,
        rope_local_base_freq=10_000.0,
        query_pre_attn_scalar=32,
    ),
}
