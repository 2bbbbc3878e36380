"""Run one configuration through the SimPy model and reduce it to the study's metrics."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import replace

import simpy

from contracts.names import SIMULATED_PHASES
from contracts.policies import Arm, Policy, make_policy

from .acceptance import Generation
from .costs import Costs
from .schedules import RUNNERS, Config, SimulatedRun


def _run(
    costs: Costs,
    config: Config,
    source,
    generations: list[Generation],
    seed: int,
    free_head: bool = False,
    events: bool = False,
    timeline: bool = False,
    policy: Policy | None = None,
    advance: Callable[[int], None] | None = None,
    noise: tuple[tuple[float, ...], int] = ((), 0),
) -> dict:
    env = simpy.Environment()
    policy = policy or make_policy(config.policy, config.arms(), seed)
    m = SimulatedRun(
        env,
        costs,
        config,
        free_head=free_head,
        events=[] if events else None,
        policy=policy,
        timing_noise=noise[0],
        noise_seed=noise[1],
    )
    ttft, decode, recorded = [], [], {}

    def host_thread():
        with m.host.request() as host:
            yield host
            for index, g in enumerate(generations):
                if timeline and index == 0:  # record the first generation's launches, from its prefill on
                    m.timeline = recorded["intervals"] = []
                start = env.now
                m.cached = {}  # a new generation: every drafter's cache is refilled by its prefill
                m.policy.begin(g.prompt_id)
                # as the decoder: a draft model that no arm drafts with is not prefilled
                with_draft = config.schedule != "baseline" and m.policy.plays("draft-model")
                yield from m.prefill(g, with_draft)
                ttft.append(env.now - start)
                first = env.now
                if timeline and index == 0:
                    recorded["origin"] = first
                if with_draft and not m.two_devices:  # the decoder issues it after the first token there
                    yield from m.draft_prefill(g.prompt_len)
                yield from RUNNERS[config.schedule](m, g, source.stream(g, seed))
                decode.append(env.now - first)
                m.timeline = None  # launches of later generations are not recorded
                if advance is not None:
                    advance(g.decode_tokens)

    env.process(host_thread())
    env.run()
    result = {"run": m, "ttft": ttft, "decode": decode}
    if timeline:  # times from the first generation's decode start
        origin = recorded.get("origin", 0.0)
        result["timeline"] = [
            (stream, name, a - origin, b - origin, args) for stream, name, a, b, args in recorded.get("intervals", [])
        ]
    return result


def simulate(
    costs: Costs,
    config: Config,
    source,
    generations: list[Generation],
    seed: int = 0,
    ceiling: bool = True,
    events: bool = False,
    timeline: bool = False,
    policy: Policy | None = None,
    advance: Callable[[int], None] | None = None,
    noise: tuple[tuple[float, ...], int] = ((), 0),
) -> dict:
    """Predicted metrics for one configuration (a flat dict, ready for a table row or JSON).

    The `oracle` policy first simulates every fixed arm, then plays for each generation the arm that
    decoded it fastest (the best fixed arm in hindsight, per generation).

    `events`: also return the event log of every generation in turn (`result["events"]`: one
    `(name, stream, tokens)` per operation, as model.decoder.Decoder logs them).
    `policy`: a policy object to play instead of a fresh `config.policy` (its state carries over).
    `timeline`: also return what every stream did during the first generation (`result["timeline"]`:
    `(stream, name, start_ms, end_ms, args)` intervals of contracts.timeline, in ms from its decode
    start; its prefills before it).
    `advance`: called with each generation's decode tokens once it is simulated (progress).
    `noise`: (log ratios, seed) of the round times the policy observes (SimulatedRun.observed)."""
    choices = _oracle_arms(costs, config, source, generations, seed) if config.policy == "oracle" else None
    given = policy
    policy = (lambda: Oracle(config.arms(), seed, best=choices)) if choices else (lambda: given)
    run = _run(
        costs,
        config,
        source,
        generations,
        seed,
        events=events,
        timeline=timeline,
        policy=policy(),
        advance=advance,
        noise=noise,
    )
    m: SimulatedRun = run["run"]
    decode_ms = sum(run["decode"])
    tokens = sum(g.decode_tokens for g in generations)
    rounds = [r for r in m.rounds if r["K"] > 0]
    proposed = sum(r["proposed"] for r in rounds)
    phases = {p: m.busy[p] for p in SIMULATED_PHASES}
    result = {
        "schedule": config.schedule,
        "head": config.head if config.schedule != "baseline" else "-",
        "K": config.K if config.schedule != "baseline" else 0,
        "probes": config.probes if config.head == "flashhead" and config.schedule != "baseline" else None,
        "placement": config.placement,
        "generations": len(generations),
        "decode_tokens": tokens,
        "decode_ms": decode_ms,
        "decode_tok_s": 1000.0 * tokens / decode_ms if decode_ms else 0.0,
        "ttft_ms": statistics.median(run["ttft"]),
        "tpot_ms": decode_ms / tokens if tokens else 0.0,
        "acceptance": sum(r["accepted"] for r in rounds) / proposed if proposed else None,
        "mean_emitted": tokens / len(rounds) if rounds else None,
        "mean_accepted": sum(r["accepted"] for r in rounds) / len(rounds) if rounds else None,
        "tree": config.tree.label if config.tree is not None and config.schedule != "baseline" else None,
        "rounds": len(rounds),
        "verify_calls": m.calls["verify"],
        "append_calls": m.calls["append"],  # the baseline's forwards are appends, as the decoder counts them
        "draft_steps": m.calls["draft_steps"],
        "lookahead_used": sum(1 for r in rounds if r["lookahead_used"]),
        "phase_ms": phases,
        "phase_share": {p: v / decode_ms if decode_ms else 0.0 for p, v in phases.items()},
        "draft_path_share": (phases["draft_body"] + phases["draft_head"]) / decode_ms if decode_ms else 0.0,
        "rounds_detail": m.rounds,
        "policy": config.policy,
        "arm": "+".join(config.drafters) if config.policy != "fixed" else f"{config.drafters[0]}:K{config.K}",
        "pulls": {arm.label(): n for arm, n in m.policy.pulls.items() if n},
        "generation_ms": run["decode"],
    }
    if ceiling and config.schedule != "baseline":
        free = _run(
            costs, config, source, generations, seed, free_head=True, policy=policy(), advance=advance, noise=noise
        )
        free_ms = sum(free["decode"])
        result["head_only_tok_s"] = 1000.0 * tokens / free_ms if free_ms else 0.0
        result["head_only_ratio"] = (
            result["head_only_tok_s"] / result["decode_tok_s"] if result["decode_tok_s"] else None
        )
    else:
        result["head_only_tok_s"] = result["head_only_ratio"] = None
    if events:
        result["events"] = m.events
    if timeline:
        result["timeline"] = run["timeline"]
    return result


class Oracle(Policy):
    """The best fixed arm in hindsight for each generation (`best`: prompt id -> arm)."""

    name = "oracle"

    def __init__(self, choices, seed: int = 0, best: dict | None = None):
        super().__init__(choices, seed)
        self.best, self.arm = best or {}, choices[0]

    def begin(self, prompt_id: str) -> None:
        self.arm = self.best[prompt_id]
        self.pulls.setdefault(self.arm, 0)
        self.rewards.setdefault(self.arm, 0.0)

    def choose(self) -> Arm:
        return self.arm

    def plays(self, drafter: str) -> bool:
        """The one fixed arm of this generation, as the fixed run it stands for."""
        return self.arm.drafter == drafter


def _oracle_arms(costs: Costs, config: Config, source, generations: list[Generation], seed: int) -> dict:
    """Per generation, the fixed arm that decoded it in the least time (ties: the first arm)."""
    times = {}
    for arm in config.arms():
        fixed = replace(config, policy="fixed", drafters=(arm.drafter,), K=arm.K, Ks=())
        times[arm] = _run(costs, fixed, source, generations, seed)["decode"]
    return {g.prompt_id: min(times, key=lambda arm: times[arm][i]) for i, g in enumerate(generations)}
