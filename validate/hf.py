"""Hugging Face's own models built from OUR weights (shared tensors, nothing downloaded), and timed
`generate` runs: greedy target-only, and assisted generation with the same draft.

Our Transformer's parameter names are Hugging Face's minus the `model.` prefix (model/loading.py
maps checkpoints that way), and `lm_head.weight` is ours when the head is untied. The Hugging Face
model is built with its parameters on the meta device and then given our tensors (`assign=True`),
so it costs no second copy of the weights; its buffers (RoPE tables, Gemma's embedding scale) are
computed on the device as Hugging Face computes them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from contracts import UsageError
from model.config import FULL, SLIDING, ModelConfig
from model.transformer import Transformer


def hf_config(config: ModelConfig, max_positions: int):
    """A transformers config with exactly our architecture (Qwen3ForCausalLM, Gemma3ForCausalLM or
    LlamaForCausalLM)."""
    from transformers import Gemma3TextConfig, LlamaConfig, Qwen3Config

    if config.quant:
        raise UsageError(
            "--peers needs an unquantized target: transformers runs AWQ only through autoawq, "
            "which is not installed (use qwen3-32b rather than qwen3-32b-awq)"
        )
    common = dict(
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.n_layers,
        num_attention_heads=config.n_heads,
        num_key_value_heads=config.n_kv_heads,
        head_dim=config.head_dim,
        rms_norm_eps=config.rms_norm_eps,
        tie_word_embeddings=config.tie_word_embeddings,
        layer_types=list(config.layer_types),
        max_position_embeddings=max_positions,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
        attention_bias=False,
    )
    rope = {"rope_type": "default", "rope_theta": config.rope_theta}
    if config.arch == "qwen3":
        return Qwen3Config(
            **common,
            hidden_act=config.hidden_activation,
            rope_parameters=rope,
            use_sliding_window=SLIDING in config.layer_types,
            sliding_window=config.sliding_window,
        )
    if config.arch == "llama":
        scaling = config.rope_scaling
        if scaling is not None:
            rope = {
                "rope_type": "llama3",
                "rope_theta": config.rope_theta,
                "factor": scaling.factor,
                "low_freq_factor": scaling.low_freq_factor,
                "high_freq_factor": scaling.high_freq_factor,
                "original_max_position_embeddings": scaling.original_max_positions,
            }
        return LlamaConfig(**common, hidden_act=config.hidden_activation, rope_parameters=rope, mlp_bias=False)
    local = {"rope_type": "default", "rope_theta": config.local_rope_theta}
    return Gemma3TextConfig(
        **common,
        hidden_activation=config.hidden_activation,
        sliding_window=config.sliding_window,
        query_pre_attn_scalar=config.query_pre_attn_scalar,
        rope_parameters={FULL: rope, SLIDING: local},
    )


def hf_twin(model: Transformer, max_positions: int):
    """transformers' CausalLM over `model`'s own parameter tensors, on its device, in eval mode."""
    from accelerate import init_empty_weights
    from transformers import AutoModelForCausalLM

    device, dtype = model.head_weight.device, model.head_weight.dtype
    with torch.device(device), init_empty_weights(include_buffers=False):
        twin = AutoModelForCausalLM.from_config(hf_config(model.config, max_positions), dtype=dtype)
    state = {
        ("lm_head.weight" if name == "lm_head.weight" else f"model.{name}"): tensor
        for name, tensor in model.checkpoint_state_dict().items()
    }
    result = twin.load_state_dict(state, strict=False, assign=True)
    missing = set(result.missing_keys) - ({"lm_head.weight"} if model.config.tie_word_embeddings else set())
    if missing or result.unexpected_keys:
        raise RuntimeError(
            f"weights do not map onto transformers' model: missing {sorted(missing)[:3]}, "
            f"unexpected {sorted(result.unexpected_keys)[:3]}"
        )
    if model.config.tie_word_embeddings:
        twin.lm_head.weight = twin.model.embed_tokens.weight
    return twin.eval()


class _Clock:
    """A streamer that notes when tokens reach the host: the first put is the prompt, the next the first
    generated token(s) (Hugging Face moves each to the CPU, so the time is when they exist)."""

    def __init__(self):
        self.times: list[float] = []
        self.counts: list[int] = []

    def put(self, value) -> None:
        self.times.append(time.perf_counter())
        self.counts.append(value.numel())

    def end(self) -> None:
        self.times.append(time.perf_counter())


@dataclass
class HFRun:
    """One Hugging Face generation: tokens (the first one first), timing, and its rounds when assisted."""

    tokens: list[int]
    ttft_ms: float  # until the first generated tokens reached the host (for assisted: the first round)
    decode_ms: float  # the rest
    decode_tokens: int  # tokens generated after the first put
    total_ms: float
    target_calls: int  # target forwards (rounds for assisted generation, the prefill included)
    proposed: int  # draft tokens the target checked (assisted)


def generation_config(max_new: int):
    """Greedy, exactly max_new tokens (no EOS stop, as our decoder runs)."""
    from transformers import GenerationConfig

    return GenerationConfig(max_new_tokens=max_new, do_sample=False, eos_token_id=None, pad_token_id=0, num_beams=1)


def set_assistant(draft_twin, K: int) -> None:
    """K proposals every round, as ours: constant schedule, no confidence-based early stop (the
    assistant's own generation config is what assisted generation reads)."""
    gc = draft_twin.generation_config
    gc.num_assistant_tokens, gc.num_assistant_tokens_schedule, gc.assistant_confidence_threshold = K, "constant", 0.0


@torch.no_grad()
def generate(twin, prompt_ids: list[int], max_new: int, assistant=None) -> HFRun:
    """One timed `generate` (assisted when `assistant` is given), counting the target's forwards."""
    device = twin.lm_head.weight.device
    inputs = torch.tensor([prompt_ids], dtype=torch.long, device=device)
    lengths: list[int] = []
    hook = twin.register_forward_pre_hook(
        lambda module, a, kw: lengths.append(kw["input_ids"].shape[1] if "input_ids" in kw else a[0].shape[1]),
        with_kwargs=True,
    )
    clock = _Clock()
    try:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        out = twin.generate(
            inputs,
            attention_mask=torch.ones_like(inputs),
            generation_config=generation_config(max_new),
            assistant_model=assistant,
            streamer=clock,
        )
        tokens = out[0, len(prompt_ids) :].tolist()
        end = time.perf_counter()
    finally:
        hook.remove()
    first = clock.times[1] if len(clock.times) > 2 else end
    proposed = (lengths[0] - len(prompt_ids) + sum(n - 1 for n in lengths[1:])) if assistant is not None else 0
    return HFRun(
        tokens,
        (first - start) * 1e3,
        (end - first) * 1e3,
        len(tokens) - clock.counts[1],
        (end - start) * 1e3,
        len(lengths),
        proposed,
    )
