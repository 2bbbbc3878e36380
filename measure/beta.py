"""Expected acceptance of speculative sampling, beta = sum_x min(p(x), q(x)), on real hidden states.

    python -m measure.beta --model ~/.cache/flashspec/gemma-3-270m --draft-layers 12 \\
        --temperatures 0.3,0.7,1.0 --out reports/gemma3-270m/beta/ [--add-to-profile PROFILE]

Why: under speculative sampling a proposal drawn from the draft's q is accepted with probability
min(1, p/q), so a position is accepted with expected probability beta = sum_x min(p(x), q(x)) (the
overlap of the two distributions). How much a FlashHead draft loses there is the question: its q is
the softmax over the tokens of its probed clusters only, zero elsewhere, so the mass it leaves out
is lost to the overlap. The simulator answers `--what-if temperature=T` from these curves.

p is the model's distribution after its full depth, q the early-exit draft's (the first
--draft-layers layers, the final norm and the same head: dense, or FlashHead at each probe count),
both at temperature T (no top-k or top-p). The states are those a proposal sees: every position of
each prompt's greedy continuation, teacher-forced (recall.collect_states, cached in the model
folder, as is the clustering). beta is averaged over states; intervals are 95% bootstrap intervals
over prompts. Writes beta.json, beta.md, beta.png and beta_by_category.png into --out; with
--add-to-profile also adds its `beta` to that profile's `sampling` section (contracts.profile.check_sampling).
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
from model.flashhead import Clustering

from . import beta_plot
from .figures import write_figure
from .recall import (
    STUDY_CATEGORIES,
    cached_states,
    check_sizes,
    clustering_for,
    load_real_checkpoint,
    profile_to_extend,
    study_prompts,
    write_record,
)
from .timing import at_least_one

COMMAND = "python -m measure.beta"
DEFAULT_PROBES = (1, 4, 16, 64, 256, 1024)
CHUNK = 32  # states per pass: each holds V logits for the target and the draft, twice per temperature
BOOTSTRAP = 200


@torch.no_grad()
def beta_per_state(
    weight: torch.Tensor,
    clustering: Clustering,
    target_states: torch.Tensor,
    draft_states: torch.Tensor,
    temperatures: list[float],
    probes: list[int],
) -> dict:
    """{T: {"dense": [n], p: [n] for each probe count}} of sum_x min(p(x), q(x)) per state."""
    out = {t: {"dense": [], **{p: [] for p in probes}} for t in temperatures}
    centroids = clustering.centroids.to(weight.dtype)
    assignments = clustering.assignments.to(torch.long)
    for target_part, draft_part in zip(target_states.split(CHUNK), draft_states.split(CHUNK)):
        target_logits = F.linear(target_part, weight).float()
        draft_logits = F.linear(draft_part, weight).float()
        order = F.linear(draft_part, centroids).topk(max(probes), dim=-1).indices
        probed = {}
        for p in probes:
            clusters = torch.zeros(order.shape[0], clustering.clusters, dtype=torch.bool)
            probed[p] = clusters.scatter_(1, order[:, :p], True)[:, assignments]  # [n, V] tokens of probed clusters
        for t in temperatures:
            target = torch.softmax(target_logits / t, dim=-1)
            out[t]["dense"].append(overlap(target, torch.softmax(draft_logits / t, dim=-1)))
            for p in probes:
                shortlist = torch.softmax((draft_logits / t).masked_fill(~probed[p], float("-inf")), dim=-1)
                out[t][p].append(overlap(target, shortlist))
    return {t: {key: torch.cat(parts) for key, parts in curves.items()} for t, curves in out.items()}


def overlap(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """sum_x min(p(x), q(x)) per row: the probability that speculative sampling accepts a draw of q."""
    return torch.minimum(p, q).sum(dim=-1)


def summarize(values: torch.Tensor, prompt_of_state: torch.Tensor, seed: int) -> dict:
    """Mean over states, and a 95% bootstrap interval over prompts (resampled whole)."""
    prompts = prompt_of_state.unique().tolist()
    sums = {p: float(values[prompt_of_state == p].double().sum()) for p in prompts}
    counts = {p: int((prompt_of_state == p).sum()) for p in prompts}
    rng = random.Random(seed)
    means = []
    for _ in range(BOOTSTRAP):
        drawn = [rng.choice(prompts) for _ in prompts]
        means.append(sum(sums[p] for p in drawn) / sum(counts[p] for p in drawn))
    means.sort()
    return {
        "beta": float(values.double().mean()),
        "low": means[int(0.025 * BOOTSTRAP)],
        "high": means[int(0.975 * BOOTSTRAP) - 1],
        "n": int(values.numel()),
        "prompts": len(prompts),
    }


def curves(per_state: dict, prompt_of_state: torch.Tensor, probes: list[int], seed: int) -> dict:
    """Per temperature: the dense head's beta and FlashHead's curve over probe counts, with intervals."""
    result = {}
    for t, values in per_state.items():
        flash = [summarize(values[p], prompt_of_state, seed) for p in probes]
        result[f"{t:g}"] = {
            "dense": summarize(values["dense"], prompt_of_state, seed),
            "flashhead": {
                "probes": list(probes),
                **{key: [f[key] for f in flash] for key in ("beta", "low", "high")},
                "n": flash[0]["n"],
            },
        }
    return result


def sampling_section(result: dict) -> dict:
    """The profile's `sampling` section (contracts.profile.check_sampling) from a beta result."""
    return {
        "weights": result["weights"],
        "source": f"{COMMAND} on {result['model_label']}: draft = its first {result['draft_layers']} layers, "
        f"FlashHead c={result['clusters']}, {result['states']} states of {len(result['prompts'])} prompts",
        "beta": result["overall"],
    }


def markdown(result: dict) -> str:
    lines = [
        f"# Expected acceptance beta under speculative sampling: {result['model_label']}",
        "",
        f"**Weights: {result['weights'].upper()}.** Target: the whole model; draft: its first "
        f"{result['draft_layers']} layers + final norm + the same head (dense, or FlashHead with "
        f"c = {result['clusters']} clusters). {result['states']} states (greedy continuations, "
        f"teacher-forced) of {len(result['prompts'])} Spec-Bench prompts; 95% bootstrap intervals over prompts.",
        f"Command: `{result['command']}`",
        "",
        "| temperature | head | " + " | ".join(["dense", *(f"p={p}" for p in result["probes"])]) + " |",
        "|---|---|" + "---|" * (1 + len(result["probes"])),
    ]
    for scope, by_temperature in [("all", result["overall"])] + sorted(result["per_category"].items()):
        for t, curve in by_temperature.items():
            dense = curve["dense"]
            cells = [f"{dense['beta']:.3f} [{dense['low']:.3f}, {dense['high']:.3f}]"]
            flash = curve["flashhead"]
            cells += [f"{b:.3f} [{lo:.3f}, {hi:.3f}]" for b, lo, hi in zip(flash["beta"], flash["low"], flash["high"])]
            lines.append(f"| {t} | {scope} (n={dense['n']}) | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def figure(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for index, (t, curve) in enumerate(result["overall"].items()):
        color = f"C{index}"
        flash = curve["flashhead"]
        ax.plot(flash["probes"], flash["beta"], marker="o", color=color, label=f"FlashHead, T={t}")
        ax.fill_between(flash["probes"], flash["low"], flash["high"], color=color, alpha=0.2)
        ax.axhline(curve["dense"]["beta"], color=color, linestyle="--", label=f"dense head, T={t}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("FlashHead probes p")
    ax.set_ylabel("beta = sum min(p, q)")
    ax.set_title(f"{result['model_label']} ({result['weights']} weights)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    write_figure(fig, path, dpi=120)


def parse_numbers(text: str, kind, what: str) -> list:
    try:
        values = [kind(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise UsageError(f"{what}: expected comma-separated numbers, got {text!r}") from None
    if not values or any(not 0 < v < float("inf") for v in values):
        raise UsageError(f"{what}: expected numbers > 0, got {text!r}")
    return sorted(set(values))


def parser() -> OneLineParser:
    p = OneLineParser(prog=COMMAND, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="checkpoint folder (e.g. the converted Gemma 3 270M)")
    p.add_argument("--draft-layers", type=int, required=True, help="the early-exit draft's depth (its first N layers)")
    p.add_argument("--temperatures", default="0.3,0.7,1.0", help="comma-separated, each > 0 (default 0.3,0.7,1.0)")
    p.add_argument("--probes", default=",".join(map(str, DEFAULT_PROBES)), help="FlashHead probe counts")
    p.add_argument("--clusters", type=at_least_one, default=None, help="FlashHead clusters c (default V/16)")
    p.add_argument(
        "--iters", type=at_least_one, default=4, help="k-means iterations if the clustering is built (default 4)"
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the clustering and the bootstrap (default 0)")
    p.add_argument("--per-category", type=at_least_one, default=5, help="prompts per study category (default 5)")
    p.add_argument("--prompt-max-len", type=at_least_one, default=256, help="prompt tokens kept (default 256)")
    p.add_argument("--new-tokens", type=at_least_one, default=32, help="greedy continuation per prompt (default 32)")
    p.add_argument("--threads", type=at_least_one, default=2, help="torch CPU threads (default 2)")
    p.add_argument("--add-to-profile", metavar="PROFILE", help="also write the curves into this profile's sampling")
    p.add_argument("--out", required=True, help="folder for beta.json, beta.md and beta.png")
    return p


def run(argv) -> list[Path]:
    args = parser().parse_args(argv)
    check_sizes(args)
    temperatures = parse_numbers(args.temperatures, float, "--temperatures")
    probes = parse_numbers(args.probes, int, "--probes")
    out = Path(args.out)
    check_output_folder(out, "--out")
    profile = profile_to_extend(args.add_to_profile)
    folder, loaded = load_real_checkpoint(args.model, args.draft_layers, args.threads, "beta is")
    model, weight = loaded.model, loaded.model.head_weight
    clusters = args.clusters or weight.shape[0] // 16
    if weight.shape[0] % clusters or probes[-1] > clusters:
        raise UsageError(
            f"--clusters {clusters} must divide the vocabulary of {weight.shape[0]} and be at least the largest "
            f"probe count {probes[-1]}"
        )
    if profile is not None and profile["flashhead"]["clusters"] != clusters:
        raise UsageError(
            f"--add-to-profile: its FlashHead has {profile['flashhead']['clusters']} clusters, these curves {clusters}"
        )
    clustering, _ = clustering_for(folder, weight, weight.shape[0] // clusters, args.iters, args.seed)
    prompts = study_prompts(args.per_category)
    per_prompt = cached_states(
        folder, loaded, prompts, args.per_category, args.prompt_max_len, args.new_tokens, [args.draft_layers]
    )
    target = torch.cat([x["states"][x["start"] :] for x in per_prompt])
    draft = torch.cat([x["exit"][args.draft_layers][x["start"] :] for x in per_prompt])
    prompt_of_state = torch.cat([torch.full((x["states"].shape[0] - x["start"],), i) for i, x in enumerate(per_prompt)])
    category_of_state = [x["category"] for x in per_prompt for _ in range(x["states"].shape[0] - x["start"])]
    per_state = beta_per_state(weight, clustering, target, draft, temperatures, probes)
    per_category = {}
    for category in STUDY_CATEGORIES:
        chosen = torch.tensor([c == category for c in category_of_state])
        if chosen.any():
            picked = {t: {k: v[chosen] for k, v in values.items()} for t, values in per_state.items()}
            per_category[category] = curves(picked, prompt_of_state[chosen], probes, args.seed)
    weights = loaded.info["weights"]
    result = {
        "model": str(folder),
        "model_label": f"{model.config.arch} {folder.name}",
        "weights": weights,
        "draft_layers": args.draft_layers,
        "clusters": clustering.clusters,
        "probes": probes,
        "temperatures": temperatures,
        "prompts": [x["id"] for x in per_prompt],
        "states": int(target.shape[0]),
        "command": " ".join([COMMAND, *argv]),
        "overall": curves(per_state, prompt_of_state, probes, args.seed),
        "per_category": per_category,
    }
    if profile is not None:
        profile["sampling"] = {**(profile.get("sampling") or {}), **sampling_section(result)}
    files = [out / "beta.json", out / "beta.md", out / "beta.png", out / beta_plot.FILE]
    drawings = [(figure, files[2]), (beta_plot.category_figure, files[3])]
    return write_record(result, files, markdown(result), drawings, profile, args.add_to_profile)


def main(argv=None) -> int:
    def body():
        for path in run(sys.argv[1:] if argv is None else argv):
            print(f"wrote {path}")

    return run_command(body)


if __name__ == "__main__":
    sys.exit(main())
