"""Acceptance sources: which draft tokens the target accepts, round by round.

Every source answers `block(pos, K, drafter=None)`: K+1 booleans, whether the draft's proposals for output
positions pos .. pos+K-1 match the target's greedy tokens, and (the last one) whether the draft's
guess of the token after a fully accepted block matches (used by the pipelined-deferred look-ahead).
Accepted = the leading run of True among the first K. Synthetic sources answer the same for every
drafter; a trace answers for the drafters whose outcomes it recorded (`runs`, contracts.trace).

- `TraceReplay`: the draft's match at an output position depends only on that position (it always
  conditions on the true prefix), so a recorded trace gives a per-position match stream; positions
  it never tested (the bonus token after a full block) are drawn with the trace's acceptance rate.
  Replaying at the recorded K reproduces the recorded rounds exactly. A trace with `runs` gives,
  for every drafter it names and every output position, how many proposals of a block begun there
  would be accepted (prompt lookup's block depends on where it begins, not only on the position).
- `IIDAcceptance(a)`: every position matches with probability a.
- `ControlledAcceptance(a)`: the decoder's acceptance control `a=A` (contracts.acceptance): for
  a chain the same as i.i.d. at a; a token tree (sim/trees.py) takes its per-depth top-k rates from the
  control's rule instead of the profile's measured ones.
- `PerPositionAcceptance([a1..aK])`: the j-th proposal of a block matches with probability a_j.
- `EmpiricalLengths({L: weight})`: the accepted length of a round drawn from a distribution.
All are deterministic for a given seed.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from contracts import UsageError
from contracts.names import DRAFTERS
from contracts.trace import RUN_CAP


def _probability(value, where: str) -> float:
    try:
        a = float(value)
    except (TypeError, ValueError):
        raise UsageError(f"{where}: expected a probability in [0, 1], got {value!r}") from None
    if not 0.0 <= a <= 1.0:
        raise UsageError(f"{where}: acceptance must be in [0, 1], got {value!r}")
    return a


def leading_accepts(block: list[bool], K: int) -> int:
    accepted = 0
    while accepted < K and block[accepted]:
        accepted += 1
    return accepted


@dataclass
class Generation:
    """What one simulated generation needs: its prompt and how many tokens it decodes."""

    prompt_id: str
    prompt_len: int
    decode_tokens: int


class IIDAcceptance:
    name = "iid"

    def __init__(self, a: float):
        self.a = _probability(a, "acceptance")

    def describe(self) -> str:
        return f"i.i.d. per-token acceptance a={self.a:g}"

    def mean_rate(self) -> float:
        return self.a

    def stream(self, generation: Generation, seed: int):
        rng = random.Random(f"{seed}/{generation.prompt_id}")
        memo: dict[int, bool] = {}
        a = self.a

        def at(i: int) -> bool:
            if i not in memo:
                memo[i] = rng.random() < a
            return memo[i]

        return lambda pos, K, drafter=None: [at(pos + j) for j in range(K + 1)]


class ControlledAcceptance(IIDAcceptance):
    """`a=A`: the acceptance a synthetic run under the decoder's control a=A sees."""

    name = "control"

    def __init__(self, rate: float):
        super().__init__(rate)

    def describe(self) -> str:
        return f"acceptance control a={self.a:g} (i.i.d. per token; a tree's top-k holds the token at 1-(1-a)^k)"


class PerPositionAcceptance:
    name = "per-position"

    def __init__(self, rates: list[float]):
        if not rates:
            raise UsageError("acceptance: per-position list is empty")
        self.rates = [_probability(r, f"acceptance[{i}]") for i, r in enumerate(rates)]

    def describe(self) -> str:
        return "per-position acceptance " + ",".join(f"{r:g}" for r in self.rates)

    def mean_rate(self) -> float:
        return sum(self.rates) / len(self.rates)

    def _rate(self, j: int) -> float:
        return self.rates[min(j, len(self.rates) - 1)]

    def stream(self, generation: Generation, seed: int):
        rng = random.Random(f"{seed}/{generation.prompt_id}")
        return lambda pos, K, drafter=None: [rng.random() < self._rate(j) for j in range(K + 1)]


class EmpiricalLengths:
    name = "empirical"

    def __init__(self, weights: dict[int, float]):
        if not weights or any(int(k) < 0 for k in weights) or any(w < 0 for w in weights.values()):
            raise UsageError("acceptance: empirical lengths need non-negative lengths and weights")
        total = float(sum(weights.values()))
        if total <= 0:
            raise UsageError("acceptance: empirical length weights sum to zero")
        self.lengths = sorted(int(k) for k in weights)
        self.cumulative = []
        running = 0.0
        for length in self.lengths:
            running += weights[length] / total
            self.cumulative.append(running)
        self.max_len = self.lengths[-1]
        mean_len = sum(length * weights[length] for length in self.lengths) / total
        self.rate = mean_len / max(self.max_len, 1)

    def describe(self) -> str:
        return f"empirical accepted lengths 0..{self.max_len}"

    def mean_rate(self) -> float:
        return self.rate

    def stream(self, generation: Generation, seed: int):
        rng = random.Random(f"{seed}/{generation.prompt_id}")

        def block(pos: int, K: int, drafter: str | None = None) -> list[bool]:
            if self.max_len < K:
                raise UsageError(f"acceptance: empirical lengths go up to {self.max_len}, cannot answer K={K}")
            u = rng.random()
            length = next(L for L, c in zip(self.lengths, self.cumulative) if u <= c + 1e-12)
            length = min(length, K)
            tail = [rng.random() < self.rate for _ in range(K - length)]
            return [True] * length + ([False] + tail[1:] if length < K else []) + [rng.random() < self.rate]

        return block


class TraceReplay:
    name = "trace"

    def __init__(self, rounds_by_prompt: dict[str, list[dict]], head: str, probes: int | None):
        self.head, self.probes = head, probes
        self.matches: dict[str, list[bool | None]] = {}
        self.generations: list[Generation] = []
        every = [r for rs in rounds_by_prompt.values() for r in rs]
        played = {r.get("drafter") or "draft-model" for r in every}
        self.drafter = played.pop() if len(played) == 1 else None  # the one drafter of `matches`
        self.runs = {
            name: {pid: [v for r in rs for v in r["runs"][name]] for pid, rs in rounds_by_prompt.items()}
            for name in DRAFTERS
            if all(name in (r.get("runs") or {}) for r in every)
        }
        self.drafters = tuple(d for d in DRAFTERS if d in self.runs or d == self.drafter)
        self.sampled = any("sample" in r for r in every)  # recorded under speculative sampling: its costs apply
        tested = accepted = 0
        for prompt_id, rounds in rounds_by_prompt.items():
            stream: list[bool | None] = []
            for r in rounds:
                K, acc = r["proposed"], r["accepted"]  # a policy may propose fewer than the trace's K
                stream += [True] * acc
                if acc < K:
                    stream.append(False)
                    tested += acc + 1
                else:
                    stream.append(r.get("lookahead_used"))  # the bonus position: known only with look-ahead
                    tested += acc
                accepted += acc
            self.matches[prompt_id] = stream
            decode = sum(r["emitted"] for r in rounds)
            self.generations.append(Generation(prompt_id, max(rounds[0]["context"] - 1, 0), decode))
        self.rate = accepted / tested if tested else 0.0
        self.recorded_K = sorted({r["K"] for rs in rounds_by_prompt.values() for r in rs})
        self.trees = sorted({r.get("tree") or "chain" for r in every})  # the trees its rounds drafted

    def describe(self) -> str:
        head = self.head if self.head == "dense" else f"{self.head} p={self.probes}"
        return (
            f"trace replay of {len(self.generations)} generations recorded at K="
            f"{','.join(map(str, self.recorded_K))} ({head}), untested positions drawn at "
            f"{self.rate:.3f}; outcomes for {', '.join(self.drafters)}"
        )

    def mean_rate(self) -> float:
        return self.rate

    def stream(self, generation: Generation, seed: int):
        rng = random.Random(f"{seed}/{generation.prompt_id}")
        known = self.matches.get(generation.prompt_id, [])
        drawn: dict[int, bool] = {}

        def at(i: int) -> bool:
            if i < len(known) and known[i] is not None:
                return known[i]
            if i not in drawn:
                drawn[i] = rng.random() < self.rate
            return drawn[i]

        runs = {name: by_prompt.get(generation.prompt_id, []) for name, by_prompt in self.runs.items()}

        def block(pos: int, K: int, drafter: str | None = None, chain: bool = False) -> list[bool]:
            """`chain` (a tree run's chain round) changes nothing: the trace recorded each position's outcome."""
            if drafter is None or (drafter == self.drafter and drafter not in runs):
                return [at(pos + j) for j in range(K + 1)]
            known_runs = runs[drafter]
            if pos >= len(known_runs):
                return [at(pos + j) for j in range(K + 1)]
            run = known_runs[pos]
            if run >= RUN_CAP:  # matched as far as recorded: the rest drawn
                return ([True] * RUN_CAP + [at(pos + j) for j in range(RUN_CAP, K + 1)])[: K + 1]
            return [j < run for j in range(K + 1)]

        return block

    def check_drafters(self, wanted: tuple[str, ...]) -> None:
        """UsageError unless the trace recorded outcomes for every drafter in `wanted`."""
        missing = [d for d in wanted if d not in self.drafters]
        if missing:
            raise UsageError(
                f"drafter {missing[0]}: the trace records outcomes for {', '.join(self.drafters) or 'no drafter'} only "
                "(record a run with match runs: python -m model --record-lookup-runs G)"
            )


class AgreementScaled:
    """A FlashHead draft proposes the dense draft's token only where their argmaxes agree.

    Model: agreement at each position is an independent event of probability r(p), and a token
    the FlashHead draft proposes against the dense argmax is never the target's. So acceptance
    scales from r0 (the head the source describes) to r1 (the head simulated): matches are kept
    with probability r1/r0 when r1 < r0; when r1 > r0 a recorded miss becomes a match with the
    probability that it was a dense match lost to disagreement, a_d (r1 - r0) / (1 - a_d r0).
    """

    def __init__(self, source, r0: float, r1: float):
        self.source, self.r0, self.r1 = source, r0, r1
        self.generations = getattr(source, "generations", None)

    def describe(self) -> str:
        return f"{self.source.describe()}, scaled by FlashHead agreement r={self.r1:.4f}/{self.r0:.4f}"

    def mean_rate(self) -> float:
        return self.source.mean_rate() * self.r1 / self.r0

    def stream(self, generation: Generation, seed: int):
        inner = self.source.stream(generation, seed)
        rng = random.Random(f"agreement/{seed}/{generation.prompt_id}")
        r0, r1 = self.r0, self.r1
        dense_rate = min(1.0, self.source.mean_rate() / r0) if r0 > 0 else 0.0
        gain = dense_rate * (r1 - r0) / (1 - dense_rate * r0) if r1 > r0 and dense_rate * r0 < 1 else 0.0

        def rescale(match: bool) -> bool:
            u = rng.random()
            return (u < r1 / r0) if match and r1 < r0 else (match or u < gain)

        return lambda pos, K, drafter=None: [rescale(m) for m in inner(pos, K, drafter)]
