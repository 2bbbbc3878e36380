"""The validation report: report.md, results.csv, scatter.png and phases.png (into a staged folder), and
timeline.png, one configuration's measured and predicted timelines."""

from __future__ import annotations

import csv
import io
import statistics
from dataclasses import dataclass
from pathlib import Path

from contracts.files import write_atomic
from contracts.timeline import TIMELINE_NAMES, TIMELINE_STREAMS, category
from sim.report import render

from .closed_form import ClosedForm
from .plan import Config
from .predict import error_carrier

THRESHOLD = 0.03  # configurations missing by more than this get a phase diagnosis


@dataclass
class Result:
    """One configuration: what the real run measured, what the simulator and the closed form predicted."""

    config: Config
    probes: int | None
    summary: dict  # the real run's summary (contracts.trace)
    predicted: dict  # the simulator's row (with the in-process calibration where there is one)
    closed: ClosedForm
    phases: list[dict]  # predict.phase_rows
    trace: str  # path of the trace, relative to the report
    profile_only: dict | None = None  # the simulator's row from the profile alone, when calibrated
    measured_accepted: float | None = None  # mean accepted draft tokens (a tree's path length) per round
    by_control: dict | None = None  # a tree's prediction from the control's rule (validate/trees.py)
    runs_range: tuple | None = None  # (slowest, fastest) decode tok/s of its runs, where it ran several times

    @property
    def profile_only_error(self) -> float | None:
        if self.profile_only is None:
            return None
        return (self.profile_only["decode_tok_s"] - self.measured_tok_s) / self.measured_tok_s

    @property
    def measured_tok_s(self) -> float:
        return self.summary["decode_tok_s"]

    @property
    def predicted_tok_s(self) -> float:
        return self.predicted["decode_tok_s"]

    @property
    def error(self) -> float:
        return (self.predicted_tok_s - self.measured_tok_s) / self.measured_tok_s

    @property
    def closed_error(self) -> float:
        return (self.closed.tok_s - self.measured_tok_s) / self.measured_tok_s

    @property
    def control_errors(self) -> tuple[float, float] | None:
        """A tree's (mean accepted length, tok/s) errors when predicted from the control's rule."""
        if self.by_control is None or not self.measured_accepted:
            return None
        accepted = (self.by_control["mean_accepted"] - self.measured_accepted) / self.measured_accepted
        return accepted, (self.by_control["decode_tok_s"] - self.measured_tok_s) / self.measured_tok_s


def _exactness(inexact: list[str] | None) -> list[str]:
    """The outputs line: whether every recorded greedy generation equals the target's reference (none:
    not known, e.g. sampled or predicted again from runs)."""
    if inexact is None:
        return []
    if not inexact:
        return ["- Outputs: every recorded generation equals the target's greedy reference token for token"]
    return [f"- Outputs: **NOT exact** against the target's greedy reference: {', '.join(inexact)}"]


def _repeats(count: int) -> list[str]:
    """The measured line where every configuration ran several times (validate/repeats.py)."""
    if count == 1:
        return []
    return [
        f"- Measured: the median of {count} runs of each configuration, each run of a decoder instance's "
        "calibration and configurations before the next (`runs' range` gives the slowest and the fastest); "
        "the calibration pools its runs"
    ]


def _pct(x: float) -> str:
    return f"{100 * x:+.1f}%"


def _f(x, digits: int = 2) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


HEADERS = [
    "configuration",
    "measured tok/s",
    "predicted tok/s",
    "error",
    "profile-only error",
    "closed-form tok/s",
    "closed error",
    "acc/prop",
    "tok/rd",
    "verify m/p",
    "append m/p",
]


def _table(results: list[Result]) -> tuple[list[str], list[list[str]]]:
    """HEADERS and a row per result, with the runs' range beside the measurement where configurations ran
    several times."""
    ranged = any(r.runs_range for r in results)
    return HEADERS[:2] + ["runs' range"] * ranged + HEADERS[2:], [_cells(r, ranged) for r in results]


def _cells(r: Result, ranged: bool) -> list[str]:
    s, p = r.summary, r.predicted
    profile_only = "-" if r.profile_only_error is None else _pct(r.profile_only_error)
    runs_range = [f"{r.runs_range[0]:.2f}-{r.runs_range[1]:.2f}" if r.runs_range else "-"] * ranged
    return [
        r.config.name + (f" p={r.probes}" if r.probes else ""),
        _f(r.measured_tok_s),
        *runs_range,
        _f(r.predicted_tok_s),
        _pct(r.error),
        profile_only,
        _f(r.closed.tok_s),
        _pct(r.closed_error),
        _f(s["acceptance"], 3),
        _f(s["mean_emitted"], 3),
        f"{s['verify_calls']}/{p['verify_calls']}",
        f"{s['append_calls']}/{p['append_calls']}",
    ]


def stdout_table(results: list[Result]) -> str:
    return render(*_table(results))


def _md_table(headers: list[str], rows: list[list[str]]) -> list[str]:
    head = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    return head + ["| " + " | ".join(r) + " |" for r in rows]


def errors_summary(results: list[Result]) -> dict:
    """Median and max absolute relative error of each estimator (the profile-only simulator too, when
    the runs were calibrated)."""

    def spread(errors):
        errors = [abs(e) for e in errors]
        return statistics.median(errors), max(errors)

    summary = {"simulator": spread(r.error for r in results)}
    if all(r.profile_only is not None for r in results):
        summary["simulator_profile_only"] = spread(r.profile_only_error for r in results)
    summary["closed_form"] = spread(r.closed_error for r in results)
    return summary


TREE_HEADERS = [
    "configuration",
    "measured accepted/round",
    "rule accepted/round",
    "error",
    "measured tok/s",
    "rule tok/s",
    "error",
]


def tree_section(results: list[Result]) -> list[str]:
    """The trees' acceptance predicted from the control's rule against measured (none: no lines)."""
    ruled = [r for r in results if r.control_errors is not None]
    if not ruled:
        return []
    rows = [
        [
            r.config.name,
            _f(r.measured_accepted, 3),
            _f(r.by_control["mean_accepted"], 3),
            _pct(r.control_errors[0]),
            _f(r.measured_tok_s),
            _f(r.by_control["decode_tok_s"]),
            _pct(r.control_errors[1]),
        ]
        for r in ruled
    ]
    spreads = [
        [name, f"{100 * median:.1f}%", f"{100 * most:.1f}%"] for name, (median, most) in tree_errors(ruled).items()
    ]
    return [
        "## Token trees: acceptance predicted from the control's rule",
        "",
        f"Under acceptance control a={ruled[0].by_control['a']:g} a node's top-k children hold the target's token "
        "with probability 1-(1-a)^k at every depth. Here the simulator draws each tree's acceptance from that rule "
        f"alone, not from the trace, on the runs' own prompts and lengths, with the same profile and calibration "
        f"(mean over {ruled[0].by_control['seeds']} seeds of its draws). A dynamic tree picks its nodes by the "
        "synthetic draft's own probabilities, which the rule does not know: the simulator stands in a static tree "
        "for it (docs/design.md), so its rule prediction is an approximation. The results table above predicts "
        "every tree by replaying its trace, as every chain."
        + (
            " The runs sample: the control then sets each node's accept number (0 at its position's hit rank, "
            "+inf elsewhere), so the accepted paths follow the same rule (docs/design.md, Token trees in the "
            "simulator)."
            if ruled[0].summary["config"].get("sampling")
            else ""
        ),
        "",
        *_md_table(TREE_HEADERS, rows),
        "",
        *_md_table(["from the rule", "median absolute error", "max absolute error"], spreads),
        "",
    ]


def tree_errors(results: list[Result]) -> dict:
    """Median and max absolute error of the rule's mean accepted length and tok/s over the trees it predicted."""
    errors = [r.control_errors for r in results if r.control_errors is not None]
    if not errors:
        return {}
    return {
        name: (statistics.median(abs(e[i]) for e in errors), max(abs(e[i]) for e in errors))
        for i, name in enumerate(("mean accepted length", "tok/s"))
    }


def diagnosis(r: Result) -> str:
    """Which phase carries a miss: the phase totals furthest apart, against the decode-time difference."""
    c = error_carrier(r.phases)
    delta = r.predicted["decode_ms"] - r.summary["decode_ms"]
    others = ", ".join(
        f"{x['phase']} {x['predicted_ms'] - x['measured_ms']:+.1f}"
        for x in r.phases
        if x is not c and abs(x["predicted_ms"] - x["measured_ms"]) >= 0.05 * abs(delta or 1)
    )
    return (
        f"- **{r.config.name}** (error {_pct(r.error)}): predicted decode {r.predicted['decode_ms']:.1f} ms vs "
        f"measured {r.summary['decode_ms']:.1f} ms ({delta:+.1f} ms). Largest phase gap: **{c['phase']}** "
        f"predicted {c['predicted_ms']:.1f} ms vs measured {c['measured_ms']:.1f} ms "
        f"({c['predicted_ms'] - c['measured_ms']:+.1f} ms)" + (f"; other gaps (ms): {others}." if others else ".")
    )


def markdown(results: list[Result], meta: dict) -> str:
    setup = meta["profile_setup"]
    weights = meta["weights"].upper()
    lines = [
        f"# Validation: simulator vs real runs ({meta['placement']})",
        "",
        f"**Weights: {weights}**"
        + (
            " (real architectures, seeded random values: timings are real, outputs are "
            "not language; acceptance is set by acceptance control)"
            if meta["weights"] == "synthetic"
            else ""
        ),
        "",
        f"- Target: {meta['target']} ({meta['target_info']}); draft: {meta['draft']} ({meta['draft_info']})",
        f"- Placement: **{meta['placement']}**; CUDA graphs: {'on' if meta['graphs'] else 'off'}; "
        f"GPUs (profile env): {', '.join(meta['gpus'])}",
        f"- Profile: `{meta['profile']}` ({meta['profile_origin']}; target {setup['target'].get('name')}, "
        f"draft {setup['draft'].get('name')}, created {meta['profile_created']})",
        f"- Acceptance: {meta['acceptance']}",
        f"- Prompts: {len(meta['prompts'])} Spec-Bench questions ({meta['prompt_spec']}: "
        f"{', '.join(meta['prompts'])}), {meta['max_new_tokens']} new tokens each, "
        + (
            f"{meta['warmup']} warm-up generation(s) per configuration (not recorded)"
            if meta["warmup"] is not None
            else "the runs' warm-up generations are not in their traces"
        ),
        f"- Command: `{meta['command']}`",
        *_repeats(meta.get("repeats", 1)),
        *_exactness(meta.get("inexact")),
        "- Calibration: "
        + ("; ".join(meta["calibrations"]) if meta.get("calibrations") else "none (the profile's costs as measured)"),
        "",
    ]
    lines += [f"> {w}" for w in meta["warnings"]] + ([""] if meta["warnings"] else [])
    med = errors_summary(results)
    lines += [
        "## Summary",
        "",
        f"{len(results)} configurations. Absolute error of predicted decode tok/s against measured:",
        "",
        *_md_table(
            ["estimator", "median absolute error", "max absolute error"],
            [[name.replace("_", " "), f"{100 * m:.1f}%", f"{100 * x:.1f}%"] for name, (m, x) in med.items()],
        ),
        "",
        "## Definitions",
        "",
        "- **measured tok/s**: decode tokens (all generated tokens but the first, which belongs to TTFT) over "
        "decode wall time, summed over the prompts (the run summary's `decode_tok_s`).",
        "- **predicted tok/s**: `python -m sim` on the same profile, replaying this run's own trace (exact at "
        "the recorded K) with the same schedule, head, probes, placement and regime; with the in-process "
        "calibration where the runs carry one: each decoder instance first decoded a calibration prompt "
        "(not a validation prompt) under baseline and deferred; pooled over the instances with the same head "
        "(the baseline over all), the profile's target forward, draft body and draft head costs are scaled "
        "by measured / predicted phase times, and the read gap is fitted so that those generations take "
        "their measured decode time.",
        "- **profile-only error**: the same prediction from the profile's costs as measured, uncalibrated.",
        "- **error** = (predicted - measured) / measured, for every estimator.",
        "- **closed form**: the study's TPOT = (T_p(K) + K·T_q + T_o) / E[R], tok/s = 1000 / TPOT, where "
        "T_p(K) is the profile's target forward for the verify size the schedule uses (K tokens for ordinary "
        "and pipelined, K+1 for deferred and pipelined-deferred, 1 for baseline) at the trace's mean "
        "context; T_q is one draft step (body at the mean context + the dense head, or FlashHead at the run's "
        "probes); T_o is the per-round overhead: the standalone one-token target append (ordinary and "
        "pipelined only) + one host read (`item_ms`) + the decoder's per-round bookkeeping + two token copies "
        "on two GPUs; E[R] is the trace's mean tokens emitted per round. It ignores skipped verifies, "
        "overlap between devices and the look-ahead.",
        "- **phases**: measured = the trace's per-round `phases_ms` summed (device phases are CUDA-event "
        "intervals, `sync` the host's read, `other` the rest of each round's wall time; overlapped phases on "
        "two GPUs can sum past the wall time); predicted = the simulator's busy time per phase. `initial` "
        "(the draft's prefill): on one device the decoder issues it after the first token, so it is decode "
        "time, measured as the first round's `other` beyond the median `other` of the generation's later "
        "rounds (and taken out of `other`); on two devices it runs within TTFT.",
        "- **verify m/p, append m/p**: target verify and standalone append calls, measured / predicted "
        "(equal when the trace replays exactly).",
        "",
        "## Results",
        "",
        *_md_table(*_table(results)),
        "",
    ]
    lines += tree_section(results)
    missed = [r for r in results if abs(r.error) > THRESHOLD]
    lines += [f"## Configurations off by more than {100 * THRESHOLD:.0f}%", ""]
    lines += [diagnosis(r) for r in missed] if missed else ["None."]
    lines += turnaround_section(meta.get("timeline") or {})
    lines += ["", "## Phases per configuration", ""]
    for r in results:
        lines += [
            f"### {r.config.name}",
            "",
            f"Measured {r.measured_tok_s:.2f} tok/s, predicted {r.predicted_tok_s:.2f} ({_pct(r.error)}), "
            f"closed form {r.closed.tok_s:.2f} ({_pct(r.closed_error)}: T_p({r.closed.verify_tokens})="
            f"{r.closed.T_p:.3f} ms, T_q={r.closed.T_q:.3f} ms, T_o={r.closed.T_o:.3f} ms, "
            f"E[R]={r.closed.E_R:.3f}, mean context {r.closed.context:.0f}). Trace: `{r.trace}`.",
            "",
            *_md_table(
                ["phase", "measured ms", "measured share", "predicted ms", "predicted share"],
                [
                    [
                        x["phase"],
                        f"{x['measured_ms']:.1f}",
                        f"{100 * x['measured_share']:.1f}%",
                        f"{x['predicted_ms']:.1f}",
                        f"{100 * x['predicted_share']:.1f}%",
                    ]
                    for x in r.phases
                ],
            ),
            "",
        ]
    lines += ["## Simulator notes", ""] + [f"- {n}" for n in meta["notes"]]
    lines += [
        "",
        "Files: `results.csv` (one row per configuration), `scatter.png` (predicted vs measured), "
        "`phases.png` (phase shares), `traces/` (trace JSONL and run summary per configuration)"
        + (", `profile.json` / `profile.md` (measured for this report)" if meta["measured_here"] else "")
        + _timeline_files(meta.get("timeline") or {})
        + ".",
    ]
    return "\n".join(lines) + "\n"


def turnaround_section(timeline: dict) -> list[str]:
    """The verify's turnaround in the measured and predicted timelines of one configuration
    (validate/turnaround.py); nothing where there are no such timelines."""
    rows = timeline.get("turnaround") or []
    if not rows:
        return []

    def cell(row, side):
        value = row[f"{side}_ms"]
        return "-" if value is None else f"{value:.3f} ({row[f'{side}_count']})"

    return [
        "",
        f"## A verify's turnaround ({timeline['configuration']}, its timelines)",
        "",
        "From each verify's end to the start of the next draft step or verify, whichever comes first: the "
        "settle, the host's read and its bookkeeping before the next launch. Median ms (how many).",
        "",
        *_md_table(
            ["next work", "measured", "predicted"],
            [[row["next"], cell(row, "measured"), cell(row, "predicted")] for row in rows],
        ),
    ]


TIMELINE_FILES = {
    "timeline-measured.json": (
        "the real run's first recorded generation of {c}: CUDA events on GPU, perf_counter on the CPU"
    ),
    "timeline-predicted.json": "the simulator's timeline of the same generation, as it predicts it",
    "timeline.png": "both as Gantt charts, measured above predicted, per stream",
}


def _timeline_files(timeline: dict) -> str:
    """The Files line's part for the timelines (Chrome/Perfetto traces: open them in ui.perfetto.dev)."""
    files = timeline.get("files") or []
    if not files:
        return ""
    parts = [
        f"`{name}` ({TIMELINE_FILES[name].format(c=timeline.get('configuration') or 'one configuration')})"
        for name in files
    ]
    return ", " + ", ".join(parts) + " (the .json files are Chrome/Perfetto traces: https://ui.perfetto.dev)"


def csv_text(results: list[Result]) -> str:
    rows = []
    for r in results:
        s, c = r.summary, r.closed
        row = {
            "configuration": r.config.name,
            "schedule": r.config.schedule,
            "head": r.config.head,
            "K": r.config.K,
            "tree": r.config.tree,
            "probes": r.probes,
            "prompts": len(s["per_prompt"]),
            "decode_tokens": s["decode_tokens"],
            "measured_tok_s": r.measured_tok_s,
            "runs_slowest_tok_s": r.runs_range[0] if r.runs_range else None,
            "runs_fastest_tok_s": r.runs_range[1] if r.runs_range else None,
            "predicted_tok_s": r.predicted_tok_s,
            "error": r.error,
            "closed_form_tok_s": c.tok_s,
            "closed_form_error": r.closed_error,
            "T_p_ms": c.T_p,
            "T_q_ms": c.T_q,
            "T_o_ms": c.T_o,
            "E_R": c.E_R,
            "mean_context": c.context,
            "acceptance": s["acceptance"],
            "mean_emitted": s["mean_emitted"],
            "measured_decode_ms": s["decode_ms"],
            "predicted_decode_ms": r.predicted["decode_ms"],
            "ttft_ms": s["ttft_ms"],
            "measured_verify_calls": s["verify_calls"],
            "predicted_verify_calls": r.predicted["verify_calls"],
            "measured_append_calls": s["append_calls"],
            "predicted_append_calls": r.predicted["append_calls"],
        }
        for x in r.phases:
            for key in ("measured_ms", "predicted_ms", "measured_share", "predicted_share"):
                row[f"{x['phase']}_{key}"] = x[key]
        row["profile_only_tok_s"] = r.profile_only["decode_tok_s"] if r.profile_only else None
        row["profile_only_error"] = r.profile_only_error
        row["measured_mean_accepted"] = r.measured_accepted
        row["predicted_mean_accepted"] = r.predicted.get("mean_accepted")
        control = r.control_errors
        row["control_rule_mean_accepted"] = r.by_control["mean_accepted"] if control else None
        row["control_rule_accepted_error"] = control[0] if control else None
        row["control_rule_tok_s"] = r.by_control["decode_tok_s"] if control else None
        row["control_rule_error"] = control[1] if control else None
        row["trace"] = r.trace
        rows.append(row)
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def scatter_png(results: list[Result], path: Path, title: str) -> None:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 6))
    measured = [r.measured_tok_s for r in results]
    ax.scatter(measured, [r.predicted_tok_s for r in results], label="simulator", marker="o")
    ax.scatter(measured, [r.closed.tok_s for r in results], label="closed form", marker="x")
    for r in results:
        ax.annotate(r.config.name, (r.measured_tok_s, r.predicted_tok_s), fontsize=5, alpha=0.7)
    values = measured + [r.predicted_tok_s for r in results] + [r.closed.tok_s for r in results]
    lo, hi = 0.9 * min(values), 1.1 * max(values)
    ax.plot([lo, hi], [lo, hi], color="black", linewidth=1, label="identity")
    ax.plot(
        [lo, hi],
        [lo * (1 + THRESHOLD), hi * (1 + THRESHOLD)],
        color="grey",
        linewidth=0.6,
        linestyle="--",
        label=f"±{100 * THRESHOLD:.0f}%",
    )
    ax.plot([lo, hi], [lo * (1 - THRESHOLD), hi * (1 - THRESHOLD)], color="grey", linewidth=0.6, linestyle="--")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel("measured decode tok/s")
    ax.set_ylabel("predicted decode tok/s")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    fig.savefig(path, dpi=130, bbox_inches="tight")
    plt.close(fig)


def phases_png(results: list[Result], path: Path, title: str) -> None:
    """Measured and predicted phase shares side by side for every configuration (stacked bars)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(max(7.0, 0.55 * len(results) + 2), 4.5))
    phases = [x["phase"] for x in results[0].phases]
    colors = plt.get_cmap("tab10").colors
    xs_m = [3 * i for i in range(len(results))]
    xs_p = [3 * i + 1 for i in range(len(results))]
    bottom_m, bottom_p = [0.0] * len(results), [0.0] * len(results)
    for j, phase in enumerate(phases):
        m = [100 * r.phases[j]["measured_share"] for r in results]
        p = [100 * r.phases[j]["predicted_share"] for r in results]
        ax.bar(xs_m, m, bottom=bottom_m, color=colors[j % 10], label=phase)
        ax.bar(xs_p, p, bottom=bottom_p, color=colors[j % 10], hatch="//", edgecolor="white", linewidth=0)
        bottom_m = [b + v for b, v in zip(bottom_m, m)]
        bottom_p = [b + v for b, v in zip(bottom_p, p)]
    ax.set_xticks([x + 0.5 for x in xs_m])
    ax.set_xticklabels([r.config.name for r in results], rotation=60, ha="right", fontsize=6)
    ax.set_ylabel("% of decode wall time (left: measured, right hatched: predicted)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.savefig(path, dpi=130, bbox_inches="tight")
    plt.close(fig)


def timeline_png(measured: tuple[list, dict], predicted: tuple[list, dict], path: Path) -> None:
    """Gantt charts of one generation: per stream (target device, draft device, host) the measured
    timeline above the predicted one, on one time axis, colored by event name (contracts.timeline;
    each argument is what read_timeline returns). Host issue times are drawn lighter than reads and gaps."""
    plt = _pyplot()
    from matplotlib.patches import Patch

    colors = dict(zip(TIMELINE_NAMES, plt.get_cmap("tab10").colors))
    rows = [
        (stream, label, intervals)
        for stream in TIMELINE_STREAMS
        for label, (intervals, _) in (("measured", measured), ("predicted", predicted))
    ]
    fig, ax = plt.subplots(figsize=(14, 1.0 + 0.55 * len(rows)))
    seen = set()
    for y, (stream, _, intervals) in enumerate(reversed(rows)):
        by_name: dict[str, list] = {}
        for s, name, start, end, _ in intervals:
            if s == stream:
                by_name.setdefault(name, []).append((start, end - start))
        for name, bars in by_name.items():
            issue = category(stream, name) == "issue"
            ax.broken_barh(bars, (y - 0.38, 0.76), facecolors=colors[name], alpha=0.45 if issue else 1.0, linewidth=0)
            seen.add(name)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([f"{stream} {label}" for stream, label, _ in reversed(rows)], fontsize=8)
    for y in range(1, len(rows), 2):
        ax.axhline(y + 0.5, color="grey", linewidth=0.5)
    for y, (stream, _, intervals) in enumerate(reversed(rows)):
        if not any(s == stream for s, *_ in intervals):
            ax.text(
                0.5,
                y,
                "no work"
                + (" (one device: both models' work is on target-device)" if stream == "draft-device" else ""),
                transform=ax.get_yaxis_transform(),
                ha="center",
                va="center",
                fontsize=7,
                color="grey",
            )
    ax.axvline(0, color="black", linewidth=0.8, linestyle=":")
    ax.set_xlabel("ms from the decode start (the first token on the host; prefills before it)")
    meta, other = measured[1], predicted[1]
    config = meta.get("configuration", {})
    prompt = (meta.get("generation") or {}).get("prompt_id", "?")
    weights = {meta.get("weights"), other.get("weights")}
    label = "SYNTHETIC weights" if "synthetic" in weights else f"{'/'.join(sorted(w for w in weights if w))} weights"
    ax.set_title(
        f"{config.get('name', '?')}, prompt {prompt}: measured (upper row) vs predicted (lower row), "
        f"{meta.get('target', '?')} + {meta.get('draft', '?')}, {config.get('placement', '?')} ({label}); "
        f"decode {meta.get('decode_ms', 0):.1f} ms measured, {other.get('decode_ms', 0):.1f} ms predicted",
        fontsize=9,
    )
    handles = [Patch(color=colors[name], label=name) for name in TIMELINE_NAMES if name in seen]
    handles.append(Patch(color="grey", alpha=0.45, label="host: issuing that work"))
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.savefig(path, dpi=130, bbox_inches="tight")
    plt.close(fig)


def write(folder: Path, results: list[Result], meta: dict) -> None:
    title = f"{meta['target']} + {meta['draft']}, {meta['placement']} ({meta['weights']} weights)"
    write_atomic(folder / "report.md", markdown(results, meta))
    write_atomic(folder / "results.csv", csv_text(results))
    scatter_png(results, folder / "scatter.png", title)
    phases_png(results, folder / "phases.png", title)
