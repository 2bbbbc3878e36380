"""python -m validate --drafter ... --policy ...: drafters, and the policies that choose among them each
round, run for real per Spec-Bench category and predicted by the simulator.

Per category (the chosen prompts grouped by their category), on the deferred schedule: the baseline,
every fixed arm (drafter, K) and every online policy decode the category's prompts, each configuration
with its own policy learning from nothing (warm-up generations first, then forgotten). The output is the
target's greedy output under every one (checked), so every drafter's match runs are recorded once per
prompt (model/drafter_runs.py) and written into every configuration's trace. The simulator then replays,
per category, every fixed arm, every policy and the oracle on those runs with the profile's costs, once
from the profile alone and once calibrated: per category, a prompt of that category that is no
validation prompt is decoded in baseline and with each drafter fixed at the largest K, and each cost is
scaled by measured / predicted time of its phase (target forwards; each drafter's body, head or lookup;
validate/calibration.py's method, per drafter), and the read gap is fitted to the pace of their rounds
after the first, up to the last read (`_steady_gap`). Unlike the default validation's, the fit leaves
out each generation's first round and its final append: one prompt's generation per drafter has about 15
reads, and a fit to its total spread those one-off costs over them (0.37 ms a read where 0.09 was
measured, session 15), which every validation round then paid. The calibration is the category's own
because what the fit absorbs depends on the workload: on the committed runs of session 15, a verify
after a prompt lookup took 0.2-0.45 ms more than the profile's at contexts near 3,000 and nothing more
near 240, so one long calibration prompt charged math's short rounds 0.2-0.5 ms each that they never
paid (its prompt lookup predicted 4-5% slow). No configuration that is predicted enters its own
calibration. Every configuration runs `--repeats` times per category, each run of every configuration
before the next and each calibration run just before the same decoder's run of the category, so that
both see the host alike; a configuration is measured as its median run (`median_run`), and the
calibration pools its runs. Online policies are predicted as the median of `noise_seeds` replays, each
with its own seed of timing noise on the round times the policy observes, drawn from how the calibration
rounds varied between the calibration's runs (`_timing_noise`): ucb1's choice of its next arm turns on a
few percent of a round. The report gives per configuration measured and predicted tok/s
and the error, and per category the order of the policies, measured and predicted, against the best
fixed arm and the oracle (measured: per generation the fastest fixed arm's time).
"""

from __future__ import annotations

import itertools
import json
import math
import shutil
import statistics
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from contracts import HEADS, UsageError
from contracts.cli import parse_choices
from contracts.files import staged, write_atomic
from contracts.names import POLICIES, REGIME_OF_GRAPHS_FLAG
from contracts.policies import Arm, arms, make_policy, parse_drafters
from contracts.progress import Progress
from contracts.trace import read_summary, read_trace, write_summary, write_trace
from model.drafter_runs import drafter_runs
from model.drafting import Drafting
from model.early_exit import early_exit
from model.lookup_control import LookupControl, parse_rates
from model.pair import resolve_placement
from model.trace import summarize, trace_lines
from sim.scenario import Scenario
from sim.scenario import run as simulate

from .calibration import described, draft_prefill_edit, read_gap_from, round_ms
from .pipeline import calibration_workload, profile_has_read_gap
from .plan import (
    Config,
    check_acceptance,
    check_generation_lengths,
    check_out,
    check_profile,
    choose_prompts,
    graphs_on,
    parse_ks,
    report_folder,
)
from .predict import predict
from .repeats import checked_repeats, median_by_tok_s, run_stem
from .runs import Workload, control_for, decode, free_memory, load_pair, references, run_config_dict

SCHEDULE = "deferred"
ONLINE = tuple(p for p in POLICIES if p != "fixed")
# Replays of each online policy under seeded timing noise (odd: the median is one replay). A bandit that
# rewards tokens per millisecond picks its next arm on a few percent of a round's time, so one replay of
# recorded acceptance predicts one of the runs the decoder could have made. On session 15's one-H200 run
# ucb1's median moved by up to 2% from 15 replays to 51, and by under 0.5% from 51 to 101 (8 s in all).
NOISE_SEEDS = 51
MAX_NOISE_SEEDS = 1001
# Runs of each configuration per category, interleaved (`median_run`): the measurement is the median run.
REPEATS = 3
# profile cost -> the phases whose measured / predicted time scales it, per drafter that pays it
DRAFTER_COSTS = {
    "draft-model": {"draft.body_ms": ("draft_body",)},
    "early-exit": {"draft.early_exit_body_ms": ("draft_body",), "draft.early_exit_head_ms": ("draft_head",)},
    "prompt-lookup": {"draft.lookup_ms": ("draft_body",)},
}
HEAD_COSTS = {"dense": "draft.head_dense_ms", "flashhead": "draft.head_flashhead_ms"}


@dataclass(frozen=True)
class Setting:
    """One configuration: the baseline, a fixed arm, or an online policy over every arm."""

    policy: str  # baseline, fixed, or one of ONLINE
    arm: Arm | None = None  # fixed: the arm played

    @property
    def name(self) -> str:
        if self.policy == "baseline":
            return "baseline"
        return f"fixed-{self.arm.drafter}-K{self.arm.K}" if self.policy == "fixed" else self.policy

    @property
    def label(self) -> str:
        return self.arm.label() if self.policy == "fixed" else self.policy


@dataclass
class Measured:
    """A configuration's generations in one category: one run, or (`median_run`) the median of its runs."""

    summary: dict
    exact: bool
    generation_ms: list  # decode ms per prompt
    pulls: dict = field(default_factory=dict)  # arm label -> rounds played
    runs_range: tuple | None = None  # (slowest, fastest) decode tok/s of the runs, where there were several


def median_run(runs: list[Measured]) -> Measured:
    """The run of median decode tok/s (an odd count), exact only if every run is, with each prompt's median
    time and the runs' range. A configuration run several times, interleaved with the others, is measured
    so: a host's slow spell or a bandit's unlucky arm moves one run, not the median (on one H200 in
    session 16 one fixed arm's rounds paid 0.3 ms more host time for a whole run, 6% of its tok/s)."""
    middle, runs_range = median_by_tok_s(runs, lambda m: m.summary)
    if runs_range is None:
        return middle
    return Measured(
        middle.summary,
        all(m.exact for m in runs),
        [statistics.median(times) for times in zip(*(m.generation_ms for m in runs))],
        middle.pulls,
        runs_range,
    )


def parse_policies(text: str) -> tuple[str, ...]:
    """Online policies joined by '+', or all (every fixed arm is always run)."""
    if text.strip() == "all":
        return ONLINE
    chosen = tuple(dict.fromkeys(p.strip() for p in text.split("+") if p.strip()))
    bad = [p for p in chosen if p not in POLICIES]
    if bad or not chosen:
        raise UsageError(f"--policy: {bad[0] if bad else text!r} is unknown; valid: {', '.join(POLICIES)}, or all")
    return tuple(p for p in chosen if p != "fixed")


def noise_seeds(args) -> int:
    """--noise-seeds, checked: 0 or an odd count up to MAX_NOISE_SEEDS (default NOISE_SEEDS)."""
    seeds = NOISE_SEEDS if args.noise_seeds is None else args.noise_seeds
    if seeds != 0 and not (seeds % 2 and 1 <= seeds <= MAX_NOISE_SEEDS):
        raise UsageError(
            f"--noise-seeds must be 0 (one replay without noise) or odd from 1 to {MAX_NOISE_SEEDS} "
            f"(the median is one replay), got {seeds}"
        )
    return seeds


def plan(args) -> dict:
    """Every input checked before a model loads (UsageError)."""
    drafters = parse_drafters(args.drafter or "draft-model+prompt-lookup", "--drafter")
    policies = parse_policies(args.policy or "all")
    Ks = parse_ks(args.K)
    heads = parse_choices(args.heads, HEADS, "head")
    if args.schedules not in ("all", SCHEDULE):
        raise UsageError(f"--drafter/--policy validate the {SCHEDULE} schedule only (drop --schedules)")
    if "early-exit" in drafters and (args.early_exit_layers is None or args.early_exit_layers < 1):
        raise UsageError("--drafter early-exit needs --early-exit-layers L (L >= 1, the target's first L layers)")
    if args.lookup_ngram < 1:
        raise UsageError(f"--lookup-ngram must be >= 1, got {args.lookup_ngram}")
    if args.lookup_acceptance is not None:
        if "prompt-lookup" not in drafters:
            raise UsageError("--lookup-acceptance controls prompt lookup: add it to --drafter")
        parse_rates(args.lookup_acceptance, args.prompts_file)
    check_generation_lengths(args.max_new_tokens, args.warmup)
    seeds, count = noise_seeds(args), checked_repeats(args.repeats, REPEATS)
    if args.measure or not args.profile:
        raise UsageError(
            "--drafter/--policy need --profile PATH with the drafters' costs (python -m measure "
            "--early-exit-layers L times them); --measure is not available here"
        )
    placement, target_device, _ = resolve_placement(args.placement)
    graphs = graphs_on(args.graphs, target_device)
    profile = check_profile(args.profile, placement, graphs)
    regime = REGIME_OF_GRAPHS_FLAG["on" if graphs else "off"]
    profile.costs[regime].check_drafters(drafters)
    check_acceptance(args.acceptance)
    prompts = choose_prompts(args.prompts, args.prompts_file, args.n_prompts)
    K = max(Ks)
    first = Arm(drafters[0], K)
    choices = (first, *(a for a in arms(drafters, Ks) if a != first))
    settings = [Setting("baseline")] + [Setting("fixed", a) for a in choices] + [Setting(p) for p in policies]
    out = report_folder(args.out, "policies", placement, target_device, args.force)
    return dict(
        drafters=drafters,
        policies=policies,
        Ks=Ks,
        K=K,
        head=heads[0],
        choices=choices,
        settings=settings,
        placement=placement,
        graphs=graphs,
        prompts=prompts,
        out=out,
        noise_seeds=seeds,
        repeats=count,
    )


def run(args) -> Path:
    p = plan(args)
    validation = _Validation(args, p)
    with staged(p["out"]) as folder, Progress(validation.generations(), "validate policies", "gen") as progress:
        measured, calibration_runs = validation.measure(folder, progress)
        results, calibrations = _predicted(measured, calibration_runs, folder, p, args.profile)
        meta = validation.meta(calibrations)
        write_atomic(folder / "report.md", _report(results, meta, p))
        write_atomic(folder / "results.json", json.dumps({"meta": meta, "categories": results}, indent=2) + "\n")
        write_atomic(folder / "results.csv", _csv(results))
    print(_table(results))
    print(_headline(results))
    print(f"wrote {p['out']}/report.md, results.json, results.csv, traces/")
    return p["out"]


class _Validation:
    """One drafter/policy validation's models and prompts: the pair, its head, the early-exit body and the
    acceptance controls, the prompts grouped by category with each category's calibration prompt, and the
    target's greedy output of every prompt (each configuration's output is checked against it, and every
    drafter's match runs are read from it)."""

    def __init__(self, args, p: dict):
        self.args, self.p = args, p
        K = p["K"]
        reference_len = args.max_new_tokens + 2 * K + 2
        self.pair, self.work = load_pair(
            args.target,
            args.draft,
            p["placement"],
            args.dtype,
            args.seed,
            p["prompts"],
            reference_len,
            K,
            args.clustering,
        )
        self.control = control_for(self.pair, args.acceptance)
        if args.lookup_acceptance is not None and self.pair.weights != "synthetic":
            raise UsageError("--lookup-acceptance is for synthetic weights only (real ones propose their own tokens)")
        target = self.pair.target.model
        self.early = None
        if args.early_exit_layers is not None:
            self.early = early_exit(target, args.early_exit_layers)
            self.early.setup_cache(target.max_seq_len, target.head_weight.device)
        self.lookup_control = None
        if args.lookup_acceptance:
            self.lookup_control = LookupControl(
                args.lookup_acceptance,
                target.config.vocab_size,
                self.pair.room,
                target.head_weight.device,
                args.seed,
                args.prompts_file,
            )
        self.head = self.pair.head(p["head"], args.probes)
        self.probes = self.head.probes if p["head"] == "flashhead" else None
        self.categories: dict[str, list[int]] = {}
        for index, prompt in enumerate(self.work.prompts):
            self.categories.setdefault(prompt.category, []).append(index)
        self.calibration_prompts = {
            category: calibration_workload(args, self.pair, self.work, category) for category in self.categories
        }
        self.everything = Workload(
            [*self.work.prompts, *(prompt for prompt, _ in self.calibration_prompts.values())],
            [*self.work.ids, *(ids for _, ids in self.calibration_prompts.values())],
        )
        self.refs = references(
            self.pair.decoder(self.head, K, p["graphs"], self.control), self.everything, reference_len
        )
        self.calibration_settings = calibration_settings_of(p)
        self.controls = {}
        if self.control is not None:
            self.controls["draft-model"] = self.control
        if self.lookup_control is not None:
            self.controls["prompt-lookup"] = self.lookup_control

    def generations(self) -> int:
        """The generations `measure` decodes, for its progress line."""
        p, categories = self.p, len(self.categories)
        total = len(p["settings"]) * (len(self.work.prompts) + self.args.warmup * categories) * p["repeats"]
        return total + 2 * (len(p["drafters"]) + 1) * categories * p["repeats"]

    def measure(self, folder: Path, progress) -> tuple[dict, dict]:
        """(each configuration measured per category, each category's calibration runs), every run's trace
        and summary written under `folder`/traces. Per category and run, every configuration in turn; the
        calibration's (the baseline and every drafter fixed at the largest K) each decode the category's
        calibration prompt just before, so a calibration run sees the host as the runs it calibrates do."""
        decoders = {setting: self._decoder(setting) for setting in self.p["settings"]}
        measured, calibration_runs = {}, {}
        for offset, (category, indices) in enumerate(self.categories.items()):
            measured[category] = self._category(category, indices, offset, decoders, folder, progress)
            calibration_runs[category] = _calibration_runs(
                calibration_traces(folder, category), self.calibration_settings
            )
        decoders.clear()
        free_memory()
        return measured, calibration_runs

    def meta(self, calibrations: dict) -> dict:
        """results.json's meta: what ran, on what, and each category's calibration."""
        args, p, categories = self.args, self.p, self.categories
        acceptance = "the drafters' own proposals (no acceptance control)"
        if self.control is not None:
            acceptance = f"draft model under acceptance control {self.control.spec} (seed {self.control.seed})"
        if self.lookup_control is not None:
            acceptance += f"; prompt lookup under acceptance control {self.lookup_control.spec} per category"
        return {
            **_calibration_meta(calibrations),
            "weights": self.pair.weights,
            "target": args.target,
            "draft": args.draft,
            "early_exit_layers": args.early_exit_layers,
            "placement": p["placement"],
            "graphs": p["graphs"],
            "acceptance": acceptance,
            "prompts": {category: [p["prompts"][i].id for i in indices] for category, indices in categories.items()},
            "prompt_count": len(p["prompts"]),
            "per_category": ", ".join(f"{c}: {len(i)}" for c, i in categories.items()),
            "max_new_tokens": args.max_new_tokens,
            "warmup": args.warmup,
            "repeats": p["repeats"],
            "profile": args.profile,
            "calibration_prompt": {category: prompt.id for category, (prompt, _) in self.calibration_prompts.items()},
            "command": args.command,
        }

    def _decoder(self, setting: Setting):
        p = self.p
        if setting.policy == "baseline":
            return self.pair.decoder(self.head, p["K"], p["graphs"], self.control)
        choices = (setting.arm,) if setting.policy == "fixed" else p["choices"]
        policy = make_policy(setting.policy, choices, self.args.seed)
        drafting = Drafting(policy, self.early, self.args.lookup_ngram, self.lookup_control)
        return self.pair.decoder(self.head, p["K"], p["graphs"], self.control, drafting=drafting)

    def _category(self, category: str, indices: list, offset: int, decoders: dict, folder: Path, progress) -> dict:
        """Every configuration of `category` measured as its median run (`median_run`); its calibration runs
        recorded beside."""
        p, args = self.p, self.args
        runner = next(d for s, d in decoders.items() if s.policy != "baseline")
        chunk = Workload([self.work.prompts[i] for i in indices], [self.work.ids[i] for i in indices])
        prompt, ids = self.calibration_prompts[category]
        calibration_work, calibration_index = Workload([prompt], [ids]), [len(self.work.prompts) + offset]
        runs = {setting: [] for setting in p["settings"]}
        for repeat in range(1, p["repeats"] + 1):  # each run of every configuration before the next
            for setting in p["settings"]:
                dec = decoders[setting]
                progress.note(f"{category} {setting.name} run {repeat}")
                if setting in self.calibration_settings:
                    generations = _decode(dec, calibration_work, setting, args, self.control, self.refs, args.warmup)
                    if setting.policy == "baseline" and repeat == 1:
                        calibration_match_runs = self._match_runs(runner, calibration_index, generations)
                    where = folder / "traces" / "calibration" / category
                    self._record(setting, dec, generations, [prompt], calibration_match_runs, where, repeat)
                    progress.update(2)
                generations = _decode(dec, chunk, setting, args, self.control, self.refs, args.warmup, progress)
                if setting.policy == "baseline" and repeat == 1:
                    match_runs = self._match_runs(runner, indices, generations)
                where = folder / "traces" / category
                runs[setting].append(self._record(setting, dec, generations, chunk.prompts, match_runs, where, repeat))
        return {setting: median_run(each) for setting, each in runs.items()}

    def _match_runs(self, runner, indices, generations) -> dict:
        """Every drafter's match runs of each prompt, from the baseline's (= target greedy) tokens."""
        out = {}
        for i, (pid, g) in zip(indices, generations):
            prompt, ids = self.everything.prompts[i], self.everything.ids[i]
            if self.control is not None:
                self.control.bind(self.refs[prompt.id], len(ids), prompt.id)
            if self.lookup_control is not None:
                self.lookup_control.bind(self.refs[prompt.id], len(ids), prompt)
            out[pid] = drafter_runs(runner, self.p["drafters"], ids, g.tokens, self.controls)
        return out

    def _record(self, setting, dec, runs, prompts, match_runs, where: Path, repeat: int) -> Measured:
        """Trace and summary of one configuration's generations of `prompts` by its decoder `dec` (written to
        `where`); `repeat`: which of its runs (`run_stem`)."""
        p = self.p
        K_field = 0 if setting.policy == "baseline" else (setting.arm.K if setting.arm else p["K"])
        lines = [
            line
            for pid, g in runs
            for line in trace_lines(
                g,
                prompt_id=pid,
                schedule=SCHEDULE if setting.policy != "baseline" else "baseline",
                head=p["head"] if K_field else "dense",
                K=K_field,
                probes=self.probes if K_field else None,
                runs=match_runs[pid] if K_field else None,
            )
        ]
        config = run_config_dict(
            self.pair,
            prompts,
            _sim_config(setting, p["K"]),
            self.probes,
            p["graphs"],
            self.args.max_new_tokens,
            self.control,
        )
        if setting.policy != "baseline":
            config.update(policy=setting.policy, arms=[a.label() for a in dec.drafting.policy.arms])
            config.update(lookup_ngram=self.args.lookup_ngram, early_exit_layers=self.args.early_exit_layers)
            if self.lookup_control is not None:
                config["lookup_acceptance_control"] = self.lookup_control.describe()
        summary = summarize(config, runs)
        where.mkdir(parents=True, exist_ok=True)
        write_trace(where / f"{run_stem(setting.name, repeat)}.trace.jsonl", lines)
        write_summary(where / f"{run_stem(setting.name, repeat)}.summary.json", summary)
        exact = all(g.tokens == self.refs[pid][: len(g.tokens)] for pid, g in runs)
        pulls = Counter(f"{r.drafter}:K{r.proposed}" for _, g in runs for r in g.rounds if r.drafter)
        return Measured(summary, exact, [g.decode_ms for _, g in runs], dict(pulls))


def _predicted(measured: dict, calibration_runs: dict, folder: Path, p: dict, profile_path) -> tuple[dict, dict]:
    """(results per category, calibration per category): every category's configurations predicted from
    the profile alone and calibrated on the category's own calibration generations (`calibration_runs`),
    against their measurements (`folder`/traces holds every trace)."""
    results, calibrations = {}, {}
    for category, runs in measured.items():
        calibration = calibrations[category] = _calibrate(calibration_runs[category], p, profile_path)
        trace = folder / "traces" / category / f"{Setting('fixed', p['choices'][0]).name}.trace.jsonl"
        noise = calibration["timing_noise"]
        alone = _predict(trace, p, profile_path, (), (), noise)
        calibrated = _predict(trace, p, profile_path, calibration["speculative"], calibration["baseline"], noise)
        results[category] = _compare(runs, alone, calibrated, p)
    return results, calibrations


def calibration_settings_of(p: dict) -> list[Setting]:
    """What a category's calibration decodes: the baseline and every drafter fixed at the largest K."""
    return [Setting("baseline")] + [Setting("fixed", Arm(d, p["K"])) for d in p["drafters"]]


def calibration_traces(folder: Path, category: str) -> Path:
    """Where `category`'s calibration traces are: its own folder, or (a run recorded before session 16,
    with one calibration prompt for every category) the calibration folder itself."""
    own = folder / "traces" / "calibration" / category
    return own if own.is_dir() else own.parent


def recorded_in(folder) -> bool:
    """Whether `folder` holds a drafter/policy validation's runs (its calibration has a folder of its own)."""
    return (Path(folder) / "traces" / "calibration").is_dir()


def run_from_runs(args) -> Path:
    """--from-runs DIR of a policies report: its recorded runs predicted again with --profile into --out
    (no model runs; exactness as DIR's results.json recorded it, which needs the target's references)."""
    source = Path(args.from_runs)
    if not args.profile or not args.out:
        raise UsageError("--from-runs needs --profile (the profile to predict with) and --out")
    if not (source / "results.json").is_file():
        raise UsageError(f"--from-runs: {source} has no results.json of a drafter/policy validation")
    seeds = noise_seeds(args)
    recorded = json.loads((source / "results.json").read_text())
    categories = recorded["meta"]["prompts"]
    config = _policy_config(source / "traces" / next(iter(categories)))
    choices = tuple(Arm(label.split(":K")[0], int(label.split(":K")[1])) for label in config["arms"])
    drafters = tuple(dict.fromkeys(a.drafter for a in choices))
    policies = tuple(x for x in ONLINE if (source / "traces" / next(iter(categories)) / f"{x}.summary.json").is_file())
    settings = [Setting("baseline")] + [Setting("fixed", a) for a in choices] + [Setting(x) for x in policies]
    placement, graphs = config["placement"], config["graphs"]
    profile = check_profile(args.profile, placement, graphs)
    profile.costs[REGIME_OF_GRAPHS_FLAG["on" if graphs else "off"]].check_drafters(drafters)
    p = dict(
        drafters=drafters,
        policies=policies,
        Ks=tuple(sorted({a.K for a in choices})),
        K=max(a.K for a in choices),
        head=config["head"],
        choices=choices,
        settings=settings,
        placement=placement,
        graphs=graphs,
        noise_seeds=seeds,
        repeats=recorded["meta"].get("repeats", 1),
    )
    check_out(Path(args.out), args.force)
    exact = {(c, r["label"]): r["exact"] for c, result in recorded["categories"].items() for r in result["rows"]}
    with staged(Path(args.out)) as folder:
        shutil.copytree(source / "traces", folder / "traces")
        calibration_settings = calibration_settings_of(p)
        calibration_runs = {
            c: _calibration_runs(calibration_traces(folder, c), calibration_settings) for c in categories
        }
        measured = {
            c: {s: _recorded(folder / "traces" / c, s, exact[(c, s.label)]) for s in settings} for c in categories
        }
        results, calibrations = _predicted(measured, calibration_runs, folder, p, args.profile)
        meta = dict(recorded["meta"])
        if not isinstance(meta["calibration_prompt"], dict):  # one calibration prompt served every category
            meta["calibration_prompt"] = dict.fromkeys(categories, meta["calibration_prompt"])
        meta.update(
            _calibration_meta(calibrations),
            command=f"{meta['command']}` (measured); predicted again from its runs by `{args.command}",
            profile=args.profile,
        )
        write_atomic(folder / "report.md", _report(results, meta, p))
        write_atomic(folder / "results.json", json.dumps({"meta": meta, "categories": results}, indent=2) + "\n")
        write_atomic(folder / "results.csv", _csv(results))
    print(_table(results))
    print(_headline(results))
    print(f"wrote {args.out}/report.md, results.json, results.csv, traces/")
    return Path(args.out)


def _policy_config(folder: Path) -> dict:
    """The config of an online policy's run in a category's traces (it names every arm, the first first)."""
    for path in sorted(folder.glob("*.summary.json")):
        config = read_summary(path)["config"]
        if config.get("policy") in ONLINE:
            return config
    raise UsageError(f"--from-runs: no online policy's run in {folder}")


def recorded_runs(folder: Path, setting: Setting) -> list[tuple[Path, dict]]:
    """A configuration's recorded runs in `folder`, in order: (its trace, its summary)."""
    runs = []
    for repeat in itertools.count(1):
        stem = run_stem(setting.name, repeat)
        if not (folder / f"{stem}.summary.json").is_file():
            return runs
        runs.append((folder / f"{stem}.trace.jsonl", read_summary(folder / f"{stem}.summary.json")))


def _recorded(folder: Path, setting: Setting, exact: bool) -> Measured:
    """A configuration's recorded runs in one category, as measured (`median_run`)."""
    runs = []
    for trace, summary in recorded_runs(folder, setting):
        pulls = Counter(f"{line['drafter']}:K{line['proposed']}" for line in read_trace(trace) if line.get("drafter"))
        runs.append(Measured(summary, exact, [g["decode_ms"] for g in summary["per_prompt"]], dict(pulls)))
    return median_run(runs)


def _decode(dec, work, setting, args, control, refs, warmup, progress=None):
    """The configuration's generations (`decode` binds the controls and makes the policy forget the warm-up)."""
    schedule = SCHEDULE if setting.policy != "baseline" else "baseline"
    return decode(dec, work, schedule, args.max_new_tokens, control, refs, warmup, progress=progress)


def _sim_config(setting: Setting, K: int) -> Config:
    """The validation matrix's Config of a setting (what the summary's config and the baseline's prediction name)."""
    if setting.policy == "baseline":
        return Config("baseline", "dense", 0)
    return Config(SCHEDULE, "dense", setting.arm.K if setting.arm else K)


def _scenario(trace: Path, p: dict, profile_path, edits, policies, drafters, K, noise=((), 0)) -> Scenario:
    return Scenario(
        profile=str(profile_path),
        acceptance=f"trace:{trace}",
        schedules=(SCHEDULE,),
        heads=(p["head"],),
        K=K,
        placement=p["placement"],
        graphs="on" if p["graphs"] else "off",
        edits=tuple(edits),
        policies=policies,
        drafters=drafters,
        arms_K=tuple(p["Ks"]),
        noise=noise,
    )


def _predict(trace: Path, p: dict, profile_path, edits, baseline_edits, noise: tuple) -> dict[str, dict]:
    """The simulator's rows by configuration label ('baseline', arm labels, policies, 'oracle'). With
    p['noise_seeds'] and `noise` (`_timing_noise`), each online policy's row is the
    median of that many replays, each with its own seed of noise on the round times it observes, and
    carries their range ('noise_range')."""
    rows, _ = simulate(
        _scenario(trace, p, profile_path, edits, ("arms", *p["policies"], "oracle"), p["drafters"], p["K"]),
        ceiling=False,
        rounds=False,
    )
    out = {(r["arm"] if r["policy"] == "fixed" else r["policy"]): r for r in rows[1:]}
    if p["noise_seeds"] and noise and p["policies"]:
        replays = [
            simulate(
                _scenario(trace, p, profile_path, edits, p["policies"], p["drafters"], p["K"], (noise, seed)),
                ceiling=False,
                rounds=False,
            )[0][1:]
            for seed in range(p["noise_seeds"])
        ]
        for policy in p["policies"]:
            runs = sorted((row for replay in replays for row in replay if row["policy"] == policy), key=_tok_s)
            low, high = runs[0]["decode_tok_s"], runs[-1]["decode_tok_s"]  # none where the time goes unobserved
            out[policy] = {**runs[len(runs) // 2], "noise_range": (low, high) if low < high else None}
    base, _ = simulate(
        _scenario(trace, p, profile_path, baseline_edits, ("fixed",), p["drafters"][:1], p["K"]),
        ceiling=False,
        rounds=False,
    )
    out["baseline"] = base[0]
    return out


def _tok_s(row: dict) -> float:
    return row["decode_tok_s"]


def _calibration_runs(traces: Path, settings: list) -> list[tuple[Setting, Path, dict]]:
    """Every recorded run of the calibration `settings` in `traces`: (setting, its trace, its summary)."""
    return [(setting, *run) for setting in settings for run in recorded_runs(traces, setting)]


def _calibrate(runs: list, p: dict, profile_path) -> dict:
    """Cost scales from the calibration runs ((setting, trace, summary), every run pooled), the read gap
    fitted to their rounds' steady pace (`_steady_gap`) and the spread of their rounds' times;
    {'speculative': edits, 'baseline': edits, 'scales': ..., 'read_gap_ms': ..., 'timing_noise': ...}.
    Pooled because a host's slow spell moves one run: on one H200 in session 16 a calibration run's
    reads took a third of the time of some validation runs' (0.03 against 0.1 ms)."""
    measured, predicted = Counter(), Counter()
    per_drafter = {}
    for setting, trace, summary in runs:
        row = _one(trace, setting, p, profile_path, ())
        phases = summary.get("phases_ms") or {}
        for phase in ("verify", "finalize"):
            measured["target"] += phases.get(phase, 0.0)
            predicted["target"] += row["phase_ms"].get(phase, 0.0)
        if setting.arm is not None:
            pooled_phases, pooled_row = per_drafter.setdefault(setting.arm.drafter, (Counter(), Counter()))
            pooled_phases.update(phases)
            pooled_row.update(row["phase_ms"])
    scales = {"target.forward_ms": measured["target"] / predicted["target"]} if predicted["target"] else {}
    for drafter, (phases, row_phases) in per_drafter.items():
        costs = dict(DRAFTER_COSTS[drafter])
        if drafter == "draft-model":
            costs[HEAD_COSTS[p["head"]]] = ("draft_head",)
        for path, names in costs.items():
            m, q = sum(phases.get(n, 0.0) for n in names), sum(row_phases.get(n, 0.0) for n in names)
            if m > 0 and q > 0:
                scales[path] = m / q
    drafted = [  # the draft model's arms: the only drafter with a prefill of its own
        (_sim_config(s, p["K"]), None, read_trace(trace), summary, trace)
        for s, trace, summary in runs
        if s.arm is not None and s.arm.drafter == "draft-model"
    ]
    prefill = draft_prefill_edit(drafted, profile_path, p["placement"], p["graphs"])
    edits = tuple((path, "*=", factor) for path, factor in sorted(scales.items())) + prefill
    gaps = {"baseline": None, "speculative": None}
    for kind in gaps if profile_has_read_gap(profile_path, p["graphs"]) else ():  # it can only set a cost it has
        chosen = [run for run in runs if (run[0].policy == "baseline") == (kind == "baseline")]
        gaps[kind] = _steady_gap(chosen, p, profile_path, edits)
    speculative = edits + ((("host.read_gap_ms", "=", gaps["speculative"]),) if gaps["speculative"] else ())
    return {
        "scales": scales,
        "prefill": prefill,
        "read_gap_ms": gaps,
        "timing_noise": _timing_noise([run for run in runs if run[0].arm is not None], p, profile_path, speculative),
        "speculative": speculative,
        "baseline": edits + ((("host.read_gap_ms", "=", gaps["baseline"]),) if gaps["baseline"] else ()),
    }


def _steady_rounds(runs: list, p: dict, profile_path, edits):
    """Per generation of `runs` ((setting, trace, summary)), simulated with `edits`: its traced rounds
    after the first, and the simulated times at which its rounds' reads ended (the first round's too)."""
    for setting, trace, _ in runs:
        simulated = _one(trace, setting, p, profile_path, edits, rounds=True)
        lines, rounds = read_trace(trace), simulated["rounds_detail"]
        for prompt_id in dict.fromkeys(line["prompt_id"] for line in lines):
            mine = [line for line in lines if line["prompt_id"] == prompt_id]
            yield mine[1:], [r["end_ms"] for r in rounds if r["prompt_id"] == prompt_id]


def _timing_noise(runs: list, p: dict, profile_path, edits) -> tuple[float, ...]:
    """The log ratios each replay of an online policy draws the noise on its observed round times from:
    how the calibration's rounds varied between its runs (`_round_jitter`), or, where each ran once, how
    their measured times differ from the simulated ones (`_round_residuals`)."""
    return _round_jitter(runs) or _round_residuals(runs, p, profile_path, edits)


def _round_jitter(runs: list) -> tuple[float, ...]:
    """Each calibration round's log time less the mean of the same round's over the calibration's runs
    (scaled by sqrt(n / (n - 1)) so that their spread is one run's), after a generation's first round;
    empty where no round ran twice. A fixed arm's runs replay the same rounds, so what differs between
    them is noise alone, where `_round_residuals` also counts what the simulator misprices for a kind of
    round in every run alike (docs/design.md, "Drafters and policies")."""
    times = {}
    for setting, trace, _ in runs:
        firsts = set()
        for line in read_trace(trace):
            if line["prompt_id"] in firsts:
                times.setdefault((setting.name, line["prompt_id"], line["round"]), []).append(round_ms(line))
            firsts.add(line["prompt_id"])
    jitter = []
    for same_round in times.values():
        if len(same_round) > 1 and min(same_round) > 0:
            logs = [math.log(ms) for ms in same_round]
            mean, scale = statistics.fmean(logs), math.sqrt(len(logs) / (len(logs) - 1))
            jitter += [(x - mean) * scale for x in logs]
    return tuple(jitter)


def _round_residuals(runs: list, p: dict, profile_path, edits) -> tuple[float, ...]:
    """The log ratios of each calibration round's measured time to its simulated time (after a
    generation's first round), centered on their median: what each replay of an online policy draws
    the noise on its observed round times from. Drawn, not fitted: real rounds have heavy tails. On
    one H200 (session 16) the ratios' standard deviation was 0.8-2.5% where a robust spread of
    consecutive rounds gave 0.2-0.5%, single rounds were off by up to 12%, and ucb1's three real runs
    of one category spread over 11% where replays with the robust sigma all made one run."""
    ratios = [
        math.log(round_ms(line) / (end - start))
        for lines, ends in _steady_rounds(runs, p, profile_path, edits)
        for line, start, end in zip(lines, ends, ends[1:])
        if end > start and round_ms(line) > 0
    ]
    center = statistics.median(ratios) if ratios else 0.0
    return tuple(r - center for r in ratios)


def _steady_gap(runs: list, p: dict, profile_path, edits) -> float | None:
    """The read gap at which the rounds of `runs` ((setting, trace, summary)) after their first, up to
    their last read, take their measured time in total (None: no gaps recorded). A generation's first
    round carries its prefill's tail and its end the standalone append: paid once, they stay out of
    what every read is charged."""
    gap = read_gap_from(summary for *_, summary in runs)
    if gap is None:
        return None
    measured = predicted = 0.0
    reads = 0
    for lines, ends in _steady_rounds(runs, p, profile_path, edits + (("host.read_gap_ms", "=", gap),)):
        measured += sum(round_ms(line) for line in lines)
        predicted += ends[-1] - ends[0]
        reads += len(lines)
    return max(0.0, gap + (measured - predicted) / reads) if reads else gap


def _one(trace: Path, setting: Setting, p: dict, profile_path, edits, rounds: bool = False) -> dict:
    """The simulator's row for one calibration generation (the baseline, or one drafter fixed); with
    `rounds`, a drafter's row keeps its rounds_detail."""
    if setting.policy == "baseline":
        config = _sim_config(setting, p["K"])
        return predict(profile_path, trace, read_trace(trace), config, None, p["placement"], p["graphs"], edits)[0]
    drafters = (setting.arm.drafter,)
    rows, _ = simulate(
        _scenario(trace, p, profile_path, edits, ("fixed",), drafters, setting.arm.K), ceiling=False, rounds=rounds
    )
    return rows[1]


def _compare(measured: dict, alone: dict, calibrated: dict, p: dict) -> dict:
    """Per configuration measured against predicted, and the category's orders and comparisons."""
    rows = []
    for setting, m in measured.items():
        label = setting.label
        tok_s = m.summary["decode_tok_s"]
        predicted = calibrated[label]["decode_tok_s"]
        rows.append(
            {
                "configuration": setting.name,
                "label": label,
                "measured_tok_s": tok_s,
                "predicted_tok_s": predicted,
                "error": (predicted - tok_s) / tok_s,
                "profile_only_tok_s": alone[label]["decode_tok_s"],
                "profile_only_error": (alone[label]["decode_tok_s"] - tok_s) / tok_s,
                "exact": m.exact,
                "acceptance": m.summary.get("acceptance"),
                "measured_rounds": sum(m.pulls.values()),
                "predicted_rounds": calibrated[label]["rounds"],
                "measured_pulls": m.pulls,
                "predicted_pulls": calibrated[label].get("pulls", {}) if setting.policy not in ("baseline",) else {},
                "predicted_range": calibrated[label].get("noise_range"),
                "measured_range": m.runs_range,
            }
        )
    fixed = [(s, m) for s, m in measured.items() if s.policy == "fixed"]
    tokens = fixed[0][1].summary["decode_tokens"]
    oracle_ms = sum(min(m.generation_ms[i] for _, m in fixed) for i in range(len(fixed[0][1].generation_ms)))
    by_label = {r["label"]: r for r in rows}
    best_fixed_measured = max(fixed, key=lambda sm: sm[1].summary["decode_tok_s"])[0].label
    best_fixed_predicted = max((s.label for s, _ in fixed), key=lambda label: calibrated[label]["decode_tok_s"])
    policies = [s.label for s in measured if s.policy in ONLINE]
    measured_order = sorted(policies, key=lambda x: -by_label[x]["measured_tok_s"])
    predicted_order = sorted(policies, key=lambda x: -by_label[x]["predicted_tok_s"])
    everything = [r["label"] for r in rows if r["label"] != "baseline"]
    return {
        "rows": rows,
        "best_fixed": {"measured": best_fixed_measured, "predicted": best_fixed_predicted},
        "oracle_tok_s": {"measured": 1000.0 * tokens / oracle_ms, "predicted": calibrated["oracle"]["decode_tok_s"]},
        "policy_order": {
            "measured": measured_order,
            "predicted": predicted_order,
            "same": measured_order == predicted_order,
        },
        "kendall_tau": _kendall(
            [by_label[x]["measured_tok_s"] for x in everything], [by_label[x]["predicted_tok_s"] for x in everything]
        ),
    }


def _kendall(a: list[float], b: list[float]) -> float | None:
    """Kendall's tau between two rankings of the same items (None for fewer than two)."""
    pairs = [(i, j) for i in range(len(a)) for j in range(i + 1, len(a))]
    if not pairs:
        return None
    score = sum((a[i] > a[j]) == (b[i] > b[j]) for i, j in pairs)
    return (2 * score - len(pairs)) / len(pairs)


def errors(results: dict, key: str = "error") -> tuple[float, float]:
    values = [abs(r[key]) for c in results.values() for r in c["rows"]]
    return statistics.median(values), max(values)


def _headline(results: dict) -> str:
    median, most = errors(results)
    median_alone, most_alone = errors(results, "profile_only_error")
    same = sum(c["policy_order"]["same"] for c in results.values())
    exact = all(r["exact"] for c in results.values() for r in c["rows"])
    return (
        f"simulator |error|: median {100 * median:.1f}%, max {100 * most:.1f}% "
        f"(profile only: {100 * median_alone:.1f}% / {100 * most_alone:.1f}%); "
        f"policy order matches in {same} of {len(results)} categories; "
        + (f"{_inside(results)}; " if _inside(results) else "")
        + f"every output {'equals' if exact else 'does NOT equal'} target greedy"
    )


def _table(results: dict) -> str:
    lines = []
    header = ("category", "configuration", "measured tok/s", "predicted", "error %", "profile only %", "exact")
    lines.append(header)
    for category, c in results.items():
        for r in c["rows"]:
            lines.append(
                (
                    category,
                    r["label"],
                    f"{r['measured_tok_s']:.2f}",
                    f"{r['predicted_tok_s']:.2f}",
                    f"{100 * r['error']:+.1f}",
                    f"{100 * r['profile_only_error']:+.1f}",
                    "yes" if r["exact"] else "NO",
                )
            )
    widths = [max(len(row[i]) for row in lines) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in lines)


def _markdown_rows(header: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(out)


def _report(results: dict, meta: dict, p: dict) -> str:
    median, most = errors(results)
    median_alone, most_alone = errors(results, "profile_only_error")
    parts = [
        f"# Drafters and policies per category: measured against the simulator ({meta['weights'].upper()} weights)",
        "",
        f"- Command: `{meta['command']}`",
        f"- Target {meta['target']}, draft {meta['draft']}; placement {meta['placement']}; graphs {meta['graphs']}.",
        f"- Drafters: {', '.join(p['drafters'])}; arms K: {', '.join(map(str, p['Ks']))}; "
        f"policies: {', '.join(p['policies'])}; schedule {SCHEDULE}; draft-model head {p['head']}.",
        f"- Prompts: {meta['prompt_count']} ({meta['per_category']}), {meta['max_new_tokens']} tokens each, "
        f"{meta['warmup']} warm-up generation(s) per configuration and category.",
        f"- Measured: {_measured_as(meta.get('repeats', 1))}.",
        f"- Acceptance: {meta['acceptance']}.",
        f"- Profile: {meta['profile']}.",
        "- Calibration per category, on the prompt named (the baseline and each drafter at the largest K):",
        *(
            f"  - {category} (prompt {meta['calibration_prompt'][category]}): {text}; "
            f"{_spread(meta['timing_noise'][category])}."
            for category, text in meta["calibration"].items()
        ),
        f"- Online policies: {_replays(p['noise_seeds'], meta['timing_noise'])}.",
        "",
        f"**Simulator |error| over {sum(len(c['rows']) for c in results.values())} configurations: "
        f"median {100 * median:.1f}%, max {100 * most:.1f}%** (profile alone: {100 * median_alone:.1f}% / "
        f"{100 * most_alone:.1f}%). Goal: median <= 1.5%, max <= 4%. "
        f"Policy order matches in {sum(c['policy_order']['same'] for c in results.values())} of {len(results)} "
        f"categories.{' ' + _inside(results).capitalize() + '.' if _inside(results) else ''}",
        "",
    ]
    for category, c in results.items():
        parts += [f"## {category}", ""]
        rows = [
            [
                r["label"],
                f"{r['measured_tok_s']:.2f}",
                f"{r['measured_range'][0]:.2f}-{r['measured_range'][1]:.2f}" if r.get("measured_range") else "",
                f"{r['predicted_tok_s']:.2f}",
                f"{r['predicted_range'][0]:.2f}-{r['predicted_range'][1]:.2f}" if r["predicted_range"] else "",
                f"{100 * r['error']:+.1f}%",
                f"{r['profile_only_tok_s']:.2f} ({100 * r['profile_only_error']:+.1f}%)",
                "-" if r["acceptance"] is None else f"{r['acceptance']:.3f}",
                "yes" if r["exact"] else "NO",
                ", ".join(f"{k} {v}" for k, v in sorted(r["measured_pulls"].items())) if r["label"] in ONLINE else "",
                ", ".join(f"{k} {v}" for k, v in sorted(r["predicted_pulls"].items())) if r["label"] in ONLINE else "",
            ]
            for r in c["rows"]
        ]
        parts.append(
            _markdown_rows(
                [
                    "configuration",
                    "measured tok/s",
                    "runs' range",
                    "predicted",
                    "replays' range",
                    "error",
                    "profile only",
                    "acceptance",
                    "exact",
                    "arms played, measured (rounds)",
                    "predicted",
                ],
                rows,
            )
        )
        by_label = {r["label"]: r for r in c["rows"]}
        best_m, best_p = c["best_fixed"]["measured"], c["best_fixed"]["predicted"]
        parts += [
            "",
            f"- Best fixed arm: measured {best_m} ({by_label[best_m]['measured_tok_s']:.2f} tok/s), "
            f"predicted {best_p} ({by_label[best_p]['predicted_tok_s']:.2f}).",
            f"- Oracle (per generation the fastest fixed arm): measured {c['oracle_tok_s']['measured']:.2f} tok/s, "
            f"predicted {c['oracle_tok_s']['predicted']:.2f}.",
            f"- Policies, fastest first: measured {' > '.join(c['policy_order']['measured'])}; predicted "
            f"{' > '.join(c['policy_order']['predicted'])} "
            f"({'same order' if c['policy_order']['same'] else 'order differs'}).",
            "- Each policy against the best fixed arm (measured / predicted): "
            + "; ".join(
                f"{x} {100 * (by_label[x]['measured_tok_s'] / by_label[best_m]['measured_tok_s'] - 1):+.1f}% / "
                f"{100 * (by_label[x]['predicted_tok_s'] / by_label[best_p]['predicted_tok_s'] - 1):+.1f}%"
                for x in c["policy_order"]["measured"]
            )
            + ".",
            f"- Kendall tau of all configurations' order, measured against predicted: {_number(c['kendall_tau'])}.",
            "",
        ]
    return "\n".join(parts)


def _measured_as(count: int) -> str:
    """How the report's measurements were taken."""
    if count == 1:
        return "one run of each configuration per category"
    return (
        f"the median of {count} runs of each configuration per category, each run of every configuration "
        "before the next (`runs' range` gives the slowest and the fastest)"
    )


def _replays(seeds: int, noise: dict) -> str:
    """How the report's online policies were predicted (`noise`: `_noise_meta` per category)."""
    if not seeds or not any(n["rounds"] for n in noise.values()):
        return "one replay each, without timing noise"
    return (
        f"each the median of {seeds} replays; each replay multiplies every round time the policy observes "
        "by a ratio drawn at random, from its own seed, from how a calibration round of its category varied "
        "between the calibration's runs (with one run, its measured to simulated time); `replays' range` "
        "gives the slowest and the fastest"
    )


def _noise_meta(residuals: tuple) -> dict:
    """The calibration rounds' log ratios (`_timing_noise`) in brief, for results.json and the report."""
    if not residuals:
        return {"rounds": 0, "sd": 0.0, "largest": 0.0}
    return {"rounds": len(residuals), "sd": statistics.pstdev(residuals), "largest": max(map(abs, residuals))}


def _spread(noise: dict) -> str:
    return (
        f"timing noise of {noise['rounds']} rounds: log ratio sd {100 * noise['sd']:.2f}%, "
        f"largest {100 * noise['largest']:.1f}%"
    )


def _inside(results: dict) -> str:
    """How many online policies were measured inside their replays' range ('' without replays)."""
    ranged = [r for c in results.values() for r in c["rows"] if r.get("predicted_range")]
    inside = sum(low <= r["measured_tok_s"] <= high for r in ranged for low, high in [r["predicted_range"]])
    return f"online policies measured inside their replays' range: {inside} of {len(ranged)}" if ranged else ""


def _csv(results: dict) -> str:
    header = "category,configuration,measured_tok_s,predicted_tok_s,error,profile_only_tok_s,profile_only_error,exact\n"
    return header + "".join(
        f"{category},{r['label']},{r['measured_tok_s']:.4f},{r['predicted_tok_s']:.4f},{r['error']:.5f},"
        f"{r['profile_only_tok_s']:.4f},{r['profile_only_error']:.5f},{r['exact']}\n"
        for category, c in results.items()
        for r in c["rows"]
    )


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _calibration_meta(calibrations: dict) -> dict:
    """The calibration of each category, for results.json's meta and the report."""

    def text(calibration: dict) -> str:
        scales = ", ".join(f"{path} x{factor:.4f}" for path, factor in sorted(calibration["scales"].items()))
        scales += "".join(f", {described(edit)}" for edit in calibration["prefill"])
        gaps = ", ".join(f"{kind} read gap {_number(gap)} ms" for kind, gap in calibration["read_gap_ms"].items())
        return f"{scales}; {gaps}"

    def each(read) -> dict:
        return {category: read(calibration) for category, calibration in calibrations.items()}

    return {
        "calibration": each(text),
        "calibration_scales": each(lambda c: c["scales"]),
        "calibration_draft_prefill": each(lambda c: [f"{path}{op}{value:g}" for path, op, value in c["prefill"]]),
        "calibration_read_gap_ms": each(lambda c: c["read_gap_ms"]),
        "timing_noise": each(lambda c: _noise_meta(c["timing_noise"])),
    }
