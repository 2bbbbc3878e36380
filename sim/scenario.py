"""A scenario (profile, acceptance, schedules, heads, K, probes, edits) and its what-if changes.

A what-if is `key=value` or, for numeric profile fields, `key*=factor`. Named keys change the
question asked; any other key is a dotted path into the profile (the regime's costs first), e.g.
`draft.body_ms*=0.5` or `host.item_ms=0`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from pathlib import Path

from contracts import HEADS, PLACEMENTS, SCHEDULES, UsageError
from contracts.acceptance import is_control, parse_control
from contracts.heads import parse_head, parse_heads
from contracts.names import (
    POLICY_SCHEDULES,
    REGIME_OF_GRAPHS_FLAG,
    SIMULATED_POLICIES,
    SPECULATIVE_SCHEDULES,
    tensor_parallel_size,
)
from contracts.policies import parse_drafters
from contracts.progress import Progress
from contracts.trace import MAX_CONTEXT
from contracts.trees import MAX_K, parse_tree

from . import heads as head_specs
from . import tensor_parallel
from .acceptance import (
    AgreementScaled,
    ControlledAcceptance,
    EmpiricalLengths,
    Generation,
    IIDAcceptance,
    PerPositionAcceptance,
    TraceReplay,
)
from .profile import DATA, Profile, check_path, load_profile
from .sampled_trees import drafts_sample
from .sampling_costs import sampled_profile
from .schedules import Config
from .simulate import simulate
from .trace import rounds_by_prompt
from .trees import tree_setup

DEFAULT_TRACE = DATA / "study_trace.jsonl"
NAMED_KEYS = (
    "probes",
    "K",
    "schedule",
    "head",
    "placement",
    "acceptance",
    "graphs",
    "prompts",
    "max_new_tokens",
    "prompt_len",
    "seed",
    "temperature",
    "policy",
    "drafter",
    "arms_K",
    "tree",
    "allreduce",
)
DEFAULT_ARMS_K = (1, 2, 4, 6, 8)  # the K values of a policy's arms below the scenario's K (the largest)


@dataclass(frozen=True)
class Scenario:
    profile: str = "default"
    graphs: str | None = None  # on | off; None: the profile's default regime
    schedules: tuple = SPECULATIVE_SCHEDULES  # the baseline always runs, for speedups
    heads: tuple = HEADS
    K: int | None = None  # None: the trace's K, else 6
    probes: int | None = None  # None: the profile's default probes
    placement: str | None = None  # None: the profile's placement
    acceptance: str = "default"
    prompts: int | None = None
    max_new_tokens: int | None = None
    prompt_len: int | None = None
    seed: int = 0
    temperature: float = 0.0  # 0: greedy; > 0: speculative sampling, acceptance from the profile's beta
    edits: tuple = field(default_factory=tuple)
    policies: tuple = ("fixed",)  # contracts.policies; `all` adds every fixed arm and the oracle
    drafters: tuple = ("draft-model",)  # the arms' drafters, the first one first
    arms_K: tuple = DEFAULT_ARMS_K
    tree: str | None = None  # contracts.trees spec; None: chains, with the acceptance source given
    all_reduce_scale: float = 1.0  # a tensor-parallel target's all-reduce costs, scaled (what-if allreduce=xF)
    noise: tuple = ((), 0)  # (log ratios, seed) of the round times policies observe (SimulatedRun.observed)
    inputs: tuple = ()  # (key, the option or what-if that set it) per change, so that errors name what was given

    def describe(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "inputs"}

    def input_of(self, key: str) -> str:
        """The option or what-if that set `key` last, or `default KEY` where none did."""
        return next((label for k, label in reversed(self.inputs) if k == key), f"default {key}")


# Documented limits of what one simulation is asked (README, `python -m sim --help`): beyond them a run
# takes minutes with no answer, or describes no decoder that exists. reports/limits/ measures the time and
# memory of the largest accepted inputs (python -m sim.limits).
LIMITS = {
    "K": MAX_K,
    "probes": 1 << 20,
    "prompts": 10_000,
    "max_new_tokens": 32_768,
    "prompt_len": MAX_CONTEXT,
    "seed": 2**32 - 1,
    "temperature": 100,
}
MAX_DECODE_TOKENS = 200_000  # prompts x new tokens of one configuration
# Model operations (draft steps and target forwards) one command may simulate, counted at their most: a
# speculative round of K draft steps and a verify for every decode token, each once more for the ceiling.
MAX_RUN_OPERATIONS = 2_000_000
NUMBER_LIMIT = 1e6  # what-if values and scale factors of profile fields


def _int(label: str, key: str, value: str, low: int) -> int:
    try:
        number = int(value)
    except ValueError:
        raise UsageError(f"{label}: expected an integer, got {value!r}") from None
    if not low <= number <= LIMITS[key]:
        raise UsageError(f"{label}: must be in {low}..{LIMITS[key]:,}, got {number}")
    return number


def items(label: str, value: str, separators: str = "+,") -> list[str]:
    """A list joined by any of `separators`; an empty item is a typo, refused rather than dropped."""
    pieces = [piece.strip() for piece in re.split(f"[{re.escape(separators)}]", value)]
    if "" in pieces:
        raise UsageError(f"{label}: empty item in {value!r}")
    return pieces


def _choices(label: str, value: str, valid, every: tuple | None = None) -> tuple:
    """Names joined by '+' or ',', each one of `valid`; where `every` is given, `all` stands for it."""
    if every is not None and value.strip() == "all":
        return every
    chosen = tuple(items(label, value))
    bad = [v for v in chosen if v not in valid]
    if bad:
        raise UsageError(f"{label}: {bad[0]!r} is unknown; valid: {', '.join(valid)}{', or all' if every else ''}")
    return chosen


def with_change(s: Scenario, key: str, op: str, value: str, label: str | None = None) -> Scenario:
    """The scenario with one change applied (`op` is '=' or '*='); `label` names the input in errors
    (an option such as `--K`, or by default `--what-if KEY`)."""
    label = label or f"--what-if {key}"
    changed = _changed(s, key, op, value, label)
    return replace(changed, inputs=changed.inputs + ((key, label),))


def _changed(s: Scenario, key: str, op: str, value: str, label: str) -> Scenario:
    if key in NAMED_KEYS and op != "=":
        raise UsageError(f"{label}: use {key}=value ('*=' scales numeric profile fields only)")
    if key in ("probes", "K", "prompts", "max_new_tokens", "prompt_len", "seed"):
        low = {"max_new_tokens": 2, "seed": 0}.get(key, 1)
        changed = replace(s, **{key: _int(label, key, value, low)})
        given = changed.prompts and changed.max_new_tokens  # with a default in place, resolve() checks
        if given and changed.prompts * changed.max_new_tokens > MAX_DECODE_TOKENS:
            raise UsageError(
                f"{label}: {changed.prompts} generations x {changed.max_new_tokens} tokens "
                f"is over the {MAX_DECODE_TOKENS:,} decode tokens one configuration may simulate"
            )
        return changed
    if key == "temperature":
        try:
            temperature = float(value)
        except ValueError:
            temperature = float("nan")
        if not 0 <= temperature <= LIMITS["temperature"]:
            raise UsageError(f"{label}: expected a number in 0..{LIMITS['temperature']} (0 is greedy), got {value!r}")
        return replace(s, temperature=temperature)
    if key == "tree":
        return replace(s, tree=parse_tree(value, label).label)
    if key == "policy":  # `all`: every fixed arm, every online policy and the oracle
        return replace(s, policies=_choices(label, value, SIMULATED_POLICIES, every=("arms", *SIMULATED_POLICIES[1:])))
    if key == "drafter":
        return replace(s, drafters=parse_drafters(value, label))
    if key == "arms_K":
        return replace(s, arms_K=tuple(sorted({_int(label, "K", v, 1) for v in items(label, value)})))
    if key == "schedule":
        chosen = _choices(label, value, SCHEDULES, every=SPECULATIVE_SCHEDULES)
        return replace(s, schedules=tuple(v for v in chosen if v != "baseline"))
    if key == "head":
        return replace(s, heads=tuple(spec.label for spec in parse_heads(value, label)))
    if key == "placement":
        return replace(s, placement=value if tensor_parallel_size(value) else _choices(label, value, PLACEMENTS)[0])
    if key == "allreduce":
        return replace(s, all_reduce_scale=tensor_parallel.scale(label, value, NUMBER_LIMIT))
    if key == "graphs":
        return replace(s, graphs=_choices(label, value, tuple(REGIME_OF_GRAPHS_FLAG))[0])
    if key == "acceptance":
        parse_acceptance(value, label)  # fail early on a malformed value
        return replace(s, acceptance=value)
    profile = load_profile(s.profile)
    check_path(profile.raw, key, _regime(s, profile), NAMED_KEYS)  # an unknown key before its value
    try:
        number = float(value)
    except ValueError:
        raise UsageError(f"{label}{op}{value}: expected a number") from None
    if not 0 <= number <= NUMBER_LIMIT:
        raise UsageError(f"{label}{op}{value}: must be a number in 0..{NUMBER_LIMIT:g}")
    return replace(s, edits=s.edits + ((key, op, number),))


def parse_change(text: str, option: str) -> tuple[str, str, str]:
    """`key=value` or `key*=factor` of a what-if or sweep; `option` names it in errors."""
    match = re.fullmatch(r"\s*([^=*\s]+)\s*(\*=|=)\s*(.+?)\s*", text)
    if not match:
        raise UsageError(f"{option} {text!r}: expected key=value or key*=factor")
    return match.group(1), match.group(2), match.group(3)


def parse_acceptance(spec: str, label: str = "acceptance"):
    """`default`, `trace:PATH` (or a .jsonl path), `0.43`, `0.8,0.6,0.5`, `lengths:0=0.3,1=0.2,...`, or an
    acceptance control (contracts.acceptance: `a=0.43`, whose tree rule the simulator follows too,
    `a=0.8,0.6`; a `curve:` gives its base rates, which `resolve` scales per head)."""
    if is_control(spec):
        control = parse_control(spec)
        if control.pattern:
            raise UsageError(f"{label} {spec!r}: a pattern is a decoder test control; give a=RATE or a=R1,R2,...")
        if control.curve or control.per_position:
            return rates_source(control.rates)
        return ControlledAcceptance(control.rates[0])
    if spec == "default":
        return _trace_source(DEFAULT_TRACE)
    if spec.startswith("trace:") or spec.endswith(".jsonl"):
        path = spec.removeprefix("trace:").strip()
        if not path:
            raise UsageError(f"{label} {spec!r}: no trace path given; valid: trace:PATH")
        return _trace_source(Path(path))
    if spec.startswith("lengths:"):
        weights = {}
        for item in spec.removeprefix("lengths:").split(","):
            length, _, weight = item.partition("=")
            try:
                weights[int(length)] = float(weight)
            except ValueError:
                raise UsageError(f"{label} {spec!r}: expected lengths:L=weight,...") from None
        return EmpiricalLengths(weights)
    return rates_source(spec.split(","))


def rates_source(rates) -> IIDAcceptance | PerPositionAcceptance:
    """One rate: i.i.d.; several: per draft position."""
    return PerPositionAcceptance(list(rates)) if len(rates) > 1 else IIDAcceptance(rates[0])


def _trace_source(path: Path) -> TraceReplay:
    rounds, meta = rounds_by_prompt(path)
    return TraceReplay(rounds, meta.get("head") or "dense", meta.get("probes"))


@dataclass
class Resolved:
    """Everything a run needs, and notes saying which models applied."""

    profile: Profile
    regime: str
    sources: dict  # head -> acceptance source for that head
    generations: list
    configs: list
    notes: list
    warnings: list = field(default_factory=list)  # costs asked outside the profile's measured grid


def _regime(s: Scenario, profile: Profile) -> str:
    """The cost regime the scenario asks (--graphs), else the profile's default; bad input if it lacks it."""
    regime = REGIME_OF_GRAPHS_FLAG[s.graphs] if s.graphs else profile.default_regime
    if regime not in profile.costs:
        raise UsageError(f"graphs={s.graphs}: the profile carries only {', '.join(profile.costs)} costs")
    return regime


def resolve(s: Scenario) -> Resolved:
    base = load_profile(s.profile)
    regime = _regime(s, base)
    profile = base.edited(list(s.edits), regime) if s.edits else base
    notes = [f"profile: {profile.label()} [{profile.source}], regime: {regime}"]
    notes += [
        f"warning: the what-if {path}{op}{value:g} makes it free: predictions that use it describe no real machine"
        for path, op, value in s.edits
        if value == 0 and not path.startswith("host.")
    ]
    if "study-derived" in profile.label():
        notes.append("profile derived from the study's published tables (see its notes)")
    if "synthetic" in profile.label():
        notes.append("profile measured with SYNTHETIC weights (real shapes, random values)")
    if profile.costs[regime].read_gap is None:
        notes.append(
            "host gap after each read: not measured in this profile; taken as round_bookkeeping_ms less "
            "the token copies it contains"
        )
    source = parse_acceptance(s.acceptance)
    probes = s.probes or profile.default_probes
    _check_probes(s, probes, profile.clusters)
    K = s.K or (source.recorded_K[0] if isinstance(source, TraceReplay) and len(source.recorded_K) == 1 else 6)
    placement = s.placement or profile.placement
    if tensor_parallel_size(placement) is not None:
        profile = tensor_parallel.placed(profile, placement, regime, s.all_reduce_scale, s.drafters, notes)
    elif s.all_reduce_scale != 1:
        raise UsageError("what-if allreduce scales a tensor-parallel target's all-reduces: it needs placement tpN")
    generations = _generations(s, source, profile)
    traced = isinstance(source, TraceReplay)
    given = f"{s.input_of('prompts')} x {s.input_of('max_new_tokens')}"
    _check_size(generations, K, f"trace {s.acceptance.removeprefix('trace:')}" if traced else given)
    notes.append(f"acceptance: {source.describe()}")
    for head in s.heads:
        profile.costs[regime].head_table.check(head, probes)
    if s.temperature > 0 and s.tree is None:  # a tree's acceptance under sampling: sim/sampled_trees.py
        if s.drafters != ("draft-model",):
            raise UsageError(
                f"temperature={s.temperature:g}: sampling is modeled for the draft-model drafter only "
                f"(its beta curves); drafters given: {'+'.join(s.drafters)}"
            )
        budgeted = [head for head in s.heads if head_specs.is_budgeted(head)]
        if budgeted:
            raise UsageError(
                f"temperature={s.temperature:g}: sampling is modeled for the heads dense and flashhead only (their "
                f"beta curves); head given: {budgeted[0]}"
            )
        sources = {head: _sampled(profile, s.temperature, head, probes, notes) for head in s.heads}
    elif is_control(s.acceptance) and parse_control(s.acceptance).curve:
        sources = {head: _curve_source(s.acceptance, head, probes, K, profile, notes) for head in s.heads}
    else:
        sources = {
            head: head_specs.head_source(source, head, probes, K, profile, notes)
            if head_specs.is_budgeted(head)
            else _for_head(source, head, probes, profile, notes)
            for head in s.heads
        }
    schedules, heads, tree = _schedules_for(s), s.heads, None
    if s.tree is not None:  # token trees: acceptance from top-k rates or the tree's own trace (sim/trees.py)
        tree, tree_source, schedules, heads, K = tree_setup(s, profile, profile.costs[regime], K, notes, source)
        sources = {head: tree_source for head in heads}
    configs = [Config("baseline", heads[0], K, probes, placement)]
    configs += [
        replace(config, schedule=sched, head=head, tree=tree)
        for sched in schedules
        for head in heads
        for config in _policy_configs(s, K, probes, placement)
    ]
    if isinstance(source, TraceReplay):
        source.check_drafters(s.drafters)
    elif s.drafters != ("draft-model",):
        notes.append("drafters: a synthetic acceptance source gives every drafter the same acceptance")
    profile.costs[regime].check_drafters(s.drafters)
    if s.temperature > 0 or (traced and source.sampled):
        profile = sampled_profile(profile, regime, notes, heads=drafts_sample(tree))
        for head in heads:  # each head as sampling pays it (sim/sampling_costs.py)
            profile.costs[regime].head_table.check(head, probes)
    return Resolved(profile, regime, sources, generations, configs, notes)


def _check_probes(s: Scenario, probes: int, clusters: int) -> None:
    """Probes beyond the clusters describe no FlashHead (its costs would be extrapolated): refused, whether
    the probes or a flashhead:P head asks them."""
    asked = [(s.input_of("probes"), "", probes)]
    for head in s.heads:
        spec = parse_head(head)
        if spec.kind == "flashhead":
            asked += [(s.input_of("head"), f"head {head!r}: ", budget) for budget in spec.budgets]
    for option, what, count in asked:
        if count > clusters:
            raise UsageError(
                f"{option}: {what}probes {count} exceeds the {clusters} FlashHead clusters (valid: 1..{clusters})"
            )


def _curve_source(spec: str, head: str, probes: int, K: int, profile, notes: list):
    """A curve's rates for one head (sim/heads.py: head_control), the numbers the decoder is controlled with."""
    control = head_specs.head_control(parse_control(spec), profile, head, probes, K)
    notes.append(f"{head}: acceptance control {control.label} ({spec} times its agreement per position)")
    return rates_source(control.rates)


def _schedules_for(s: Scenario) -> tuple:
    """The scenario's schedules; with a policy or a drafter other than a fixed draft model, the deferred
    ones only (they read each round's accepted count at its end)."""
    if s.policies == ("fixed",) and s.drafters == ("draft-model",):
        return s.schedules
    chosen = tuple(x for x in s.schedules if x in POLICY_SCHEDULES)
    if not chosen:
        raise UsageError(
            f"policies and drafters other than a fixed draft model run on {' and '.join(POLICY_SCHEDULES)} only "
            f"(asked: {', '.join(s.schedules)})"
        )
    return chosen


def _policy_configs(s: Scenario, K: int, probes: int, placement: str) -> list[Config]:
    """One configuration per policy; `arms` stands for every fixed arm, each its own configuration."""
    Ks = tuple(k for k in s.arms_K if k < K)  # K is the largest, as in the decoder (its buffers' size)
    base = Config("deferred", "dense", K, probes, placement, drafters=s.drafters, Ks=Ks)
    configs = []
    for policy in s.policies:
        if policy == "arms":
            configs += [replace(base, drafters=(a.drafter,), K=a.K, Ks=()) for a in base.arms()]
        else:
            configs.append(replace(base, policy=policy))
    return configs


def _check_size(generations: list[Generation], K: int, label: str) -> None:
    """The limits hold for what a trace asks too, not only for what the options say."""
    longest_prompt = max(g.prompt_len for g in generations)
    longest_generation = max(g.decode_tokens for g in generations) + 1  # the first token is not decoded
    tokens = sum(g.decode_tokens for g in generations)
    problem = None
    if LIMITS["K"] < K:
        problem = f"K={K} is over the limit of {LIMITS['K']}"
    elif len(generations) > LIMITS["prompts"]:
        problem = f"{len(generations):,} generations are over the limit of {LIMITS['prompts']:,}"
    elif longest_prompt > LIMITS["prompt_len"]:
        problem = f"a prompt of {longest_prompt:,} tokens is over the limit of {LIMITS['prompt_len']:,}"
    elif longest_generation > LIMITS["max_new_tokens"]:
        problem = f"a generation of {longest_generation:,} tokens is over the limit of {LIMITS['max_new_tokens']:,}"
    elif tokens > MAX_DECODE_TOKENS:
        problem = f"{tokens:,} decode tokens are over the {MAX_DECODE_TOKENS:,} of one configuration"
    if problem:
        raise UsageError(f"{label}: {problem} (python -m sim --help lists the limits)")


def work(r: Resolved, ceiling: bool) -> tuple[int, int]:
    """(decode tokens, model operations at most) that `run` simulates for a resolved scenario: every
    configuration, and each speculative one again with a free head when the ceiling is asked. A
    speculative decode token costs at most a round of K draft steps and one verify (every draft rejected)."""
    tokens = sum(g.decode_tokens for g in r.generations)
    runs = [1 + (ceiling and c.schedule != "baseline") for c in r.configs]
    operations = [1 if c.schedule == "baseline" else c.K + 1 for c in r.configs]
    return tokens * sum(runs), tokens * sum(n * o for n, o in zip(runs, operations))


def _generations(s: Scenario, source, profile: Profile) -> list[Generation]:
    if isinstance(source, TraceReplay) and s.prompt_len is None:
        generations = source.generations[: s.prompts] if s.prompts else list(source.generations)
        if s.max_new_tokens:
            generations = [replace(g, decode_tokens=s.max_new_tokens - 1) for g in generations]
        return generations
    lengths = profile.raw["setup"].get("prompt_lengths") or [128]
    prompt_len = s.prompt_len or int(lengths[0])
    decode = (s.max_new_tokens or 64) - 1
    return [Generation(str(i), prompt_len, decode) for i in range(s.prompts or 8)]


def _for_head(source, head: str, probes: int, profile: Profile, notes: list):
    """The acceptance the simulated head sees: scaled by FlashHead agreement where it is known."""
    if profile.agreement is None:
        if head == "flashhead":
            why = (
                "its agreement curve was measured on synthetic weights"
                if profile.agreement_ignored
                else "profile has no agreement curve r(p)"
            )
            notes.append(f"flashhead: acceptance as given ({why}; probes change cost only)")
        return source
    if isinstance(source, TraceReplay):
        r0 = 1.0 if source.head == "dense" else profile.agreement_at(source.probes or profile.default_probes)
    else:
        r0 = 1.0 if head == "dense" else profile.agreement_at(profile.default_probes)
    r1 = 1.0 if head == "dense" else profile.agreement_at(probes)
    if abs(r1 - r0) < 1e-12:
        return source
    if r0 == 0:
        raise UsageError(
            f"{head}: the source's head agrees with the dense head nowhere (r=0); "
            "its acceptance cannot be rescaled to other probes"
        )
    notes.append(f"{head}: acceptance scaled by agreement r({probes})={r1:.4f} against r={r0:.4f} of the source")
    return AgreementScaled(source, r0, r1)


def _sampled(profile: Profile, temperature: float, head: str, probes: int, notes: list) -> IIDAcceptance:
    """Speculative sampling accepts each proposal with probability min(1, p/q), so a position is
    accepted with expected probability beta = sum_x min(p(x), q(x)): the profile's curve for this
    temperature and head gives it, taken as the same at every position."""
    measured = sorted(profile.beta)
    beta = profile.beta_at(temperature, head, probes)
    if beta is None:
        have = ", ".join(f"{t:g}" for t in measured) or "none"
        raise UsageError(
            f"temperature={temperature:g}: the profile has no beta curve for the {head} head at this temperature "
            f"(temperatures measured: {have}); python -m measure.beta measures them"
        )
    what = head if head == "dense" else f"{head} p={probes}"
    notes.append(
        f"acceptance at temperature {temperature:g} ({what}): i.i.d. beta={beta:.4f} from the profile's sampling "
        f"curves ({profile.sampling_weights} weights); the acceptance source given applies to greedy decoding only"
    )
    if profile.sampling_weights == "synthetic":
        notes.append("warning: the beta curves were measured on SYNTHETIC weights: they say nothing about language")
    return IIDAcceptance(beta)


def timeline(s: Scenario) -> tuple[list[tuple], dict]:
    """What every stream does in one configuration of the scenario, as contracts.timeline intervals
    and the file's otherData: its first speculative configuration (the first schedule with the first
    head; the baseline where it has none), over its first generation."""
    r = resolve(s)
    costs = r.profile.costs[r.regime]
    config = next((c for c in r.configs if c.schedule != "baseline"), r.configs[0])
    generation = r.generations[0]
    row = simulate(costs, config, r.sources[config.head], [generation], s.seed, ceiling=False, timeline=True)
    setup = r.profile.raw["setup"]
    weights = {setup.get(part, {}).get("weights", "unknown") for part in ("target", "draft")}
    speculative = config.schedule != "baseline"
    meta = {
        "source": "simulator",
        "weights": "synthetic" if "synthetic" in weights else "+".join(sorted(weights)),
        "configuration": {
            "name": f"{config.schedule}-{config.head}-K{config.K}" if speculative else "baseline",
            "schedule": config.schedule,
            "head": config.head if speculative else "dense",
            "K": config.K if speculative else 0,
            "probes": config.probes if speculative and config.head == "flashhead" else None,
            "placement": config.placement,
            "regime": r.regime,
        },
        "chosen": (
            "the scenario's first speculative configuration (first schedule, first head)"
            if speculative
            else "the baseline (the scenario has no speculative schedule)"
        ),
        "generation": {
            "index": 0,
            "prompt_id": generation.prompt_id,
            "prompt_len": generation.prompt_len,
            "decode_tokens": generation.decode_tokens,
        },
        "time_origin": "the generation's decode start (its first token on the host); its prefills are before it",
        "profile": f"{r.profile.label()} [{r.profile.source}]",
        "edits": [f"{path}{op}{value:g}" for path, op, value in s.edits],
        "decode_ms": row["decode_ms"],
        "phase_ms": row["phase_ms"],
        "notes": r.notes,
    }
    return row["timeline"], meta


def run(
    s: Scenario, ceiling: bool = True, progress: Progress | None = None, rounds: bool = True
) -> tuple[list[dict], Resolved]:
    """Simulate the baseline and every (schedule, head) of the scenario; rows carry speedups.
    `progress` counts the decode tokens simulated; `rounds=False` drops each row's `rounds_detail` (one
    dict per round: a long run's largest part, which the command line never shows)."""
    r = resolve(s)
    costs = r.profile.costs[r.regime]
    advance = progress.update if progress is not None else None
    rows = []
    for config in r.configs:
        if progress is not None:
            progress.note(f"{config.schedule} {config.head}" if config.schedule != "baseline" else "baseline")
        row = simulate(
            costs, config, r.sources[config.head], r.generations, s.seed, ceiling, advance=advance, noise=s.noise
        )
        if not rounds:
            del row["rounds_detail"]
        if row["decode_ms"] <= 0:
            raise UsageError(
                f"{config.schedule} decodes in no time: the profile's costs{' after the what-ifs' if s.edits else ''} "
                "are zero, so no throughput can be predicted"
            )
        rows.append(row)
    base = rows[0]["decode_tok_s"]
    for row in rows:
        row["speedup"] = row["decode_tok_s"] / base if base else None
        row["regime"] = r.regime
    r.warnings = costs.warnings()
    r.notes += [f"warning: {line}" for line in r.warnings]
    return rows, r
