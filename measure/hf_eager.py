"""The Hugging Face eager reference: the same architectures through `transformers` with DynamicCache.

    python -m measure.hf_eager --model qwen3-0.6b --device cuda:1 --out hf.json

Weights are SYNTHETIC (random values, like our presets: timing depends on shapes, not values). One
forward of n new tokens after a prefilled context, the way `generate` runs a decode step; medians of
CUDA-event times (measure/timing.py) on a CUDA GPU. This is the figure our own decoder's costs are
compared against in reports/. --model names a bf16 Qwen3 preset (repeatable; default the draft's,
qwen3-0.6b); the models are measured one at a time.
"""

from __future__ import annotations

import argparse
import sys

import torch

from contracts import UsageError
from model.cli import run_torch_command
from model.presets import PRESETS

from .timing import at_least_one, gpu_command_parser, start_gpu_command, time_op, write_result

COMMAND = "python -m measure.hf_eager"
MODELS = tuple(name for name, config in PRESETS.items() if config.arch == "qwen3" and not config.quant)
MAX_POSITIONS = 4096  # the configs' max_position_embeddings: the context and the new tokens must fit


def hf_config(name: str):
    """A transformers config with the preset's exact architecture."""
    from transformers import Qwen3Config

    c = PRESETS[name]
    return Qwen3Config(
        vocab_size=c.vocab_size,
        hidden_size=c.hidden_size,
        intermediate_size=c.intermediate_size,
        num_hidden_layers=c.n_layers,
        num_attention_heads=c.n_heads,
        num_key_value_heads=c.n_kv_heads,
        head_dim=c.head_dim,
        rope_theta=c.rope_theta,
        rms_norm_eps=c.rms_norm_eps,
        tie_word_embeddings=c.tie_word_embeddings,
        max_position_embeddings=MAX_POSITIONS,
    )


@torch.no_grad()
def time_hf_forward(name: str, device: torch.device, n_tokens: list[int], context: int, reps: int) -> dict:
    from transformers import AutoModelForCausalLM, DynamicCache

    with torch.device(device):
        model = AutoModelForCausalLM.from_config(hf_config(name), dtype=torch.bfloat16).eval()
    prompt = torch.randint(0, model.config.vocab_size, (1, context), device=device)
    results = {}
    for n in n_tokens:
        caches = []
        for _ in range(2):  # prefilled caches, rotated; each decode crops its cache back to the context
            caches.append(DynamicCache())
            model(prompt, past_key_values=caches[-1], use_cache=True)
        new = torch.randint(0, model.config.vocab_size, (1, n), device=device)

        def decode(cache, new=new, n=n):
            out = model(new, past_key_values=cache, use_cache=True)
            cache.crop(-n)  # the n tokens this forward added
            return out.logits[:, -1].argmax(-1)

        results[n] = time_op(decode, [(c,) for c in caches], device, reps=reps, warmup=3)
    return {"model": name, "weights": "synthetic", "context": context, "forward_ms": results}


def token_counts(text: str) -> list[int]:
    """--n-tokens: new tokens per forward, comma-separated integers >= 1."""
    return [at_least_one(piece) for piece in text.split(",")]


def parser() -> argparse.ArgumentParser:
    p = gpu_command_parser(COMMAND, __doc__, 10, "timed repetitions per forward")
    p.add_argument(
        "--model", action="append", choices=MODELS, help="a bf16 Qwen3 preset (repeatable; default qwen3-0.6b)"
    )
    p.add_argument(
        "--n-tokens", type=token_counts, default=[1, 6, 7, 8], help="new tokens per forward (default 1,6,7,8)"
    )
    p.add_argument("--context", type=at_least_one, default=512, help="prefilled context tokens (default 512)")
    return p


def main(argv=None) -> int:
    def body():
        args = parser().parse_args(argv)
        if args.context + max(args.n_tokens) > MAX_POSITIONS:
            raise UsageError(
                f"--context {args.context} plus {max(args.n_tokens)} new tokens exceed {MAX_POSITIONS} positions"
            )
        out, device = start_gpu_command(COMMAND, args.out, args.device, modules=("transformers",))
        data = []
        for name in args.model or ["qwen3-0.6b"]:  # one model on the GPU at a time
            data.append(time_hf_forward(name, device, args.n_tokens, args.context, args.reps))
            torch.cuda.empty_cache()
        write_result(out, {"device": torch.cuda.get_device_name(device), "torch": torch.__version__, "runs": data})
        for run in data:
            for n, t in run["forward_ms"].items():
                print(f"{run['model']} n={n}: {t['median_ms']:.3f} ms [{t['p10_ms']:.3f}, {t['p90_ms']:.3f}]")

    return run_torch_command(body)


if __name__ == "__main__":
    sys.exit(main())
