"""python -m model.build_head: build the shortlist and router head assets from the draft's own generations.

    python -m model.build_head --kind shortlist,router --draft ~/.cache/flashspec/gemma-3-270m#layers=12 \\
        --out ~/.cache/flashspec/gemma-3-270m/head_assets

The draft greedily continues each training prompt (a training split of Spec-Bench categories, kept
apart from the categories heads are evaluated on); at every position of prompt and continuation we
keep the token fed, the previous hidden state and the hidden state. The shortlist ranks tokens by how
often the dense draft proposes them there (its argmax); the router learns which clusters hold the
draft's top tokens (model/router.py). The assets record their training prompts (model/head_assets.py).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from contracts import UsageError
from contracts.cli import OneLineParser, parse_choices, require_modules
from contracts.files import check_output_folder, staged

require_modules("python -m model.build_head", ("torch",), "pip install torch, then pip install -e '.[model]'")

import torch  # noqa: E402

from contracts.progress import each  # noqa: E402
from model.cli import run_torch_command  # noqa: E402
from model.decoder import Decoder, cache_room  # noqa: E402
from model.head_assets import Shortlist, save_router, save_shortlist  # noqa: E402
from model.loading import load_model  # noqa: E402
from model.memory import check_cache  # noqa: E402
from model.prompts import Prompt, load_questions  # noqa: E402
from model.router import build_router  # noqa: E402
from model.sampling import check_seed  # noqa: E402

KINDS = ("shortlist", "router")
# Spec-Bench categories heads are trained on, and the ones held out for evaluation (disjoint).
TRAIN_CATEGORIES = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")
TRAIN_CATEGORIES += ("translation", "summarization")
HELD_OUT_CATEGORIES = ("qa", "math_reasoning", "rag")


def training_prompts(categories: tuple[str, ...], per_category: int, path=None) -> list[Prompt]:
    """The first `per_category` questions of each category, in file order."""
    questions = load_questions(path)
    known = list(dict.fromkeys(q.category for q in questions))
    unknown = [c for c in categories if c not in known]
    if not categories:
        raise UsageError(f"--categories names no category; valid: {', '.join(known)}")
    if unknown:
        raise UsageError(f"unknown categories {', '.join(unknown)}; valid: {', '.join(known)}")
    chosen = []
    for category in categories:
        chosen += [q for q in questions if q.category == category][:per_category]
    return chosen


@torch.no_grad()
def draft_samples(loaded, prompts: list[Prompt], prompt_max: int, new_tokens: int) -> dict:
    """Per position of every prompt (cut to `prompt_max` tokens) and its greedy continuation by the
    draft: `tokens` fed [N], `previous` hidden state [N, d] (zeros at a sequence's start), `hidden`
    [N, d]; `prompts` the ids used."""
    model = loaded.model
    model.setup_cache(cache_room(prompt_max, new_tokens, 1))
    decoder = Decoder(model, graphs=False, phases=False, K=1)
    device = model.head_weight.device
    tokens, previous, hidden = [], [], []
    for prompt in each(prompts, "draft generations", "prompt"):
        ids = loaded.tokenizer.encode(prompt.text)[:prompt_max]
        sequence = ids + decoder.reference(ids, new_tokens)[:-1]
        states = model.forward_hidden(
            torch.tensor([sequence], device=device), torch.arange(len(sequence), device=device)
        )[0]
        tokens.append(torch.tensor(sequence))
        hidden.append(states.float().cpu())
        previous.append(torch.cat([torch.zeros_like(states[:1]), states[:-1]]).float().cpu())
    return {
        "tokens": torch.cat(tokens),
        "previous": torch.cat(previous),
        "hidden": torch.cat(hidden),
        "prompts": [p.id for p in prompts],
    }


def build_shortlist(weight: torch.Tensor, samples: dict, info: dict) -> Shortlist:
    """Tokens ranked by how often the dense draft head proposes them over the samples (ties and
    never-proposed tokens: lower id first)."""
    vocab = weight.shape[0]
    proposed = torch.cat([(h @ weight.float().T.cpu()).argmax(1) for h in samples["hidden"].split(256)])
    counts = torch.bincount(proposed, minlength=vocab)
    ranking = torch.argsort(-counts, stable=True)
    return Shortlist(ranking, counts[ranking], {**info, "proposals_counted": int(proposed.numel())})


def parse_args(argv) -> argparse.Namespace:
    p = OneLineParser(
        prog="python -m model.build_head", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add = p.add_argument
    add("--kind", default="shortlist,router", help="shortlist, router or both (default)")
    add(
        "--draft",
        default="tiny-qwen3-draft",
        help="the draft: a preset, a folder, or SPEC#layers=N (default tiny-qwen3-draft)",
    )
    add("--out", required=True, metavar="DIR", help="head-assets folder (files of the kinds built are replaced)")
    add(
        "--categories",
        default=",".join(TRAIN_CATEGORIES),
        help="training categories (default: all but the held-out qa, math_reasoning, rag)",
    )
    add("--per-category", type=int, default=4, help="training prompts per category (default 4)")
    add("--prompt-max", type=int, default=128, help="prompt tokens kept (default 128)")
    add("--new-tokens", type=int, default=48, help="greedy draft tokens per prompt (default 48)")
    add("--router-clusters", type=int, default=None, help="k-means clusters of the router (default vocabulary / 128)")
    add("--router-epochs", type=int, default=30, help="router training epochs (default 30)")
    add("--router-iters", type=int, default=5, help="k-means iterations of the router's clusters (default 5)")
    add("--prompts-file", default=None, help="a Spec-Bench question.jsonl (default: the copy shipped in model/data)")
    add("--seed", type=int, default=0, help="seed of synthetic weights, k-means and training (default 0)")
    return p.parse_args(argv)


def run(args) -> int:
    kinds = parse_choices(args.kind, KINDS, "kind")
    for name in ("per_category", "prompt_max", "new_tokens", "router_epochs", "router_iters"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    check_seed(args.seed)
    categories = tuple(c.strip() for c in args.categories.split(",") if c.strip())
    held = [c for c in categories if c in HELD_OUT_CATEGORIES]
    if held:
        raise UsageError(f"--categories {', '.join(held)} are held out for evaluation; train on others")
    out = Path(args.out)
    check_output_folder(out, "--out")
    prompts = training_prompts(categories, args.per_category, args.prompts_file)
    loaded = load_model(args.draft, "cpu", None, args.seed + 1, max_seq_len=1)
    check_cache(loaded.model, cache_room(args.prompt_max, args.new_tokens, 1), "--prompt-max and --new-tokens")
    weight = loaded.model.head_weight.detach()
    vocab = weight.shape[0]
    clusters = max(1, vocab // 128) if args.router_clusters is None else args.router_clusters
    if not 1 <= clusters <= vocab:
        raise UsageError(f"--router-clusters must be in [1, {vocab}], got {clusters}")
    samples = draft_samples(loaded, prompts, args.prompt_max, args.new_tokens)
    info = {
        "draft": args.draft,
        "weights": loaded.info["weights"],
        "categories": list(categories),
        "train_prompts": samples["prompts"],
        "prompt_max": args.prompt_max,
        "new_tokens": args.new_tokens,
        "seed": args.seed,
    }
    with staged(out, merge=True) as folder:
        if "shortlist" in kinds:
            save_shortlist(build_shortlist(weight, samples, info), folder)
        if "router" in kinds:
            embedding = loaded.model.embed_tokens.weight.detach()
            router = build_router(
                weight,
                embedding,
                samples,
                clusters,
                iters=args.router_iters,
                epochs=args.router_epochs,
                seed=args.seed,
                info=info,
            )
            save_router(router, folder)
            print(f"router: {router.clusters} clusters, training {router.info}", file=sys.stderr)
    positions = samples["tokens"].numel()
    print(f"wrote {', '.join(kinds)} assets ({len(prompts)} training prompts, {positions} positions) to {out}")
    return 0


def main(argv=None) -> int:
    return run_torch_command(lambda: run(parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
