"""FlashHead recall on real weights: how often FlashHead's argmax equals the dense head's, r(p).

    python -m measure.recall --model ~/.cache/flashspec/gemma-3-270m --clusters 16384 --out reports/gemma3-270m/

Hidden states are the ones a draft proposal sees: the final-norm hidden state of every position of
a Spec-Bench prompt and of the model's own greedy continuation (each predicts the next token).
Prompts come from the study's six categories (MT-Bench's eight categories are its multi-turn
conversation). For each state the dense argmax token's cluster gets a rank in the centroid-score
order; FlashHead with p probes returns the dense token exactly when that rank is below p, so one
pass gives r(p) for every p (a subsample is checked against `FlashHead.argmax` itself).

The same pass records the centroid margin (top-1 minus top-2 centroid score) and the sorted
top centroid scores, from which adaptive probe policies are evaluated against fixed p.
`--exit-layers` adds the early-exit table: how often the first N layers (+ final norm + head)
predict the full model's greedy token, and `--draft-layers N` repeats r(p) on the N-layer states.
The clustering (published asset layout) and the hidden states are cached in the model folder, so a
second run only redoes the analysis.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from contracts import UsageError
from contracts.files import check_output_file, check_output_folder, read_json, write_atomic
from contracts.profile import check_profile
from contracts.progress import each
from measure.figures import write_figure
from measure.timing import at_least_one
from model.cli import run_torch_command
from model.decoder import Decoder, cache_room
from model.flashhead import ASSET_DIR, Clustering, build_clustering, load_assets, save_assets
from model.heads import DenseHead, FlashHead
from model.loading import load_model
from model.prompts import load_questions
from model.sampling import MAX_SEED

MT_BENCH = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")
STUDY_CATEGORIES = ("multi-turn", "translation", "summarization", "qa", "math_reasoning", "rag")
MAX_PROBES = 1024
_CHUNK = 256
_BUILD_FILE = "build.json"


def check_sizes(args) -> None:
    """The numbers the real-weights commands (recall, beta, tree_rates) share, refused before any model
    is loaded: beyond these a run cannot hold its states, start its threads or seed its clustering."""
    for option, value, low, high in (
        ("--per-category", args.per_category, 1, 10_000),
        ("--new-tokens", args.new_tokens, 1, 4096),
        ("--prompt-max-len", args.prompt_max_len, 1, 32_768),
        ("--threads", args.threads, 1, 1024),
        ("--seed", args.seed, 0, MAX_SEED),
    ):
        if not low <= value <= high:
            raise UsageError(f"{option} must be in {low}..{high:,}, got {value}")


def profile_to_extend(path: str | None) -> dict | None:
    """--add-to-profile: the profile, writable, read and checked before any work (None without one)."""
    if not path:
        return None
    check_output_file(path, "--add-to-profile")
    profile = read_json(path, "profile")
    check_profile(profile, path)
    return profile


def load_real_checkpoint(model: str, draft_layers: int, threads: int, measured: str):
    """(folder, loaded): a checkpoint folder's model on the CPU in float32, with an early exit of
    `draft_layers` inside it. `measured` names what the command measures, for the refusal of a folder
    that is not a checkpoint."""
    folder = Path(model).expanduser()
    if not (folder / "config.json").is_file():
        raise UsageError(
            f"--model {model}: not a checkpoint folder with config.json ({measured} a property of real weights; "
            "python -m model.gemma_gguf makes the Gemma 3 270M folder)"
        )
    torch.set_num_threads(threads)
    loaded = load_model(str(folder), "cpu", "float32", max_seq_len=1)
    layers = loaded.model.config.n_layers
    if not 1 <= draft_layers < layers:
        raise UsageError(f"--draft-layers must be in 1..{layers - 1}, got {draft_layers}")
    return folder, loaded


def write_record(result: dict, files: list[Path], text: str, drawings, profile: dict | None, profile_path) -> list:
    """files[0] the JSON record, files[1] the Markdown `text`, then each (draw, path) of `drawings`; the
    profile (already extended by the caller) checked and written over `profile_path`. Returns what was
    written, in that order."""
    write_atomic(files[0], json.dumps(result, indent=1) + "\n")
    write_atomic(files[1], text)
    for draw, path in drawings:
        draw(result, path)
    written = list(files)
    if profile is not None:
        check_profile(profile, profile_path)
        write_atomic(profile_path, json.dumps(profile, indent=1) + "\n")
        written.append(Path(profile_path))
    print(text)
    return written


def study_category(category: str) -> str:
    """Spec-Bench category -> the study's six (MT-Bench's eight are its multi-turn conversation)."""
    return "multi-turn" if category in MT_BENCH else category


def study_prompts(per_category: int, path=None) -> list:
    """The first `per_category` prompts of each study category in file order; multi-turn takes its
    MT-Bench sub-categories in turn (writing, roleplay, ..., then each one's second question)."""
    groups = defaultdict(list)
    for q in load_questions(path):
        groups[q.category].append(q)
    mt = [
        q
        for i in range(max(len(groups[c]) for c in MT_BENCH))
        for c in MT_BENCH
        if i < len(groups[c])
        for q in [groups[c][i]]
    ]
    chosen = mt[:per_category]
    for category in STUDY_CATEGORIES[1:]:
        chosen += groups[category][:per_category]
    return chosen


# --- clustering (cached as published assets beside the model) -------------------------------------


def objective(weight: torch.Tensor, clustering: Clustering) -> float:
    """Spherical k-means objective: mean cosine of every head row with its cluster's centroid."""
    x = F.normalize(weight.float(), dim=1)
    return float((x * clustering.centroids[clustering.assignments]).sum(1).mean())


def clustering_for(
    folder: Path, weight: torch.Tensor, cluster_size: int, iters: int, seed: int
) -> tuple[Clustering, dict]:
    """The model folder's FlashHead assets if built with these settings, else built now and saved
    there (published layout) with a build record: iterations, objective, seconds."""
    record_path = folder / ASSET_DIR / _BUILD_FILE
    wanted = {"cluster_size": cluster_size, "iters": iters, "seed": seed}
    if record_path.is_file():
        record = json.loads(record_path.read_text())
        if {k: record.get(k) for k in wanted} == wanted:
            return load_assets(folder), record
    print(f"building the FlashHead clustering ({iters} iterations, cluster size {cluster_size}) ...", file=sys.stderr)
    t0 = time.perf_counter()
    clustering = build_clustering(weight, cluster_size=cluster_size, iters=iters, seed=seed)
    record = {
        **wanted,
        "clusters": clustering.clusters,
        "objective": objective(weight, clustering),
        "seconds": round(time.perf_counter() - t0, 1),
        "threads": torch.get_num_threads(),
    }
    save_assets(clustering, folder)
    write_atomic(record_path, json.dumps(record, indent=1) + "\n")
    return clustering, record


# --- hidden states ------------------------------------------------------------------------------


@torch.no_grad()
def collect_states(loaded, prompts, prompt_max: int, new_tokens: int, exit_layers: list[int]) -> list[dict]:
    """Per prompt: the full model's final-norm states over prompt + greedy continuation, the
    continuation's first position, and the early-exit states (layer N's output, final-normed:
    what `model.early_exit` computes) for each N in `exit_layers`."""
    model = loaded.model
    model.setup_cache(cache_room(prompt_max, new_tokens, K=1))
    decoder = Decoder(model, graphs=False, phases=False, K=1)
    captured = {}
    hooks = [
        model.layers[n - 1].register_forward_hook(lambda _m, _i, out, n=n: captured.__setitem__(n, out))
        for n in exit_layers
    ]
    out = []
    try:
        for prompt in each(prompts, "hidden states", "prompt"):
            ids = loaded.tokenizer.encode(prompt.text)[:prompt_max]
            continuation = decoder.reference(ids, new_tokens)
            tokens = ids + continuation[:-1]
            hidden = model.forward_hidden(torch.tensor([tokens]), torch.arange(len(tokens)))[0]
            out.append(
                {
                    "id": prompt.id,
                    "category": study_category(prompt.category),
                    "states": hidden.clone(),
                    "start": len(ids) - 1,
                    "exit": {n: model.norm(captured[n])[0].clone() for n in exit_layers},
                }
            )
    finally:
        for hook in hooks:
            hook.remove()
    return out


def cached_states(
    folder: Path, loaded, prompts, per_category: int, prompt_max: int, new_tokens: int, exit_layers: list[int]
) -> list[dict]:
    """`collect_states`, cached in the model folder (a second analysis of the same states is instant)."""
    exits = "-".join(map(str, exit_layers))
    cache = folder / f"recall_states_{per_category}x{prompt_max}+{new_tokens}_exit{exits}.pt"
    if cache.is_file():
        return torch.load(cache)
    per_prompt = collect_states(loaded, prompts, prompt_max, new_tokens, exit_layers)
    torch.save(per_prompt, cache.with_suffix(".tmp"))
    os.replace(cache.with_suffix(".tmp"), cache)
    return per_prompt


# --- ranks, margins, agreement ------------------------------------------------------------------


@torch.no_grad()
def rank_states(weight: torch.Tensor, clustering: Clustering, states: torch.Tensor) -> dict:
    """Per state: the dense argmax token, the rank of its cluster among centroid scores (number of
    clusters scoring strictly higher), and the sorted top `MAX_PROBES + 1` centroid scores."""
    dense = DenseHead(weight)
    centroids = clustering.centroids.to(weight.dtype)
    tokens, ranks, tops = [], [], []
    for part in states.split(_CHUNK):
        token = dense.argmax(part)
        scores = F.linear(part.to(weight.dtype), centroids)
        own = scores.gather(1, clustering.assignments[token][:, None])
        tokens.append(token)
        ranks.append((scores > own).sum(1))
        tops.append(scores.topk(min(MAX_PROBES + 1, scores.shape[1]), dim=1).values)
    return {"tokens": torch.cat(tokens), "ranks": torch.cat(ranks), "top": torch.cat(tops)}


@torch.no_grad()
def check_ranks(weight, clustering, states, ranked, probes=(1, 8, 64), n=128) -> dict:
    """`FlashHead.argmax` itself on the first n states: does rank < p predict agreement exactly?"""
    sample = states[:n]
    dense = ranked["tokens"][:n]
    checked = same = 0
    for p in probes:
        flash = FlashHead(weight, clustering, probes=p).argmax(sample)
        same += int(((flash == dense) == (ranked["ranks"][:n] < p)).sum())
        checked += sample.shape[0]
    return {"states": sample.shape[0], "probes": list(probes), "checked": checked, "consistent": same}


def probe_grid(clusters: int) -> list[int]:
    return [p for p in (2**i for i in range(11)) if p <= min(clusters, MAX_PROBES)]


def curve(ranks_by_prompt: dict, categories: dict, probes: list[int], boot: int = 200, seed: int = 0) -> dict:
    """r(p) overall (with a 95% bootstrap interval over prompts) and per study category."""
    ids = list(ranks_by_prompt)
    all_ranks = torch.cat([ranks_by_prompt[i] for i in ids])
    r = [float((all_ranks < p).float().mean()) for p in probes]
    rng = random.Random(seed)
    counts = {i: ranks_by_prompt[i].numel() for i in ids}
    hits = {i: [int((ranks_by_prompt[i] < p).sum()) for p in probes] for i in ids}
    samples = []
    for _ in range(boot):
        pick = [rng.choice(ids) for _ in ids]
        total = sum(counts[i] for i in pick)
        samples.append([sum(hits[i][j] for i in pick) / total for j in range(len(probes))])
    low = [sorted(s[j] for s in samples)[int(0.025 * boot)] for j in range(len(probes))]
    high = [sorted(s[j] for s in samples)[int(0.975 * boot) - 1] for j in range(len(probes))]
    per_category = {}
    for category in STUDY_CATEGORIES:
        members = [i for i in ids if categories[i] == category]
        if members:
            ranks = torch.cat([ranks_by_prompt[i] for i in members])
            per_category[category] = {
                "r": [float((ranks < p).float().mean()) for p in probes],
                "n": ranks.numel(),
                "prompts": len(members),
            }
    return {
        "probes": probes,
        "r": r,
        "ci95": [low, high],
        "n": all_ranks.numel(),
        "prompts": len(ids),
        "per_category": per_category,
    }


# --- adaptive probes ----------------------------------------------------------------------------


def fixed_r_at(probes: list[int], r: list[float], p: float) -> float:
    """Fixed-p agreement at a (fractional) probe count, linear in log2(p) between grid points."""
    xs = [math.log2(q) for q in probes]
    x = min(max(math.log2(p), xs[0]), xs[-1])
    for x0, x1, y0, y1 in zip(xs, xs[1:], r, r[1:]):
        if x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return r[-1]


def margin_policy(top: torch.Tensor, small: int, large: int, threshold: float) -> torch.Tensor:
    """p = small where the top-1 minus top-2 centroid score exceeds `threshold`, else large."""
    margin = top[:, 0] - top[:, 1]
    return torch.where(margin > threshold, small, large)


def window_policy(top: torch.Tensor, delta: float, least: int, most: int) -> torch.Tensor:
    """p = the clusters scoring within `delta` of the best one, clamped to [least, most]."""
    within = (top[:, :most] >= top[:, :1] - delta).sum(1)
    return within.clamp(least, most)


def policies(top: torch.Tensor) -> list[tuple[str, dict, Callable]]:
    """The swept adaptive policies: thresholds at margin/score-gap quantiles of these states."""
    margin = top[:, 0] - top[:, 1]
    gap = top[:, 0] - top[:, min(63, top.shape[1] - 1)]
    quantiles = [0.1, 0.25, 0.4, 0.5, 0.6, 0.75, 0.9]
    out = []
    for small, large in ((1, 64), (4, 64), (4, 256), (16, 256), (16, 1024), (64, 1024)):
        for q in quantiles:
            t = float(margin.quantile(q))
            out.append(
                (
                    "margin",
                    {"small": small, "large": large, "threshold": round(t, 4), "quantile": q},
                    lambda top, s=small, l=large, t=t: margin_policy(top, s, l, t),
                )
            )
    for least in (1, 4, 16):
        for q in [0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 0.9, 1.2, 1.6, 2.0]:
            delta = float(gap.quantile(0.5)) * q
            out.append(
                (
                    "window",
                    {"delta": round(delta, 4), "least": least, "most": MAX_PROBES},
                    lambda top, d=delta, a=least: window_policy(top, d, a, MAX_PROBES),
                )
            )
    return out


def adaptive(ranks: torch.Tensor, top: torch.Tensor, fixed: dict, halves: tuple[torch.Tensor, torch.Tensor]) -> dict:
    """Every swept policy: mean probes, r, and fixed-p r at the same mean probes. Then a held-out
    check: on half A pick the cheapest policy matching fixed r(p*) of half A; report it on half B."""
    points = []
    for kind, params, policy in policies(top):
        p = policy(top)
        mean_p = float(p.float().mean())
        r = float((ranks < p).float().mean())
        points.append(
            {
                "policy": kind,
                **params,
                "mean_probes": mean_p,
                "r": r,
                "fixed_r_same_probes": fixed_r_at(fixed["probes"], fixed["r"], mean_p),
            }
        )
    a, b = halves
    held_out = []
    for target in (16, 64, 256):
        goal = float((ranks[a] < target).float().mean())
        best = None
        for kind, params, policy in policies(top[a]):
            p = policy(top[a])
            if float((ranks[a] < p).float().mean()) >= goal and (best is None or p.float().mean() < best[0]):
                best = (float(p.float().mean()), kind, params, policy)
        if best is None:
            continue
        p_b = best[3](top[b])
        held_out.append(
            {
                "fixed_probes": target,
                "policy": best[1],
                **best[2],
                "train_mean_probes": best[0],
                "train_r_fixed": goal,
                "test_mean_probes": float(p_b.float().mean()),
                "test_r": float((ranks[b] < p_b).float().mean()),
                "test_r_fixed": float((ranks[b] < target).float().mean()),
            }
        )
    return {"points": points, "held_out": held_out}


# --- outputs ------------------------------------------------------------------------------------


def _axes():
    """A fresh figure and axes drawn off-screen (matplotlib is imported only when a figure is asked for)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(figsize=(7, 4.5))


def _save(fig, ax, path: Path, xlabel: str, ylabel: str, title: str) -> None:
    """Log-2 probes axis, labels, grid and legend, written to `path`."""
    ax.set_xscale("log", base=2)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    write_figure(fig, path, dpi=120)


def agreement_figure(result: dict, path: Path) -> None:
    main = result["agreement"]
    fig, ax = _axes()
    ax.fill_between(main["probes"], *main["ci95"], alpha=0.2, color="k")
    ax.plot(main["probes"], main["r"], "k-o", lw=2, label=f"all ({main['n']} states)")
    for category, v in main["per_category"].items():
        ax.plot(main["probes"], v["r"], "--", marker=".", label=f"{category} ({v['n']})")
    draft = result.get("draft_agreement")
    if draft:
        ax.plot(draft["probes"], draft["r"], "r-s", lw=1.5, label=f"early-exit {draft['layers']} layers ({draft['n']})")
    _save(
        fig,
        ax,
        path,
        f"probes p (of c = {result['clustering']['clusters']} clusters)",
        "r(p) = P(FlashHead argmax == dense argmax)",
        f"FlashHead recall, {result['model_label']} (real weights)",
    )


def adaptive_figure(result: dict, path: Path) -> None:
    main, points = result["agreement"], result["adaptive"]["points"]
    fig, ax = _axes()
    ax.plot(main["probes"], main["r"], "k-o", lw=2, label="fixed p")
    for kind, marker in (("margin", "x"), ("window", "+")):
        chosen = [q for q in points if q["policy"] == kind]
        ax.scatter(
            [q["mean_probes"] for q in chosen],
            [q["r"] for q in chosen],
            marker=marker,
            s=30,
            label={
                "margin": "margin: p = small if top1-top2 > t else large",
                "window": "window: p = #clusters within delta of the best",
            }[kind],
        )
    _save(
        fig,
        ax,
        path,
        "mean probes per state",
        "r = P(FlashHead argmax == dense argmax)",
        f"Adaptive vs fixed probes, {result['model_label']} (real weights)",
    )


def pareto(points: list[dict]) -> list[dict]:
    """Policies no other policy beats on both mean probes and r."""
    ordered = sorted(points, key=lambda q: (q["mean_probes"], -q["r"]))
    front, best = [], -1.0
    for q in ordered:
        if q["r"] > best:
            front.append(q)
            best = q["r"]
    return front


def markdown(result: dict) -> str:
    main = result["agreement"]
    cats = list(main["per_category"])
    lines = [
        f"## r(p) on {result['model_label']} (real weights), c = {result['clustering']['clusters']}",
        "",
        f"{main['n']} hidden states from {main['prompts']} prompts; 95% interval: bootstrap over prompts.",
        "",
        "| p | p/c | r(p) | 95% CI | " + " | ".join(f"{c} (n={main['per_category'][c]['n']})" for c in cats) + " |",
        "|---|---|---|---|" + "---|" * len(cats),
    ]
    c = result["clustering"]["clusters"]
    for j, p in enumerate(main["probes"]):
        lines.append(
            f"| {p} | {p / c:.5f} | {main['r'][j]:.4f} | [{main['ci95'][0][j]:.4f}, {main['ci95'][1][j]:.4f}] | "
            + " | ".join(f"{main['per_category'][k]['r'][j]:.4f}" for k in cats)
            + " |"
        )
    draft = result.get("draft_agreement")
    if draft:
        lines += [
            "",
            f"Early-exit draft ({draft['layers']} layers) states: {draft['n']} states",
            "",
            "| p | " + " | ".join(str(p) for p in draft["probes"]) + " |",
            "|---|" + "---|" * len(draft["probes"]),
            "| r(p) | " + " | ".join(f"{v:.4f}" for v in draft["r"]) + " |",
        ]
    exits = result.get("early_exit")
    if exits:
        lines += [
            "",
            "## Early exit: first N layers + final norm + dense head vs the full model's greedy token",
            "",
            f"{exits['n']} continuation positions.",
            "",
            "| N layers | top-1 agreement |",
            "|---|---|",
        ]
        lines += [f"| {n} | {v:.4f} |" for n, v in exits["agreement"].items()]
    ad = result["adaptive"]
    lines += [
        "",
        "## Adaptive probes (Pareto front of the swept policies)",
        "",
        "| policy | parameters | mean probes | r | fixed-p r at same mean probes | gain |",
        "|---|---|---|---|---|---|",
    ]
    for q in pareto(ad["points"]):
        params = ", ".join(f"{k}={q[k]}" for k in ("small", "large", "threshold", "delta", "least") if k in q)
        lines.append(
            f"| {q['policy']} | {params} | {q['mean_probes']:.1f} | {q['r']:.4f} | "
            f"{q['fixed_r_same_probes']:.4f} | {q['r'] - q['fixed_r_same_probes']:+.4f} |"
        )
    lines += [
        "",
        "Held-out check (policy chosen on half the prompts to match fixed r(p*) there, applied to the other half):",
        "",
        "| fixed p* | policy | parameters | mean probes (test) | r (test) | fixed r(p*) (test) |",
        "|---|---|---|---|---|---|",
    ]
    for h in ad["held_out"]:
        params = ", ".join(f"{k}={h[k]}" for k in ("small", "large", "threshold", "delta", "least") if k in h)
        lines.append(
            f"| {h['fixed_probes']} | {h['policy']} | {params} | {h['test_mean_probes']:.1f} | "
            f"{h['test_r']:.4f} | {h['test_r_fixed']:.4f} |"
        )
    return "\n".join(lines) + "\n"


# --- CLI ----------------------------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise UsageError(message)


def parse_args(argv):
    p = _Parser(
        prog="python -m measure.recall", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model", required=True, help="checkpoint folder (e.g. the converted Gemma 3 270M)")
    p.add_argument(
        "--clusters",
        type=at_least_one,
        default=None,
        help="FlashHead clusters c (default V/16); the cluster size is V/c",
    )
    p.add_argument(
        "--iters",
        type=at_least_one,
        default=4,
        help="balanced k-means iterations when the clustering is built (default 4)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the clustering (default 0)")
    p.add_argument("--per-category", type=at_least_one, default=10, help="prompts per study category (default 10)")
    p.add_argument(
        "--prompts-file", default=None, help="Spec-Bench question.jsonl (default: the copy in model/data/spec_bench)"
    )
    p.add_argument("--prompt-max-len", type=at_least_one, default=256, help="prompt tokens kept (default 256)")
    p.add_argument("--new-tokens", type=at_least_one, default=64, help="greedy continuation per prompt (default 64)")
    p.add_argument(
        "--exit-layers", type=layer_counts, default=[], help="early-exit depths N for the agreement table, e.g. 6,9,12"
    )
    p.add_argument(
        "--draft-layers", type=at_least_one, default=None, help="also measure r(p) on the N-layer early-exit states"
    )
    p.add_argument("--threads", type=at_least_one, default=2, help="torch CPU threads (default 2)")
    p.add_argument(
        "--sim-agreement", default=None, metavar="PATH", help="also write the compact r(p) curve (for sim/data)"
    )
    p.add_argument("--out", required=True, help="folder for agreement.json, adaptive.json, recall.md and the plots")
    return p.parse_args(argv)


def layer_counts(text: str) -> list[int]:
    """--exit-layers: comma-separated layer counts >= 1 (empty: none)."""
    return [at_least_one(piece) for piece in text.split(",") if piece.strip()]


def run(args) -> list[Path]:
    check_sizes(args)
    check_output_folder(Path(args.out), "--out")
    if args.sim_agreement:
        check_output_file(Path(args.sim_agreement), "--sim-agreement")
    torch.set_num_threads(args.threads)
    folder = Path(args.model).expanduser()
    exit_layers = sorted(set(args.exit_layers) | ({args.draft_layers} if args.draft_layers else set()))
    loaded = load_model(str(folder), "cpu", "float32", max_seq_len=1)
    weight = loaded.model.head_weight
    vocab = weight.shape[0]
    clusters = args.clusters or vocab // 16
    if vocab % clusters:
        raise UsageError(
            f"--clusters {clusters} does not divide the vocabulary of {vocab} (valid: divisors, e.g. {vocab // 16})"
        )
    if any(not 1 <= n < loaded.model.config.n_layers for n in exit_layers):
        raise UsageError(f"early-exit depths must lie in 1..{loaded.model.config.n_layers - 1}")
    clustering, build = clustering_for(folder, weight, vocab // clusters, args.iters, args.seed)
    prompts = study_prompts(args.per_category, args.prompts_file)
    per_prompt = cached_states(
        folder, loaded, prompts, args.per_category, args.prompt_max_len, args.new_tokens, exit_layers
    )
    categories = {x["id"]: x["category"] for x in per_prompt}
    states = torch.cat([x["states"] for x in per_prompt])
    ranked = rank_states(weight, clustering, states)
    sizes = [x["states"].shape[0] for x in per_prompt]
    ranks_by_prompt = dict(zip(categories, ranked["ranks"].split(sizes)))
    probes = probe_grid(clustering.clusters)
    agreement = curve(ranks_by_prompt, categories, probes)
    index = torch.cat([torch.full((n,), i) for i, n in enumerate(sizes)])
    halves = (index % 2 == 0, index % 2 == 1)
    label = f"{loaded.model.config.arch} {folder.name}"
    result = {
        "schema": "flashspec.recall/1",
        "model": str(folder),
        "model_label": label,
        "synthetic": False,
        "prompts": [x["id"] for x in per_prompt],
        "prompt_max_len": args.prompt_max_len,
        "new_tokens": args.new_tokens,
        "clustering": build,
        "agreement": agreement,
        "rank_check": check_ranks(weight, clustering, states, ranked),
        "margin_quantiles": {
            str(q): float((ranked["top"][:, 0] - ranked["top"][:, 1]).quantile(q)) for q in (0.1, 0.25, 0.5, 0.75, 0.9)
        },
        "adaptive": adaptive(ranked["ranks"], ranked["top"], agreement, halves),
    }
    if exit_layers:
        continuation = torch.cat([torch.arange(x["states"].shape[0]) >= x["start"] for x in per_prompt])
        dense = DenseHead(weight)
        target = ranked["tokens"][continuation]
        table = {}
        for n in exit_layers:
            exit_states = torch.cat([x["exit"][n] for x in per_prompt])[continuation]
            table[n] = float(
                torch.cat([dense.argmax(part) for part in exit_states.split(_CHUNK)]).eq(target).float().mean()
            )
        result["early_exit"] = {"n": int(continuation.sum()), "agreement": table}
    if args.draft_layers:
        draft_states = torch.cat([x["exit"][args.draft_layers] for x in per_prompt])
        draft_ranks = rank_states(weight, clustering, draft_states)["ranks"]
        draft_curve = curve(dict(zip(categories, draft_ranks.split(sizes))), categories, probes)
        result["draft_agreement"] = {"layers": args.draft_layers, **draft_curve}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    files = [out / "agreement.json", out / "recall.md", out / "agreement.png", out / "adaptive.png"]
    write_atomic(files[0], json.dumps(result, indent=1) + "\n")
    write_atomic(files[1], markdown(result))
    agreement_figure(result, files[2])
    adaptive_figure(result, files[3])
    if args.sim_agreement:
        compact = {
            "source": f"{label} (real weights), FlashHead c={clustering.clusters} b={clustering.cluster_size}, "
            f"{agreement['n']} hidden states of {agreement['prompts']} Spec-Bench prompts (six study categories)",
            "model": label,
            "synthetic": False,
            "clusters": clustering.clusters,
            "cluster_size": clustering.cluster_size,
            "probes": probes,
            "r": agreement["r"],
            "n": agreement["n"],
        }
        files.append(Path(args.sim_agreement))
        write_atomic(files[-1], json.dumps(compact, indent=1) + "\n")
    print(markdown(result))
    return files


def main(argv=None) -> int:
    def body() -> None:
        for path in run(parse_args(sys.argv[1:] if argv is None else argv)):
            print(f"wrote {path}")

    return run_torch_command(body)


if __name__ == "__main__":
    sys.exit(main())
