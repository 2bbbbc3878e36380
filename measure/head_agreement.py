"""Each draft head's agreement with the dense draft head, per draft position, on held-out prompts.

    python -m measure.head_agreement --draft ~/.cache/flashspec/gemma-3-270m#layers=12 \\
        --head-assets ~/.cache/flashspec/gemma-3-270m/head_assets \\
        --heads shortlist:4096+shortlist:32768+router:64+router:256,64,16 --out reports/heads/gemma.json

For every held-out prompt the dense draft greedily continues it; rounds start every `--stride`
tokens of that continuation. From each start a head drafts K tokens, feeding its own tokens (its
own trajectory, as in the decoder); at every step the dense head scores the same hidden state. Per
draft position we count `agree` (the head's token is the dense head's on that state) and `prefix`
(the head's first i tokens are all the dense draft's: what an always-accepting target would accept
of it relative to the dense draft). The router reads the true previous hidden state. A second
table pools every state of prompt and continuation (one forward per prompt) for each head at each
budget. Intervals: Wilson 95% (rounds of one prompt are correlated, so they are a little narrow).
Evaluation prompts must not be training prompts of the assets: checked from the assets' records.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

from contracts import UsageError
from contracts.cli import OneLineParser
from contracts.files import check_output_file, write_atomic
from contracts.heads import parse_heads
from contracts.progress import each
from model.build_head import HELD_OUT_CATEGORIES, training_prompts
from model.cli import run_torch_command
from model.decoder import Decoder, cache_room
from model.head_assets import training_prompt_ids
from model.heads import DenseHead, PositionalHead, RouterHead, heads_by_position
from model.loading import load_model
from model.memory import check_cache
from model.pair import Pair
from model.sampling import check_seed

_GATHERED = 1 << 24  # head-row elements a pooled call may gather at once (rows x scored tokens x d)


def wilson(successes: int, n: int, z: float = 1.96) -> list[float]:
    """The Wilson score interval of a proportion (95% by default)."""
    if n == 0:
        return [0.0, 1.0]
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return [round(max(0.0, centre - half), 4), round(min(1.0, centre + half), 4)]


def _propose(head, hidden: torch.Tensor, fed: torch.Tensor, previous: torch.Tensor) -> torch.Tensor:
    """The head's token for hidden [n, d] with the router's inputs given explicitly."""
    if isinstance(head, RouterHead):
        return head.score(hidden, head.route(fed, previous))
    return head.argmax(hidden)


@torch.no_grad()
def rounds_agreement(model, dense, heads: dict, sequence: list[int], start: int, K: int, stride: int) -> dict:
    """Per head: per position [agree, prefix, n] over the rounds of one prompt's sequence (prompt then
    the dense draft's continuation, which starts after index `start`)."""
    device = model.head_weight.device
    tokens = torch.tensor([sequence], device=device)
    states = model.forward_hidden(tokens, torch.arange(len(sequence), device=device))[0]
    counts = {name: [[0, 0, 0] for _ in range(K)] for name in heads}
    for s in range(start, len(sequence) - K, stride):
        for name, head in heads.items():
            fed, previous, prefix = tokens[0, s : s + 1], states[s - 1 : s], True
            for i in range(K):
                hidden = model.forward_hidden(fed.view(1, 1), torch.tensor([s + i], device=device))[0]
                at = head.at(i) if isinstance(head, PositionalHead) else head
                token = _propose(at, hidden, fed, previous)
                agree = bool(token == dense.argmax(hidden))
                prefix = prefix and agree
                counts[name][i][0] += agree
                counts[name][i][1] += prefix
                counts[name][i][2] += 1
                fed, previous = token, hidden
            model.forward_hidden(tokens[:, s : s + K], torch.arange(s, s + K, device=device))  # restore the cache
    return counts


@torch.no_grad()
def pooled_agreement(dense, heads: dict, sequence: list[int], states: torch.Tensor) -> dict:
    """Per head and budget: [agree, n] over every state of the sequence (the router reads the true
    previous state and the token fed)."""
    fed = torch.tensor(sequence, device=states.device)
    previous = torch.cat([torch.zeros_like(states[:1]), states[:-1]])
    want = dense.argmax(states)
    out = {}
    for name, head in heads.items():
        for index, one in enumerate(dict.fromkeys(heads_by_position(head))):
            rows = max(1, _GATHERED // max(1, round(one.work_ratio * one.vocab_size) * states.shape[1]))
            parts = zip(states.split(rows), fed.split(rows), previous.split(rows))
            got = torch.cat([_propose(one, h, f, p) for h, f, p in parts])
            out[(name, index)] = [int((got == want).sum()), int(want.numel())]
    return out


def parse_args(argv):
    p = OneLineParser(
        prog="python -m measure.head_agreement",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add = p.add_argument
    add("--draft", default="tiny-qwen3-draft", help="the draft model (default tiny-qwen3-draft)")
    add("--heads", required=True, help="head specs joined by + (contracts/heads.py)")
    add("--head-assets", default=None, metavar="DIR", help="shortlist/router assets")
    add("--clustering", default=None, metavar="DIR", help="FlashHead assets folder (default: built from the head)")
    add(
        "--categories",
        default=",".join(HELD_OUT_CATEGORIES),
        help="held-out categories (default qa, math_reasoning, rag)",
    )
    add("--per-category", type=int, default=6, help="prompts per category (default 6)")
    add("--prompt-max", type=int, default=128, help="prompt tokens kept (default 128)")
    add("--new-tokens", type=int, default=48, help="dense draft tokens per prompt (default 48)")
    add("--K", type=int, default=4, help="draft positions per round (default 4)")
    add("--stride", type=int, default=8, help="tokens between round starts (default 8)")
    add("--out", required=True, metavar="FILE", help="result JSON")
    add("--seed", type=int, default=0, help="seed of synthetic weights and clustering (default 0)")
    return p.parse_args(argv)


def run(args) -> int:
    specs = parse_heads(args.heads)
    if args.K < 1 or args.stride < args.K or args.per_category < 1 or args.new_tokens <= args.K:
        raise UsageError("need --K >= 1, --stride >= --K, --per-category >= 1 and --new-tokens > --K")
    check_seed(args.seed)
    check_output_file(Path(args.out), "--out")
    categories = tuple(c.strip() for c in args.categories.split(",") if c.strip())
    prompts = training_prompts(categories, args.per_category)
    loaded = load_model(args.draft, "cpu", None, args.seed + 1, max_seq_len=1)
    room = cache_room(args.prompt_max, args.new_tokens, args.K)
    check_cache(loaded.model, room, "--prompt-max and --new-tokens")
    pair = Pair(loaded, loaded, "cpu", args.seed, args.clustering, args.head_assets)
    heads = {spec.label: pair.head(spec) for spec in specs}
    trained = training_prompt_ids(args.head_assets)
    overlap = sorted(trained & {p.id for p in prompts})
    if overlap:
        raise UsageError(f"evaluation prompts {', '.join(overlap[:5])} were used to build the head assets")
    model = loaded.model
    model.setup_cache(room)
    dense = DenseHead(model.head_weight)
    reference = Decoder(model, graphs=False, phases=False, K=1)
    per_round = {name: defaultdict(lambda: [[0, 0, 0] for _ in range(args.K)]) for name in heads}
    pooled = defaultdict(lambda: [0, 0])
    t0 = time.perf_counter()
    for prompt in each(prompts, "held-out prompts", "prompt"):
        ids = loaded.tokenizer.encode(prompt.text)[: args.prompt_max]
        sequence = ids + reference.reference(ids, args.new_tokens)[:-1]
        states = model.forward_hidden(torch.tensor([sequence]), torch.arange(len(sequence)))[0]
        for key, (agree, n) in pooled_agreement(dense, heads, sequence, states).items():
            pooled[key][0] += agree
            pooled[key][1] += n
        counts = rounds_agreement(model, dense, heads, sequence, len(ids) - 1, args.K, args.stride)
        for name, rows in counts.items():
            for i, row in enumerate(rows):
                for target in (per_round[name][prompt.category][i], per_round[name]["all"][i]):
                    for j in range(3):
                        target[j] += row[j]
    result = {
        "schema": "specloop.head_agreement/1",
        "weights": loaded.info["weights"],
        "draft": args.draft,
        "categories": list(categories),
        "prompts": [p.id for p in prompts],
        "trained_on": sorted(trained),
        "K": args.K,
        "stride": args.stride,
        "prompt_max": args.prompt_max,
        "new_tokens": args.new_tokens,
        "seconds": round(time.perf_counter() - t0, 1),
        "machine": f"{platform.machine()} CPU, {torch.get_num_threads()} torch threads, torch {torch.__version__}",
        "commit": _commit(),
        "heads": {},
    }
    for name, head in heads.items():
        rows = {}
        for group, positions in per_round[name].items():
            rows[group] = [
                {
                    "position": i + 1,
                    "n": n,
                    "agree": round(a / n, 4),
                    "agree_ci": wilson(a, n),
                    "prefix": round(f / n, 4),
                    "prefix_ci": wilson(f, n),
                }
                for i, (a, f, n) in enumerate(positions)
            ]
        pool = []
        for i, one in enumerate(dict.fromkeys(heads_by_position(head))):
            agree, n = pooled[(name, i)]
            rows_scored = round(one.work_ratio * one.vocab_size)
            pool.append(
                {
                    "budget": one.budget,
                    "rows_scored": rows_scored,
                    "n": n,
                    "agree": round(agree / n, 4),
                    "agree_ci": wilson(agree, n),
                }
            )
        result["heads"][name] = {"per_position": rows, "pooled": pool}
    write_atomic(Path(args.out), json.dumps(result, indent=1) + "\n")
    print(markdown(result))
    return 0


def _commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def markdown(result: dict) -> str:
    """Per-position agreement (all held-out categories) and the pooled table, as Markdown."""
    K = result["K"]
    lines = [f"weights: {result['weights']}; draft {result['draft']}; categories {', '.join(result['categories'])}", ""]
    lines.append(
        "| head | " + " | ".join(f"pos {i + 1} agree [95% CI]" for i in range(K)) + " | prefix at K | n per position |"
    )
    lines.append("|---" * (K + 3) + "|")
    for name, data in result["heads"].items():
        rows = data["per_position"]["all"]
        cells = [f"{r['agree']:.3f} [{r['agree_ci'][0]:.3f}, {r['agree_ci'][1]:.3f}]" for r in rows]
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {rows[-1]['prefix']:.3f} | {rows[0]['n']} |")
    lines += ["", "| head | budget | rows scored | pooled agree [95% CI] | n |", "|---|---|---|---|---|"]
    for name, data in result["heads"].items():
        for row in data["pooled"]:
            low, high = row["agree_ci"]
            cells = f"{row['budget']} | {row['rows_scored']} | {row['agree']:.3f} [{low:.3f}, {high:.3f}] | {row['n']}"
            lines.append(f"| {name} | {cells} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    return run_torch_command(lambda: run(parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
