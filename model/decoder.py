"""Speculative decoding on static KV caches, greedy or sampled, with at most one host sync per round.

The decoder owns the device-side state of a generation (`Run`): the output buffer, the counter of
emitted tokens, the per-round accepted counts and a cursor [prev, f, p] (f the last emitted token,
at position p, and prev the token before it). A round's result is computed on the device: accepted
= the cumulative product of matches, summed; f = the target's argmax at that index; the emitted
tokens are scattered into the output buffer (sampling: the round's verification decides accepted and
f from the target's and draft's distributions and the round's random numbers, all on the device;
docs/design.md, "Sampling"). The host reads one small packed tensor per round, and
the tokens once at the end. Cropping a cache after a rejection is only moving the cursor: the
models write K/V by position and mask the slots above it (see model/transformer.py).

Target and draft forwards go through `GraphedCall` (a CUDA graph per shape, eager on the CPU):
the target per number of new tokens, the draft's body and head as separate graphs, so phase times
can tell them apart, and the draft's prefill in chunks of a few graphed widths (model/prefill.py). The
target's prefill stays eager: it yields the first token, and one graph per prompt length would not pay.
The schedules themselves live in `model/schedules.py`.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from contracts import SCHEDULES, UsageError
from contracts.names import PHASES
from contracts.policies import Arm
from contracts.trees import CHAIN, TreeShape
from model import sampling, schedules
from model.draft_q_triton import DraftQ
from model.dynamic_tree import DynamicTreeRounds
from model.graphs import GraphedCall
from model.heads import DenseHead, heads_by_position
from model.prefill import GraphedPrefill, decoding_widths
from model.router_stream import SideStream
from model.sampling import GREEDY, SamplingSettings
from model.sampling_noise import SamplingNoise
from model.sampling_triton import BlockVerifier
from model.settle import RoundSettler
from model.step_heads import step_heads
from model.trace import Generation, Round
from model.tree_rounds import TreeRounds, check_tree, check_tree_precision, head_kind

EXACT_WIDTH = 8  # rows of every fixed-width target decode forward (more when K + 1 exceeds it)


def cache_room(prompt_len: int, new_tokens: int, K: int, nodes: int = 0) -> int:
    """Cache slots a generation may touch: the last round and a look-ahead run past the new tokens,
    and fixed-width dummies sit past the last real row (a tree of `nodes` nodes: K is its depth)."""
    return prompt_len + new_tokens + 2 * K + 3 + width(max(K, nodes))


def width(K: int) -> int:
    """Rows of a fixed-width target forward: the same for every K up to EXACT_WIDTH - 1, so the
    baseline's tokens do not depend on K."""
    return max(EXACT_WIDTH, K + 1)


class PhaseClock:
    """Per-round phase times, recorded without host syncs.

    Device phases (draft_body, draft_head, verify, finalize) are CUDA-event intervals on the
    phase's device, read once when the generation ends (perf_counter on the CPU). `sync` is the
    host's time materializing the round's read once the device work it waits for has finished.
    `other` is the rest of the round's host wall time (copies, bookkeeping, launch gaps); it is 0
    where device phases overlap (two GPUs), whose sum may then exceed the wall time. The host gap
    of a read is the host's time from the read's end to its next device phase: the Python work on
    the critical path, which every device waits for; each round records the gaps of its reads.

    `timeline` (needs `enabled`; off by default, and then nothing more is recorded): also keep where
    every interval lies on one clock, for `intervals()` (contracts.timeline): each device phase on its
    device's stream (`streams` names them), the host's time issuing it, its reads and its gaps, and
    the prefills, the draft's prefill and (two devices) the token copies, which the phases do not time.
    On GPU a device interval is a pair of CUDA events read against a reference event recorded on each
    device when the generation begins (`begin`: the devices idle, the host time at which it ran is
    known within microseconds); the host's intervals are perf_counter times. On the CPU every
    interval is perf_counter times.
    """

    def __init__(self, enabled: bool, timeline: bool = False, streams: dict | None = None):
        self.enabled = enabled
        self.rounds: list[dict[str, list]] = []
        self.marks: list[float] = []
        self.read_end: tuple[int, float] | None = None  # (round, perf_counter time) of the last read's end
        self.timeline = timeline
        self.streams = streams or {}  # device -> the stream name of its work on the timeline
        self.spans: list[tuple] = []  # timeline: (stream, name, device or None, start, end)
        self.references: dict = {}  # timeline: device -> CUDA event recorded when the generation began
        self.origins: dict = {}  # timeline: device -> the perf_counter time at which that event ran
        self.begun = False  # timeline: `begin` ran for this generation
        self.event_pool: dict = {}  # device -> timing events, reused by every generation (`recycle`)
        self.events_taken: dict = {}  # device -> how many of its pool this generation has taken

    @property
    def timeline(self) -> bool:
        return self._timeline

    @timeline.setter
    def timeline(self, on: bool) -> None:
        if on and not self.enabled:
            raise UsageError("a timeline needs the phase times (phases on)")
        self._timeline = bool(on)

    def recycle(self) -> None:
        """A generation begins: its phases take the pool's timing events again from the first. The last
        generation's were all waited for when it ended (`results`). Why: creating a CUDA event costs the host
        a few microseconds, and the first phase after a read is on the critical path."""
        self.events_taken = {}

    def _timing_events(self, device: torch.device) -> tuple:
        """The next two timing events of `device`'s pool (made the first time they are needed)."""
        pool = self.event_pool.setdefault(device, [])
        taken = self.events_taken.get(device, 0)
        while len(pool) < taken + 2:
            pool.append(torch.cuda.Event(enable_timing=True))
        self.events_taken[device] = taken + 2
        return pool[taken], pool[taken + 1]

    def begin(self) -> None:
        """Timeline: a generation begins (before its prefill), outside the timed windows. On each idle
        GPU a reference event is recorded and waited for; it ran halfway between the host's record call
        and the wait's return (within microseconds: the device does nothing else)."""
        self.spans, self.references, self.origins, self.begun = [], {}, {}, True
        for device in self.streams:
            if device.type == "cuda":
                torch.cuda.synchronize(device)
                event = torch.cuda.Event(enable_timing=True)
                stream = torch.cuda.current_stream(device)
                event.record(stream)  # the first record creates the CUDA event: not timed
                event.synchronize()
                before = time.perf_counter()
                event.record(stream)
                event.synchronize()
                self.origins[device] = (before + time.perf_counter()) / 2
                self.references[device] = event

    def span(self, name: str, device: torch.device):
        """Timeline only (a no-op context otherwise): time work that is no round phase on `device`."""
        return self._span(name, device) if self._timeline else nullcontext()

    @contextmanager
    def _span(self, name: str, device: torch.device) -> Iterator[None]:
        if device.type == "cuda":
            start, end = self._timing_events(device)
            stream = torch.cuda.current_stream(device)
            issued = time.perf_counter()
            start.record(stream)
            yield
            end.record(stream)
            self._spans(name, device, (start, end), (issued, time.perf_counter()))
        else:
            t0 = time.perf_counter()
            yield
            t1 = time.perf_counter()
            self._spans(name, device, (t0, t1), (t0, t1))

    def _spans(self, name: str, device: torch.device, work: tuple, issue: tuple) -> None:
        """Timeline: work on the device's stream and the host's time issuing it (on the CPU the host
        does the work: the same interval)."""
        self.spans.append((self.streams.get(device, "target-device"), name, device, *work))
        self.spans.append(("host", name, None, *issue))

    def reset(self, start: float) -> None:
        """A new generation whose decode phase started at perf_counter time `start`."""
        self.rounds, self.marks, self.read_end = [], [start], None

    def next_round(self) -> None:
        """Round boundaries: the first round's wall time runs from the decode start."""
        if self.rounds:
            self.marks.append(time.perf_counter())
        self.rounds.append({})

    @contextmanager
    def phase(self, name: str, device: torch.device) -> Iterator[None]:
        if not self.enabled:
            yield
            return
        if self.read_end is not None:  # the first launch after a read closes its host gap
            index, end = self.read_end
            now = time.perf_counter()
            self.rounds[index].setdefault("host_gap", []).append((now - end) * 1e3)
            self.read_end = None
            if self._timeline:
                self.spans.append(("host", "host_gap", None, end, now))
        if device.type == "cuda":
            stream = torch.cuda.current_stream(device)
            start, end = self._timing_events(device)
            issued = time.perf_counter() if self._timeline else None
            start.record(stream)
            yield
            end.record(stream)
            self.rounds[-1].setdefault(name, []).append((start, end))
            if self._timeline:
                self._spans(name, device, (start, end), (issued, time.perf_counter()))
        else:
            t0 = time.perf_counter()
            yield
            t1 = time.perf_counter()
            self.rounds[-1].setdefault(name, []).append((t1 - t0) * 1e3)
            if self._timeline:
                self._spans(name, device, (t0, t1), (t0, t1))

    def read(self, packed: torch.Tensor) -> list[int]:
        """The host sync of a round: wait for the device, then time the materialization alone."""
        if self.enabled and packed.is_cuda:
            done = torch.cuda.Event()
            done.record(torch.cuda.current_stream(packed.device))
            done.synchronize()
        t0 = time.perf_counter()
        values = packed.tolist()
        if self.enabled:
            self.read_end = (len(self.rounds) - 1, time.perf_counter())
            self.rounds[-1].setdefault("sync", []).append((self.read_end[1] - t0) * 1e3)
            if self._timeline:
                self.spans.append(("host", "sync", None, t0, self.read_end[1]))
        return values

    def intervals(self) -> list[tuple] | None:
        """Timeline: the generation's intervals (stream, name, start_ms, end_ms, args) in ms from its
        decode start (`marks[0]`); None without a timeline. Call after the generation's final read."""
        if not self._timeline or not self.begun or not self.marks:
            return None
        out = []
        for stream, name, device, start, end in self.spans:
            if device is not None and device.type == "cuda":
                end.synchronize()
                reference = self.references[device]
                shift = (self.origins[device] - self.marks[0]) * 1e3  # the reference event, from the decode start
                a, b = shift + reference.elapsed_time(start), shift + reference.elapsed_time(end)
            else:
                a, b = (start - self.marks[0]) * 1e3, (end - self.marks[0]) * 1e3
            out.append((stream, name, a, max(a, b), {}))
        return out

    def results(self, end: float) -> list[tuple[dict[str, float], float, int]] | None:
        """Per round: (phase totals in ms, host gap total in ms, gap count); `end` closes the last
        round (perf_counter time)."""
        if not self.enabled:
            return None
        walls = [(b - a) * 1e3 for a, b in zip(self.marks, self.marks[1:] + [end])]
        out = []
        for wall, recorded in zip(walls, self.rounds):
            phases = {p: sum(_ms(x) for x in recorded.get(p, ())) for p in PHASES if p != "other"}
            phases["other"] = max(0.0, wall - sum(phases.values()))
            gaps = recorded.get("host_gap", [])
            out.append((phases, sum(gaps), len(gaps)))
        return out


def _upload(values: list[int], device: torch.device) -> torch.Tensor:
    """A small host list on `device` without waiting for the device's queued work (pinned, async)."""
    host = torch.tensor(values, dtype=torch.long)
    return host.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else host


def _ms(interval) -> float:
    """A perf_counter duration, or a pair of CUDA events (waited for here, after the generation)."""
    if not isinstance(interval, tuple):
        return interval
    interval[1].synchronize()
    return interval[0].elapsed_time(interval[1])


@dataclass
class Proposals:
    """Draft proposals: tokens [n] and, when sampling, the draft's distributions q they were drawn
    from (None when greedy): q [n, V] over the vocabulary, or, from a head that scores N tokens
    (model/draft_q.py), q [n, N] over the token ids `scored` [n, N] (zero on every other token).
    Slicing and `.to` keep them together."""

    tokens: torch.Tensor
    probs: torch.Tensor | None = None
    scored: torch.Tensor | None = None

    def __getitem__(self, index: slice) -> Proposals:
        return Proposals(*(None if t is None else t[index] for t in self._fields()))

    def to(self, device: torch.device, non_blocking: bool = False) -> Proposals:
        return Proposals(*(None if t is None else t.to(device, non_blocking=non_blocking) for t in self._fields()))

    def _fields(self) -> tuple:
        return self.tokens, self.probs, self.scored

    def numel(self) -> int:
        return self.tokens.numel()

    def q_of_tokens(self, count: int) -> torch.Tensor:
        """q_i(d_i) [count] of the first `count` proposals (exact: the scored row holds d_i once)."""
        drafted = self.tokens[:count].view(-1, 1)
        if self.scored is None:
            return self.probs[:count].gather(1, drafted)[:, 0]
        return torch.where(self.scored[:count] == drafted, self.probs[:count], 0.0).sum(dim=1)


@dataclass
class HostRound:
    """What the host knows of a round when it is issued; the accepted counts come at the end."""

    proposed: int
    verify_skipped: bool = False
    lookahead_used: bool | None = None
    drafter: str | None = None  # with a policy (model/drafting.py): the round's drafter
    nodes: int | None = None  # a tree round: the nodes drafted and verified


@dataclass
class Run:
    """One generation's device state and what the host knows about it."""

    prompt_len: int
    max_new: int
    first: int  # the first token (read for TTFT)
    out: torch.Tensor  # [max_new + K + 2] on the target device: emitted tokens, the first one first
    n: torch.Tensor  # [1] tokens emitted so far
    eos: torch.Tensor  # [1] bool: an emitted token was EOS
    accepted: torch.Tensor  # [max_new] accepted count of each round (0 for baseline)
    cursor: torch.Tensor  # [3] prev, f, p on the target device
    draft_cursor: torch.Tensor  # the same, as the draft device last received it
    least: int = 1  # host bounds on the device counter n after the rounds issued so far
    most: int = 1
    certain: bool = True  # the host read n and the EOS flag after the last round issued
    eos_seen: bool = False
    verify_calls: int = 0
    append_calls: int = 0
    pending: torch.Tensor | None = None  # ordinary schedules: the target's pending next token t*
    rounds: list[HostRound] = field(default_factory=list)
    prompt: torch.Tensor | None = None  # [P] on the target device (prompt lookup searches it)
    cached: dict = field(default_factory=dict)  # model drafter -> its cache's valid positions (Decoder.drafted)
    moves: torch.Tensor | None = None  # tree rounds: the last round's cache moves [3, depth] (docs/design.md)
    chain_round: bool = False  # a tree decoder's round that verifies a used look-ahead's chain (pipelined-deferred)

    def more(self) -> bool:
        """Whether another round is needed (`Decoder.resolve` has made the bounds decisive)."""
        return self.least < self.max_new and not self.eos_seen

    def issued(self, fewest: int, most: int) -> None:
        """A round was issued that emits `fewest` .. `most` tokens."""
        self.least, self.most, self.certain = self.least + fewest, self.most + most, False

    def known(self, n: int, eos: int) -> None:
        """The host read the counter and the EOS flag."""
        self.least, self.most, self.eos_seen, self.certain = n, n, bool(eos), True


class Decoder:
    """Decoding of `target`, alone (baseline) or speculatively with `draft`: greedy, or exact
    speculative sampling with `sampling` (a SamplingSettings with temperature > 0).

    target, draft: `Transformer`s with static caches set up, on their devices (two devices make the
    `pipelined` schedules overlap). The target always picks tokens with its dense head; the draft
    with `draft_head` (any head of model/heads.py; a PositionalHead gives each draft position its own
    head and graph: a round's step i uses position i, a look-ahead's step i position max(0, i - 1),
    since its first token guesses the bonus token and the rest become the next round's). `control`
    (an AcceptanceControl on the draft device) replaces the draft's proposals. `graphs` captures
    every step as a CUDA graph up front. `router_side_stream` (default on) runs a router head's
    cluster choice on a second stream beside the draft body (model/router_stream.py); off, after it.

    `events`: a list to log the generation's events into (None, the default: no log). One entry
    per operation, in host issue order, `(name, stream, tokens)` (contracts.names.EVENTS and
    docs/contracts.md, "Schedule event order"): `draft_step` on the draft stream with the tokens it
    feeds, `copy_tokens` on the source device's stream with the tokens copied (only where a real
    cross-device copy happens: the devices differ), `sync` on the target stream (a host read, which
    waits for everything queued there), `verify` / `append` on the target stream with the new tokens.
    Prefill is not logged; the reads and the append at the end of a generation are. The simulator
    logs the same sequence for the same rounds (tests/test_schedule_parity.py).

    `timeline` (off by default; needs `phases`; `clock.timeline` switches it per generation): each
    generation also returns where its work lay on one clock (`Generation.timeline`, the intervals of
    contracts.timeline: the device phases per device stream, the host's issue times, reads and gaps,
    the prefills, and the token copies between two devices). Off, nothing more is recorded.

    `tensor_parallel` (a model.tensor_parallel.TensorParallel; None by default): `target` is this rank's
    shard and every rank runs the same generations in lockstep; proposals reach the target through a
    broadcast from the draft rank (the other ranks' `draft` is a stand-in).

    `fixed_width` (default: on for CUDA) runs every target decode forward (baseline step, append,
    verify) over the same number of rows, `width()`: the real tokens, then dummy ones. GPU kernels
    pick their arithmetic by shape, so a token's bf16 logits from a 1-token forward and from a
    7-token verify can differ in the last bit and flip a near-tie; at one fixed width every token
    is computed by the same kernels whichever forward carries it, which is what makes speculative
    output equal target-only greedy token for token on the GPU. The dummy rows sit after the real
    ones, so the real rows never attend to them, and later forwards overwrite their cache slots.
    `min_rows` widens that width (validate runs every decoder of a validation at its profile's width).
    """

    def __init__(
        self,
        target,
        draft=None,
        draft_head=None,
        *,
        K: int = 6,
        graphs: bool = True,
        control=None,
        phases: bool = True,
        eos_id: int | None = None,
        stop_at_eos: bool = False,
        fixed_width: bool | None = None,
        events: list | None = None,
        timeline: bool = False,
        drafting=None,
        tensor_parallel=None,
        sampling: SamplingSettings = GREEDY,
        tree: TreeShape = CHAIN,
        min_rows: int = 0,
        router_side_stream: bool = True,
    ):
        check_tree(tree, (), head_kind(draft_head), drafting is None and tensor_parallel is None)
        if tree.kind != "chain":
            K = tree.depth  # a tree round is a chain round of K = depth steps, verifying every node
        if K < 1:
            raise UsageError(f"K must be >= 1 (draft tokens per round), got {K}")
        if draft is not None and draft_head is None:
            raise UsageError("a draft model needs a draft head (model/heads.py)")
        if not sampling.greedy and (drafting is not None or tensor_parallel is not None):
            raise UsageError(
                "sampling runs with the draft model at a fixed K on one or two devices (no drafting, no tpN)"
            )
        self.target, self.draft, self.draft_head, self.control, self.K = target, draft, draft_head, control, K
        self.target_device = target.head_weight.device
        check_tree_precision(tree, self.target_device.type, target.head_weight.dtype, target.kernels)
        self.draft_device = draft.head_weight.device if draft is not None else self.target_device
        self.target_head = DenseHead(target.head_weight)
        self.sampling = sampling
        self.verifier = None if sampling.greedy else BlockVerifier(self.target_device)
        # sampling: the generation's seed on each device (fixed addresses, for graphs)
        self.seed_on_target = torch.zeros(1, dtype=torch.long, device=self.target_device)
        self.seed_on_draft = self.seed_on_target.to(self.draft_device)
        self.vocab_size = target.head_weight.shape[0]
        # the random numbers and the draft's race (model/sampling_noise.py: a few kernels on a GPU)
        self.noise_on_target = SamplingNoise(self.target_device, self.vocab_size)
        self.noise_on_draft = SamplingNoise(self.draft_device, self.vocab_size)
        # the draft's q (model/draft_q_triton.py: three launches on a GPU)
        self.draft_q = None if sampling.greedy else DraftQ(self.draft_device, sampling)
        self.eos_id = eos_id if stop_at_eos else None
        self.settler = RoundSettler(self.target_device, self.eos_id)  # one launch on a GPU (model/settle.py)
        self.events = events
        self.tensor_parallel = tensor_parallel
        # on one device its one stream is the target's (as the simulator's one resource)
        streams = {self.draft_device: "draft-device", self.target_device: "target-device"}
        self.clock = PhaseClock(phases, timeline, streams)
        use_width = self.target_device.type == "cuda" if fixed_width is None else fixed_width
        self.tree = tree
        # the tree mask lives in the one-pass attention: a tree decoder's reference and verify both use it,
        # chosen per forward so that a chain decoder on the same target keeps its split-KV attention
        self.split_kv = tree.kind == "chain"
        own_rows = width(max(K, tree.node_count if tree.kind != "chain" else 0))
        self.rows = max(own_rows, min_rows) if use_width else None
        self.positions = torch.arange(max(K + 2, self.rows or 0, tree.node_count + 1), device=self.target_device)
        self.positions_on_draft = self.positions.to(self.draft_device)
        # a used look-ahead of a K-token block moves the draft's cursor K + 1 on (per K: a policy varies it)
        self.past_lookahead = {k: torch.tensor([0, 0, k + 1], device=self.draft_device) for k in range(1, K + 1)}
        self._target = GraphedCall(self._target_fn, enabled=graphs)
        self._body = GraphedCall(self._body_fn, enabled=graphs)
        heads = heads_by_position(draft_head) if draft_head is not None else []
        # sampling: q's width per draft step (None: over the vocabulary), and a zeroed [K, V] row
        # buffer into which `_dense_q` scatters a round's scored q for the verify, and clears it after
        scored = not sampling.greedy and not all(isinstance(head, DenseHead) for head in heads)
        self.q_width = max(head.scored_width for head in heads) if scored else None
        self._q_rows = torch.zeros(K, self.vocab_size, device=self.target_device) if scored else None
        slots = control.slots(K) if control is not None else 1
        if slots > 1 and (not sampling.greedy or tree.kind != "chain"):
            raise UsageError(
                f"acceptance control {control.spec}: a rate per draft position runs greedy chain rounds only"
            )
        side = SideStream(self.draft_device) if router_side_stream else None  # router heads choose beside the body
        self._heads = step_heads(heads, self._head_fn, graphs, slots, side)
        # each model drafter's (body, heads by draft position, device, stream); `drafting`
        # (model/drafting.Drafting) adds the early-exit draft, prompt lookup and the policy that picks each round's arm
        self.steppers = {"draft-model": (self._body, self._heads, self.draft_device, "draft")}
        self.drafting = drafting.attach(self, graphs) if drafting is not None else None
        rounds = DynamicTreeRounds if tree.kind == "dynamic" else TreeRounds
        self.trees = rounds(self, tree, graphs) if tree.kind != "chain" and draft is not None else None
        if self.trees is not None:  # a tree round's look-ahead (pipelined-deferred): tree attention, the same heads
            self.steppers["tree-lookahead"] = (self.trees.ahead.body, self._heads, self.draft_device, "draft")
        self.graphs = graphs and self.target_device.type == "cuda"
        if draft is not None:
            self.draft_prefill = GraphedPrefill(draft, self.draft_device, decoding_widths(self.draft_device, graphs))
        if self.graphs:
            self._capture()

    # --- step functions (graph-captured) ----------------------------------------------------------
    def _target_fn(self, tokens: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
        """tokens [1, n] at positions start.. -> the target's argmax after each of them [n] (greedy),
        or its distribution after each of them [n, V] (sampling)."""
        n = tokens.shape[1]
        if self.rows:
            tokens = F.pad(tokens, (0, self.rows - n))
        hidden = self.target.forward_hidden(tokens, start + self.positions[: tokens.shape[1]], split_kv=self.split_kv)
        return self._pick(hidden[0, :n])

    def _pick(self, hidden: torch.Tensor) -> torch.Tensor:
        """The target head's greedy tokens [n], or its distributions [n, V] when sampling."""
        if self.sampling.greedy:
            return self.target_head.argmax(hidden)
        return sampling.probabilities(self.target_head.logits(hidden), self.sampling)

    def target_forward(self, tokens: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
        """The target decode step exactly as the schedules run it (graph, fixed width): for measure."""
        return self._target(tokens, start)

    def _body_fn(self, tokens: torch.Tensor, start: torch.Tensor):
        """Draft body over tokens [1, n] at start.. -> (last hidden [1, d], position of the next token)."""
        n = tokens.shape[1]
        hidden = self.draft.forward_hidden(tokens, start + self.positions_on_draft[:n])
        return hidden[0, -1:], start + n

    def _head_fn(self, hidden: torch.Tensor, pos: torch.Tensor, fed: torch.Tensor, head, slot: int = 0):
        """The proposal for position `pos` by `head` (`fed` [1, 1]: the last token the body was fed
        this step, which the router head reads): its argmax (greedy), or (token [1], q [1, N], the
        token ids [1, N] of q's slots or None where N is the vocabulary) with the token drawn from q by
        the race on the draft noise keyed at `pos` (sampling; model/draft_q.py, on a GPU its kernels in
        model/draft_q_triton.py). `slot`: the draft position whose rate a per-position acceptance
        control applies."""
        if self.sampling.greedy:
            token = head.argmax(hidden, fed)
            return token if self.control is None else self.control.propose(token, pos, slot)
        scored, logits = head.scored_logits(hidden, fed)
        q = self.draft_q(logits, scored)
        return self.noise_on_draft.draw(q, self.seed_on_draft, pos, scored), q, scored

    def _capture(self) -> None:
        """Capture every graph the schedules use now, before anything is timed. Dummy steps write
        cache slots that every generation's prefill and decode rewrite before reading."""
        start = torch.zeros(1, dtype=torch.long, device=self.target_device)
        for n in sorted({1, self.K, self.K + 1}):
            self._target(torch.zeros(1, n, dtype=torch.long, device=self.target_device), start)
        if self.draft is not None:
            self.draft_prefill.capture()
            for n in (1, 2):
                tokens = torch.zeros(1, n, dtype=torch.long, device=self.draft_device)
                hidden, pos = self._body(tokens, start.to(self.draft_device))
                for head in self._heads:
                    head.capture(hidden, pos, tokens[:, -1:])
        if self.drafting is not None:
            self.drafting.capture()
        if self.trees is not None:
            self.trees.capture()
        for device in {self.target_device, self.draft_device}:
            torch.cuda.synchronize(device)

    # --- a generation ---------------------------------------------------------------------------
    def generate(self, prompt_ids: list[int], max_new_tokens: int, schedule: str, sample: int = 0) -> Generation:
        """Decode up to `max_new_tokens` tokens (the first included) after the prompt with `schedule`.
        Sampling: `sample` picks the generation's random numbers (sampling.generation_seed)."""
        if schedule not in schedules.RUNNERS:
            raise UsageError(f"unknown schedule {schedule!r}; valid: {', '.join(SCHEDULES)}")
        if schedule != "baseline" and self.draft is None:
            raise UsageError(f"schedule {schedule} needs a draft model")
        if self.drafting is not None and schedule != "baseline":
            self.drafting.check(schedule)
        check_tree(self.tree, (schedule,))
        if max_new_tokens < 1 or not prompt_ids:
            raise UsageError("need a non-empty prompt and max_new_tokens >= 1")
        self._check_room(len(prompt_ids), max_new_tokens)
        if not self.sampling.greedy:
            seed = sampling.generation_seed(self.sampling.seed, sample)
            self.seed_on_target.fill_(seed)
            self.seed_on_draft.fill_(seed)
        self.clock.recycle()
        if self.clock.timeline:
            self.clock.begin()
        t0 = time.perf_counter()
        run = self._prefill(prompt_ids, max_new_tokens, speculative=schedule != "baseline")
        schedules.RUNNERS[schedule](self, run)
        tokens, accepted = self._final_read(run)
        end = time.perf_counter()
        first = self.clock.marks[0]
        generation = self._generation(
            run, tokens, accepted, (first - t0) * 1e3, (end - first) * 1e3, self.clock.results(end)
        )
        if self.clock.timeline:
            generation.timeline = self.clock.intervals()
        if not self.sampling.greedy:
            generation.sample = sample
        return generation

    def reference(self, prompt_ids: list[int], length: int, sample: int = 0) -> list[int]:
        """The target's own continuation (`length` tokens, the first one first), timing discarded:
        greedy, or sampled with the random numbers of `sample`."""
        return self.generate(prompt_ids, length, "baseline", sample).tokens

    def _check_room(self, prompt_len: int, max_new: int) -> None:
        nodes = max(self.tree.node_count if self.trees is not None else 0, (self.rows or 1) - 1)
        need = cache_room(prompt_len, max_new, self.K, nodes)
        models = [self.target] + ([self.draft] if self.draft is not None else [])
        have = min(m.max_seq_len for m in models)
        if need > have:
            raise UsageError(
                f"a {prompt_len}-token prompt with {max_new} new tokens and K={self.K} needs "
                f"{need} cache slots, the models have {have}"
            )

    def _prefill(self, prompt_ids: list[int], max_new: int, speculative: bool) -> Run:
        """Prefill and the first token (TTFT), then the decode state with f = the first token.

        The draft's prefill overlaps the target's on two devices; on one device it is queued after
        the first token, so TTFT is the target's alone in both (as the simulator models it). A draft
        model that no arm drafts with is not prefilled. No cross-device copy here: PyTorch's copy
        between GPUs waits for both devices' queued work."""
        P = len(prompt_ids)
        with_draft = speculative and (self.drafting is None or self.drafting.policy.plays("draft-model"))
        prompt = torch.tensor(prompt_ids, dtype=torch.long, device=self.target_device).view(1, -1)
        prompt_d = (
            torch.tensor(prompt_ids, dtype=torch.long, device=self.draft_device).view(1, -1) if with_draft else None
        )
        with self.clock.span("prefill", self.target_device):
            positions = torch.arange(P, device=self.target_device)
            hidden = self.target.forward_hidden(prompt, positions, split_kv=self.split_kv)
            first = self._pick(hidden[0, -1:])
            if not self.sampling.greedy:  # the first token: the race noise of the round at the prompt's end
                first = sampling.race(first, self._race_noise(torch.tensor([P - 1], device=self.target_device)))
        if speculative and self.drafting is not None:
            self.drafting.prefill(prompt, P)
        overlap = with_draft and self.draft_device != self.target_device
        if overlap:
            with self.clock.span("initial", self.draft_device):
                self.draft_prefill(prompt_d)
        first_token = first.item()  # the first token reaches the host: TTFT ends, decoding starts
        self.clock.reset(time.perf_counter())
        if with_draft and not overlap:
            with self.clock.span("initial", self.draft_device):
                self.draft_prefill(prompt_d)
        cursor = [prompt_ids[-1], first_token, P]
        out = torch.zeros(max_new + self.K + 2, dtype=torch.long, device=self.target_device)
        out[:1] = first
        zero = torch.zeros(1, dtype=torch.long, device=self.target_device)
        accepted = torch.zeros(max_new, dtype=torch.long, device=self.target_device)
        return Run(
            P,
            max_new,
            first_token,
            out,
            zero + 1,
            zero.bool(),
            accepted,
            _upload(cursor, self.target_device),
            _upload(cursor, self.draft_device),
            prompt=prompt[0],
        )

    def _final_read(self, run: Run) -> tuple[list[int], list[int]]:
        """One read at the end: the tokens (cut at max_new, and after EOS when stopping there) and
        the accepted count of every round."""
        n, rounds = min(run.least, run.max_new), len(run.rounds)
        if rounds:
            self._event("sync", "target")
        values = self.clock.read(torch.cat([run.out[:n], run.accepted[:rounds]])) if rounds else [run.first]
        tokens, accepted = values[:n], values[n:]
        if self.eos_id is not None and self.eos_id in tokens:
            tokens = tokens[: tokens.index(self.eos_id) + 1]
        return tokens, accepted

    def _generation(self, run: Run, tokens, accepted, ttft_ms, decode_ms, phases) -> Generation:
        """Host records: emitted = accepted + 1, cut on the last round to the tokens kept."""
        rounds, emitted_before, remaining = [], 1, len(tokens) - 1
        for index, (acc, host) in enumerate(zip(accepted, run.rounds)):
            emitted = min(acc + 1, remaining)
            timed, gap_ms, gaps = phases[index] if phases else (None, None, None)
            rounds.append(
                Round(
                    host.proposed,
                    acc,
                    emitted,
                    host.verify_skipped,
                    run.prompt_len + emitted_before,
                    host.lookahead_used,
                    timed,
                    gap_ms,
                    gaps,
                    host.drafter,
                    None if host.nodes is None else self.tree.label,
                    host.nodes,
                )
            )
            emitted_before += acc + 1
            remaining -= emitted
        return Generation(tokens, rounds, ttft_ms, decode_ms, run.verify_calls, run.append_calls)

    # --- operations the schedules issue, named as in docs/contracts.md -----------------------------
    @property
    def copies(self) -> bool:
        """Whether `to_target` / `to_draft` copy between devices (two devices): only then are they
        logged, since on one device `.to()` is a no-op (and the simulator charges no copy)."""
        return self.draft_device != self.target_device

    def _event(self, name: str, stream: str, tokens: int | None = None) -> None:
        """Log one event when the log is on (host-known values only: logging never syncs)."""
        if self.events is not None:
            self.events.append((name, stream, tokens))

    def begin_round(self, run: Run, proposed: int, drafter: str | None = None, chain: bool = False) -> HostRound:
        """`chain`: the round verifies a used look-ahead's chain (a tree decoder then verifies K nodes)."""
        self.clock.next_round()
        run.chain_round = chain and self.trees is not None
        nodes = (self.K if run.chain_round else self.trees.nodes) if self.trees is not None and proposed else None
        run.rounds.append(HostRound(proposed, drafter=drafter, nodes=nodes))
        return run.rounds[-1]

    def draft_steps(
        self, tokens: torch.Tensor, start: torch.Tensor, steps: int, drafter: str = "draft-model", shift: int = 0
    ) -> Proposals:
        """`steps` draft steps (body, then head) of a model drafter from tokens [1, n] at start..;
        proposals [steps] on the drafter's device (with their q when sampling: `Proposals`). Step i uses
        the head of draft position max(0, i + shift); a look-ahead's first step (shift -1) guesses the token
        after the block, draft position K + 1 to an acceptance control (its slot)."""
        body, heads, device, stream = self.steppers[drafter]
        proposals = Proposals(torch.empty(steps, dtype=torch.long, device=device))
        if self.q_width is not None:  # scored q: a head scoring fewer than q_width slots leaves zeros (token 0, q 0)
            proposals.probs = torch.zeros(steps, self.q_width, device=device)
            proposals.scored = torch.zeros(steps, self.q_width, dtype=torch.long, device=device)
        elif not self.sampling.greedy:
            proposals.probs = torch.empty(steps, self.vocab_size, device=device)
        for i in range(steps):
            self._event("draft_step", stream, tokens.shape[1])
            head = heads[min(max(0, i + shift), len(heads) - 1)]
            with self.clock.phase("draft_body", device):
                head.before_body(tokens)  # a router's cluster choice, beside the body
                hidden, start = body(tokens, start)
            with self.clock.phase("draft_head", device):
                token = head(hidden, start, tokens[:, -1:], i + shift if i + shift >= 0 else steps - 1)
                if proposals.probs is not None:  # sampling: (token, q, its token ids or None)
                    token, q, scored = token
                    proposals.probs[i : i + 1, : q.shape[1]] = q
                    if scored is not None:
                        proposals.scored[i : i + 1, : q.shape[1]] = scored
                proposals.tokens[i : i + 1] = token
            tokens = token.view(1, 1)
        return proposals

    def propose(self, run: Run, arm: Arm | None = None) -> Proposals:
        """K draft steps from f. The first step feeds the tokens the draft's cache lacks (`missed`): f, or
        [prev, f] (re-feeding a token already fed is harmless). Other arms (another drafter, another K)
        are proposed by `drafting` (model/drafting.py)."""
        if arm is not None and self.drafting is not None:
            return self.drafting.propose(run, arm)
        if self.trees is not None:
            return Proposals(self.trees.propose(run))
        return self.steps_from_cursor(run.draft_cursor, self.missed(run, "draft-model"), self.K)

    def steps_from_cursor(self, cursor: torch.Tensor, fed: int, K: int, drafter: str = "draft-model") -> Proposals:
        """K draft steps whose first feeds the last `fed` (1 or 2) tokens of a cursor (prev, f, p): f at p.
        (One fed token starts at p itself: no subtraction launched on the round's critical path.)"""
        start = cursor[2:3] if fed == 1 else cursor[2:3] - (fed - 1)
        return self.draft_steps(cursor[2 - fed : 2].view(1, fed), start, K, drafter)

    def missed(self, run: Run, drafter: str) -> int:
        """How many tokens a model drafter's first step of the round feeds, f the last: those its cache
        lacks (`drafted`). At least [prev, f] where the host has not read the last round's outcome
        (ordinary rounds: no `drafted`), after a fully accepted block whose last token no look-ahead fed, and
        in a tree round (its root step re-feeds prev); more for a drafter idle since an earlier round.
        Why it pays: a Qwen3-0.6B step of 1 token runs the persistent kernel (0.65 ms on an H200), one of
        2 the fused kernels (0.85; docs/design.md, "The speculative round and its schedules")."""
        context = run.prompt_len + run.least
        return max(1 if self.trees is None else 2, context - run.cached.get(drafter, context - 2))

    def drafted(self, run: Run, arm: Arm, context: int, accepted: int, fed_last: bool) -> None:
        """After a deferred round's read: a model drafter's cache holds f and the proposals it fed that were
        accepted, the block's last one only when `fed_last` (a look-ahead fed it)."""
        if arm.drafter != "prompt-lookup":
            run.cached[arm.drafter] = context + (accepted if fed_last else min(accepted, arm.K - 1))

    def lookahead(self, run: Run, block_on_draft: Proposals) -> Proposals:
        """K+1 draft steps past the block being verified: e1 (the bonus guess), then e2..e(K+1) (a tree
        round: past its guessed path, model/tree_lookahead.py)."""
        if self.trees is not None and not run.chain_round:
            return self.trees.lookahead(run, block_on_draft.tokens)
        K = block_on_draft.numel()
        return self.draft_steps(block_on_draft.tokens[-1:].view(1, 1), run.draft_cursor[2:3] + K, K + 1, shift=-1)

    def to_target(self, x: Proposals) -> Proposals:
        """copy_tokens to the target device (when sampling, the proposals' q travel with them). A
        cross-GPU copy orders both devices' streams with CUDA events (PyTorch's two-way barrier), so
        no host sync is involved: the copy runs on the source (draft) device's stream after the work
        queued on the target device, and the target device's later work waits for it. (A peer copy
        also waits for the kernels running on the target, even when the stream PyTorch's barrier takes
        there has nothing queued: docs/decoder-speed.md, "Decoder speed: short first splits, and session 27's
        routes".) On one device `.to()` is a no-op, and no copy is logged. A tensor-parallel target
        (model/tensor_parallel.py) gets the draft rank's proposals on every rank (a broadcast)."""
        if self.tensor_parallel is not None:
            moved = x.to(self.target_device, non_blocking=True)
            return Proposals(*(None if t is None else self.tensor_parallel.share(t) for t in moved._fields()))
        if self.copies:
            self._event("copy_tokens", "draft", x.numel())
            with self.clock.span("copy_tokens", self.draft_device):  # on the source's stream
                if self.trees is not None:  # a dynamic tree round's tables travel with its nodes
                    self.trees.send_tables(x.tokens)
                return x.to(self.target_device, non_blocking=True)
        return x.to(self.target_device, non_blocking=True)

    def cursor_to_draft(self, run: Run) -> torch.Tensor:
        """copy_tokens of the cursor (prev, f, p) to the draft device. A deferred round of a chain decoder
        issues it before its read, so that it runs as soon as the round is settled on the target;
        `to_draft` takes it after the read."""
        return self._copy_to_draft(run.cursor)

    def to_draft(self, run: Run, copied: torch.Tensor | None = None) -> None:
        """The cursor to the draft device: `copied` (`cursor_to_draft`'s, issued before the read) or a
        copy now; a tree decoder's cursor and round's cache moves travel in one copy, and the draft's
        cache is cropped."""
        if self.trees is not None:  # the cursor and the round's cache moves travel in one copy
            packed = self._copy_to_draft(torch.cat([run.cursor, run.moves.view(-1)]))
            run.draft_cursor = packed[:3]
            with self.clock.phase("finalize", self.draft_device):  # the crop of the draft's cache
                self.trees.to_draft(run, packed[3:].view(3, -1))
            return
        run.draft_cursor = self.cursor_to_draft(run) if copied is None else copied

    def _copy_to_draft(self, values: torch.Tensor) -> torch.Tensor:
        """copy_tokens of target-device values to the draft device: on the target device's stream, with
        the same two-way barrier as `to_target` (logged and timed on two devices only)."""
        if self.copies:
            self._event("copy_tokens", "target", values.numel())
            with self.clock.span("copy_tokens", self.target_device):  # on the source's stream
                return values.to(self.draft_device, non_blocking=True)
        return values.to(self.draft_device, non_blocking=True)

    def verify(self, run: Run, tokens: torch.Tensor, start: torch.Tensor, standalone: bool = False) -> torch.Tensor:
        """One target forward over tokens [n] at start..; the target's argmax after each [n] (its
        distributions [n, V] when sampling).
        `standalone` counts it as an append call (the study's accounting of baseline forwards)."""
        if standalone:
            run.append_calls += 1
        else:
            run.verify_calls += 1
        self._event("append" if standalone else "verify", "target", tokens.numel())
        with self.clock.phase("verify", self.target_device):
            if self.trees is not None and not standalone and not run.chain_round:
                return self.trees.verify(tokens, start)
            return self._target(tokens.view(1, -1), start)

    def append(self, run: Run) -> torch.Tensor:
        """The standalone one-token target forward over f; returns t* (its distribution p_1 [1, V]
        when sampling; cloned: graph outputs are overwritten by the next replay, and t* must outlive
        the next verify)."""
        run.append_calls += 1
        self._event("append", "target", 1)
        with self.clock.phase("finalize", self.target_device):
            return self._target(run.cursor[1:2].view(1, 1), run.cursor[2:3]).clone()

    def first_accepted(self, run: Run, drafts: Proposals) -> torch.Tensor:
        """The ordinary schedules' skip test of d1 against the pending t* ([1] bool on the target
        device): greedy, d1 == t*; sampling, the rejection test of d1 against the standalone append's
        distribution p_1 with the accept number of d1's position: exactly the test `settle` repeats
        at position 1, so a skipped verify is a round that accepts nothing."""
        if self.trees is not None:
            return self.trees.first_accepted(run, drafts.tokens)
        if self.sampling.greedy:
            return drafts.tokens[:1] == run.pending
        d1 = drafts.tokens[:1].view(1, 1)
        u1 = self._accept_uniforms(run, 1)
        return u1 * drafts.q_of_tokens(1) < run.pending.gather(1, d1)[:, 0]

    def _accept_uniforms(self, run: Run, drafted: int) -> torch.Tensor:
        """The accept numbers [drafted] of the positions p+1.. after f (at p); acceptance control
        replaces them (after computing them: their cost stays) by its pattern's 0 or +inf."""
        positions = run.cursor[2:3] + 1 + self.positions[:drafted]
        uniforms = self.noise_on_target.uniforms(self.seed_on_target, positions, sampling.ACCEPT, 1)[:, 0]
        return uniforms if self.control is None else self.control.accept_numbers(positions)

    def _race_noise(self, at: torch.Tensor) -> torch.Tensor:
        """The race noise [V] of the round whose f is at position `at` [1]: it draws the round's final token."""
        return self.noise_on_target.exponentials(self.seed_on_target, at, sampling.RACE, self.vocab_size)[0]

    def settle(self, run: Run, seq: torch.Tensor, preds: torch.Tensor, drafts: Proposals | None = None):
        """Accept and emit on the device. seq = [f, d1..dk]. Greedy: preds[i] = the target's token
        after seq[i]; accepted a = leading matches of d with preds, the new f = preds[a]. Sampling:
        preds [k+1, V] = the target's distributions, drafts' q = those of d1..dk (None: the baseline), and
        the round's verification (`self.verifier`: the fused kernel of model/sampling_triton.py on a
        GPU, its torch reference elsewhere, bit-identical) decides a and f with its random numbers. `self.settler`
        (model/settle.py: one launch on a GPU) then emits the block and moves the cursor to f at p + a + 1 (both
        caches are thereby cropped). Returns (a, f) as [1] tensors."""
        if self.trees is not None and seq.numel() > 1 and not run.chain_round:
            return self.trees.settle(run, seq, preds)
        if self.trees is not None:  # a chain round of a tree decoder: its tokens are in place in both caches
            run.moves = self.trees.chain_moves(run.cursor[2:3])
        drafted = seq.numel() - 1
        verdict = None  # greedy: the settle computes (a, f) from preds
        if not self.sampling.greedy:
            draft_probs = preds[:0] if drafts is None else self._dense_q(drafts)  # the baseline: no draft tokens
            accept = self._accept_uniforms(run, drafted)
            verify = self.verifier if drafted else sampling.verify_block_reference  # the kernel needs K >= 1
            verdict = verify(preds, draft_probs, seq[1:], accept, self._race_noise(run.cursor[2:3]))
            if drafts is not None and drafts.scored is not None:  # leave the row buffer zeroed
                draft_probs.scatter_(1, drafts.scored, 0.0)
        index = len(run.rounds) - 1
        a, f, run.cursor = self.settler(seq, preds, verdict, run.out, run.n, run.eos, run.accepted, index, run.cursor)
        return a, f

    def _dense_q(self, drafts: Proposals) -> torch.Tensor:
        """q [k, V] of the k proposals, as the verify reads it: a scored q is scattered into the zeroed
        row buffer (a repeated or padding slot adds its 0), which `settle` clears again after the verify."""
        if drafts.scored is None:
            return drafts.probs
        return self._q_rows[: drafts.numel()].scatter_add_(1, drafts.scored, drafts.probs)

    def lookahead_valid(self, run: Run, a: torch.Tensor, f: torch.Tensor, ahead: Proposals) -> torch.Tensor:
        """Whether a round's look-ahead holds for what was emitted: the whole block (a tree round: the
        guessed path) accepted, and the final token (sampled, when sampling) equal to e1."""
        guessed = self.trees.guessed if self.trees is not None and not run.chain_round else a == ahead.numel() - 1
        return guessed & (f == ahead.tokens[:1])

    def past_lookahead_of(self, run: Run, K: int) -> None:
        """A used look-ahead: the draft already stands past it (a tree round's guessed path and
        look-ahead tokens move into place in its cache first)."""
        if self.trees is not None and not run.chain_round:
            self.trees.lookahead_into_place()
        run.draft_cursor = run.draft_cursor + self.past_lookahead[K]

    def read(self, *values: torch.Tensor) -> list[int]:
        """The round's one host sync: one packed read of small target-device values (it waits for
        everything queued on the target device)."""
        self._event("sync", "target")
        return self.clock.read(torch.cat([v.view(-1).long() for v in values]))

    def resolve(self, run: Run) -> None:
        """End of a round: when the host cannot tell whether the generation is over (the ordinary
        schedules learn the counter a round late; EOS may come anywhere), it reads the counter."""
        if not run.certain and run.least < run.max_new and (run.most >= run.max_new or self.eos_id is not None):
            run.known(*self.read(run.n, run.eos))
