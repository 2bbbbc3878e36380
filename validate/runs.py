"""Real runs: load the target/draft pair, build decoders, decode prompts (warm-up first, not recorded),
and turn the generations into the contract's trace lines and run summary (model.trace)."""
from __future__ import annotations

import gc
import sys
from dataclasses import dataclass

import torch
from tqdm import tqdm

from model.acceptance_control import AcceptanceControl
from model.decoder import Decoder, cache_room
from model.errors import UsageError
from model.flashhead import Clustering, build_clustering, load_assets
from model.heads import DenseHead, FlashHead
from model.loading import Loaded, load_model
from model.prompts import Prompt
from model.tokenizer import check_compatible
from model.trace import Generation, summarize, trace_lines

from .plan import Config


@dataclass
class Pair:
    """Target and draft as the decoder uses them, the prompts' token ids, and the FlashHead clustering."""

    target: Loaded
    draft: Loaded
    prompts: list[Prompt]
    ids: list[list[int]]
    room: int
    clustering: Clustering | None = None

    @property
    def weights(self) -> str:
        return "synthetic" if "synthetic" in (self.target.info["weights"], self.draft.info["weights"]) else "real"

    def head(self, kind: str, probes: int | None):
        """The draft head: dense, or FlashHead over the pair's clustering (built once)."""
        weight = self.draft.model.head_weight
        if kind == "dense":
            return DenseHead(weight)
        eos = self.draft.tokenizer.eos_token_id
        return FlashHead(weight, self.clustering, probes, always_tokens=[eos] if eos is not None else ())


def load_pair(target: str, draft: str, td, dd, dtype, seed: int, prompts: list[Prompt], reference_len: int,
              max_K: int, clustering: str | None, need_flashhead: bool) -> Pair:
    """Both models (seeds as python -m model and python -m measure use them: target seed, draft seed + 1),
    with static caches sized for the longest prompt, a reference continuation and a look-ahead."""
    t = load_model(target, td, dtype, seed, max_seq_len=1)
    d = load_model(draft, dd, dtype, seed + 1, max_seq_len=1)
    check_compatible(t.tokenizer, d.tokenizer, t.model.config.vocab_size, d.model.config.vocab_size)
    ids = [t.tokenizer.encode(p.text) for p in prompts]
    room = cache_room(max(map(len, ids)), reference_len, max_K)
    for m in (t, d):
        m.model.setup_cache(room)
    pair = Pair(t, d, prompts, ids, room)
    if need_flashhead:
        weight = d.model.head_weight
        built = load_assets(clustering) if clustering else build_clustering(weight, seed=seed)
        pair.clustering = built.to(weight.device)
    return pair


DEFAULT_CONTROL = "a=0.43"  # the study's measured acceptance (Table 4.5)


def control_for(pair: Pair, given: str | None, dd, seed: int) -> AcceptanceControl | None:
    """Acceptance control (synthetic weights only): the draft runs its real body and head, then
    proposes by the spec against the target's own greedy continuation. `given` is --acceptance as
    parsed (None: not given, so a=0.43 for synthetic weights and none for real ones; "none": none)."""
    spec = (DEFAULT_CONTROL if pair.weights == "synthetic" else None) if given is None else given
    if spec in (None, "none"):
        return None
    if pair.weights == "real":
        raise UsageError("--acceptance replaces the draft's proposals; it is for synthetic weights only "
                         "(use --acceptance none with real checkpoints)")
    return AcceptanceControl(spec, pair.target.model.config.vocab_size, pair.room, dd, seed)


def decoder(pair: Pair, head, K: int, graphs: bool, control) -> Decoder:
    return Decoder(pair.target.model, pair.draft.model, head, K=K, graphs=graphs, control=control, phases=True)


def references(dec: Decoder, pair: Pair, length: int) -> dict[str, list[int]]:
    """The target's greedy continuation of every prompt (what every schedule must emit)."""
    return {p.id: dec.reference(x, length) for p, x in zip(pair.prompts, pair.ids)}


def progress(total: int, desc: str) -> tqdm:
    return tqdm(total=total, desc=desc, unit="gen", file=sys.stderr, disable=None, leave=False)


def decode(dec: Decoder, pair: Pair, schedule: str, max_new: int, control, refs: dict | None, warmup: int = 0,
           prompts: list[int] | None = None, bar: tqdm | None = None, label: str = "") -> list[tuple[str, Generation]]:
    """`warmup` untimed generations of the first prompt, then one per prompt (indices `prompts`, default all)."""
    order = list(range(len(pair.prompts))) if prompts is None else prompts
    runs = []
    for index, i in enumerate([order[0]] * warmup + order):
        prompt, x = pair.prompts[i], pair.ids[i]
        if control is not None:
            control.bind(refs[prompt.id], len(x), prompt.id)
        if bar is not None:
            bar.set_postfix_str(f"{label} {prompt.id}")
        generation = dec.generate(x, max_new, schedule)
        if index >= warmup:
            runs.append((prompt.id, generation))
        if bar is not None:
            bar.update()
    return runs


def run_config_dict(pair: Pair, config: Config, probes: int | None, placement: str, graphs: bool, max_new: int,
                    control) -> dict:
    """The summary's config object (docs/contracts.md)."""
    out = {"target": pair.target.info["name"], "draft": pair.draft.info["name"] if config.K else None,
           "weights": pair.weights, "head": config.head, "probes": probes, "schedule": config.schedule,
           "K": config.K, "placement": placement, "graphs": graphs, "max_new_tokens": max_new,
           "prompts": [p.id for p in pair.prompts]}
    if control is not None and config.K:
        out["acceptance_control"] = control.describe()
    return out


def records(runs, config: Config, probes: int | None, summary_config: dict) -> tuple[list[dict], dict]:
    """Trace lines (with the contract's `probes` field) and the run summary of one configuration."""
    lines = [dict(line, probes=probes) for pid, g in runs
             for line in trace_lines(g, prompt_id=pid, schedule=config.schedule, head=config.head, K=config.K)]
    return lines, summarize(summary_config, runs)


def free_memory() -> None:
    """Return the memory of dropped decoders (their CUDA graphs and pools) before the next capture."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
