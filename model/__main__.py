"""python -m model: greedy speculative decoding of Spec-Bench prompts -> acceptance traces, run summaries.

Runs each chosen schedule over the chosen prompts (after a warm-up generation), writes one
trace (JSONL) and one summary (JSON) per schedule into --out, and prints a table. Bad input gets
one line `error: ...` on stderr, exit code 2, and nothing in --out.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from contracts import PLACEMENTS, SCHEDULES, UsageError
from contracts.cli import OneLineParser, parse_choices, require_modules
from contracts.files import check_output_file, check_output_folder, staged
from contracts.heads import HEAD_FORMS, check_assets, parse_head
from contracts.names import DRAFTERS, POLICIES, POLICY_SCHEDULES
from contracts.policies import Arm, arms, make_policy, parse_drafters, parse_policy
from contracts.progress import Progress
from contracts.timeline import write_timeline
from contracts.trace import write_summary, write_trace
from contracts.trees import MAX_K, TREE_FORMS, parse_tree

require_modules("python -m model", ("torch",), "pip install torch, then pip install -e '.[model]'")

from model.acceptance_control import check_spec  # noqa: E402
from model.cli import add_sampling_options, run_torch_command, sampling_settings  # noqa: E402
from model.drafting import Drafting  # noqa: E402
from model.early_exit import early_exit  # noqa: E402
from model.pair import load_pair, resolve_placement  # noqa: E402
from model.prompt_lookup import match_runs  # noqa: E402
from model.prompts import select_prompts  # noqa: E402
from model.trace import summarize, timeline_meta, trace_lines  # noqa: E402
from model.tree_rounds import check_tree, check_tree_precision  # noqa: E402

EPILOG = """\
prompt selections (--prompts):
  first:N            the first N Spec-Bench questions
  per-category:N     the first N of every category
  writing,math,81    categories and question ids, comma-separated (the first turn is the prompt)

draft heads (--head; contracts/heads.py):
  dense              the full head (default)
  flashhead[:P]      FlashHead at P probes (default clusters / 16)
  shortlist:N        the N tokens the draft proposes most often (needs --head-assets)
  router:C           a learned router's C best clusters (needs --head-assets)
  KIND:B1,B2,...     a budget per draft position 1..K, the last repeated (flashhead:64,64,32,16)
  Build shortlist and router assets with python -m model.build_head.

acceptance control (--acceptance, synthetic weights only):
  a=0.43             the draft proposes the target's greedy token with i.i.d. probability 0.43
  pattern=1,1,0      ... by a fixed accept/reject pattern over output positions (repeated)
  a=0.8,0.7,0.6      ... with probability R_j at draft position j of its round (the last repeats;
                     greedy chain rounds)
  The draft still runs its real body and head every step; only its proposal is replaced.

outputs (--out DIR): SCHEDULE.trace.jsonl (specloop.trace/1) and SCHEDULE.summary.json
(specloop.summary/1) for every schedule run; see docs/contracts.md.

timeline (--timeline FILE): the first recorded (not warm-up) generation of the first speculative
schedule run (the baseline when only it runs), as a Chrome/Perfetto trace with the simulator's
stream and event names (python -m sim --timeline): each device's phases from CUDA events on one clock
(perf_counter on the CPU, where both models share one device), the host's launches, reads and gaps.

examples:
  python -m model --placement cpu --prompts first:2 --max-new-tokens 32 --acceptance a=0.5 --check-exact
  python -m model --placement cpu --schedule deferred --acceptance a=0.5 --timeline out/timeline.json
  python -m model --target qwen3-32b-awq --draft qwen3-0.6b --head flashhead --probes 593 \\
      --placement two-gpu --schedule all --K 6 --acceptance a=0.43 --out out/run1
"""


def parse_args(argv) -> argparse.Namespace:
    p = OneLineParser(
        prog="python -m model", description=__doc__, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add = p.add_argument
    add("--target", default="tiny-qwen3", help="target model: a preset or a checkpoint folder (default tiny-qwen3)")
    add(
        "--draft",
        default="tiny-qwen3-draft",
        help="draft model: a preset or a checkpoint folder (default tiny-qwen3-draft)",
    )
    add("--head", default="dense", help=f"draft head: {HEAD_FORMS} (see below; the target always uses its dense head)")
    add("--probes", type=int, default=None, help="probes of a plain --head flashhead (same as flashhead:P)")
    add(
        "--head-assets",
        default=None,
        metavar="DIR",
        help="shortlist/router assets (python -m model.build_head --out DIR)",
    )
    add(
        "--router-stream",
        choices=("side", "sequential"),
        default="side",
        help="router heads: choose clusters on a side stream beside the draft body (default) or after it",
    )
    add(
        "--clustering",
        default=None,
        metavar="DIR",
        help="load the FlashHead clustering from DIR (published asset layout); default: build it from the draft's head",
    )
    add("--schedule", default="all", help=f"one of {', '.join(SCHEDULES)}, several joined by ',', or all (default)")
    add("--K", type=int, default=6, help="draft tokens proposed per round, >= 1 (default 6; a tree: its depth)")
    add(
        "--tree",
        default="chain",
        help=f"what a round drafts: {TREE_FORMS} (default chain; trees run with --schedule ordinary,deferred)",
    )
    add("--max-new-tokens", type=int, default=64, help="tokens generated per prompt, the first included (default 64)")
    add("--prompts", default="first:2", help="which Spec-Bench prompts (see below; default first:2)")
    add("--prompts-file", default=None, help="a Spec-Bench question.jsonl (default: the copy shipped in model/data)")
    add(
        "--placement",
        default=None,
        help=f"{', '.join(PLACEMENTS)}: target on cuda:0 and draft on cuda:1, both on cuda:0, or the CPU "
        "(default: two-gpu with 2 GPUs, one-gpu with 1, else cpu); or tpN: the target tensor-parallel over N "
        "GPUs with the draft on rank 0's, launched as torchrun --nproc-per-node N -m model ...",
    )
    add("--dtype", default=None, help="float32, bfloat16 or float16 (default: bfloat16 on GPU, float32 on CPU)")
    add("--graphs", default="on", choices=["on", "off"], help="replay steps as CUDA graphs (on GPU; default on)")
    add(
        "--kernels",
        default=None,
        choices=["fused", "torch"],
        help="layer kernels: fused (Triton, model/fused_ops.py) or torch (default: fused for Qwen3 on GPU)",
    )
    add("--acceptance", default=None, metavar="SPEC", help="acceptance control for synthetic weights (see below)")
    add(
        "--seed",
        type=int,
        default=0,
        help="seed of synthetic weights, clustering, acceptance control and sampling (default 0)",
    )
    add_sampling_options(p)
    add(
        "--samples",
        type=int,
        default=1,
        help="independent generations of each prompt when sampling; each one's tokens go to the summary (default 1)",
    )
    add("--warmup", type=int, default=1, help="untimed generations of the first prompt per schedule (default 1)")
    add(
        "--phases",
        default="on",
        choices=["on", "off"],
        help="record per-round phase times (CUDA events; default on; off removes their small overhead)",
    )
    add("--stop-at-eos", action="store_true", help="stop a generation at the tokenizer's EOS token (if it has one)")
    add(
        "--check-exact",
        action="store_true",
        help="compare every output with target-only greedy decoding; exit 1 on a mismatch",
    )
    add("--out", default=None, metavar="DIR", help="folder for traces and summaries (created at the end, all at once)")
    add(
        "--policy",
        default="fixed",
        help=f"what picks each round's drafter and K: {', '.join(POLICIES)} (default fixed; deferred schedules only)",
    )
    add("--drafter", default="draft-model", help=f"the arms' drafters joined by '+': {', '.join(DRAFTERS)}")
    add("--arms-K", default=None, help="the arms' K values joined by '+', each <= --K (default: 1+2+4+6+8 up to --K)")
    add("--early-exit-layers", type=int, default=None, help="the early-exit drafter's layers L (the target's first L)")
    add("--lookup-ngram", type=int, default=2, help="prompt lookup's max_matching_ngram_size (default 2, as HF's)")
    add(
        "--record-lookup-runs",
        type=int,
        default=None,
        metavar="G",
        help="also record in the traces, for every decode position, how many tokens prompt lookup "
        "(max_matching_ngram_size G, Hugging Face's default 2) would have had accepted, so that "
        "python -m sim can replay --drafter prompt-lookup on this run",
    )
    add(
        "--timeline",
        default=None,
        metavar="FILE",
        help="write one generation's streams as a Chrome/Perfetto trace (JSON; see below)",
    )
    return p.parse_args(argv)


def main(argv=None) -> int:
    return run_torch_command(lambda: run(parse_args(argv)))


def run(args) -> int:
    schedules = parse_choices(args.schedule, SCHEDULES, "schedule")
    _check_numbers(args)
    settings = _sampling(args)
    if args.acceptance:
        check_spec(args.acceptance, settings.greedy, parse_tree(args.tree).kind == "chain")
    out = Path(args.out) if args.out else None
    if out is not None:
        check_output_folder(out, "--out")
    if args.timeline:
        if args.phases == "off":
            raise UsageError("--timeline needs the phase times (--phases on)")
        check_output_file(Path(args.timeline), "--timeline")
    # the timeline's schedule: the first speculative one run (the baseline when only it runs)
    args.timeline_schedule = next((s for s in schedules if s != "baseline"), schedules[0]) if args.timeline else None
    arms_choice = _arms(args, schedules)
    args.tree_shape = parse_tree(args.tree)
    alone = not arms_choice and not (args.placement or "").startswith("tp")
    check_tree(args.tree_shape, schedules, args.head_spec.kind, alone)
    if args.tree_shape.kind != "chain":  # check_tree refused trees that do not run alone
        device_type = "cpu" if resolve_placement(args.placement)[0] == "cpu" else "cuda"
        check_tree_precision(args.tree_shape, device_type, args.dtype or "bfloat16", args.kernels)
        args.K = args.tree_shape.depth
    if not settings.greedy and (arms_choice or (args.placement or "").startswith("tp")):
        raise UsageError(
            "--temperature > 0 runs with the draft model at a fixed K on one or two devices "
            "(not with --policy, --drafter or tpN placements yet)"
        )
    prompts = select_prompts(args.prompts, args.prompts_file)
    speculative = any(s != "baseline" for s in schedules)
    pair = load_pair(
        args.target,
        args.draft if speculative else None,
        args.placement,
        args.dtype,
        args.seed,
        args.kernels,
        args.clustering,
        head_assets=args.head_assets,
    )
    ids = [pair.target.tokenizer.encode(p.text) for p in prompts]
    reference_len = args.max_new_tokens + (2 * args.K + 2 if args.acceptance else 0)
    pair.size_caches([len(x) for x in ids], reference_len, args.K, args.tree_shape.node_count)
    control = pair.acceptance_control(args.acceptance) if speculative else None
    head = pair.head(args.head_spec, args.probes) if speculative else None
    decoder = pair.decoder(
        head,
        args.K,
        graphs=args.graphs == "on",
        control=control,
        phases=args.phases == "on",
        stop_at_eos=args.stop_at_eos,
        drafting=_drafting(pair, arms_choice, args) if arms_choice else None,
        sampling=settings,
        tree=args.tree_shape,
        router_side_stream=args.router_stream == "side",
    )
    needs_reference = control is not None or args.check_exact
    references = {p.id: decoder.reference(x, reference_len) for p, x in zip(prompts, ids)} if needs_reference else {}
    results = _decode(decoder, schedules, prompts, ids, references, control, args)
    if not pair.writes_outputs:  # a tensor-parallel rank without the draft: rank 0 reports
        return 0
    config = {
        "target": args.target,
        "draft": args.draft if speculative else None,
        "weights": pair.weights,
        "placement": pair.placement,
        "graphs": decoder.graphs,
        "kernels": pair.target.info["kernels"],
        "awq_kernel": pair.target.info["kernel"],
        "max_new_tokens": args.max_new_tokens,
        "prompts": [p.id for p in prompts],
    }
    if control is not None:
        config["acceptance_control"] = control.describe()
    if arms_choice:
        config.update(policy=args.policy, arms=[a.label() for a in arms_choice], lookup_ngram=args.lookup_ngram)
        config["early_exit_layers"] = args.early_exit_layers
    if not settings.greedy:
        config["sampling"] = {**settings.describe(), "samples": args.samples}
    summaries = {s: summarize({**config, **_head_config(s, head, args)}, runs) for s, runs in results.items()}
    if out is not None:
        lookup_ngram = args.record_lookup_runs
        prompt_ids = {p.id: x for p, x in zip(prompts, ids)} if lookup_ngram else None
        _write_outputs(out, results, summaries, prompt_ids, lookup_ngram)
    if args.timeline:
        _write_timeline(Path(args.timeline), args.timeline_schedule, results, summaries, decoder)
    mismatches = _check_exact(results, references, args) if args.check_exact else {}
    _print_table(summaries, config, args, mismatches if args.check_exact else None)
    for line in mismatches.values():
        print(f"error: check-exact: {line}", file=sys.stderr)
    return 1 if mismatches else 0


def _head_config(schedule: str, head, args) -> dict:
    if schedule == "baseline":
        return {"schedule": schedule, "K": 0, "head": "dense", "probes": None}
    probes = getattr(head, "probes", None)
    config = {"schedule": schedule, "K": args.K, "head": args.head_spec.label, "probes": probes}
    return config if args.tree_shape.kind == "chain" else {**config, "tree": args.tree_shape.label}


def _arms(args, schedules) -> tuple | None:
    """The policy's arms, checked before any model loads; None for the fixed draft model."""
    drafters = parse_drafters(args.drafter, "--drafter")
    parse_policy(args.policy, "--policy")
    if args.policy == "fixed" and drafters == ("draft-model",):
        if args.arms_K is not None:
            raise UsageError("--arms-K sets the arms a policy chooses among: give it with --policy or --drafter")
        return None
    bad = [s for s in schedules if s not in POLICY_SCHEDULES and s != "baseline"]
    if bad:
        raise UsageError(
            f"--policy/--drafter run on {' and '.join(POLICY_SCHEDULES)} only, not {', '.join(bad)} (use --schedule)"
        )
    if "early-exit" in drafters and args.early_exit_layers is None:
        raise UsageError("--drafter early-exit needs --early-exit-layers L (L >= 1, the target's first L layers)")
    if args.arms_K is None:
        Ks = {k for k in (1, 2, 4, 6, 8) if k < args.K}
    else:
        try:
            Ks = {int(k) for k in args.arms_K.split("+")}
        except ValueError:
            raise UsageError(f"--arms-K: expected K values joined by '+', got {args.arms_K!r}") from None
        if any(not 1 <= k <= args.K for k in Ks):
            raise UsageError(f"--arms-K: every K must be in 1..{args.K} (--K sizes the decoder's buffers)")
    first = Arm(drafters[0], args.K)
    return (first, *(a for a in arms(drafters, (args.K, *Ks)) if a != first))


def _drafting(pair, choices, args) -> Drafting:
    """The policy over the arms, with the early-exit draft (the target's first L layers) where asked."""
    early = None
    if args.early_exit_layers is not None:
        target = pair.target.model
        early = early_exit(target, args.early_exit_layers)
        early.setup_cache(target.max_seq_len, target.head_weight.device)
    return Drafting(make_policy(args.policy, choices, args.seed), early=early, lookup_ngram=args.lookup_ngram)


def _check_numbers(args) -> None:
    if not 1 <= args.K <= MAX_K:
        raise UsageError(f"--K must be in 1..{MAX_K} (draft tokens per round), got {args.K}")
    if args.record_lookup_runs is not None and args.record_lookup_runs < 1:
        raise UsageError(
            f"--record-lookup-runs must be >= 1 (the largest n-gram matched), got {args.record_lookup_runs}"
        )
    if args.early_exit_layers is not None and args.early_exit_layers < 1:
        raise UsageError(
            f"--early-exit-layers must be >= 1 (the target's first L layers), got {args.early_exit_layers}"
        )
    if args.lookup_ngram < 1:
        raise UsageError(f"--lookup-ngram must be >= 1, got {args.lookup_ngram}")
    if args.max_new_tokens < 1:
        raise UsageError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    if args.warmup < 0:
        raise UsageError(f"--warmup must be >= 0, got {args.warmup}")
    args.head_spec = parse_head(args.head)
    if args.head_spec.kind != "flashhead" and (args.probes is not None or args.clustering):
        raise UsageError("--probes and --clustering apply to --head flashhead only")
    if args.probes is not None and args.head_spec.budgets:
        raise UsageError(f"--probes repeats the budget of --head {args.head}; give one of them")
    if args.head_assets and not Path(args.head_assets).is_dir():
        raise UsageError(f"--head-assets {args.head_assets} is not a folder")
    check_assets(args.head_spec, args.head_assets)


def _sampling(args):
    """The sampling settings (bad values: one line, exit 2), and the options that need greedy decoding."""
    settings = sampling_settings(args.temperature, args.top_k, args.top_p, args.seed, args.acceptance)
    if args.samples < 1:
        raise UsageError(f"--samples must be >= 1, got {args.samples}")
    if settings.greedy and args.samples > 1:
        raise UsageError("--samples needs --temperature > 0 (greedy generations are all the same)")
    if not settings.greedy and args.check_exact:
        raise UsageError("--check-exact compares with greedy decoding: use it with --temperature 0")
    return settings


def _decode(dec, schedules, prompts, ids, references, control, args) -> dict:
    """Every schedule over every prompt and sample (warm-up generations first);
    {schedule: [(prompt_id, Generation)]}."""
    results = {}
    total = len(schedules) * (len(prompts) * args.samples + args.warmup)
    with Progress(total, "decoding", "gen") as progress:
        for schedule in schedules:
            runs = [(prompts[0], ids[0], 0)] * args.warmup
            runs += [(p, x, sample) for p, x in zip(prompts, ids) for sample in range(args.samples)]
            results[schedule] = []
            for index, (prompt, x, sample) in enumerate(runs):
                if control is not None:
                    control.bind(references[prompt.id], len(x), prompt.id)
                if index == args.warmup and dec.drafting is not None:
                    dec.drafting.reset()  # the warm-up's lessons are forgotten, as the simulator never saw them
                progress.note(f"{schedule} {prompt.id}")
                # the timeline: the first recorded generation of its schedule only
                dec.clock.timeline = schedule == args.timeline_schedule and index == args.warmup
                generation = dec.generate(x, args.max_new_tokens, schedule, sample)
                dec.clock.timeline = False
                if index >= args.warmup:
                    results[schedule].append((prompt.id, generation))
                progress.update()
    return results


def _write_outputs(out: Path, results, summaries, prompt_ids=None, lookup_ngram=None) -> None:
    """Every schedule's trace and summary, added to `out` all at once (contracts.files.staged). With
    `prompt_ids`, speculative traces also record prompt lookup's match runs (contracts.trace `runs`)."""
    with staged(out, merge=True) as folder:
        for schedule, runs in results.items():
            config = summaries[schedule]["config"]
            record = prompt_ids is not None and schedule != "baseline"
            lines = [
                line
                for pid, g in runs
                for line in trace_lines(
                    g,
                    prompt_id=pid,
                    schedule=schedule,
                    head=config["head"],
                    K=config["K"],
                    probes=config["probes"],
                    runs={"prompt-lookup": match_runs(prompt_ids[pid], g.tokens, lookup_ngram)} if record else None,
                )
            ]
            write_trace(folder / f"{schedule}.trace.jsonl", lines)
            write_summary(folder / f"{schedule}.summary.json", summaries[schedule])


def _write_timeline(path: Path, schedule: str, results, summaries, decoder) -> None:
    """The timeline of the first recorded generation of `schedule`."""
    prompt_id, generation = results[schedule][0]
    chosen = (
        "the first recorded (not warm-up) generation of the first speculative schedule run"
        if schedule != "baseline"
        else "the first recorded generation of the baseline (no speculative schedule ran)"
    )
    meta = timeline_meta(
        generation, summaries[schedule]["config"], prompt_id, decoder.target_device.type == "cuda", chosen
    )
    write_timeline(path, generation.timeline, meta)
    print(f"wrote {path} (timeline of {meta['configuration']['name']}, prompt {prompt_id})")


def _check_exact(results, references, args) -> dict[str, str]:
    """The first mismatch of each schedule's outputs against target-only greedy decoding."""
    problems = {}
    for schedule, runs in results.items():
        for pid, g in runs:
            want = references[pid][: args.max_new_tokens]
            if g.tokens != want and schedule not in problems:
                at = next((i for i, (a, b) in enumerate(zip(g.tokens, want)) if a != b), min(len(g.tokens), len(want)))
                got_tok = g.tokens[at] if at < len(g.tokens) else "end"
                want_tok = want[at] if at < len(want) else "end"
                problems[schedule] = (
                    f"{schedule} differs from target-only greedy on prompt {pid} at token {at} "
                    f"(got {got_tok}, expected {want_tok})"
                )
    return problems


def _sampling_note(config: dict) -> str:
    sampling = config.get("sampling")
    if sampling is None:
        return " | greedy"
    return (
        f" x {sampling['samples']} samples | sampling: temperature {sampling['temperature']}, "
        f"top-k {sampling['top_k'] or 'off'}, top-p {sampling['top_p']}, seed {sampling['seed']}"
    )


def _print_table(summaries, config, args, mismatches: dict | None) -> None:
    draft = f", draft {config['draft']}" if config["draft"] else ""
    print(
        f"target {config['target']}{draft} | weights: {config['weights']} | placement {config['placement']} | "
        f"graphs {'on' if config['graphs'] else 'off'} | kernels {config['kernels']} ({config['awq_kernel']}) | "
        f"K={args.K} | {len(config['prompts'])} prompts x "
        f"{args.max_new_tokens} tokens{_sampling_note(config)}"
    )
    if config["weights"] == "synthetic":
        note = (
            f"acceptance controlled ({args.acceptance})"
            if args.acceptance
            else "acceptance between random-weight models is meaningless; use --acceptance a=RATE"
        )
        print(f"synthetic weights: timings are real, outputs are not language; {note}")
    base = summaries.get("baseline", {}).get("decode_tok_s")
    header = ("schedule", "head", "K", "tok/s", "speedup", "TTFT ms", "accept", "emitted", "verify", "append")
    rows = [header + (("exact",) if mismatches is not None else ())]
    for schedule, s in summaries.items():
        c = s["config"]
        row = (
            schedule,
            c["head"] + (f" p={c['probes']}" if c["head"] == "flashhead" else ""),
            str(c["K"]),
            f"{s['decode_tok_s']:.2f}",
            f"{s['decode_tok_s'] / base:.3f}x" if base else "-",
            f"{s['ttft_ms']:.1f}",
            "-" if s["acceptance"] is None else f"{s['acceptance']:.3f}",
            f"{s['mean_emitted']:.3f}",
            str(s["verify_calls"]),
            str(s["append_calls"]),
        )
        rows.append(row + (("NO" if schedule in mismatches else "yes",) if mismatches is not None else ()))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip())


if __name__ == "__main__":
    sys.exit(main())
