"""The Hugging Face eager reference: the same architectures through `transformers` with DynamicCache.

    python -m measure.hf_eager --model qwen3-0.6b --device cuda:1 --out hf.json

Random weights (synthetic, like our presets: timing depends on shapes, not values). One forward of
n new tokens after a prefilled context, the way `generate` runs a decode step; medians of CUDA-event
times. This is the figure our own decoder's costs are compared against in reports/.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

from model.presets import PRESETS

from .timing import time_op


def hf_config(name: str):
    """A transformers config with the preset's exact architecture."""
    from transformers import Qwen3Config

    c = PRESETS[name]
    if c.arch != "qwen3" or c.quant:
        raise SystemExit(f"error: hf_eager covers bf16 Qwen3 presets, not {name}")
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
        max_position_embeddings=4096,
    )


@torch.no_grad()
def time_hf_forward(name: str, device: torch.device, n_tokens: list[int], context: int, reps: int) -> dict:
    from transformers import AutoModelForCausalLM, DynamicCache

    with torch.device(device):
        model = AutoModelForCausalLM.from_config(hf_config(name), torch_dtype=torch.bfloat16).eval()
    prompt = torch.randint(0, model.config.vocab_size, (1, context), device=device)
    results = {}
    for n in n_tokens:
        caches = []
        for _ in range(2):  # prefilled caches, rotated; each decode crops its cache back to the context
            caches.append(DynamicCache())
            model(prompt, past_key_values=caches[-1], use_cache=True)
        new = torch.randint(0, model.config.vocab_size, (1, n), device=device)

        def decode(cache, new=new):
            out = model(new, past_key_values=cache, use_cache=True)
            cache.crop(context)
            return out.logits[:, -1].argmax(-1)

        results[n] = time_op(decode, [(c,) for c in caches], device, reps=reps, warmup=3)
    return {"model": name, "weights": "synthetic", "context": context, "forward_ms": results}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m measure.hf_eager", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model", action="append", required=True, help="bf16 Qwen3 preset (repeatable)")
    p.add_argument("--device", default="cuda:0")
    p.add_argument("--n-tokens", default="1,6,7,8", help="new tokens per forward")
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    device = torch.device(args.device)
    if device.type != "cuda" or not torch.cuda.is_available():
        print("error: no GPU: the Hugging Face eager reference is measured on CUDA", file=sys.stderr)
        return 2
    n_tokens = [int(x) for x in args.n_tokens.split(",")]
    data = []
    for name in args.model:  # one model on the GPU at a time
        data.append(time_hf_forward(name, device, n_tokens, args.context, args.reps))
        torch.cuda.empty_cache()
    with open(args.out, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(device), "torch": torch.__version__, "runs": data}, f, indent=1)
    for run in data:
        for n, t in run["forward_ms"].items():
            print(f"{run['model']} n={n}: {t['median_ms']:.3f} ms [{t['p10_ms']:.3f}, {t['p90_ms']:.3f}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
