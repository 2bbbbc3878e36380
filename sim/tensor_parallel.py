"""A target tensor-parallel over N GPUs (placement tpN), from the profile's `tensor_parallel.tpN` section.

A TP forward costs one rank's compute plus two all-reduces per layer (after o_proj and after down_proj),
each of rows x hidden x dtype bytes, where rows are the forward's tokens (the fixed width on GPUs, where
every decode forward runs that many rows); the all-reduce cost is interpolated between the measured
message sizes. The draft sits on rank 0's GPU: its work and rank 0's target work share one stream, as on
one GPU, and the other ranks wait for rank 0 inside the next all-reduce, so the loop is rank 0's. The
draft and host costs are the profile's own (measured with the draft on one GPU).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, replace

from contracts import UsageError

from .costs import Cost
from .profile import Profile


@dataclass(frozen=True)
class TensorParallelForward:
    """A target forward over N ranks with Cost's interface: `device_ms(**axes)`, `host_ms(**axes)`.
    `rows` names the axis that counts the forward's tokens (n_tokens for decode, prompt_len for prefill)."""

    name: str
    compute: Cost
    all_reduce: Cost
    rows: str
    layers: int
    row_bytes: int  # hidden x dtype bytes: one row of an all-reduce message
    fixed_width: int | None
    all_reduce_scale: float
    graphed: bool  # the all-reduces run inside the forward's CUDA graph: they cost the host nothing

    def _all_reduces(self, which: str, tokens: float) -> float:
        rows = max(tokens, self.fixed_width) if self.fixed_width and self.rows == "n_tokens" else tokens
        one = getattr(self.all_reduce, which)(bytes=rows * self.row_bytes)
        return 2 * self.layers * self.all_reduce_scale * one

    def device_ms(self, **axes) -> float:
        return self.compute.device_ms(**axes) + self._all_reduces("device_ms", axes[self.rows])

    def host_ms(self, **axes) -> float:
        """The host's issue time: the rank's compute, and its all-reduces where they are launched one by one."""
        issued = 0.0 if self.graphed else self._all_reduces("host_ms", axes[self.rows])
        return self.compute.host_ms(**axes) + issued

    def warnings(self) -> list[str]:
        return self.compute.warnings() + self.all_reduce.warnings()


def placed(profile: Profile, placement: str, regime: str, all_reduce_scale: float, drafters, notes: list) -> Profile:
    """A copy of `profile` whose `regime` costs run the target over the ranks of `placement` (tpN), or a
    one-line UsageError where the profile did not measure that placement."""
    if "early-exit" in drafters:
        raise UsageError(f"placement={placement}: the early-exit drafter's costs were measured on one GPU's target")
    sections = profile.raw.get("tensor_parallel") or {}
    if placement not in sections:
        have = ", ".join(sections) or "none"
        raise UsageError(
            f"placement={placement}: the profile has no tensor_parallel.{placement} costs (measured: {have}); "
            f"torchrun --nproc-per-node N -m measure --placement {placement} --add-to PROFILE adds them"
        )
    entry = sections[placement]
    where = f"{profile.source}: tensor_parallel.{placement}"
    base = profile.costs[regime]
    row_bytes = entry["hidden_size"] * entry["dtype_bytes"]
    all_reduce = Cost.parse(entry["all_reduce_ms"], f"{where}.all_reduce_ms", f"tensor_parallel.{placement}.all_reduce")

    def forward(name: str, rows: str, flat: dict | None, graphed: bool) -> TensorParallelForward:
        compute = Cost.parse(entry[name], f"{where}.{name}", f"tensor_parallel.{placement}.{name}", flat)
        return TensorParallelForward(
            name, compute, all_reduce, rows, entry["layers"], row_bytes, entry["fixed_width"], all_reduce_scale, graphed
        )

    width = entry["fixed_width"]
    costs = copy.copy(base)
    graphed = entry["regime"] == "graphs"  # decode forwards only: prefills are eager
    costs.verify = forward("forward_ms", "n_tokens", {"n_tokens": width} if width else None, graphed)
    costs.target_prefill = forward("prefill_ms", "prompt_len", None, False)
    costs.named = {**base.named, "target.forward_ms": costs.verify, "target.prefill_ms": costs.target_prefill}
    result = copy.copy(profile)
    result.costs = {**profile.costs, regime: costs}
    target = entry["target"]
    notes.append(
        f"placement {placement}: target {target['name']} ({target['weights']}) over {entry['ranks']} ranks: each "
        f"forward is one rank's compute plus 2 x {entry['layers']} all-reduces"
        + (f" scaled x{all_reduce_scale:g}" if all_reduce_scale != 1 else "")
        + "; the draft shares rank 0's GPU"
    )
    if entry["regime"] != regime:
        notes.append(f"warning: tensor_parallel.{placement} was timed in the {entry['regime']} regime, not {regime}")
    notes.append(model_check(entry, costs.verify, placement))
    return result


def model_check(entry: dict, forward: TensorParallelForward, placement: str) -> str:
    """How far compute + all-reduces lands from the decode step measured with its all-reduces: the
    largest gap over the measured points (at the scale measured, x1)."""
    unscaled = replace(forward, all_reduce_scale=1.0)
    gaps = []
    for point in entry["measured_forward_ms"]["points"]:
        axes = {"n_tokens": point["n_tokens"], "context": point["context"]}
        if point["median_ms"] > 0:
            gaps.append((unscaled.device_ms(**axes) / point["median_ms"] - 1, axes))
    if not gaps:
        return f"{placement}: no measured forward with all-reduces to check the model against"
    gap, axes = max(gaps, key=lambda item: abs(item[0]))
    return (
        f"{placement} model check: compute + all-reduces is {100 * gap:+.1f}% off the decode step measured with "
        f"its all-reduces at n_tokens={axes['n_tokens']:g}, context={axes['context']:g} (the largest gap)"
    )


def scale(label: str, value: str, limit: float) -> float:
    """The factor of `allreduce=xF`: a number F in 0..limit after an 'x'."""
    try:
        factor = float(value.removeprefix("x")) if value.startswith("x") else float("nan")
    except ValueError:
        factor = float("nan")
    if not 0 <= factor <= limit:
        raise UsageError(
            f"{label}: expected xF, the all-reduce costs scaled by F in 0..{limit:g} (e.g. x0.5), got {value!r}"
        )
    return factor
