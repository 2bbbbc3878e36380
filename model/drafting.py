"""The arms a decoder can play each round (drafter, K), and the policy that picks them.

Three drafters propose a block of K tokens; verification is the same for all, so the output is the
target's greedy output whichever proposes:
- `draft-model`: the decoder's draft model, on the draft device (the proposals are copied over);
- `early-exit`: the target's first L layers, its final norm and its head (model/early_exit.py), on the
  target's device; it shares the target's weights but keeps its own KV cache;
- `prompt-lookup`: the tokens that followed an earlier occurrence of the context's last n-gram
  (model/prompt_lookup.py), searched on the target device with no host sync; with synthetic weights a
  LookupControl (model/lookup_control.py) then sets, in the same graph, which of them the target accepts.
A model drafter that sat out some rounds first feeds every token its cache missed (from the output
buffer, where the host knows how many there are), so its proposals condition on the true context. It
feeds them in forwards of the widths of contracts.policies.catch_up_widths, whose graphs `capture`
takes with the decoder's: a graph captured during a generation costs some twenty draft steps.

The policy (contracts.policies) sees, after each round, the arm played, the tokens emitted and the
host's time from the round's start to its read. Policies run on the deferred schedules only
(contracts.names.POLICY_SCHEDULES): they read each round's accepted count at its end, where the
ordinary schedules learn it a round late. Only the draft model looks ahead (pipelined-deferred):
the other drafters share the target's device, so there is nothing to overlap.
"""

from __future__ import annotations

import time

import torch

from contracts import UsageError
from contracts.names import POLICY_SCHEDULES
from contracts.policies import CATCH_UP_WIDTHS, Arm, Policy, catch_up_widths, make_policy
from model.decoder import Proposals
from model.graphs import GraphedCall
from model.heads import DenseHead
from model.prompt_lookup import LookupSearch
from model.step_heads import StepHead


class Drafting:
    """`policy` over arms whose K is at most the decoder's K; `early`: the early-exit draft, its cache
    set up on the target's device; `lookup_ngram`: prompt lookup's max_matching_ngram_size;
    `lookup_control`: a LookupControl on the target's device that replaces the lookup's proposals."""

    def __init__(self, policy: Policy, early=None, lookup_ngram: int = 2, lookup_control=None):
        if lookup_ngram < 1:
            raise UsageError(f"prompt lookup's max_matching_ngram_size must be >= 1, got {lookup_ngram}")
        self.policy, self.early, self.lookup_ngram = policy, early, lookup_ngram
        self.lookup_control = lookup_control
        self.search: LookupSearch | None = None  # prompt lookup's, where an arm plays it (attach)
        self.started = 0.0

    def attach(self, dec, graphs: bool) -> Drafting:
        """Bind to a decoder: check every arm can be played there and add the early-exit stepper."""
        self.dec = dec
        # a catch-up feeds up to a cache's worth of tokens in one step: positions for all of them
        room = max(m.max_seq_len for m in (dec.target, dec.draft, self.early) if m is not None)
        if room > dec.positions.numel():
            dec.positions = torch.arange(room, device=dec.target_device)
            dec.positions_on_draft = dec.positions.to(dec.draft_device)
        for arm in self.policy.arms:
            if not 1 <= arm.K <= dec.K:
                raise UsageError(f"arm {arm.label()}: K must be in 1..{dec.K} (the decoder's K sizes its buffers)")
            if arm.drafter == "draft-model" and dec.draft is None:
                raise UsageError(f"arm {arm.label()}: the decoder has no draft model")
            if arm.drafter == "early-exit" and self.early is None:
                raise UsageError(f"arm {arm.label()}: no early-exit draft was given")
        if self.policy.plays("prompt-lookup"):
            self.search = LookupSearch(
                dec.target.max_seq_len, dec.K, dec.target_device, self.lookup_ngram, graphs, self.lookup_control
            )
        if self.early is not None:
            self.head = DenseHead(dec.target.head_weight)
            dec.steppers["early-exit"] = (
                GraphedCall(self._early_body, enabled=graphs),
                [StepHead([GraphedCall(self._early_head, enabled=graphs)])],
                dec.target_device,
                "target",
            )
        return self

    def capture(self) -> None:
        """With the decoder's graphs (`Decoder._capture`): the verify of every K up to the decoder's
        (the heuristic plays them all), the early-exit steps, and where the arms switch drafters
        every model drafter's catch-up widths (dummy tokens at position 0, in slots every generation
        rewrites before reading them)."""
        start = torch.zeros(1, dtype=torch.long, device=self.dec.target_device)
        for n in range(2, self.dec.K + 1):
            self.dec.target_forward(torch.zeros(1, n, dtype=torch.long, device=self.dec.target_device), start)
        played = {arm.drafter for arm in self.policy.arms}
        for K in sorted({arm.K for arm in self.policy.arms if arm.drafter == "prompt-lookup"}):
            self.search(start, start, start + 1, K, start)  # a one-token context: every generation rewrites it
        models = {"draft-model": self.dec.draft, "early-exit": self.early}
        for drafter in sorted(played - {"prompt-lookup"}):
            body, heads, device, _ = self.dec.steppers[drafter]
            widths = (1, 2) if drafter == "early-exit" else ()  # the draft model's are the decoder's
            if len(played) > 1:
                widths += tuple(w for w in CATCH_UP_WIDTHS if w <= models[drafter].max_seq_len)
            start = torch.zeros(1, dtype=torch.long, device=device)
            for n in widths:
                tokens = torch.zeros(1, n, dtype=torch.long, device=device)
                hidden, pos = body(tokens, start)
                for head in heads:
                    head(hidden, pos, tokens[:, -1:])

    def _early_body(self, tokens: torch.Tensor, start: torch.Tensor):
        n = tokens.shape[1]
        hidden = self.early.forward_hidden(tokens, start + self.dec.positions[:n])
        return hidden[0, -1:], start + n

    def _early_head(self, hidden: torch.Tensor, pos: torch.Tensor, fed: torch.Tensor) -> torch.Tensor:
        return self.head.argmax(hidden)

    def check(self, schedule: str) -> None:
        if schedule not in POLICY_SCHEDULES:
            raise UsageError(
                f"schedule {schedule}: policies and drafters run on {' and '.join(POLICY_SCHEDULES)} only "
                "(they read each round's accepted count at its end)"
            )

    def prefill(self, prompt: torch.Tensor, prompt_len: int) -> None:
        """The early-exit draft's prefill (the draft model's is the decoder's own)."""
        if self.early is not None:
            with self.dec.clock.span("initial", self.dec.target_device):
                self.early.forward_hidden(prompt, torch.arange(prompt_len, device=self.dec.target_device))

    def reset(self) -> None:
        """A fresh policy of the same kind over the same arms (each schedule's recorded generations
        start from nothing learned, as each simulated configuration does)."""
        self.policy = make_policy(self.policy.name, self.policy.arms, self.policy.seed)

    # --- per round ---------------------------------------------------------------------------------
    def choose(self) -> Arm:
        return self.policy.choose()

    def begin(self) -> None:
        """The round starts now (its time runs to its read)."""
        self.started = time.perf_counter()

    def propose(self, run, arm: Arm) -> Proposals:
        """The arm's K proposals, on its drafter's device."""
        dec, context = self.dec, run.prompt_len + run.least  # the host knows n: every deferred round reads it
        if arm.drafter == "prompt-lookup":
            dec._event("lookup", "target", arm.K)
            with dec.clock.phase("draft_body", dec.target_device):  # for positions p + 1 .. p + K
                return Proposals(self.search(run.prompt, run.out, run.n + run.prompt_len, arm.K, run.cursor[2:3]))
        first = dec.missed(run, arm.drafter)
        body, _, device, stream = dec.steppers[arm.drafter]
        cursor = run.cursor if device == dec.target_device else run.draft_cursor
        if first <= 2:
            return dec.steps_from_cursor(cursor, first, arm.K, arm.drafter)
        # catch up: the tokens at positions context - first .. context - 1 (the last forward may reach
        # further back), from the prompt and the output buffer
        *leading, last = catch_up_widths(first, context)
        begin = context - max(first, last)
        P = run.prompt_len
        tokens = (
            run.out[begin - P : context - P] if begin >= P else torch.cat([run.prompt[begin:], run.out[: context - P]])
        )
        if arm.drafter == "draft-model" and dec.copies:  # as Decoder.to_draft: a real copy only
            dec._event("copy_tokens", "target", tokens.numel())
            with dec.clock.span("copy_tokens", dec.target_device):
                tokens = tokens.to(device, non_blocking=True)
        p = cursor[2:3]  # position context - 1
        for index, width in enumerate(leading):  # the oldest missed tokens, body only
            at = context - first + index * width
            dec._event("catch_up", stream, width)
            with dec.clock.phase("draft_body", device):
                body(tokens[at - begin : at - begin + width].view(1, width), p - (context - 1 - at))
        return dec.draft_steps(tokens[context - last - begin :].view(1, last), p - (last - 1), arm.K, arm.drafter)

    def observe(self, run, arm: Arm, before: int) -> None:
        """After the round's read (n known): the policy's update (the drafter's cache: Decoder.drafted)."""
        emitted = min(run.least, run.max_new) - before
        self.policy.update(arm, run.least - before - 1, emitted, (time.perf_counter() - self.started) * 1e3)
