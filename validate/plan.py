"""Every input of a run, checked before a model is loaded or a file written (bad input: UsageError)."""
from __future__ import annotations

import datetime
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from model.acceptance_control import parse_spec
from model.decoder import placement_devices
from model.errors import UsageError
from model.prompts import Prompt, select_prompts
from sim.profile import Profile, load_profile
from sim.scenario import GRAPHS
from sim.schedules import HEADS, SCHEDULES


@dataclass(frozen=True)
class Config:
    """One configuration of the matrix; the baseline has no draft (head dense, K 0)."""

    schedule: str
    head: str
    K: int

    @property
    def name(self) -> str:
        return "baseline" if self.schedule == "baseline" else f"{self.schedule}-{self.head}-K{self.K}"


def _choices(text: str, valid: tuple, what: str) -> tuple[str, ...]:
    chosen = valid if text == "all" else tuple(dict.fromkeys(v.strip() for v in text.split(",") if v.strip()))
    bad = [v for v in chosen if v not in valid]
    if bad or not chosen:
        raise UsageError(f"unknown {what} {', '.join(bad) or repr(text)}; valid: {', '.join(valid)}, or all")
    return chosen


def parse_schedules(text: str) -> tuple[str, ...]:
    return _choices(text, SCHEDULES, "schedule")


def parse_heads(text: str) -> tuple[str, ...]:
    return _choices(text, HEADS, "head")


def parse_ks(text: str) -> tuple[int, ...]:
    try:
        ks = tuple(dict.fromkeys(int(k) for k in text.split(",") if k.strip()))
    except ValueError:
        raise UsageError(f"--K: expected comma-separated integers, got {text!r}") from None
    if not ks or min(ks) < 1:
        raise UsageError(f"--K must be >= 1 (draft tokens per round), got {text!r}")
    return ks


def matrix(schedules, heads, ks) -> list[Config]:
    """The baseline once, then every (schedule, head, K), grouped by (K, head): one decoder per group."""
    configs = [Config("baseline", "dense", 0)] if "baseline" in schedules else []
    return configs + [Config(s, h, K) for K in ks for h in heads for s in schedules if s != "baseline"]


def check_acceptance(text: str | None) -> None:
    """None (the default for the weights), `none` (the draft's own proposals) or an acceptance-control
    spec (a=0.43, pattern=1,0)."""
    if text not in (None, "none"):
        parse_spec(text)


def choose_prompts(spec: str, path: str | None, n: int) -> list[Prompt]:
    """The selection, cut to n prompts spread evenly over it (so a per-category selection keeps its
    variety instead of its first categories)."""
    if n < 1:
        raise UsageError(f"--n-prompts must be >= 1, got {n}")
    prompts = select_prompts(spec, path)
    if len(prompts) <= n:
        return prompts
    return [prompts[round(i * len(prompts) / n)] for i in range(n)]


def devices(placement: str | None) -> tuple[str, torch.device, torch.device]:
    """(placement, target device, draft device); the default follows the GPUs present."""
    placement = placement or ("two-gpu" if torch.cuda.device_count() >= 2 else
                              "one-gpu" if torch.cuda.is_available() else "cpu")
    td, dd = placement_devices(placement)
    return placement, td, dd


def graphs_on(graphs: str | None, target_device: torch.device) -> bool:
    if graphs is None:
        return target_device.type == "cuda"
    if graphs == "on" and target_device.type != "cuda":
        raise UsageError("--graphs on needs a GPU placement (CUDA graphs); use --graphs off on the CPU")
    return graphs == "on"


def check_profile(path: str, placement: str, graphs: bool) -> Profile:
    """The profile the simulator will read, measured where this run runs and in its regime."""
    if not Path(path).is_file():
        raise UsageError(f"profile not found: {path} (pass a profile JSON from python -m measure, or --measure)")
    profile = load_profile(path)
    if profile.placement != placement:
        raise UsageError(f"profile {path} was measured on placement {profile.placement}, this run uses {placement} "
                         f"(measure again with --placement {placement}, or pass --measure)")
    regime = GRAPHS["on" if graphs else "off"]
    if regime not in profile.costs:
        raise UsageError(f"profile {path} has no {regime} costs (it carries {', '.join(profile.costs)}); "
                         f"run with --graphs {'off' if graphs else 'on'} or measure that regime")
    return profile


def default_out(kind: str, placement: str, target_device: torch.device) -> Path:
    """reports/<kind>/<placement>-<gpu or cpu>-<date>/."""
    machine = torch.cuda.get_device_name(target_device) if target_device.type == "cuda" else "cpu"
    slug = re.sub(r"[^a-z0-9]+", "-", machine.lower()).strip("-")
    return Path("reports") / kind / f"{placement}-{slug}-{datetime.date.today().isoformat()}"


def check_out(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} exists and is not a folder")
