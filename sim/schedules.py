"""The speculative loop as SimPy processes, one generator function per schedule.

Schedules are defined in words in docs/design.md, their names in contracts.names; `model/schedules.py` implements
the same names with the same event order on real devices. The generator functions below are the
host (the Python thread that launches work and syncs): they advance simulated time by the host's
issue cost of each launch and wait only at syncs. Device work runs as separate processes on the
resources `target-device` and `draft-device` (one resource when both models share a device), in
launch order, as a CUDA stream does. A launch-bound operation (host time close to device time)
cannot finish before the host has finished issuing it. Every cross-device dependency is a token
copy, modelled as PyTorch makes it (a two-way barrier between the streams), and every host read
waits for the whole target stream, as a read of target-device values does.

`SimulatedRun.events`, when a list, logs one `(name, stream, tokens)` per operation in host issue
order, the same log `model.decoder.Decoder(events=...)` keeps (docs/contracts.md).
`SimulatedRun.timeline`, when a list, records what every stream does, as intervals
`(stream, name, start_ms, end_ms, args)` of `contracts.timeline`: each device's work by phase, and
the host's issue time of each launch, its reads (`sync`) and its gaps after them (`host_gap`).
"""

from __future__ import annotations

import math
import random
from collections import Counter
from dataclasses import dataclass, field

import simpy

from contracts.policies import Arm, Policy, arms, catch_up_widths, make_policy
from contracts.trees import TreeShape

from .acceptance import Generation, leading_accepts
from .costs import Costs
from .trees import cursor_tokens, draft_points, is_tree, verify_tokens


@dataclass(frozen=True)
class Config:
    schedule: str
    head: str
    K: int
    probes: int
    placement: str
    policy: str = "fixed"  # contracts.policies: what chooses each round's arm (drafter, K)
    drafters: tuple = ("draft-model",)  # the arms' drafters, the first one first
    Ks: tuple = ()  # the arms' K values besides K
    tree: TreeShape | None = None  # contracts.trees: the tree each round drafts (None: a chain of K; K = its depth)

    def arms(self) -> tuple[Arm, ...]:
        """The policy's arms: (first drafter, K) first, then every other (drafter, K) pair."""
        first = Arm(self.drafters[0], self.K)
        return (first, *(arm for arm in arms(self.drafters, (self.K, *self.Ks)) if arm != first))


class DeviceStream:
    """A device as a CUDA stream sees it: work runs one piece at a time, in launch order."""

    def __init__(self, env: simpy.Environment, name: str):
        self.env, self.name, self.tail = env, name, None
        self.waits = []  # work on another stream that this stream's next work waits for (an event wait)

    def queued(self) -> list:
        """What a wait for everything queued on this stream so far waits for."""
        return [self.tail, *self.waits]

    def run(self, machine: SimulatedRun, phases: dict, device_ms: float, not_before: float, after, pieces=None):
        """`pieces` (with a timeline only): the work's parts in order, (name, device_ms, host_ms)."""
        previous = self.tail
        after, self.waits = [*after, *self.waits], []
        self.tail = self.env.process(
            self._work(machine, previous, phases, device_ms, not_before, after, pieces, machine.timeline)
        )
        return self.tail

    def _work(self, machine, previous, phases, device_ms, not_before, after, pieces, timeline):
        for event in (previous, *after):
            if event is not None and not event.processed:
                yield event
        start = self.env.now
        end = max(start + device_ms, not_before)
        yield self.env.timeout(end - start)
        for phase, ms in phases.items():
            machine.busy[phase] += ms
        if timeline is not None:
            self._record(timeline, pieces, start, end)

    def _record(self, timeline: list, pieces, start: float, end: float) -> None:
        """The pieces in order within [start, end]. A launch-bound launch takes longer than its device
        time (the host issues it no faster): each piece then ends when its share of that time is over,
        as the device runs each kernel once it is issued. Durations are the device costs."""
        total = sum(ms for _, ms, _ in pieces)
        if total <= 0:
            return
        stretch, done, previous = (end - start) / total, 0.0, start
        for name, ms, _ in pieces:
            done += ms
            stop = min(end, max(start + done * stretch, previous + ms))
            if ms > 0:
                timeline.append((self.name, name, max(previous, stop - ms), stop, {}))
                previous = stop


@dataclass
class SimulatedRun:
    """Resources and tallies of one simulation."""

    env: simpy.Environment
    costs: Costs
    config: Config
    free_head: bool = False  # the head-only ceiling: the draft head costs nothing
    busy: Counter = field(default_factory=Counter)
    calls: Counter = field(default_factory=Counter)
    rounds: list = field(default_factory=list)
    events: list | None = None  # the event log, when asked for: (name, stream, tokens) per operation
    timeline: list | None = None  # intervals (stream, name, start, end, args) of launches made while a list
    policy: Policy | None = None  # chooses each round's arm; lives across the run's generations
    cached: dict = field(default_factory=dict)  # model drafter -> cache positions valid after its last round
    read_end: float = 0.0  # when the last read's value reached the host (before its host gap)
    # what a policy observes of a round's time, multiplied by exp(r) with r drawn from timing_noise (log
    # ratios of measured to simulated round times) by noise_seed's stream: the simulated clock keeps the
    # costs (validate/policies.py, noise_seeds)
    timing_noise: tuple[float, ...] = ()
    noise_seed: int = 0

    def __post_init__(self):
        self.target = DeviceStream(self.env, "target-device")
        self.draft = DeviceStream(self.env, "draft-device") if self.two_devices else self.target
        self.host = simpy.Resource(self.env, 1)  # the Python thread: held by the schedule it runs
        c = self.costs
        self.item_ms = c.item.device_ms()
        self.copy_ms = c.copy_token.device_ms() if self.two_devices else 0.0
        self.cross_wait_ms = c.event_sync.device_ms() if self.two_devices else 0.0
        self.read_gap_ms = read_gap_ms(c, self.two_devices)
        self.memo = {}
        self.noise = random.Random(self.noise_seed)
        if self.policy is None:
            self.policy = make_policy(self.config.policy, self.config.arms(), seed=0)

    @property
    def two_devices(self) -> bool:
        return self.config.placement == "two-gpu"

    def observed(self, round_ms: float) -> float:
        """A round's time as its policy observes it: a host's timings vary from round to round by a few
        percent, and a bandit that rewards tokens per millisecond may choose its next arm on that."""
        return round_ms * math.exp(self.noise.choice(self.timing_noise)) if self.timing_noise else round_ms

    # --- primitives -------------------------------------------------------------------------
    def log(self, name: str, stream: str, tokens: int | None = None) -> None:
        """One event of the log (`events`), as `model.decoder.Decoder` logs it."""
        if self.events is not None:
            self.events.append((name, stream, tokens))

    def launch(
        self, stream: DeviceStream, phases: dict, host_ms: float = 0.0, after=(), cross_wait: bool = False, pieces=None
    ):
        """Issue work on a device stream; the host is busy for host_ms. Returns the completion event.

        `after`: other events the work waits for besides its stream's earlier work. `cross_wait`:
        it waits for the other device (a cross-device event wait: event_sync_ms on two devices).
        `pieces` (for the timeline; by default one per phase): the parts of the work in order,
        (name, device_ms, host_ms), their host times summing to host_ms."""
        if cross_wait and self.cross_wait_ms:
            phases = {**phases, "sync": phases.get("sync", 0.0) + self.cross_wait_ms}
        if self.timeline is not None:
            pieces = pieces or self._pieces(phases, host_ms)
            self._issue(pieces)
        done = stream.run(
            self, phases, sum(phases.values()), self.env.now + host_ms, [e for e in after if e is not None], pieces
        )
        if host_ms:
            yield self.env.timeout(host_ms)
        return done

    @staticmethod
    def _pieces(phases: dict, host_ms: float) -> list[tuple[str, float, float]]:
        """A launch's timeline pieces, one per phase: a cross-device wait (`sync`) first, the host's
        issue time on the last."""
        ordered = sorted(phases.items(), key=lambda item: item[0] != "sync")
        return [
            (TIMELINE_NAME.get(phase, phase), ms, host_ms if i == len(ordered) - 1 else 0.0)
            for i, (phase, ms) in enumerate(ordered)
        ]

    def _issue(self, pieces) -> None:
        """The host's issue time of each piece of a launch, from now on (timeline)."""
        at = self.env.now
        for name, _, host_ms in pieces:
            if host_ms > 0:
                self.timeline.append(("host", name, at, at + host_ms, {}))
                at += host_ms

    def sync(self, *events, phase: str = "sync"):
        """The host waits for device work and materializes a scalar (`.item()`)."""
        for event in events:
            if event is not None and not event.processed:
                yield event
        self.busy[phase] += self.item_ms
        if self.timeline is not None and phase == "sync" and self.item_ms:
            self.timeline.append(("host", "sync", self.env.now, self.env.now + self.item_ms, {}))
        yield self.env.timeout(self.item_ms)

    def host_work(self, ms: float, phase: str = "other", name: str | None = None):
        """The host busy for ms (charged to `phase`); `name`: its name on the timeline."""
        self.busy[phase] += ms
        if ms:
            if self.timeline is not None and name:
                self.timeline.append(("host", name, self.env.now, self.env.now + ms, {}))
            yield self.env.timeout(ms)

    # --- operations of the loop, one per operation of model.decoder.Decoder --------------------
    def _cost(self, key, compute):
        if key not in self.memo:
            self.memo[key] = compute()
        return self.memo[key]

    def read(self, final: bool = False):
        """`Decoder.read` (and resolve's and the final read): a host read of target-device values. It
        waits for everything queued on the target stream, which waits for every copy made to it. The
        host's Python work after a read (the read gap) is on the critical path: no launch comes
        before it ends. After the final read the generation is over."""
        self.log("sync", "target")
        yield from self.sync(*self.target.queued())
        self.read_end = self.env.now
        if not final:
            yield from self.host_work(self.read_gap_ms, name="host_gap")

    def copy_tokens(self, source: str, tokens: int):
        """`Decoder.to_target` (source "draft") or `cursor_to_draft` / `to_draft` (source "target"), on two
        devices only (on one the decoder's `.to()` is a no-op). As PyTorch copies between GPUs: on the
        source's stream after the work queued on the destination, and the destination's later work waits
        for the copy (a two-way barrier); the copy pays copy_token_ms and one cross-device wait."""
        if not self.two_devices:
            return None
        self.log("copy_tokens", source, tokens)
        src, dst = (self.draft, self.target) if source == "draft" else (self.target, self.draft)
        done = yield from self.launch(src, {"other": self.copy_ms}, after=dst.queued(), cross_wait=True)
        dst.waits.append(done)  # the destination's stream waits for the copy
        return done

    def target_forward(self, name: str, n_tokens: int, context: int, phase: str | None = None):
        """`Decoder.verify` (name "verify") or a standalone one (name "append": `Decoder.append`, and
        the baseline's forwards, which the decoder charges to the verify phase). A tree decoder runs
        every target forward with the tree rule's attention (`Costs.tree_verify`), its appends too."""
        c = self.costs.tree_verify if is_tree(self.config.tree) else self.costs.verify
        device_ms, host_ms = self._cost(
            ("target", n_tokens, context),
            lambda: (c.device_ms(n_tokens=n_tokens, context=context), c.host_ms(n_tokens=n_tokens, context=context)),
        )
        self.calls[name] += 1
        self.log(name, "target", n_tokens)
        phase = phase or ("verify" if name == "verify" else "finalize")
        return (yield from self.launch(self.target, {phase: device_ms}, host_ms))

    def draft_steps(
        self,
        steps: int,
        context: int,
        first_tokens: int = 1,
        drafter: str = "draft-model",
        shift: int = 0,
        chain: bool = False,
    ):
        """`Decoder.draft_steps`: `steps` draft steps (body then head each) issued back to back on
        the drafter's stream (the early-exit draft shares the target's device), the first feeding
        `first_tokens` tokens after `context` cached ones, every later one the previous proposal (a
        tree's: its frontier, unless `chain`, as a look-ahead's). Step i pays the head of draft position
        max(0, i + shift). `tree-lookahead`: the draft model past a tree round's guessed leaf
        (model/tree_lookahead.py), one token a step under the tree rule."""
        on_target = drafter == "early-exit"
        stream = self.target if on_target else self.draft
        name = "target" if on_target else "draft"
        points = (steps, context, first_tokens, chain)
        if self.events is not None:
            self.events += [("draft_step", name, n) for n, _ in self._draft_points(*points)]
        body_ms, head_ms, host_ms = self._cost(
            ("draft", drafter, shift, *points), lambda: self._draft_cost(points, drafter, shift)
        )
        self.calls["draft_steps"] += steps
        pieces = self._draft_pieces(points, drafter, shift) if self.timeline is not None else None
        return (yield from self.launch(stream, {"draft_body": body_ms, "draft_head": head_ms}, host_ms, pieces=pieces))

    def propose(self, context: int, arm: Arm | None = None):
        """`Decoder.propose`: K draft steps from f, at position p = context - 1. The first feeds the
        tokens the drafter's cache lacks (`Decoder.missed`): f alone at p, or [prev, f] at p - 1 (2 tokens
        after p - 1 cached ones) where the host cannot tell (ordinary rounds), after a fully accepted block
        whose last token no look-ahead fed, and in a tree round; the next ones d1..d(K-1) at p + 1..
        A model drafter idle since an earlier round first feeds every token its cache missed.
        Prompt lookup instead searches the context on the target device (one `lookup`)."""
        arm = arm or Arm("draft-model", self.config.K)
        if arm.drafter == "prompt-lookup":
            lookup = self.costs.lookup
            self.log("lookup", "target", arm.K)
            self.calls["lookups"] += 1
            return (
                yield from self.launch(
                    self.target, {"draft_body": lookup.device_ms(context=context)}, lookup.host_ms(context=context)
                )
            )
        first = max(2 if is_tree(self.config.tree) else 1, context - self.cached.get(arm.drafter, context - 2))
        *leading, last = catch_up_widths(first, context)
        if first > 2 and arm.drafter == "draft-model":  # catching up: the missed tokens go to the draft device
            yield from self.copy_tokens("target", max(first, last))
        for index, width in enumerate(leading):  # the oldest missed tokens, body only
            yield from self.catch_up(width, context - first + index * width, arm.drafter)
        return (yield from self.draft_steps(arm.K, context - last, first_tokens=last, drafter=arm.drafter))

    def catch_up(self, width: int, context: int, drafter: str):
        """`Drafting.propose`'s body-only forward of `width` missed tokens after `context` cached ones."""
        stream = self.draft if drafter == "draft-model" else self.target
        self.log("catch_up", "draft" if drafter == "draft-model" else "target", width)
        body = self._drafter_costs(drafter, 0, 0)[0]
        device_ms, host_ms = self._cost(
            ("catch_up", drafter, width, context),
            lambda: (body.device_ms(n_tokens=width, context=context), body.host_ms(n_tokens=width, context=context)),
        )
        return (yield from self.launch(stream, {"draft_body": device_ms}, host_ms))

    def drafted(self, arm: Arm, context: int, accepted: int, fed_last: bool) -> None:
        """`Decoder.drafted`: after a round, the drafter's cache holds f and the proposals it fed that were
        accepted (the block's last one only when `fed_last`: a look-ahead fed it)."""
        if arm.drafter != "prompt-lookup":
            self.cached[arm.drafter] = context + (accepted if fed_last else min(accepted, arm.K - 1))

    def _draft_points(self, steps: int, context: int, first_tokens: int, chain: bool) -> list[tuple[int, int]]:
        """Step j's (n_tokens, context), a tree's frontier widths after its first step unless `chain`: a
        profile without an n_tokens axis costs every step as one token."""
        return draft_points(None if chain else self.config.tree, steps, context, first_tokens)

    def _drafter_costs(self, drafter: str, steps: int, shift: int):
        """(body cost, [(head device_ms, host_ms)] per step) of a model drafter's `steps` steps."""
        if drafter == "early-exit":
            head = self.costs.early_exit_head
            return self.costs.early_exit_body, [(head.device_ms(), head.host_ms())] * steps
        if self.free_head:
            return self.costs.draft_body, [(0.0, 0.0)] * steps
        at = self.costs.head_at
        head_ms = [at(self.config.head, self.config.probes, max(0, i + shift)) for i in range(steps)]
        return self.costs.draft_body, head_ms

    def _draft_pieces(self, points: tuple, drafter: str, shift: int) -> list[tuple[str, float, float]]:
        """The timeline's pieces of `draft_steps` (`points`: its steps, context, first_tokens, chain): body,
        then head, per step, (name, device_ms, host_ms)."""
        body, head_ms = self._drafter_costs(drafter, points[0], shift)
        bodies = self._step_bodies(body, points, drafter)
        pieces = []
        for (n, c), body, (head_device, head_host) in zip(self._draft_points(*points), bodies, head_ms):
            pieces += [
                ("draft_body", body.device_ms(n_tokens=n, context=c), body.host_ms(n_tokens=n, context=c)),
                ("draft_head", head_device, head_host),
            ]
        return pieces

    def _draft_cost(self, points: tuple, drafter: str, shift: int):
        body, head_ms = self._drafter_costs(drafter, points[0], shift)
        steps = list(zip(self._step_bodies(body, points, drafter), self._draft_points(*points)))
        body_ms = sum(body.device_ms(n_tokens=n, context=c) for body, (n, c) in steps)
        host_ms = sum(body.host_ms(n_tokens=n, context=c) for body, (n, c) in steps)
        return body_ms, sum(d for d, _ in head_ms), host_ms + sum(h for _, h in head_ms)

    def _step_bodies(self, body, points: tuple, drafter: str) -> list:
        """Each step's body cost: after a tree round's root step, its frontier steps run under the tree rule
        (`Costs.tree_body`), as does every step of its look-ahead."""
        steps, _, _, chain = points
        if drafter == "tree-lookahead":
            return [self.costs.tree_body] * steps
        frontier = drafter == "draft-model" and not chain and is_tree(self.config.tree)
        return [body] + [self.costs.tree_body if frontier else body] * (steps - 1)

    def prefill(self, generation: Generation, with_draft: bool):
        """The prefills up to the first token (TTFT). On two devices the draft's prefill runs beside the
        target's; on one the decoder issues it after the first token, so all of it, the host's issue
        included, is decode time (model.decoder.Decoder._prefill; sim.simulate issues it there)."""
        t, L = self.costs.target_prefill, generation.prompt_len
        target_done = yield from self.launch(
            self.target, {"prefill": t.device_ms(prompt_len=L)}, t.host_ms(prompt_len=L)
        )
        if with_draft and self.two_devices:  # the draft's stream runs its first steps after this
            yield from self.draft_prefill(L)
        yield from self.sync(target_done, phase="prefill")  # the first token belongs to TTFT

    def draft_prefill(self, prompt_len: int):
        d = self.costs.draft_prefill
        yield from self.launch(
            self.draft, {"initial": d.device_ms(prompt_len=prompt_len)}, d.host_ms(prompt_len=prompt_len)
        )

    def record(self, generation, index, K, accepted, emitted, skipped, context, lookahead=None, arm=None):
        self.rounds.append(
            {
                "prompt_id": generation.prompt_id,
                "round": index,
                "K": K,
                "proposed": K,
                "accepted": accepted,
                "emitted": emitted,
                "verify_skipped": skipped,
                "context": context,
                "lookahead_used": lookahead,
                "drafter": arm.drafter if arm else ("draft-model" if K else None),
                "end_ms": self.env.now,  # its read done: validate/policies.py fits the rounds' steady pace on it
            }
        )


# Timeline names of the phases a launch is charged to, where they differ: a device's `other` is a token copy.
TIMELINE_NAME = {"other": "copy_tokens"}


def read_gap_ms(costs: Costs, two_devices: bool) -> float:
    """The host's time from a read's end to its next launch: measured (host.read_gap_ms), or, in a
    profile measured before that cost was, the per-round host time of a deferred round less what the
    simulator charges apart from it (its two token copies and their cross-device waits on two GPUs)."""
    if costs.read_gap is not None:
        return costs.read_gap.device_ms()
    copies = 2 * (costs.copy_token.device_ms() + costs.event_sync.device_ms()) if two_devices else 0.0
    return max(0.0, costs.bookkeeping.device_ms() - copies)


# --- schedules: one generator per schedule, each decoding one generation after its first token --
# Each follows its namesake in model/schedules.py operation for operation (docs/contracts.md,
# "Schedule event order"); tests/test_schedule_parity.py compares the two event logs.


def baseline(m: SimulatedRun, g: Generation, block):
    """One target forward per token (counted as an append, charged to verify, as the decoder does);
    tokens stay on the device until the one read at the end."""
    context = g.prompt_len + 1
    for i in range(g.decode_tokens):
        yield from m.target_forward("append", 1, context + i - 1, phase="verify")
        m.record(g, i, 0, 0, 1, False, context + i)  # the trace's context: the first token included
    if g.decode_tokens:
        yield from m.read(final=True)  # the final read of the tokens


def _ordinary_rounds(m: SimulatedRun, g: Generation, block, pipelined: bool):
    K, context, pos, remaining = m.config.K, g.prompt_len + 1, 0, g.decode_tokens
    max_new, n = g.decode_tokens + 1, 1  # n: the device's counter of emitted tokens (the first included)
    least = most = 1  # what the host knows of n (model.decoder.Run.least / most)
    index = 0
    while least < max_new:  # Run.more
        if index == 0:  # the initial append(1) of the first token gives t*
            yield from m.target_forward("append", 1, context - 1)
        yield from m.propose(context)  # draft_step x K
        yield from m.copy_tokens("draft", verify_tokens(m.config.tree, K))
        yield from m.read()  # skip test d1 == t*; it also reads n, as the previous round left it
        least = most = n
        accepted = leading_accepts(block(pos, K), K)
        skipped = accepted == 0
        if not skipped:
            yield from m.target_forward("verify", verify_tokens(m.config.tree, K), context)
        if pipelined:  # f goes to the draft first, so its next steps need not wait for the append
            yield from m.copy_tokens("target", cursor_tokens(m.config.tree))
            yield from m.target_forward("append", 1, context + accepted)
        else:  # finalize: append(1), then f to the draft
            yield from m.target_forward("append", 1, context + accepted)
            yield from m.copy_tokens("target", cursor_tokens(m.config.tree))
        n += accepted + 1
        least, most = least + 1, most + (1 if skipped else K + 1)  # Run.issued
        if least < max_new <= most:  # Decoder.resolve: the host cannot tell whether it is over
            yield from m.read()
            least = most = n
        emitted = min(accepted + 1, remaining)
        m.record(g, index, K, accepted, emitted, skipped, context)
        index += 1
        pos, context, remaining = pos + accepted + 1, context + accepted + 1, remaining - emitted
    if index:
        yield from m.read(final=True)  # the final read of the tokens


def ordinary(m, g, block):
    """Draft K, skip test, verify K, standalone append of f before the next round drafts."""
    yield from _ordinary_rounds(m, g, block, pipelined=False)


def pipelined(m, g, block):
    """As ordinary, but the draft proposes round r+1 while the target appends round r's f."""
    yield from _ordinary_rounds(m, g, block, pipelined=True)


def _deferred_rounds(m: SimulatedRun, g: Generation, block, lookahead: bool):
    context, pos, remaining = g.prompt_len + 1, 0, g.decode_tokens
    ready, index = False, 0  # ready: the look-ahead already proposed this round's block
    arm = m.policy.choose() if remaining > 0 else None
    while remaining > 0:  # every round reads n, so the host always knows it
        start, K, played = m.env.now, arm.K, arm
        on_draft = arm.drafter == "draft-model"
        if not ready:
            yield from m.propose(context, arm)  # draft_step x K (prompt lookup: one lookup)
            if on_draft:
                yield from m.copy_tokens("draft", verify_tokens(m.config.tree, K))
        chain = ready and m.config.tree is not None  # a tree run's round after a used look-ahead: a chain
        verified = K if chain else verify_tokens(m.config.tree, K)
        yield from m.target_forward("verify", verified + 1, context - 1)  # over [f, d1..dK] (a tree: its nodes)
        matches = block(pos, K, arm.drafter, chain=True) if chain else block(pos, K, arm.drafter)
        accepted = leading_accepts(matches, K)
        used = None
        ahead = lookahead and on_draft  # only the draft model looks ahead: the others share the target's device
        if ahead:  # the draft goes on as if the whole block (a tree: its guessed path) is accepted: e1..e(K+1)
            past = "tree-lookahead" if is_tree(m.config.tree) and not chain else "draft-model"
            yield from m.draft_steps(K + 1, context + K - 1, drafter=past, shift=-1, chain=True)
            yield from m.copy_tokens("draft", K + 1)  # the read packs e1: it waits for all K+1 steps
        early = not is_tree(m.config.tree) and m.policy.plays("draft-model")
        if early:  # f on its way to the draft model before the read
            yield from m.copy_tokens("target", cursor_tokens(m.config.tree))
        yield from m.read()  # n, and with the look-ahead whether it is used
        if ahead:
            used = accepted == K and bool(matches[K])
        emitted = min(accepted + 1, remaining)
        m.policy.update(arm, accepted, emitted, m.observed(m.read_end - start))
        m.drafted(arm, context, K if used else accepted, fed_last=ahead)
        if not used:  # the next round's arm; f goes to the draft model when it drafts next (a tree: copied now)
            arm = m.policy.choose() if remaining > emitted else arm
            if arm.drafter == "draft-model" and not early:
                yield from m.copy_tokens("target", cursor_tokens(m.config.tree))
        ready = bool(used)
        m.record(g, index, K, accepted, emitted, False, context, used if lookahead else None, arm=played)
        index += 1
        pos, context, remaining = pos + accepted + 1, context + accepted + 1, remaining - emitted
    if index:
        yield from m.target_forward("append", 1, context - 1)  # the one standalone append
        yield from m.read(final=True)  # the final read of the tokens


def deferred(m, g, block):
    """The round's final token opens the next verify ([f, d1..dK]); one append at the end."""
    yield from _deferred_rounds(m, g, block, lookahead=False)


def pipelined_deferred(m, g, block):
    """Deferred, and the draft keeps proposing during the verify as if the block is accepted."""
    yield from _deferred_rounds(m, g, block, lookahead=True)


RUNNERS = {
    "baseline": baseline,
    "ordinary": ordinary,
    "pipelined": pipelined,
    "deferred": deferred,
    "pipelined-deferred": pipelined_deferred,
}
