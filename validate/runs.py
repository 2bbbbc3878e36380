"""Real runs: load the target/draft pair (model.pair), decode prompts (warm-up first, not recorded),
and turn the generations into the contract's trace lines and run summary (model.trace)."""

from __future__ import annotations

import gc
from dataclasses import dataclass

import torch

from contracts.progress import Progress
from model import pair as model_pair
from model.acceptance_control import AcceptanceControl
from model.decoder import Decoder
from model.pair import Pair
from model.prompts import Prompt
from model.sampling import GREEDY, SamplingSettings
from model.trace import Generation, summarize, trace_lines

from .plan import Config


@dataclass
class Workload:
    """The prompts a validation decodes, and their token ids."""

    prompts: list[Prompt]
    ids: list[list[int]]


def load_pair(
    target: str,
    draft: str,
    placement: str,
    dtype,
    seed: int,
    prompts: list[Prompt],
    reference_len: int,
    max_K: int,
    clustering: str | None,
    head_assets: str | None = None,
    nodes: int = 0,
) -> tuple[Pair, Workload]:
    """Both models (seeds as python -m model and python -m measure use them), with static caches sized
    for the longest prompt, a reference continuation, a look-ahead and a verify of `nodes` tree nodes
    (or as wide); and the prompts' token ids."""
    pair = model_pair.load_pair(target, draft, placement, dtype, seed, clustering=clustering, head_assets=head_assets)
    ids = [pair.target.tokenizer.encode(p.text) for p in prompts]
    pair.size_caches([len(x) for x in ids], reference_len, max_K, nodes)
    return pair, Workload(prompts, ids)


DEFAULT_CONTROL = "a=0.43"  # the study's measured acceptance (Table 4.5)


def control_for(pair: Pair, given: str | None) -> AcceptanceControl | None:
    """Acceptance control: `given` is --acceptance as parsed (None: not given, so a=0.43 for synthetic
    weights and none for real ones; "none": the draft's own proposals)."""
    return pair.acceptance_control(
        (DEFAULT_CONTROL if pair.weights == "synthetic" else None) if given is None else given
    )


def references(dec: Decoder, work: Workload, length: int) -> dict[str, list[int]]:
    """The target's greedy continuation of every prompt (what every schedule must emit)."""
    return {p.id: dec.reference(x, length) for p, x in zip(work.prompts, work.ids)}


def decode(
    dec: Decoder,
    work: Workload,
    schedule: str,
    max_new: int,
    control,
    refs: dict | None,
    warmup: int = 0,
    order: list[int] | None = None,
    progress: Progress | None = None,
    label: str = "",
    timeline: bool = False,
) -> list[tuple[str, Generation]]:
    """`warmup` untimed generations of the first prompt, then one per prompt (indices `order`, default all);
    the controls are bound to each prompt, and a drafting policy is reset before the first recorded one.
    `timeline`: the first recorded generation also records its timeline (`Generation.timeline`)."""
    order = list(range(len(work.prompts))) if order is None else order
    runs = []
    for index, i in enumerate([order[0]] * warmup + order):
        prompt, x = work.prompts[i], work.ids[i]
        if control is not None:
            control.bind(refs[prompt.id], len(x), prompt.id)
        drafting = dec.drafting
        if drafting is not None and drafting.lookup_control is not None:
            drafting.lookup_control.bind(refs[prompt.id], len(x), prompt)
        if drafting is not None and index == warmup:
            drafting.reset()  # a policy forgets the warm-up, as the simulator never saw it
        if progress is not None:
            progress.note(f"{label} {prompt.id}")
        dec.clock.timeline = timeline and index == warmup
        generation = dec.generate(x, max_new, schedule)
        dec.clock.timeline = False
        if index >= warmup:
            runs.append((prompt.id, generation))
        if progress is not None:
            progress.update()
    return runs


def run_config_dict(
    pair: Pair,
    prompts: list[Prompt],
    config: Config,
    probes: int | None,
    graphs: bool,
    max_new: int,
    control,
    sampling: SamplingSettings = GREEDY,
) -> dict:
    """The summary's config object (docs/contracts.md)."""
    out = {
        "target": pair.target.info["name"],
        "draft": pair.draft.info["name"] if config.K else None,
        "weights": pair.weights,
        "head": config.head,
        "probes": probes,
        "schedule": config.schedule,
        "K": config.K,
        "placement": pair.placement,
        "graphs": graphs,
        "max_new_tokens": max_new,
        "prompts": [p.id for p in prompts],
    }
    if config.tree != "chain":
        out["tree"] = config.tree
    if control is not None and config.K:
        out["acceptance_control"] = control.describe()
    if not sampling.greedy:
        out["sampling"] = {**sampling.describe(), "samples": 1}
    return out


def records(runs, config: Config, probes: int | None, summary_config: dict) -> tuple[list[dict], dict]:
    """Trace lines (with the contract's `probes` field) and the run summary of one configuration."""
    lines = [
        dict(line, probes=probes)
        for pid, g in runs
        for line in trace_lines(g, prompt_id=pid, schedule=config.schedule, head=config.head, K=config.K)
    ]
    return lines, summarize(summary_config, runs)


def free_memory() -> None:
    """Return the memory of dropped decoders (their CUDA graphs and pools) before the next capture."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
