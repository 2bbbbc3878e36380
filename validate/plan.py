"""Every input of a run, checked before a model is loaded or a file written (bad input: UsageError)."""

from __future__ import annotations

import datetime
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from contracts import UsageError
from contracts.files import check_output_folder
from contracts.names import REGIME_OF_GRAPHS_FLAG, tensor_parallel_size
from contracts.trees import MAX_K, parse_tree
from model.acceptance_control import check_spec
from model.prompts import Prompt, select_prompts
from sim.profile import Profile, load_profile
from sim.trees import TREE_SCHEDULES

TREE_HEADS = ("dense",)  # the simulator charges a tree's head as one step of the chain's dense head


@dataclass(frozen=True)
class Config:
    """One configuration of the matrix; the baseline has no draft (head dense, K 0). A tree
    configuration (contracts.trees label) has K = the tree's depth."""

    schedule: str
    head: str
    K: int
    tree: str = "chain"

    @property
    def name(self) -> str:
        if self.schedule == "baseline":
            return "baseline"
        if self.tree != "chain":
            return f"{self.schedule}-{self.head}-tree{tree_slug(self.tree)}"
        return f"{self.schedule}-{self.head}-K{self.K}"


def tree_slug(label: str) -> str:
    """A tree label as a file name's part: dynamic:4,16,4 -> dynamic4.16.4, paths:0;1;0.0 -> paths0_1_0.0."""
    return label.replace(":", "").replace(",", ".").replace(";", "_")


def parse_ks(text: str) -> tuple[int, ...]:
    try:
        ks = tuple(dict.fromkeys(int(k) for k in text.split(",") if k.strip()))
    except ValueError:
        raise UsageError(f"--K: expected comma-separated integers, got {text!r}") from None
    if not ks or min(ks) < 1 or max(ks) > MAX_K:
        raise UsageError(f"--K must be in 1..{MAX_K} (draft tokens per round), got {text!r}")
    return ks


def matrix(schedules, heads, ks, trees: tuple = ("chain",)) -> list[Config]:
    """The baseline once, then every chain (schedule, head, K), grouped by (K, head), then every tree
    with the schedules and heads trees run with (validate/trees.py), grouped by tree: one decoder per
    group."""
    configs = [Config("baseline", "dense", 0)] if "baseline" in schedules else []
    if "chain" in trees:
        configs += [Config(s, h, K) for K in ks for h in heads for s in schedules if s != "baseline"]
    for tree in trees:
        if tree != "chain":
            depth = parse_tree(tree).depth
            configs += [
                Config(s, h, depth, tree) for h in TREE_HEADS if h in heads for s in schedules if s in TREE_SCHEDULES
            ]
    return configs


def timeline_config(configs: list[Config]) -> Config | None:
    """The configuration whose first recorded generation the report draws as a timeline: the first
    pipelined-deferred one, else the first speculative one (None: only the baseline runs)."""
    speculative = [c for c in configs if c.schedule != "baseline"]
    return next((c for c in speculative if c.schedule == "pipelined-deferred"), speculative[0] if speculative else None)


def check_acceptance(text: str | None, greedy: bool = True, curve_allowed: bool = False) -> None:
    """None (the default for the weights), `none` (the draft's own proposals) or an acceptance-control
    spec (contracts.acceptance: a=0.43, a=0.8,0.7, pattern=1,0, curve:a=0.77 where a profile resolves it)."""
    if text not in (None, "none"):
        check_spec(text, greedy, curve_allowed=curve_allowed)


def check_generation_lengths(max_new_tokens: int, warmup: int) -> None:
    """--max-new-tokens of at least 2 (the first token belongs to TTFT: a decode rate needs a second) and
    --warmup not negative."""
    if max_new_tokens < 2:
        raise UsageError(f"--max-new-tokens must be >= 2 (the first token belongs to TTFT), got {max_new_tokens}")
    if warmup < 0:
        raise UsageError(f"--warmup must be >= 0, got {warmup}")


def choose_prompts(spec: str, path: str | None, n: int) -> list[Prompt]:
    """The selection, cut to n prompts spread evenly over it (so a per-category selection keeps its
    variety instead of its first categories)."""
    if n < 1:
        raise UsageError(f"--n-prompts must be >= 1, got {n}")
    prompts = select_prompts(spec, path)
    if len(prompts) <= n:
        return prompts
    return [prompts[round(i * len(prompts) / n)] for i in range(n)]


def graphs_on(graphs: str | None, target_device: torch.device) -> bool:
    if graphs is None:
        return target_device.type == "cuda"
    if graphs == "on" and target_device.type != "cuda":
        raise UsageError("--graphs on needs a GPU placement (CUDA graphs); use --graphs off on the CPU")
    return graphs == "on"


def refuse_tensor_parallel(placement: str) -> None:
    """validate runs models in one process; a tpN run is recorded by torchrun and predicted with --from-runs."""
    if tensor_parallel_size(placement) is not None:
        raise UsageError(
            f"placement {placement}: record the runs with torchrun --nproc-per-node N -m model --placement "
            f"{placement} --out DIR/traces, then python -m validate --from-runs DIR --profile PROFILE"
        )


def check_profile(path: str, placement: str, graphs: bool, sampled: bool = False) -> Profile:
    """The profile the simulator will read, measured where this run runs and in its regime (and, for
    sampled runs, with the sampling costs of that regime)."""
    if not Path(path).is_file():
        raise UsageError(f"profile not found: {path} (pass a profile JSON from python -m measure, or --measure)")
    profile = load_profile(path)
    tensor_parallel = profile.raw.get("tensor_parallel") or {}  # a tpN run's target costs (sim/tensor_parallel.py)
    if profile.placement != placement and placement not in tensor_parallel:
        raise UsageError(
            f"profile {path} was measured on placement {profile.placement}, this run uses {placement} "
            f"(measure again with --placement {placement}, or pass --measure)"
        )
    regime = REGIME_OF_GRAPHS_FLAG["on" if graphs else "off"]
    if regime not in profile.costs:
        raise UsageError(
            f"profile {path} has no {regime} costs (it carries {', '.join(profile.costs)}); "
            f"run with --graphs {'off' if graphs else 'on'} or measure that regime"
        )
    if sampled and regime not in ((profile.raw.get("sampling") or {}).get("costs") or {}).get("regimes", {}):
        raise UsageError(
            f"profile {path} has no sampling costs for the {regime} regime (measure it with python -m measure "
            "--temperature T, or pass --measure)"
        )
    return profile


def report_folder(given: str | None, kind: str, placement: str, target_device: torch.device, force: bool) -> Path:
    """--out, or ./out/<kind>/<placement>-<gpu or cpu>-<date>/ under the current directory; an existing
    report there is replaced only with --force."""
    if given:
        out = Path(given)
    else:
        machine = torch.cuda.get_device_name(target_device) if target_device.type == "cuda" else "cpu"
        slug = re.sub(r"[^a-z0-9]+", "-", machine.lower()).strip("-")
        out = Path("out") / kind / f"{placement}-{slug}-{datetime.date.today().isoformat()}"
    check_out(out, force)
    return out


def check_out(out: Path, force: bool) -> None:
    """The report folder can be written: not a file, not an existing folder unless --force."""
    check_output_folder(out, "--out")
    if out.exists() and any(out.iterdir()) and not force:
        raise UsageError(f"--out {out} already holds a report; choose another folder or pass --force to replace it")
