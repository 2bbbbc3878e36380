"""`--peers`: our decoder side by side with Hugging Face on the same weights and prompts.

Rows: `hf-generate` (greedy, target only), `hf-assisted` (assisted generation with the same draft, K
proposals a round), `ours-baseline`, and ours in one schedule with each head. Without acceptance
control both speculative decoders see the same acceptance (the draft's own proposals); with synthetic
weights ours is also shown under acceptance control, for reference. Every system is warmed up, then
the prompts run interleaved (each prompt through every system in turn); tok/s are medians over prompts.
Every output is checked against our target's greedy continuation.
"""

from __future__ import annotations

import csv
import io
import statistics
from dataclasses import dataclass, field
from pathlib import Path

import torch

from contracts import HEADS, UsageError
from contracts.cli import parse_choices
from contracts.files import staged, write_atomic
from contracts.names import PHASES, SPECULATIVE_SCHEDULES
from contracts.progress import Progress
from model.pair import resolve_placement
from sim.report import render

from . import hf
from .plan import check_acceptance, choose_prompts, graphs_on, parse_ks, refuse_tensor_parallel, report_folder
from .runs import control_for, decode, load_pair, references

SPECULATIVE = SPECULATIVE_SCHEDULES
TARGET_SPEEDUP = 2.5  # below this over the best Hugging Face row, the report shows where our time goes


@dataclass
class Sample:
    """One generation of one system, in terms every system has."""

    tokens: list[int]
    ttft_ms: float
    decode_ms: float
    decode_tokens: int
    rounds: int
    proposed: int
    accepted: int
    phases: dict | None = None

    @property
    def decode_tok_s(self) -> float:
        return 1000.0 * self.decode_tokens / self.decode_ms if self.decode_ms > 0 else 0.0

    @property
    def e2e_tok_s(self) -> float:
        return 1000.0 * len(self.tokens) / (self.ttft_ms + self.decode_ms)


def _ours(generation) -> Sample:
    rounds = generation.rounds
    timed = rounds and all(r.phases_ms is not None for r in rounds)
    return Sample(
        generation.tokens,
        generation.ttft_ms,
        generation.decode_ms,
        generation.decode_tokens,
        len(rounds),
        sum(r.proposed for r in rounds),
        sum(r.accepted for r in rounds),
        {p: sum(r.phases_ms[p] for r in rounds) for p in PHASES} if timed else None,
    )


def _theirs(run: hf.HFRun) -> Sample:
    # each round emits its accepted proposals + 1 (Hugging Face caps the last round at max_new_tokens)
    accepted = len(run.tokens) - run.target_calls if run.proposed else 0
    return Sample(run.tokens, run.ttft_ms, run.decode_ms, run.decode_tokens, run.target_calls, run.proposed, accepted)


@dataclass
class System:
    name: str
    schedule: str
    head: str
    control: str
    run: object  # prompt index -> Sample
    samples: list[tuple[str, Sample]] = field(default_factory=list)

    def median(self, attr: str) -> float:
        return statistics.median(getattr(s, attr) for _, s in self.samples)

    def total(self, attr: str) -> int:
        return sum(getattr(s, attr) for _, s in self.samples)


def run(args) -> Path:
    heads = parse_choices(args.heads, HEADS, "head")
    ks = parse_ks(args.K)
    if len(ks) != 1:
        raise UsageError(f"--peers compares one K, got --K {args.K}")
    K = ks[0]
    if args.schedule is not None and args.schedule not in SPECULATIVE:
        raise UsageError(f"unknown schedule {args.schedule!r} for --peers; valid: {', '.join(SPECULATIVE)}")
    if args.profile or args.measure:
        raise UsageError("--peers measures real runs only; it takes no --profile or --measure")
    if args.temperature != 0 or args.top_k or args.top_p != 1:
        raise UsageError("--peers compares greedy generation: it takes no --temperature, --top-k or --top-p")
    if args.max_new_tokens < 2 or args.warmup < 0:
        raise UsageError("--max-new-tokens must be >= 2 and --warmup >= 0")
    placement, target_device, _ = resolve_placement(args.placement)
    refuse_tensor_parallel(placement)
    graphs = graphs_on(args.graphs, target_device)
    check_acceptance(args.acceptance)
    prompts = choose_prompts(args.prompts, args.prompts_file, args.n_prompts)
    out = report_folder(args.out, "peers", placement, target_device, args.force)
    reference_len = args.max_new_tokens + 2 * K + 2
    pair, work = load_pair(
        args.target, args.draft, placement, args.dtype, args.seed, prompts, reference_len, K, args.clustering
    )
    control = control_for(pair, args.acceptance)  # for the reference rows
    hf_target, hf_draft = hf.hf_twin(pair.target.model, pair.room), hf.hf_twin(pair.draft.model, pair.room)
    hf.set_assistant(hf_draft, K)
    head_objs = {h: pair.head(h, args.probes) for h in heads}
    plain = {h: pair.decoder(head_objs[h], K, graphs, None) for h in heads}
    steered = {h: pair.decoder(head_objs[h], K, graphs, control) for h in heads} if control else {}
    n, w = len(prompts), args.warmup
    trials = 0 if args.schedule else len(SPECULATIVE) * (1 + w) * (2 if control else 1)
    with Progress(n + trials + (3 + len(plain) + len(steered)) * (n + w), "peers", "gen") as progress:
        progress.note("target references")
        refs = references(plain[heads[0]], work, reference_len)
        progress.update(n)
        chosen = {"none": args.schedule or _trial(plain[heads[0]], work, None, refs, args, progress)}
        if control:
            chosen["control"] = args.schedule or _trial(steered[heads[0]], work, control, refs, args, progress)
        systems = _systems(work, hf_target, hf_draft, plain, steered, control, chosen, refs, args.max_new_tokens)
        _interleave(systems, work, w, progress)
    meta = {
        "weights": pair.weights,
        "target": args.target,
        "draft": args.draft,
        "placement": placement,
        "graphs": graphs,
        "K": K,
        "prompts": [p.id for p in prompts],
        "prompt_spec": args.prompts,
        "max_new_tokens": args.max_new_tokens,
        "warmup": w,
        "command": args.command,
        "chosen": chosen,
        "schedule_given": args.schedule is not None,
        "control": control.spec if control else None,
        "dtype": pair.target.info["dtype"],
        "gpus": _gpus(pair.target_device, pair.draft_device),
    }
    table = rows_of(systems, refs, args.max_new_tokens)
    write(out, table, systems, meta)
    print(render(list(table[0]), [[_cell(v) for v in row.values()] for row in table]))
    print(f"wrote {out}/peers.md, peers.csv")
    return out


def _systems(
    work, hf_target, hf_draft, plain: dict, steered: dict, control, chosen: dict, refs: dict, max_new: int
) -> list[System]:
    """The rows, each a function of the prompt index: Hugging Face's two, then ours."""

    def ours(dec, schedule, ctl):
        return lambda i: _ours(decode(dec, work, schedule, max_new, ctl, refs, order=[i])[0][1])

    first = next(iter(plain.values()))
    systems = [
        System("hf-generate", "greedy", "-", "-", lambda i: _theirs(hf.generate(hf_target, work.ids[i], max_new))),
        System(
            "hf-assisted",
            "assisted",
            "dense",
            "none",
            lambda i: _theirs(hf.generate(hf_target, work.ids[i], max_new, hf_draft)),
        ),
        System("ours-baseline", "baseline", "-", "-", ours(first, "baseline", None)),
    ]
    systems += [
        System(f"ours-{chosen['none']}-{h}", chosen["none"], h, "none", ours(dec, chosen["none"], None))
        for h, dec in plain.items()
    ]
    systems += [
        System(
            f"ours-{chosen['control']}-{h}+control",
            chosen["control"],
            h,
            control.spec,
            ours(dec, chosen["control"], control),
        )
        for h, dec in steered.items()
    ]
    return systems


def _interleave(systems: list[System], work, warmup: int, progress) -> None:
    """Warm-up generations of every system (not recorded), then every system on prompt i, then i + 1."""
    for s in systems:
        for _ in range(warmup):
            progress.note(f"warm-up {s.name}")
            s.run(0)
            progress.update()
    for i, prompt in enumerate(work.prompts):
        for s in systems:
            progress.note(f"{s.name} {prompt.id}")
            s.samples.append((prompt.id, s.run(i)))
            progress.update()


def _trial(dec, work, control, refs, args, progress) -> str:
    """The fastest speculative schedule on the first prompt (after a warm-up each), for this acceptance."""
    speed = {}
    for schedule in SPECULATIVE:
        progress.note(f"trial {schedule}")
        runs = decode(dec, work, schedule, args.max_new_tokens, control, refs, args.warmup, [0], progress, "trial")
        speed[schedule] = runs[0][1].decode_tokens / runs[0][1].decode_ms
    return max(speed, key=speed.get)


def _gpus(*devices) -> list[str]:
    return [torch.cuda.get_device_name(d) for d in dict.fromkeys(devices) if d.type == "cuda"] or ["none (cpu)"]


def divergence(samples, refs: dict, max_new: int) -> tuple[int, str]:
    """(prompts whose output equals our target's greedy output, where the first other one diverges)."""
    agree, first = 0, ""
    for pid, s in samples:
        want = refs[pid][:max_new]
        if s.tokens == want:
            agree += 1
        elif not first:
            at = next((i for i, (a, b) in enumerate(zip(s.tokens, want)) if a != b), min(len(s.tokens), len(want)))
            got = s.tokens[at] if at < len(s.tokens) else "end"
            first = f"prompt {pid}, token {at}: {got} vs {want[at] if at < len(want) else 'end'}"
    return agree, first


def rows_of(systems: list[System], refs: dict, max_new: int) -> list[dict]:
    by_name = {s.name: s.median("decode_tok_s") for s in systems}
    rows = []
    for s in systems:
        agree, first = divergence(s.samples, refs, max_new)
        proposed = s.total("proposed")
        tok_s = s.median("decode_tok_s")
        rows.append(
            {
                "system": s.name,
                "schedule": s.schedule,
                "head": s.head,
                "acceptance control": s.control,
                "decode tok/s": tok_s,
                "e2e tok/s": s.median("e2e_tok_s"),
                "TTFT ms": s.median("ttft_ms"),
                "x hf-generate": tok_s / by_name["hf-generate"],
                "x hf-assisted": tok_s / by_name["hf-assisted"],
                "acceptance": s.total("accepted") / proposed if proposed else None,
                "tokens/round": _tokens_per_round(s),
                "agree": f"{agree}/{len(s.samples)}",
                "first divergence": first or "-",
            }
        )
    return rows


def _tokens_per_round(s: System) -> float:
    """Ours: decode tokens / rounds (the first token is not a round). Hugging Face: new tokens / target
    forwards (its first forward is the prefill and, when assisted, the first verify)."""
    if s.name.startswith("hf-"):
        return sum(len(x.tokens) for _, x in s.samples) / s.total("rounds")
    return s.total("decode_tokens") / s.total("rounds") if s.total("rounds") else 1.0


def _cell(value) -> str:
    if value is None:
        return "-"
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def where_the_time_goes(systems: list[System], rows: list[dict]) -> list[str]:
    """Our phase times per decode token for every row of ours below TARGET_SPEEDUP over the best HF row."""
    best_hf = max(r["decode tok/s"] for r in rows if r["system"].startswith("hf-"))
    hf_ms = 1000.0 / best_hf
    lines = []
    for s, r in zip(systems, rows):
        speedup = r["decode tok/s"] / best_hf
        if s.name.startswith("hf-") or speedup >= TARGET_SPEEDUP or s.samples[0][1].phases is None:
            continue
        tokens, decode_ms = s.total("decode_tokens"), s.total("decode_ms")
        totals = {p: sum(x.phases[p] for _, x in s.samples) for p in PHASES}
        lines += [
            f"### {s.name}: {speedup:.2f}x the best Hugging Face row ({best_hf:.2f} tok/s, {hf_ms:.2f} ms/token)",
            "",
            f"{decode_ms / tokens:.2f} ms per decode token, by phase (summed over prompts; device phases "
            "can overlap on two GPUs):",
            "",
            "| phase | ms per token | share of decode time |",
            "|---|---|---|",
        ]
        lines += [f"| {p} | {totals[p] / tokens:.3f} | {100 * totals[p] / decode_ms:.1f}% |" for p in PHASES]
        lines.append("")
    return lines


def markdown(rows: list[dict], systems: list[System], meta: dict) -> str:
    weights = meta["weights"].upper()
    pick = (
        "given with --schedule"
        if meta["schedule_given"]
        else "the fastest in a short trial on the first prompt (dense head, after a warm-up each)"
    )
    lines = [
        f"# Side by side with Hugging Face ({meta['placement']})",
        "",
        f"**Weights: {weights}**"
        + (
            " (real architectures, seeded random values: outputs are not language, and "
            "the draft's own proposals are almost never accepted)"
            if meta["weights"] == "synthetic"
            else ""
        ),
        "",
        f"- Target {meta['target']}, draft {meta['draft']}, {meta['dtype']}; placement {meta['placement']}; "
        f"GPUs: {', '.join(meta['gpus'])}; our CUDA graphs: {'on' if meta['graphs'] else 'off'}",
        f"- Hugging Face models are transformers' own classes over our very weight tensors (shared, not copied); "
        f"`generate` greedy with a DynamicCache; assisted generation with the same draft, "
        f"{meta['K']} proposals per round (constant, no confidence stop), K = {meta['K']} for ours too.",
        f"- Our schedule: {meta['chosen']['none']} without acceptance control"
        + (f", {meta['chosen']['control']} under acceptance control {meta['control']}" if meta["control"] else "")
        + f" ({pick}).",
        f"- Prompts: {len(meta['prompts'])} Spec-Bench questions ({meta['prompt_spec']}: "
        f"{', '.join(meta['prompts'])}), "
        f"{meta['max_new_tokens']} new tokens; {meta['warmup']} warm-up generation(s) per system, then the "
        "prompts interleaved across systems; tok/s and TTFT are medians over prompts.",
        f"- Command: `{meta['command']}`",
        "",
        "## Results",
        "",
        "| " + " | ".join(rows[0]) + " |",
        "|" + "---|" * len(rows[0]),
    ]
    lines += ["| " + " | ".join(_cell(v) for v in r.values()) + " |" for r in rows]
    lines += [
        "",
        "- **decode tok/s**: tokens after the first ones to reach the host, over the time after them "
        "(ours: after the first token; Hugging Face assisted: after its first round). **e2e tok/s**: all new "
        "tokens over the whole call, prefill included. **x hf-…**: decode tok/s over that row's.",
        "- **acceptance**: accepted / proposed draft tokens. **tokens/round**: ours = decode tokens / rounds; "
        "Hugging Face = new tokens / target forwards (its first forward is the prefill).",
        "- **agree**: prompts whose output equals our target's greedy output token for token; **first "
        "divergence**: the first prompt and token where one does not (got vs expected).",
        "- Rows marked +control run under acceptance control (the draft runs its real body and head; its "
        "proposals follow the target's greedy output at the given rate): for reference only, Hugging Face "
        "cannot be steered that way."
        if meta["control"]
        else "- No acceptance control (real weights).",
        "",
    ]
    slow = where_the_time_goes(systems, rows)
    lines += ["## Where the time goes", ""]
    lines += slow if slow else [f"Every row of ours is at least {TARGET_SPEEDUP}x the best Hugging Face row.", ""]
    return "\n".join(lines) + "\n"


def csv_text(rows: list[dict], systems: list[System]) -> str:
    buffer = io.StringIO()
    fields = list(rows[0]) + ["prompts", "decode_tokens", "decode_ms"] + [f"{p}_ms" for p in PHASES]
    writer = csv.DictWriter(buffer, fieldnames=fields)
    writer.writeheader()
    for r, s in zip(rows, systems):
        phases = {f"{p}_ms": sum(x.phases[p] for _, x in s.samples) if s.samples[0][1].phases else None for p in PHASES}
        writer.writerow(
            {
                **r,
                "prompts": len(s.samples),
                "decode_tokens": s.total("decode_tokens"),
                "decode_ms": s.total("decode_ms"),
                **phases,
            }
        )
    return buffer.getvalue()


def write(out: Path, rows, systems, meta) -> None:
    with staged(out) as folder:
        write_atomic(folder / "peers.md", markdown(rows, systems, meta))
        write_atomic(folder / "peers.csv", csv_text(rows, systems))
