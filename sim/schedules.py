"""The speculative loop as SimPy processes, one generator function per schedule.

Schedules are defined in words in docs/design.md, their names in contracts.names; `model/schedules.py` implements
the same names with the same event order on real devices. The generator functions below are the
host (the Python thread that launches work and syncs): they advance simulated time by the host's
issue cost of each launch and wait only at syncs. Device work runs as separate processes on the
resources `target-device` and `draft-device` (one resource when both models share a device), in
launch order, as a CUDA stream does. A launch-bound operation (host time close to device time)
cannot finish before the host has finished issuing it.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import simpy

from .acceptance import Generation, leading_accepts
from .costs import Costs


@dataclass(frozen=True)
class Config:
    schedule: str
    head: str
    K: int
    probes: int
    placement: str


class DeviceStream:
    """A device as a CUDA stream sees it: work runs one piece at a time, in launch order."""

    def __init__(self, env: simpy.Environment, name: str):
        self.env, self.name, self.tail = env, name, None

    def run(self, machine: "SimulatedRun", phases: dict, device_ms: float, not_before: float, after):
        previous = self.tail
        self.tail = self.env.process(self._work(machine, previous, phases, device_ms, not_before, after))
        return self.tail

    def _work(self, machine, previous, phases, device_ms, not_before, after):
        for event in (previous, *after):
            if event is not None and not event.processed:
                yield event
        end = max(self.env.now + device_ms, not_before)
        yield self.env.timeout(end - self.env.now)
        for phase, ms in phases.items():
            machine.busy[phase] += ms


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

    def __post_init__(self):
        self.target = DeviceStream(self.env, "target-device")
        self.draft = DeviceStream(self.env, "draft-device") if self.two_devices else self.target
        self.host = simpy.Resource(self.env, 1)  # the Python thread: held by the schedule it runs
        c = self.costs
        self.item_ms = c.item.device_ms()
        self.copy_ms = c.copy_token.device_ms() if self.two_devices else 0.0
        self.cross_wait_ms = c.event_sync.device_ms() if self.two_devices else 0.0
        self.bookkeeping_ms = c.bookkeeping.device_ms()
        self.memo = {}

    @property
    def two_devices(self) -> bool:
        return self.config.placement == "two-gpu"

    # --- primitives -------------------------------------------------------------------------
    def launch(self, stream: DeviceStream, phases: dict, host_ms: float = 0.0, after=(), copy: bool = False):
        """Issue work on a device; the host is busy for host_ms. Returns the completion event.

        `after`: work on the other device this must wait for (a cross-device event wait, which costs
        event_sync_ms on two devices). `copy`: the result goes to the other device (copy_token_ms)."""
        after = [e for e in after if e is not None]
        extra = {}
        if copy and self.copy_ms:
            extra["other"] = self.copy_ms
        if after and self.cross_wait_ms:
            extra["sync"] = self.cross_wait_ms
        if extra:
            phases = {**phases, **{k: phases.get(k, 0.0) + v for k, v in extra.items()}}
        done = stream.run(self, phases, sum(phases.values()), self.env.now + host_ms, after)
        if host_ms:
            yield self.env.timeout(host_ms)
        return done

    def sync(self, *events, phase: str = "sync"):
        """The host waits for device work and materializes a scalar (`.item()`)."""
        for event in events:
            if event is not None and not event.processed:
                yield event
        self.busy[phase] += self.item_ms
        yield self.env.timeout(self.item_ms)

    def host_work(self, ms: float, phase: str = "other"):
        self.busy[phase] += ms
        if ms:
            yield self.env.timeout(ms)

    # --- operations of the loop ---------------------------------------------------------------
    def _cost(self, key, compute):
        if key not in self.memo:
            self.memo[key] = compute()
        return self.memo[key]

    def target_forward(self, phase: str, n_tokens: int, context: int, after=(), copy: bool = False):
        c = self.costs.verify
        device_ms, host_ms = self._cost(("target", n_tokens, context), lambda: (
            c.device_ms(n_tokens=n_tokens, context=context), c.host_ms(n_tokens=n_tokens, context=context)))
        self.calls["verify" if phase == "verify" else "append"] += 1
        return (yield from self.launch(self.target, {phase: device_ms}, host_ms, after, copy))

    def draft_steps(self, steps: int, context: int, after=(), copy: bool = True):
        """`steps` draft decode steps (body then head each) issued back to back; the proposals
        go to the target's device."""
        body_ms, head_ms, host_ms = self._cost(("draft", steps, context), lambda: self._draft_cost(steps, context))
        self.calls["draft_steps"] += steps
        return (yield from self.launch(self.draft, {"draft_body": body_ms, "draft_head": head_ms},
                                       host_ms, after, copy))

    def _draft_cost(self, steps: int, context: int):
        body, head, p = self.costs.draft_body, self.costs.head(self.config.head), self.config.probes
        body_ms = sum(body.device_ms(context=context + j) for j in range(steps))
        host_ms = sum(body.host_ms(context=context + j) for j in range(steps))
        if self.free_head:
            return body_ms, 0.0, host_ms
        return body_ms, steps * head.device_ms(probes=p), host_ms + steps * head.host_ms(probes=p)

    def prefill(self, generation: Generation, with_draft: bool):
        t, L = self.costs.target_prefill, generation.prompt_len
        target_done = yield from self.launch(self.target, {"prefill": t.device_ms(prompt_len=L)},
                                             t.host_ms(prompt_len=L))
        if with_draft:  # the draft's stream runs its first steps after this
            d = self.costs.draft_prefill
            yield from self.launch(self.draft, {"initial": d.device_ms(prompt_len=L)}, d.host_ms(prompt_len=L))
        yield from self.sync(target_done, phase="prefill")  # the first token belongs to TTFT

    def record(self, generation, index, K, accepted, emitted, skipped, context, lookahead=None):
        self.rounds.append({
            "prompt_id": generation.prompt_id, "round": index, "K": K, "proposed": K,
            "accepted": accepted, "emitted": emitted, "verify_skipped": skipped,
            "context": context, "lookahead_used": lookahead,
        })


# --- schedules: one generator per schedule, each decoding one generation after its first token --

def baseline(m: SimulatedRun, g: Generation, block):
    """One target forward per token; tokens stay on the device until the end."""
    context = g.prompt_len + 1
    done = None
    for i in range(g.decode_tokens):
        done = yield from m.target_forward("verify", 1, context + i - 1)
        m.record(g, i, 0, 0, 1, False, context + i - 1)
    yield from m.sync(done)


def _ordinary_rounds(m: SimulatedRun, g: Generation, block, overlap_append: bool):
    K, context, pos, remaining = m.config.K, g.prompt_len + 1, 0, g.decode_tokens
    appended = yield from m.target_forward("finalize", 1, context - 1)  # append the first token -> t*
    f_ready, index = None, 0  # f_ready: the target-side work the draft's next step waits for
    while remaining > 0:
        proposed = yield from m.draft_steps(K, context - 1, after=[f_ready])
        yield from m.sync(proposed, appended)  # skip test: d1 == t*
        accepted = leading_accepts(block(pos, K), K)
        skipped = accepted == 0
        verified = None if skipped else (yield from m.target_forward("verify", K, context, copy=overlap_append))
        appended = yield from m.target_forward("finalize", 1, context + accepted, copy=not overlap_append)
        f_ready = verified if overlap_append else appended
        yield from m.host_work(m.bookkeeping_ms)
        emitted = min(accepted + 1, remaining)
        m.record(g, index, K, accepted, emitted, skipped, context)
        index += 1
        pos, context, remaining = pos + accepted + 1, context + accepted + 1, remaining - emitted
    yield from m.sync(appended)


def ordinary(m, g, block):
    """Draft K, skip test, verify K, standalone append of f before the next round drafts."""
    yield from _ordinary_rounds(m, g, block, overlap_append=False)


def pipelined(m, g, block):
    """As ordinary, but the draft proposes round r+1 while the target appends round r's f."""
    yield from _ordinary_rounds(m, g, block, overlap_append=True)


def _deferred_rounds(m: SimulatedRun, g: Generation, block, lookahead: bool):
    K, context, pos, remaining = m.config.K, g.prompt_len + 1, 0, g.decode_tokens
    f_ready, ready_block, index = None, None, 0
    while remaining > 0:
        proposed = ready_block or (yield from m.draft_steps(K, context - 1, after=[f_ready]))
        verified = yield from m.target_forward("verify", K + 1, context - 1, after=[proposed], copy=True)
        matches = block(pos, K)
        accepted = leading_accepts(matches, K)
        used = None
        if lookahead:  # the draft goes on as if the whole block will be accepted
            guess = yield from m.draft_steps(1, context + K - 1)
            rest = yield from m.draft_steps(K, context + K)
            yield from m.sync(verified, guess)
            used = accepted == K and matches[K]
            ready_block = rest if used else None
        else:
            yield from m.sync(verified)
        f_ready = None if used else verified
        yield from m.host_work(m.bookkeeping_ms)
        emitted = min(accepted + 1, remaining)
        m.record(g, index, K, accepted, emitted, False, context, used)
        index += 1
        pos, context, remaining = pos + accepted + 1, context + accepted + 1, remaining - emitted
    tail = yield from m.target_forward("finalize", 1, context - 1)  # the one standalone append
    yield from m.sync(tail)


def deferred(m, g, block):
    """The round's final token opens the next verify ([f, d1..dK]); one append at the end."""
    yield from _deferred_rounds(m, g, block, lookahead=False)


def pipelined_deferred(m, g, block):
    """Deferred, and the draft keeps proposing during the verify as if the block is accepted."""
    yield from _deferred_rounds(m, g, block, lookahead=True)


RUNNERS = {
    "baseline": baseline, "ordinary": ordinary, "pipelined": pipelined,
    "deferred": deferred, "pipelined-deferred": pipelined_deferred,
}
