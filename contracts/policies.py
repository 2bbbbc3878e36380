"""Policies that choose each round's drafter and K (an arm), shared by the decoder and the simulator.

One implementation in plain Python, so the real decoder (`model`) and its replay (`sim`) make the
same choice from the same observations: a policy sees, after each round, the arm it played, the
tokens the round emitted and the round's wall time, and nothing else. The reward is cost-aware:
tokens emitted per millisecond of the round. Every policy is deterministic for a given seed.

- `fixed`: always the same arm.
- `heuristic`: Hugging Face's assisted-generation schedule for `num_assistant_tokens`: +2 after a
  round whose whole block was accepted, -1 otherwise, never below 1 (and here never above the
  largest K of the arm set, which sizes the decoder's buffers); the drafter stays the first one.
- `ucb1`: plays every arm once, then the arm of largest mean reward + scale * sqrt(2 ln t / n),
  where scale is the largest reward seen so far (UCB1 wants rewards in [0, 1]; ours are tok/ms).
- `thompson`: Gaussian Thompson sampling: plays every arm once, then the arm of largest draw from
  N(mean, spread^2 / n), spread the standard deviation of all rewards seen so far.
The simulator's `oracle` is no online policy: it is the best fixed arm in hindsight (sim/policies.py).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

from contracts.cli import UsageError
from contracts.names import DRAFTERS, POLICIES


@dataclass(frozen=True, order=True)
class Arm:
    """What one round plays: a drafter and how many tokens it proposes."""

    drafter: str
    K: int

    def label(self) -> str:
        return f"{self.drafter}:K{self.K}"


def parse_drafters(text: str, where: str = "drafter") -> tuple[str, ...]:
    """Drafter names joined by '+' or ','; each one of DRAFTERS."""
    chosen = tuple(dict.fromkeys(v.strip() for v in text.replace(",", "+").split("+") if v.strip()))
    bad = [v for v in chosen if v not in DRAFTERS]
    if bad or not chosen:
        raise UsageError(f"{where}: {bad[0] if bad else text!r} is unknown; valid: {', '.join(DRAFTERS)}")
    return chosen


def parse_policy(text: str, where: str = "policy", valid: tuple[str, ...] = POLICIES) -> str:
    if text not in valid:
        raise UsageError(f"{where}: {text!r} is unknown; valid: {', '.join(valid)}")
    return text


# The widths of a catch-up's draft forwards (a model drafter that sat out rounds feeding the tokens its
# cache missed): few enough to capture their graphs with the decoder's, before anything is timed. A
# forward captured in the middle of a generation costs two eager runs and a capture (about 30 ms for
# a 0.6B draft on an H200, where a step takes 1.5 ms), the whole of the first round of that width.
CATCH_UP_WIDTHS = (4, 8, 16, 32, 64)


def catch_up_widths(missed: int, context: int) -> tuple[int, ...]:
    """Tokens fed by each draft forward of a round whose model drafter feeds `missed` tokens first,
    the last one at position context - 1 (2 is the usual [prev, f]: one forward of 2). A catch-up
    (missed > 2) feeds the oldest missed tokens in forwards of the largest width while more than
    that remain, then the rest in the smallest width that holds them, reaching back over tokens the
    cache already holds (their slots are rewritten from the same tokens) but not before position 0."""
    if missed <= 2:
        return (missed,)
    *leading, last = chunk_widths(missed, CATCH_UP_WIDTHS)
    return (*leading, min(last, context))


def chunk_widths(count: int, widths: tuple[int, ...]) -> tuple[int, ...]:
    """Forwards that feed `count` tokens from a few graphed `widths` (ascending): the largest while more
    than it remain, then the smallest that holds the rest (its forward reaches back, or is padded)."""
    largest = widths[-1]
    leading = (count - 1) // largest
    rest = count - leading * largest
    return (largest,) * leading + (next(w for w in widths if w >= rest),)


def arms(drafters: tuple[str, ...], Ks: tuple[int, ...]) -> tuple[Arm, ...]:
    """Every (drafter, K) pair, drafters in the order given, K ascending."""
    return tuple(Arm(d, k) for d in drafters for k in sorted(set(Ks)))


@dataclass
class Policy:
    """Bookkeeping common to every policy: per arm, how often it was played and its rewards' sum."""

    arms: tuple[Arm, ...]
    seed: int = 0
    pulls: dict = field(default_factory=dict)
    rewards: dict = field(default_factory=dict)
    history: list = field(default_factory=list)  # (arm, emitted, round_ms) per round, in order

    name = "policy"

    def __post_init__(self):
        if not self.arms:
            raise UsageError(f"{self.name}: needs at least one arm")
        self.pulls = {arm: 0 for arm in self.arms}
        self.rewards = {arm: 0.0 for arm in self.arms}
        self.random = random.Random(f"{self.name}/{self.seed}")

    def begin(self, prompt_id: str) -> None:
        """A generation begins (online policies keep learning across a run's generations)."""

    def choose(self) -> Arm:
        raise NotImplementedError

    def plays(self, drafter: str) -> bool:
        """Whether this generation's arms draft with `drafter` (only then is its model prefilled)."""
        return any(arm.drafter == drafter for arm in self.arms)

    def update(self, arm: Arm, accepted: int, emitted: int, round_ms: float) -> None:
        """One round's outcome: `accepted` of arm.K proposals, `emitted` tokens in `round_ms`."""
        self.pulls[arm] += 1
        self.rewards[arm] += reward(emitted, round_ms)
        self.history.append((arm, emitted, round_ms))

    def mean(self, arm: Arm) -> float:
        return self.rewards[arm] / self.pulls[arm] if self.pulls[arm] else 0.0

    def _unplayed(self) -> Arm | None:
        return next((arm for arm in self.arms if self.pulls[arm] == 0), None)


def reward(emitted: int, round_ms: float) -> float:
    """Tokens per millisecond of the round (a round of no measurable time counts as 1 us)."""
    return emitted / max(round_ms, 1e-3)


class Fixed(Policy):
    name = "fixed"

    def choose(self) -> Arm:
        return self.arms[0]


class Heuristic(Policy):
    """Hugging Face's `num_assistant_tokens` schedule ("heuristic") on the first arm's drafter."""

    name = "heuristic"

    def __post_init__(self):
        super().__post_init__()
        self.drafter = self.arms[0].drafter
        self.largest = max(arm.K for arm in self.arms)
        self.K = self.arms[0].K

    def choose(self) -> Arm:
        return Arm(self.drafter, self.K)

    def update(self, arm: Arm, accepted: int, emitted: int, round_ms: float) -> None:
        self.pulls.setdefault(arm, 0)
        self.rewards.setdefault(arm, 0.0)
        super().update(arm, accepted, emitted, round_ms)
        self.K = min(self.largest, self.K + 2) if accepted == arm.K else max(1, self.K - 1)


class UCB1(Policy):
    name = "ucb1"

    def choose(self) -> Arm:
        first = self._unplayed()
        if first is not None:
            return first
        total = sum(self.pulls.values())
        scale = max(reward(e, ms) for _, e, ms in self.history) or 1.0
        return max(self.arms, key=lambda arm: self.mean(arm) + scale * math.sqrt(2 * math.log(total) / self.pulls[arm]))


class Thompson(Policy):
    name = "thompson"

    def choose(self) -> Arm:
        first = self._unplayed()
        if first is not None:
            return first
        rewards = [reward(e, ms) for _, e, ms in self.history]
        average = sum(rewards) / len(rewards)
        spread = math.sqrt(sum((r - average) ** 2 for r in rewards) / len(rewards)) or 1e-9
        draws = {arm: self.random.gauss(self.mean(arm), spread / math.sqrt(self.pulls[arm])) for arm in self.arms}
        return max(self.arms, key=draws.__getitem__)


ONLINE = {"fixed": Fixed, "heuristic": Heuristic, "ucb1": UCB1, "thompson": Thompson}


def make_policy(name: str, choices: tuple[Arm, ...], seed: int = 0) -> Policy:
    """A fresh online policy over `choices` (`fixed` and `heuristic` start from the first)."""
    return ONLINE[parse_policy(name, valid=tuple(ONLINE))](choices, seed)
