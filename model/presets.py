"""Synthetic presets: the exact architectures of the models we study, built with random weights.

Timing depends on shapes, not values, so a preset's costs are real costs. The real configs
(Qwen/Qwen3-32B, Qwen/Qwen3-32B-AWQ, Qwen/Qwen3-0.6B, Qwen/Qwen3-1.7B, google/gemma-3-270m) are
copied field for field; the tiny presets keep the same structure at test size.
"""

from __future__ import annotations

from model.config import FULL, SLIDING, ModelConfig


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
