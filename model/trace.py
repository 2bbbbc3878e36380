"""What a generation did: the decoder's host records, turned into trace lines and a run summary.

The decoder returns `Generation` records (host values read once per generation); the formats they
become, and their checkers and writers, are in `contracts.trace`.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from contracts.names import PHASES
from contracts.trace import SUMMARY_SCHEMA, TRACE_SCHEMA


@dataclass
class Round:
    """One speculative round (one token for baseline) as the host learned it."""

    proposed: int
    accepted: int
    emitted: int
    verify_skipped: bool
    context: int
    lookahead_used: bool | None = None
    phases_ms: dict[str, float] | None = None
    host_gap_ms: float | None = None  # host time from this round's reads to their next launches
    host_gaps: int | None = None  # how many such gaps
    drafter: str | None = None  # with a policy: the drafter that proposed the round's block
    tree: str | None = None  # a tree round: the tree's label (contracts.trees); accepted = the path's length
    nodes: int | None = None  # a tree round: the nodes verified


@dataclass
class Generation:
    """One prompt's generation: its tokens (the first one included), rounds, times and call counts."""

    tokens: list[int]
    rounds: list[Round]
    ttft_ms: float
    decode_ms: float
    verify_calls: int
    append_calls: int
    timeline: list[tuple] | None = None  # with Decoder(timeline=True): contracts.timeline intervals
    sample: int | None = None  # sampling: which of the prompt's samples (None: greedy)

    @property
    def decode_tokens(self) -> int:
        return len(self.tokens) - 1


def trace_lines(
    gen: Generation,
    *,
    prompt_id: str,
    schedule: str,
    head: str,
    K: int,
    probes: int | None = None,
    runs: dict[str, list[int]] | None = None,
) -> list[dict]:
    """The generation's trace lines (K is 0 for baseline; probes None for a dense head). `runs`: per
    drafter, one match run per decode position (model.prompt_lookup.match_runs), split by round."""
    lines = []
    position = 0
    for index, r in enumerate(gen.rounds):
        line = {
            "schema": TRACE_SCHEMA,
            "prompt_id": str(prompt_id),
            "round": index,
            "schedule": schedule,
            "head": head,
            "probes": probes,
            "K": K,
            "proposed": r.proposed,
            "accepted": r.accepted,
            "emitted": r.emitted,
            "verify_skipped": r.verify_skipped,
            "context": r.context,
            "lookahead_used": r.lookahead_used,
        }
        if gen.sample is not None:
            line["sample"] = gen.sample
        if r.phases_ms is not None:
            line["phases_ms"] = {p: round(r.phases_ms[p], 6) for p in PHASES}
        if r.host_gaps is not None:
            line["host_gap_ms"], line["host_gaps"] = round(r.host_gap_ms, 6), r.host_gaps
        if r.drafter is not None:
            line["drafter"] = r.drafter
        if r.tree is not None:
            line["tree"], line["nodes"] = r.tree, r.nodes
        if runs is not None:
            line.setdefault("drafter", "draft-model")
            line["runs"] = {name: values[position : position + r.emitted] for name, values in runs.items()}
        position += r.emitted
        lines.append(line)
    return lines


def timeline_meta(gen: Generation, config: dict, prompt_id: str, cuda: bool, chosen: str) -> dict:
    """The otherData of a generation's timeline (contracts.timeline); config is the summary's config
    object, `chosen` says which generation of the run this is and why."""
    schedule = config["schedule"]
    name = "baseline" if schedule == "baseline" else f"{schedule}-{config['head']}-K{config['K']}"
    meta = {
        "source": "decoder",
        "weights": config["weights"],
        "configuration": {
            "name": name,
            "schedule": schedule,
            "head": config["head"],
            "K": config["K"],
            "probes": config["probes"],
            "placement": config["placement"],
            "graphs": config["graphs"],
        },
        "target": config["target"],
        "draft": config["draft"],
        "chosen": chosen,
        "generation": {"prompt_id": str(prompt_id), "decode_tokens": gen.decode_tokens, "rounds": len(gen.rounds)},
        "clock": (
            "CUDA events, read against a reference event per device recorded when the generation began"
            if cuda
            else "perf_counter (CPU: the two models share one device)"
        ),
        "time_origin": "the generation's decode start (its first token on the host); its prefills are before it",
        "decode_ms": gen.decode_ms,
    }
    if gen.rounds and all(r.phases_ms is not None for r in gen.rounds):
        meta["phase_ms"] = {p: sum(r.phases_ms[p] for r in gen.rounds) for p in PHASES}
    if config.get("acceptance_control"):
        meta["acceptance_control"] = config["acceptance_control"]
    return meta


def summarize(config: dict, runs: list[tuple[str, Generation]]) -> dict:
    """The run summary over (prompt_id, generation) pairs; config is the contract's config object."""
    gens = [g for _, g in runs]
    rounds = [r for g in gens for r in g.rounds]
    decode_tokens = sum(g.decode_tokens for g in gens)
    decode_ms = sum(g.decode_ms for g in gens)
    proposed = sum(r.proposed for r in rounds)
    timed = bool(rounds) and all(r.phases_ms is not None for r in rounds)
    return {
        "schema": SUMMARY_SCHEMA,
        "config": config,
        "ttft_ms": statistics.median(g.ttft_ms for g in gens) if gens else 0.0,
        "decode_tokens": decode_tokens,
        "decode_ms": decode_ms,
        "decode_tok_s": decode_tokens / decode_ms * 1000.0 if decode_ms > 0 else 0.0,
        "acceptance": sum(r.accepted for r in rounds) / proposed if proposed else None,
        "mean_emitted": decode_tokens / len(rounds) if rounds else 0.0,
        "verify_calls": sum(g.verify_calls for g in gens),
        "append_calls": sum(g.append_calls for g in gens),
        "phases_ms": {p: sum(r.phases_ms[p] for r in rounds) for p in PHASES} if timed else None,
        "host_gap_ms": sum(r.host_gap_ms for r in rounds) if timed else None,
        "host_gaps": sum(r.host_gaps for r in rounds) if timed else None,
        "per_prompt": [
            {
                "prompt_id": str(pid),
                "ttft_ms": g.ttft_ms,
                "decode_tokens": g.decode_tokens,
                "decode_ms": g.decode_ms,
                "rounds": len(g.rounds),
                **({} if g.sample is None else {"sample": g.sample, "tokens": g.tokens}),
            }
            for pid, g in runs
        ],
    }
