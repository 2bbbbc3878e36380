"""Per-depth top-k rates of an early-exit draft on real hidden states: what a draft tree can accept.

    python -m measure.tree_rates --model ~/.cache/flashspec/gemma-3-270m --draft-layers 12 \\
        --out reports/gemma3-270m/trees/ [--add-to-profile PROFILE]

Why: a tree accepts depth d through a node of sibling rank r when the target's greedy token is the
draft's r-th choice there, so what a tree shape buys is set by where the target's tokens rank in the
draft's order, depth after depth. The simulator's tree rounds draw from these rates
(sim/trees.py, docs/design.md "Token trees").

The states are those a proposal sees on an accepted path: every position of each prompt's greedy
continuation, teacher-forced (recall.collect_states, cached in the model folder), so the draft at
depth d has the true prefix, as it does when depths 1..d-1 were accepted. For each position t and
depth d, r_d is the rank of the target's greedy token at t+d-1 among the draft's logits there (the
draft: the first --draft-layers layers, the final norm and the dense head). The rate at depth d and
top-k is P(r_d < k | r_j < k for every j < d): the draft's full k-ary tree accepted the path so far
(k = 1 is the chain). Rounds begin at every position; intervals are 95% bootstrap intervals over
prompts (resampled whole). Writes tree_rates.json (its `section` is the profile's `trees` section,
contracts.profile.check_trees), tree_rates.md and tree_rates.png into --out; with --add-to-profile
also writes that section into the profile.
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from contracts import UsageError
from contracts.cli import OneLineParser, run_command
from contracts.files import check_output_folder
from contracts.profile import check_trees
from contracts.trees import MAX_BRANCHING, MAX_DEPTH

from .figures import write_figure
from .recall import (
    STUDY_CATEGORIES,
    cached_states,
    check_sizes,
    load_real_checkpoint,
    profile_to_extend,
    study_prompts,
    write_record,
)

COMMAND = "python -m measure.tree_rates"
BOOTSTRAP = 200
CHUNK = 64  # states per head pass: each holds V logits twice


@torch.no_grad()
def target_ranks(weight: torch.Tensor, target_states: torch.Tensor, draft_states: torch.Tensor) -> torch.Tensor:
    """Per state, the rank of the target's greedy token among the draft's logits (0: the draft's best)."""
    ranks = []
    for target_part, draft_part in zip(target_states.split(CHUNK), draft_states.split(CHUNK)):
        chosen = F.linear(target_part, weight).float().argmax(dim=-1)
        draft_logits = F.linear(draft_part, weight).float()
        chosen_logit = draft_logits.gather(1, chosen[:, None])
        # ties rank by token id, as a top-k does: higher logits, and equal ones with a lower id, come first
        ids = torch.arange(draft_logits.shape[1])[None]
        ahead = (draft_logits > chosen_logit) | ((draft_logits == chosen_logit) & (ids < chosen[:, None]))
        ranks.append(ahead.sum(dim=1))
    return torch.cat(ranks)


def counts(ranks: torch.Tensor, depths: int, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(accepted, tried) of shape [depths, top_k] over rounds begun at every position of one
    continuation: tried[d, k-1] counts rounds whose depths 1..d were all within the top-k, and that
    reach depth d+1; accepted[d, k-1] those whose depth d+1 is within the top-k too."""
    accepted = torch.zeros(depths, top_k, dtype=torch.long)
    tried = torch.zeros(depths, top_k, dtype=torch.long)
    ks = torch.arange(1, top_k + 1)
    for start in range(ranks.numel()):
        window = ranks[start : start + depths]
        alive = torch.ones(top_k, dtype=torch.bool)
        for depth, rank in enumerate(window.tolist()):
            tried[depth] += alive
            alive = alive & (rank < ks)
            accepted[depth] += alive
    return accepted, tried


def summarize(accepted: torch.Tensor, tried: torch.Tensor, seed: int) -> dict:
    """Rates over the prompts' summed counts ([prompts, depths, top_k]), with 95% bootstrap intervals
    over prompts; a rate no round tried is null (n = 0)."""
    total_accepted, total_tried = accepted.sum(0).double(), tried.sum(0).double()

    def rates(a, t):
        return torch.where(t > 0, a / t.clamp(min=1), torch.full_like(a, float("nan")))

    rng = random.Random(seed)
    prompts = accepted.shape[0]
    draws = torch.stack(
        [
            rates(accepted[picked].sum(0).double(), tried[picked].sum(0).double())
            for picked in (torch.tensor([rng.randrange(prompts) for _ in range(prompts)]) for _ in range(BOOTSTRAP))
        ]
    )
    low = draws.nanquantile(0.025, dim=0)
    high = draws.nanquantile(0.975, dim=0)

    def listed(values):
        return [[None if v != v else round(float(v), 6) for v in row] for row in values]

    return {
        "rate": listed(rates(total_accepted, total_tried)),
        "low": listed(low),
        "high": listed(high),
        "n": total_tried.long().tolist(),
        "prompts": prompts,
    }


def rates(per_prompt: list[dict], weight: torch.Tensor, draft_layers: int, depths: int, top_k: int, seed: int):
    """(pooled, per category) rate summaries from recall.collect_states' per-prompt states."""
    accepted, tried, categories = [], [], []
    for x in per_prompt:
        ranks = target_ranks(weight, x["states"][x["start"] :], x["exit"][draft_layers][x["start"] :])
        a, t = counts(ranks, depths, top_k)
        accepted.append(a)
        tried.append(t)
        categories.append(x["category"])
    accepted, tried = torch.stack(accepted), torch.stack(tried)
    per_category = {}
    for category in STUDY_CATEGORIES:
        chosen = torch.tensor([c == category for c in categories])
        if chosen.any():
            per_category[category] = summarize(accepted[chosen], tried[chosen], seed)
    return summarize(accepted, tried, seed), per_category


def trees_section(result: dict) -> dict:
    """The profile's `trees` section (contracts.profile.check_trees) from a tree_rates result."""
    return {
        "weights": result["weights"],
        "source": f"{COMMAND} on {result['model_label']}: draft = its first {result['draft_layers']} layers + the "
        f"dense head, {result['states']} states of {len(result['prompts'])} prompts",
        "top_k": result["top_k"],
        "depths": result["depths"],
        "rates": {"all": result["overall"], **result["per_category"]},
    }


def _cell(summary: dict, depth: int, k: int) -> str:
    rate = summary["rate"][depth][k - 1]
    if rate is None:
        return "- (n=0)"
    return f"{rate:.3f} [{summary['low'][depth][k - 1]:.3f}, {summary['high'][depth][k - 1]:.3f}]"


def markdown(result: dict) -> str:
    shown = [k for k in (1, 2, 3, 4, 8) if k <= result["top_k"]]
    lines = [
        f"# Per-depth top-k rates of the early-exit draft: {result['model_label']}",
        "",
        f"**Weights: {result['weights'].upper()}.** Target: the whole model; draft: its first "
        f"{result['draft_layers']} layers + final norm + the dense head. {result['states']} states (greedy "
        f"continuations, teacher-forced) of {len(result['prompts'])} Spec-Bench prompts. Rate at depth d, top-k: "
        "P(the target's token is in the draft's top-k at depth d | it was at every depth before); "
        "95% bootstrap intervals over prompts; n = rounds that reached depth d.",
        f"Command: `{result['command']}`",
        "",
        "| scope | depth | " + " | ".join(f"top-{k}" for k in shown) + " | n (top-1 / top-8) |",
        "|---|---|" + "---|" * (len(shown) + 1),
    ]
    for scope, summary in [("all", result["overall"])] + sorted(result["per_category"].items()):
        for depth in range(result["depths"]):
            cells = " | ".join(_cell(summary, depth, k) for k in shown)
            n = summary["n"][depth]
            lines.append(f"| {scope} | {depth + 1} | {cells} | {n[0]} / {n[min(8, result['top_k']) - 1]} |")
    return "\n".join(lines) + "\n"


def figure(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    overall = result["overall"]
    depths = list(range(1, result["depths"] + 1))
    for index, k in enumerate(k for k in (1, 2, 4, 8) if k <= result["top_k"]):

        def column(key, k=k):
            return [float("nan") if row[k - 1] is None else row[k - 1] for row in overall[key]]

        ax.plot(depths, column("rate"), marker="o", color=f"C{index}", label=f"top-{k}")
        ax.fill_between(depths, column("low"), column("high"), color=f"C{index}", alpha=0.2)
    ax.set_xlabel("depth d")
    ax.set_ylabel("P(target token in draft top-k | accepted so far)")
    ax.set_ylim(0, 1)
    ax.set_title(f"{result['model_label']}, exit {result['draft_layers']} ({result['weights']} weights)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    write_figure(fig, path, dpi=120)


def parser() -> OneLineParser:
    p = OneLineParser(prog=COMMAND, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="checkpoint folder (e.g. the converted Gemma 3 270M)")
    p.add_argument("--draft-layers", type=int, required=True, help="the early-exit draft's depth (its first N layers)")
    p.add_argument("--depths", type=int, default=8, help=f"depths measured, 1..{MAX_DEPTH} (default 8)")
    p.add_argument("--top-k", type=int, default=8, help=f"largest top-k, 1..{MAX_BRANCHING} (default 8)")
    p.add_argument("--seed", type=int, default=0, help="seed of the bootstrap (default 0)")
    p.add_argument("--per-category", type=int, default=5, help="prompts per study category (default 5)")
    p.add_argument("--prompt-max-len", type=int, default=256, help="prompt tokens kept (default 256)")
    p.add_argument("--new-tokens", type=int, default=32, help="greedy continuation per prompt (default 32)")
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads (default 2)")
    p.add_argument("--add-to-profile", metavar="PROFILE", help="also write the rates into this profile's trees")
    p.add_argument("--out", required=True, help="folder for tree_rates.json, tree_rates.md and tree_rates.png")
    return p


def check_args(args) -> None:
    """Bad numbers are refused before anything is loaded."""
    for option, value, high in (("--depths", args.depths, MAX_DEPTH), ("--top-k", args.top_k, MAX_BRANCHING)):
        if not 1 <= value <= high:
            raise UsageError(f"{option} must be in 1..{high}, got {value}")
    check_sizes(args)


def run(argv) -> list[Path]:
    args = parser().parse_args(argv)
    check_args(args)
    out = Path(args.out)
    check_output_folder(out, "--out")
    profile = profile_to_extend(args.add_to_profile)
    folder, loaded = load_real_checkpoint(args.model, args.draft_layers, args.threads, "the rates are")
    model = loaded.model
    prompts = study_prompts(args.per_category)
    per_prompt = cached_states(
        folder, loaded, prompts, args.per_category, args.prompt_max_len, args.new_tokens, [args.draft_layers]
    )
    overall, per_category = rates(per_prompt, model.head_weight, args.draft_layers, args.depths, args.top_k, args.seed)
    result = {
        "model": str(folder),
        "model_label": f"{model.config.arch} {folder.name}",
        "weights": loaded.info["weights"],
        "draft_layers": args.draft_layers,
        "top_k": args.top_k,
        "depths": args.depths,
        "prompts": [x["id"] for x in per_prompt],
        "states": sum(x["states"].shape[0] - x["start"] for x in per_prompt),
        "command": " ".join([COMMAND, *argv]),
        "overall": overall,
        "per_category": per_category,
    }
    result["section"] = trees_section(result)
    check_trees(result["section"], "tree_rates")
    if profile is not None:
        profile["trees"] = result["section"]
    files = [out / "tree_rates.json", out / "tree_rates.md", out / "tree_rates.png"]
    return write_record(result, files, markdown(result), [(figure, files[2])], profile, args.add_to_profile)


def main(argv=None) -> int:
    def body():
        for path in run(sys.argv[1:] if argv is None else argv):
            print(f"wrote {path}")

    return run_command(body)


if __name__ == "__main__":
    sys.exit(main())
