"""Run every configuration for real, then predict each from the same profile and its own trace.

Order: check every input; decode all configurations (one decoder per (K, head), warm-up first); free
the models; with --measure, measure the profile now (so both never share the GPU) with contexts that
cover the prompts; predict; write the report. Everything lands in a staged folder renamed at the end.
"""

from __future__ import annotations

import itertools
import shlex
import shutil
from functools import partial
from pathlib import Path

from contracts import SCHEDULES, UsageError
from contracts.cli import parse_choices
from contracts.files import staged
from contracts.names import REGIME_OF_GRAPHS_FLAG, tensor_parallel_size
from contracts.progress import Progress
from contracts.timeline import read_timeline, write_timeline
from contracts.trace import read_summary, read_trace, write_summary, write_trace
from contracts.trees import parse_tree, parse_trees
from measure.__main__ import command_line, settings_from
from measure.profiling import MeasureSettings, check_settings, measure_profile
from model.cli import sampling_settings
from model.pair import resolve_placement
from model.prompts import select_prompts
from model.trace import timeline_meta
from model.tree_rounds import check_tree
from sim import tensor_parallel
from sim.profile import load_profile
from sim.sampled_trees import drafts_sample
from sim.sampling_costs import sampled_profile

from . import report
from .acceptance_curves import base_control, head_controls
from .calibration import SCHEDULES as CALIBRATION_SCHEDULES
from .calibration import (
    SHARED_MODEL_COSTS,
    Calibration,
    draft_prefill_edit,
    fitted_read_gap,
    group_name,
    host_kind,
    pooled,
    read_gap_from,
    scales_from,
    trace_name,
)
from .closed_form import closed_form
from .heads import check_profile_heads, is_budgeted, validated_heads
from .plan import (
    Config,
    check_acceptance,
    check_generation_lengths,
    check_out,
    check_profile,
    choose_prompts,
    graphs_on,
    matrix,
    parse_ks,
    refuse_tensor_parallel,
    report_folder,
    timeline_config,
)
from .predict import phase_rows, predict, predict_timeline
from .repeats import checked_repeats, median_by_tok_s, run_stem, split_stem
from .runs import Workload, control_for, decode, free_memory, load_pair, records, references, run_config_dict
from .trees import (
    check_profile_trees,
    control_rate,
    decoder_rows,
    predict_by_control,
    tree_widths,
    validated_trees,
)
from .turnaround import turnaround_rows

# Runs of each configuration (validate/repeats.py); --repeats 3 measures each as the median of three.
REPEATS = 1
MEASURED_CONTEXTS = 4  # context points measured across the runs' range: a noisy point moves a line through two


def context_points(lowest: int, highest: int, count: int = MEASURED_CONTEXTS) -> list[int]:
    """`count` contexts spread evenly from the runs' shortest to their longest (both included), so
    the profile's costs are interpolated, never extrapolated, and no single point sets the slope."""
    if highest <= lowest:
        return [lowest]
    return sorted({round(lowest + (highest - lowest) * i / (count - 1)) for i in range(count)})


def measure_settings(
    args, placement: str, graphs: bool, K_max: int, contexts, prompt_lengths, trees=("chain",)
) -> MeasureSettings:
    """python -m measure's settings for the same models, placement and regime (and the widths the trees
    verify and draft at); --measure-args win."""
    base = MeasureSettings(
        target=args.target,
        draft=args.draft,
        placement=placement,
        dtype=args.dtype,
        contexts=tuple(contexts),
        prompt_lengths=tuple(prompt_lengths),
        K_max=K_max,
        clustering=args.clustering,
        graphs=("on" if graphs else "off",),
        heads="+".join(h for h in validated_heads(args.heads, args.head_assets) if is_budgeted(h)) or None,
        head_assets=args.head_assets,
        prompts_file=args.prompts_file,
        seed=args.seed,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        tree_widths=tree_widths(trees),
    )
    try:
        words = shlex.split(args.measure_args)
    except ValueError as error:  # an unclosed quote or a trailing backslash
        raise UsageError(f"--measure-args {args.measure_args!r}: {error} (quote it as a shell would)") from None
    settings, _ = settings_from(words, base, overrides_only=True)
    check_settings(settings)
    return settings


def _check_numbers(args, heads) -> None:
    check_generation_lengths(args.max_new_tokens, args.warmup)
    if "flashhead" not in {h.split(":")[0] for h in heads} and (args.probes is not None or args.clustering):
        raise UsageError("--probes and --clustering apply to the flashhead head only")
    if bool(args.profile) == bool(args.measure):
        raise UsageError("give a cost profile: --profile PATH (from python -m measure), or --measure to measure one")


def run(args) -> Path:
    schedules = parse_choices(args.schedules, SCHEDULES, "schedule")
    heads = validated_heads(args.heads, args.head_assets)
    ks = parse_ks(args.K)
    _check_numbers(args, heads)
    args.sampling = sampling_settings(args.temperature, args.top_k, args.top_p, args.seed, args.acceptance)
    trees = validated_trees(args.trees, schedules, heads, args.temperature > 0)
    configs = matrix(schedules, heads, ks, trees)
    placement, target_device, _ = resolve_placement(args.placement)
    refuse_tensor_parallel(placement)
    for tree in parse_trees("+".join(trees)):  # the decoders check again, after the models load
        check_tree(tree, schedules, "dense", option="--trees")
    graphs = graphs_on(args.graphs, target_device)
    K_max = max(ks)
    repeats = checked_repeats(args.repeats, REPEATS)
    rows = decoder_rows(K_max, trees)  # every decoder's fixed width on a GPU (validate/trees.py)
    if args.profile:
        check_profile(args.profile, placement, graphs, sampled=not args.sampling.greedy)
        check_profile_heads(args.profile, heads, graphs, args.probes, sampled=not args.sampling.greedy)
        check_profile_trees(args.profile, trees, graphs, rows if target_device.type == "cuda" else None)
    else:
        measure_settings(args, placement, graphs, K_max, [1], [1], trees)
    check_acceptance(args.acceptance, args.sampling.greedy, curve_allowed=True)
    curves = head_controls(args.acceptance, args.profile, heads, ks, args.probes, args.sampling.greedy)
    prompts = choose_prompts(args.prompts, args.prompts_file, args.n_prompts)
    out = report_folder(args.out, "validation", placement, target_device, args.force)
    longest_K = max([K_max] + [c.K for c in configs])  # a tree's depth may pass the chains' K
    reference_len = args.max_new_tokens + 2 * longest_K + 2
    pair, work = load_pair(
        args.target,
        args.draft,
        placement,
        args.dtype,
        args.seed,
        prompts,
        reference_len,
        longest_K,
        args.clustering,
        args.head_assets,
        nodes=rows - 1,
    )
    control = control_for(pair, base_control(args.acceptance))
    checked = args.sampling.greedy  # outputs checked against the references, with or without control
    if control is not None:  # the default control of synthetic weights too
        sampling_settings(args.temperature, args.top_k, args.top_p, args.seed, control.spec)
    for head in heads:
        pair.head(head, args.probes)  # bad probes, budgets or assets fail here, before any run
    lengths = [len(x) for x in work.ids]
    meta = {**_meta(args, pair, graphs, control, prompts), "repeats": repeats}
    if curves:
        per_head = "; ".join(f"{head} at K={K}: {spec}" for (K, head), spec in curves.items())
        meta["acceptance"] = f"acceptance control {args.acceptance} (seed {control.seed}), per head {per_head}"
    drawn = timeline_config(configs)

    with staged(out) as folder:
        (folder / "traces").mkdir()
        recorded, calibration_records, inexact = _decode_all(
            args, pair, work, configs, control, graphs, reference_len, folder, ks[0], drawn, rows, repeats, curves
        )
        del pair, control
        free_memory()
        profile_path = args.profile
        if args.measure:
            contexts = context_points(min(lengths) + 1, max(lengths) + args.max_new_tokens + 2 * longest_K)
            profile_path = folder / "profile.json"
            prompt_lengths = sorted({min(lengths), max(lengths)})
            settings = measure_settings(args, placement, graphs, K_max, contexts, prompt_lengths, trees)
            measure_profile(settings, profile_path, command_line(settings, out / "profile.json"))
            check_profile_trees(str(profile_path), trees, graphs, rows if target_device.type == "cuda" else None)
        profile = check_profile(str(profile_path), placement, graphs)
        calibrations = calibrate(calibration_records, profile_path, placement, graphs)
        results, notes = _predict_all(recorded, calibrations, profile_path, profile, placement, graphs, folder, drawn)
        notes = [n.replace(str(folder), str(out)) for n in notes]  # the path the profile will have
        meta["calibrations"] = [c.describe() for c in calibrations.values()]
        meta["inexact"] = inexact if checked else None
        meta.update(
            _profile_meta(profile, args, pair_names=(args.target, args.draft)),
            notes=notes,
            profile="profile.json" if args.measure else args.profile,
            measured_here=bool(args.measure),
        )
        meta["timeline"] = _timeline_files(folder, drawn)
        report.write(folder, results, meta)
    _print_results(results, out, meta["timeline"]["files"])
    return out


def _print_results(results, out: Path, timeline_files: list[str]) -> None:
    print(report.stdout_table(results))
    print(
        "; ".join(
            f"{name.replace('_', ' ')} |error|: median {100 * median:.1f}%, max {100 * most:.1f}%"
            for name, (median, most) in report.errors_summary(results).items()
        )
    )
    for name, (median, most) in report.tree_errors(results).items():
        print(f"trees from the control's rule, {name} |error|: median {100 * median:.1f}%, max {100 * most:.1f}%")
    print(
        f"wrote {out}/report.md, results.csv, scatter.png, phases.png, {''.join(f + ', ' for f in timeline_files)}"
        "traces/"
    )


MEASURED_TIMELINE, PREDICTED_TIMELINE = "timeline-measured.json", "timeline-predicted.json"
TIMELINE_PNG = "timeline.png"
TIMELINE_CHOICE = (
    "the first recorded generation of the matrix's first pipelined-deferred configuration (else of "
    "its first speculative one)"
)


def _timeline_files(folder: Path, drawn: Config | None) -> dict:
    """The timelines written for `drawn` and, where both are there (of one configuration), timeline.png
    drawing them and the verify's turnaround in each (validate/turnaround.py)."""
    files = [name for name in (MEASURED_TIMELINE, PREDICTED_TIMELINE) if (folder / name).exists()]
    turnaround = []
    if len(files) == 2:
        measured, predicted = read_timeline(folder / MEASURED_TIMELINE), read_timeline(folder / PREDICTED_TIMELINE)
        if configuration_name(measured[1]) == configuration_name(predicted[1]) == drawn.name:
            report.timeline_png(measured, predicted, folder / TIMELINE_PNG)
            files.append(TIMELINE_PNG)
            turnaround = turnaround_rows(measured[0], predicted[0])
    return {"configuration": drawn.name if drawn else None, "files": files, "turnaround": turnaround}


def configuration_name(timeline_meta: dict) -> str | None:
    """The name of the configuration a timeline shows (its otherData's), if it says."""
    configuration = timeline_meta.get("configuration")
    return configuration.get("name") if isinstance(configuration, dict) else None


def run_from_runs(args) -> Path:
    """--from-runs: the simulator and the closed form over configurations recorded earlier."""
    if not args.profile or not args.out:
        raise UsageError("--from-runs needs --profile (the profile to predict with) and --out")
    source = Path(args.from_runs) / "traces"
    summaries = sorted(source.glob("*.summary.json"))
    if not summaries:
        raise UsageError(f"--from-runs: no recorded runs (*.summary.json) in {source}")
    recorded = _median_runs([path for path in summaries if not path.name.startswith("calibration-")])
    calibration = []
    for path in summaries:
        if path.name.startswith("calibration-"):
            config, probes, lines, summary = _recorded(path)
            stem, repeat = split_stem(path.name.removesuffix(".summary.json"))
            group = stem.removeprefix("calibration-").removesuffix(f"-{config.name}")
            trace = path.with_name(path.name.replace(".summary.json", ".trace.jsonl"))
            order = (repeat, CALIBRATION_SCHEDULES.index(config.schedule))
            calibration.append((order, group, (config, probes, lines, summary, trace)))
    calibration_records = {}
    # each instance's generations in the order they ran (run after run: baseline, then deferred), so that
    # pooled sums add up as in the run
    for _, group, record in sorted(calibration, key=lambda item: item[0]):
        calibration_records.setdefault(group, []).append(record)
    first = recorded[0][3]["config"]
    placement, graphs = first["placement"], first["graphs"]
    profile = check_profile(args.profile, placement, graphs)
    check_profile_trees(args.profile, tuple(dict.fromkeys(r[0].tree for r in recorded)), graphs, None)
    out = Path(args.out)
    check_out(out, args.force)
    measured_timeline = Path(args.from_runs) / MEASURED_TIMELINE  # the runs' own, when they drew one
    drawn = timeline_config([r[0] for r in recorded])
    if measured_timeline.is_file():
        name = configuration_name(read_timeline(measured_timeline)[1])
        drawn = next((r[0] for r in recorded if r[0].name == name), drawn)
    drafted = next((r[3]["config"] for r in recorded if r[0].K), first)
    control = drafted.get("acceptance_control")
    meta = {
        "weights": first["weights"],
        "target": first["target"],
        "draft": drafted["draft"],
        "target_info": "as recorded",
        "draft_info": "as recorded",
        "placement": placement,
        "graphs": graphs,
        "acceptance": (
            f"acceptance control {' '.join(f'{k}={v}' for k, v in control.items())}"
            if control
            else "the draft's own proposals (no acceptance control)"
        ),
        "prompts": first["prompts"],
        "prompt_spec": f"runs recorded earlier, predicted again from {source}",
        "max_new_tokens": first["max_new_tokens"],
        "warmup": None,
        "repeats": max(split_stem(path.name.removesuffix(".summary.json"))[1] for path in summaries),
        "command": args.command,
    }
    with staged(out) as folder:
        shutil.copytree(source, folder / "traces")
        _name_by_configuration(folder / "traces", [p for p in summaries if not p.name.startswith("calibration-")])
        if measured_timeline.is_file():
            shutil.copyfile(measured_timeline, folder / MEASURED_TIMELINE)
        calibrations = calibrate(calibration_records, args.profile, placement, graphs)
        meta["calibrations"] = [c.describe() for c in calibrations.values()]
        results, notes = _predict_all(recorded, calibrations, args.profile, profile, placement, graphs, folder, drawn)
        meta.update(
            _profile_meta(profile, args, pair_names=(first["target"], drafted["draft"])),
            notes=notes,
            profile=args.profile,
            measured_here=False,
        )
        meta["timeline"] = _timeline_files(folder, drawn)
        report.write(folder, results, meta)
    _print_results(results, out, meta["timeline"]["files"])
    return out


def _name_by_configuration(traces: Path, summaries: list[Path]) -> None:
    """`python -m model --out` names a run by its schedule; the report names it by its configuration."""
    for path in summaries:
        stem = path.name.removesuffix(".summary.json")
        named = _report_stem(stem, _recorded(path)[0])
        if stem != named:
            for suffix in (".summary.json", ".trace.jsonl"):
                (traces / f"{stem}{suffix}").rename(traces / f"{named}{suffix}")


def _report_stem(stem: str, config: Config) -> str:
    """The stem a recorded run has in a report's traces/: its configuration's name, with its run's number."""
    return run_stem(config.name, split_stem(stem)[1])


def _median_runs(summaries: list[Path]) -> list[tuple]:
    """Each recorded configuration as measured: its median run (repeats.median_by_tok_s) as (config, probes,
    trace lines, summary, its stem in the report's traces/, the runs' range or None)."""
    by_config = {}
    for path in summaries:
        config, probes, lines, summary = _recorded(path)
        stem = _report_stem(path.name.removesuffix(".summary.json"), config)
        by_config.setdefault(config, []).append((config, probes, lines, summary, stem))
    return [_as_measured(runs) for runs in by_config.values()]


def _as_measured(runs: list[tuple]) -> tuple:
    """A configuration's runs (config, probes, trace lines, summary, stem) as its median run, with the runs'
    range appended (None for one run)."""
    median, runs_range = median_by_tok_s(runs, lambda run: run[3])
    return (*median, runs_range)


def _recorded(summary_path: Path) -> tuple:
    """(config, probes, trace lines, summary) of one recorded configuration, checked against the contract."""
    summary = read_summary(summary_path)
    config = summary["config"]
    lines = read_trace(summary_path.with_name(summary_path.name.replace(".summary.json", ".trace.jsonl")))
    config_of = Config(config["schedule"], config["head"], config["K"], config.get("tree") or "chain")
    return config_of, config["probes"], lines, summary


def calibrate(records: dict, profile_path, placement: str, graphs: bool) -> dict[str, Calibration]:
    """Each decoder instance's cost scales from the calibration generations pooled for it (none recorded:
    none)."""
    calibrations = {}
    gap_in_profile = bool(records) and profile_has_read_gap(profile_path, graphs)
    shared = {}
    if records and not graphs:  # no captured graph per instance to drift: the shared models' scales, once
        every = [r for group_records in records.values() for r in group_records]
        pooled_scales = scales_from(every, "dense", profile_path, placement, graphs)
        shared = {path: factor for path, factor in pooled_scales.items() if path in SHARED_MODEL_COSTS}
    for group, group_records in records.items():
        pool = pooled(records, group)
        head = "dense" if group == "baseline" else group.split("-", 1)[1]
        scales = {**scales_from(pool, head, profile_path, placement, graphs), **shared}
        prefill = draft_prefill_edit(pool, profile_path, placement, graphs)
        prompt = group_records[0][3]["per_prompt"][0]["prompt_id"]
        gap = read_gap_from(summary for *_, summary, _ in pool) if gap_in_profile else None
        if gap is not None:
            own_kind = [r for r in pool if host_kind(group_name(r[0])) == host_kind(group)]
            gap = fitted_read_gap(own_kind, scales, gap, profile_path, placement, graphs, prefill)
        calibrations[group] = Calibration(group, prompt, pool, scales, gap, prefill)
    return calibrations


def profile_has_read_gap(profile_path, graphs: bool) -> bool:
    """Whether the profile carries host.read_gap_ms (a calibration can only set a cost it has)."""
    profile = load_profile(str(profile_path))
    return profile.costs[REGIME_OF_GRAPHS_FLAG["on" if graphs else "off"]].read_gap is not None


def _predict_all(
    recorded,
    calibrations: dict,
    profile_path,
    profile,
    placement: str,
    graphs: bool,
    folder: Path,
    drawn: Config | None = None,
):
    """Simulator (calibrated where the run's decoder instance was, and from the profile alone) and closed
    form for every recorded configuration; (results, the simulator's notes). For `drawn`, also the
    simulator's timeline of its first generation, as predicted (timeline-predicted.json)."""
    regime = REGIME_OF_GRAPHS_FLAG["on" if graphs else "off"]
    if tensor_parallel_size(placement) is not None:  # the closed form prices the TP target as the simulator does
        profile = tensor_parallel.placed(profile, placement, regime, 1.0, (), [])
    costs = profile.costs[regime]
    results, notes = [], []
    for config, probes, lines, summary, stem, runs_range in recorded:
        trace = folder / "traces" / f"{stem}.trace.jsonl"
        profile_only, sim_notes = predict(profile_path, trace, lines, config, probes, placement, graphs)
        notes += [n for n in sim_notes if n not in notes]
        calibration = calibrations.get(group_name(config))
        predicted = profile_only
        if calibration is not None:
            predicted, _ = predict(profile_path, trace, lines, config, probes, placement, graphs, calibration.edits())
        if config == drawn:
            intervals, timeline = predict_timeline(
                profile_path,
                trace,
                config,
                probes,
                placement,
                graphs,
                calibration.edits() if calibration is not None else (),
            )
            timeline["chosen"] = TIMELINE_CHOICE
            timeline["prediction"] = (
                "the report's prediction of this configuration: the same profile"
                + (" and calibration" if calibration is not None else "")
                + ", replaying its own trace"
            )
            write_timeline(folder / PREDICTED_TIMELINE, intervals, timeline)
        sampled = any("sample" in line for line in lines)
        regime = REGIME_OF_GRAPHS_FLAG["on" if graphs else "off"]
        tree = parse_tree(config.tree) if config.tree != "chain" else None
        closed_costs = sampled_profile(profile, regime, [], drafts_sample(tree)).costs[regime] if sampled else costs
        closed = closed_form(closed_costs, config.schedule, config.head, config.K, probes, placement, lines, tree)
        rate = control_rate(summary["config"]) if tree is not None else None
        by_control = None
        if rate is not None:
            edits = calibration.edits() if calibration is not None else ()
            by_control = predict_by_control(profile_path, trace, config, probes, placement, graphs, edits, rate)
        results.append(
            report.Result(
                config,
                probes,
                summary,
                predicted,
                closed,
                phase_rows(summary, predicted, lines),
                str(trace.relative_to(folder)),
                profile_only if calibration is not None else None,
                sum(line["accepted"] for line in lines) / len(lines),
                by_control,
                runs_range,
            )
        )
    return results, notes


def _decode_all(
    args,
    pair,
    work,
    configs,
    base,
    graphs,
    reference_len,
    folder: Path,
    first_K: int,
    drawn: Config | None = None,
    rows: int = 0,
    repeats: int = 1,
    curves: dict | None = None,
):
    """Every configuration over every prompt, each decoder instance calibrated first; writes every trace
    and summary, and the timeline of `drawn`'s first recorded generation (timeline-measured.json);
    returns (recorded runs, calibration records by decoder instance, the recorded generations whose tokens
    are not the target's greedy reference: "configuration prompt"). Every decoder runs at `rows` rows
    at least (its fixed width on a GPU). The target's references are computed once per attention
    choice (a tree decoder's target attends path-ordered, a chain's may split the keys). `curves`: the
    acceptance control of each (K, head) where it is not `base` (validate/acceptance_curves.py).
    `repeats`: runs of each configuration (validate/repeats.py); each run of an instance's calibration and
    of every configuration on it comes before the next, a recorded configuration is its median run, and
    the calibration pools its runs."""
    recorded, calibrations, refs_by_attention, inexact = [], {}, {}, []
    calibration_prompt, calibration_ids = calibration_workload(args, pair, work)
    calibration_work = Workload([calibration_prompt], [calibration_ids])
    per_group = len(work.prompts) + args.warmup
    groups = len({(c.K, c.head, c.tree) for c in configs})
    needs_references = base is not None or args.sampling.greedy  # control binds to them; greedy is checked
    reference_sets = len({c.tree == "chain" for c in configs}) if needs_references else 0
    total = (len(configs) * per_group + groups * len(CALIBRATION_SCHEDULES)) * repeats
    total += reference_sets * (len(work.prompts) + 1)
    with Progress(total, "validate", "gen") as progress:
        for (K, head_kind, tree), group in itertools.groupby(configs, key=lambda c: (c.K, c.head, c.tree)):
            group = list(group)
            head = pair.head(head_kind, args.probes)
            curve = (curves or {}).get((K, head_kind))
            control = pair.acceptance_control(curve) if curve else base
            dec = pair.decoder(
                head, K or first_K, graphs, control, sampling=args.sampling, tree=parse_tree(tree), min_rows=rows
            )
            if needs_references and dec.split_kv not in refs_by_attention:
                progress.note("target references")
                refs = references(dec, work, reference_len)
                refs[calibration_prompt.id] = dec.reference(calibration_ids, reference_len)
                refs_by_attention[dec.split_kv] = refs
                progress.update(len(work.prompts) + 1)
            refs = refs_by_attention.get(dec.split_kv)
            name = group_name(group[0])
            calibrations[name] = []
            probes = head.probes if head_kind == "flashhead" else None
            write_run = partial(_run_and_write, args, pair, dec, control, refs, probes=probes, folder=folder)
            runs_of = {config: [] for config in group}
            for repeat in range(1, repeats + 1):
                for schedule in CALIBRATION_SCHEDULES:
                    config = (
                        Config("baseline", "dense", 0)
                        if schedule == "baseline"
                        else Config(schedule, head_kind, K or first_K, tree)
                    )
                    stem = run_stem(trace_name(name, config), repeat)
                    _, config_probes, lines, summary, trace = write_run(calibration_work, config, stem=stem, warmup=1)
                    calibrations[name].append((config, config_probes, lines, summary, trace))
                    progress.update()
                for config in group:
                    draws = config == drawn and repeat == 1
                    stem = run_stem(config.name, repeat)
                    runs, config_probes, lines, summary, _ = write_run(
                        work, config, stem=stem, warmup=args.warmup, progress=progress, drawn=draws
                    )
                    if refs is not None and args.sampling.greedy:
                        inexact += [f"{stem} {pid}" for pid, g in runs if g.tokens != refs[pid][: len(g.tokens)]]
                    if draws:
                        prompt_id, generation = runs[0]
                        write_timeline(
                            folder / MEASURED_TIMELINE,
                            generation.timeline,
                            timeline_meta(
                                generation,
                                summary["config"],
                                prompt_id,
                                dec.target_device.type == "cuda",
                                TIMELINE_CHOICE,
                            ),
                        )
                    runs_of[config].append((config, config_probes, lines, summary, stem))
            recorded += [_as_measured(runs) for runs in runs_of.values()]
            del dec, head, control
            free_memory()
    return recorded, calibrations, inexact


def _run_and_write(
    args,
    pair,
    dec,
    control,
    refs,
    work,
    config,
    *,
    probes,
    folder: Path,
    stem: str,
    warmup: int,
    progress=None,
    drawn=False,
):
    """One configuration decoded over `work` after `warmup` generations and written as
    traces/<stem>.trace.jsonl and .summary.json; (runs, probes, trace lines, summary, trace path).
    `drawn`: its first recorded generation also records its timeline."""
    config_probes = probes if config.head == "flashhead" else None
    runs = decode(
        dec,
        work,
        config.schedule,
        args.max_new_tokens,
        control,
        refs,
        warmup,
        progress=progress,
        label=config.name,
        timeline=drawn,
    )
    run_config = run_config_dict(
        pair, work.prompts, config, config_probes, dec.graphs, args.max_new_tokens, control, args.sampling
    )
    lines, summary = records(runs, config, config_probes, run_config)
    trace = folder / "traces" / f"{stem}.trace.jsonl"
    write_trace(trace, lines)
    write_summary(folder / "traces" / f"{stem}.summary.json", summary)
    return runs, config_probes, lines, summary, trace


def calibration_workload(args, pair, work, category: str | None = None):
    """The calibration prompt: the first Spec-Bench question that is not a validation prompt and has at
    least as many tokens as the validation prompts' mean, cut to that length. Its contexts then lie at
    the runs' mean context, so a cost whose profile slope in context is off is scaled where it errs as
    much one way as the other over the runs (at the shorter of two prompts, the longer one's rounds were
    0.2-0.25 ms slower than predicted, session 16). With `category`: a question of that category (any,
    if it has no other), as long as the category's prompts' mean."""
    chosen = {p.id for p in work.prompts}
    mine = [x for p, x in zip(work.prompts, work.ids) if category is None or p.category == category]
    lengths = [len(x) for x in mine or work.ids]
    mean = round(sum(lengths) / len(lengths))
    questions = [q for q in select_prompts("first:100000", args.prompts_file) if q.id not in chosen]
    if category is not None and any(q.category == category for q in questions):
        questions = [q for q in questions if q.category == category]
    longest = None  # if no question is as long as the mean
    for prompt in questions:
        ids = pair.target.tokenizer.encode(prompt.text)
        if len(ids) >= mean:
            return prompt, ids[:mean]
        if longest is None or len(ids) > len(longest[1]):
            longest = (prompt, ids)
    return longest


def _meta(args, pair, graphs: bool, control, prompts) -> dict:
    def info(m):
        return ", ".join(f"{k} {v}" for k, v in m.info.items() if k in ("dtype", "quantization", "kernel") and v)

    return {
        "weights": pair.weights,
        "target": args.target,
        "draft": args.draft,
        "target_info": info(pair.target),
        "draft_info": info(pair.draft),
        "placement": pair.placement,
        "graphs": graphs,
        "acceptance": (
            f"acceptance control {control.spec} (seed {control.seed})"
            if control is not None
            else "the draft's own proposals (no acceptance control)"
        ),
        "prompts": [p.id for p in prompts],
        "prompt_spec": args.prompts,
        "max_new_tokens": args.max_new_tokens,
        "warmup": args.warmup,
        "command": args.command,
    }


def _profile_meta(profile, args, pair_names) -> dict:
    raw = profile.raw
    setup = raw["setup"]
    warnings = []
    names = (setup.get("target", {}).get("name"), setup.get("draft", {}).get("name"))
    if names != tuple(pair_names):
        warnings.append(
            f"The profile was measured for target {names[0]} + draft {names[1]}; this run used "
            f"{pair_names[0]} + {pair_names[1]}."
        )
    return {
        "profile_setup": setup,
        "gpus": raw.get("env", {}).get("gpus", ["unknown"]),
        "profile_created": raw.get("created", "?"),
        "profile_origin": (
            "measured for this report by python -m measure, right after the real runs, same models and placement"
            if args.measure
            else "given with --profile"
        ),
        "warnings": warnings,
    }
