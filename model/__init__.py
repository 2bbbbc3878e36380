"""Real models for speculative decoding: our own Qwen3 / Gemma3 decoder with a static KV cache,
AWQ int4 weights, checkpoint and synthetic-preset loading, tokenizers and CUDA-graph capture."""
