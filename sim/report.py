"""Tables on stdout and files (JSON, CSV, PNG) for simulated results; files written atomically."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

from contracts.files import write_atomic
from contracts.names import SIMULATED_PHASES

SHARE_COLUMNS = (
    ("draft_body", "body%"),
    ("draft_head", "head%"),
    ("sync", "sync%"),
    ("verify", "verify%"),
    ("finalize", "final%"),
)


def _fmt(value, digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def flat(row: dict) -> dict:
    """One CSV/table row: scalars, with phase times and shares spread into columns."""
    out = {k: v for k, v in row.items() if not isinstance(v, (dict, list))}
    for phase, ms in row["phase_ms"].items():
        out[f"{phase}_ms"] = ms
        out[f"{phase}_share"] = row["phase_share"][phase]
    return out


def render(headers: list[str], lines: list[list[str]]) -> str:
    widths = [max(len(h), *(len(line[i]) for line in lines)) if lines else len(h) for i, h in enumerate(headers)]
    text = ["  ".join(h.rjust(w) for h, w in zip(headers, widths)), "  ".join("-" * w for w in widths)]
    text += ["  ".join(c.rjust(w) for c, w in zip(line, widths)) for line in lines]
    return "\n".join(text)


LEGEND = """\
columns:
  tok/s      decode tokens per second (all generated tokens but the first) predicted for the run
  speedup    tok/s over the baseline's (the target alone)
  acc/prop   accepted / proposed draft tokens, as the simulated rounds came out (not the per-token
             acceptance a given with --acceptance: a round stops at its first rejection)
  tok/rd     tokens emitted per round
  draft%     share of decode wall time the draft (body + head) was busy; verify% and final% the same
             for the target's verifies and standalone appends. On two devices they overlap, so the
             shares can sum past 100.
  ceil x     tok/s with the draft head made free, over tok/s: the most a faster head can buy
  --wide adds TTFT, TPOT, verify and append calls, and the body, head and host-sync shares.
"""


def _columns(wide: bool) -> list[tuple[str, object]]:
    """(header, cell of a row) for the table; the default fits 100 columns."""
    share = lambda key: lambda r: f"{100 * r['phase_share'][key]:.1f}"  # noqa: E731
    columns = [
        ("schedule", lambda r: r["schedule"]),
        ("head", lambda r: r["head"]),
        ("K", lambda r: str(r["K"])),
        ("tok/s", lambda r: _fmt(r["decode_tok_s"])),
        ("speedup", lambda r: _fmt(r["speedup"], 3)),
    ]
    if wide:
        columns += [("TTFT ms", lambda r: _fmt(r["ttft_ms"], 1)), ("TPOT ms", lambda r: _fmt(r["tpot_ms"], 2))]
    columns += [("acc/prop", lambda r: _fmt(r["acceptance"], 3)), ("tok/rd", lambda r: _fmt(r["mean_emitted"], 2))]
    if wide:
        columns += [("verify", lambda r: str(r["verify_calls"])), ("append", lambda r: str(r["append_calls"]))]
        columns += [(name, share(phase)) for phase, name in SHARE_COLUMNS]
    columns += [("draft%", lambda r: f"{100 * r['draft_path_share']:.1f}")]
    if not wide:
        columns += [("verify%", share("verify")), ("final%", share("finalize"))]
    if wide:
        columns += [("head-free tok/s", lambda r: _fmt(r["head_only_tok_s"]))]
    columns += [("ceil x", lambda r: _fmt(r["head_only_ratio"], 3))]
    return columns


def _arm(row: dict) -> str:
    return f"{row['policy']} {row['arm']}" if row.get("policy") else "-"


def results_table(rows: list[dict], label: str | None = None, wide: bool = False) -> str:
    columns = ([(label, lambda r: _fmt(r.get("label")))] if label else []) + _columns(wide)
    if any(r.get("tree") for r in rows):  # token trees (sim/trees.py): the tree and its mean accepted length
        columns[3:3] = [("tree", lambda r: r.get("tree") or "-"), ("acc/rd", lambda r: _fmt(r["mean_accepted"], 2))]
    if any(
        r.get("policy") not in (None, "fixed") or not r.get("arm", "draft-model").startswith("draft-model")
        for r in rows
    ):
        columns.insert(3, ("policy", _arm))
    return render([h for h, _ in columns], [[cell(row) for _, cell in columns] for row in rows])


def policy_table(rows: list[dict]) -> str:
    """Per schedule and head: every policy's tok/s against the best fixed arm's (the fastest fixed row)."""
    headers = ["schedule", "head", "policy", "tok/s", "vs best fixed %", "arms played (rounds)"]
    lines = []
    groups: dict = {}
    for row in rows:
        if row["schedule"] != "baseline":
            groups.setdefault((row["schedule"], row["head"]), []).append(row)
    for (schedule, head), group in groups.items():
        fixed = [r for r in group if r["policy"] == "fixed"]
        best = max(fixed, key=lambda r: r["decode_tok_s"]) if fixed else None
        for row in group:
            name = _arm(row) + (" (best fixed)" if row is best and len(fixed) > 1 else "")
            ratio = 100.0 * (row["decode_tok_s"] / best["decode_tok_s"] - 1) if best else None
            played = " ".join(f"{arm}={n}" for arm, n in sorted(row["pulls"].items(), key=lambda x: -x[1])[:4])
            lines.append([schedule, head, name, _fmt(row["decode_tok_s"]), _fmt(ratio, 1), played])
    return "policies against the best fixed arm\n" + render(headers, lines)


def comparison_table(before: list[dict], after: list[dict], change: str) -> str:
    headers = ["schedule", "head", "base tok/s", "what-if tok/s", "delta %", "base acc/prop", "what-if acc/prop"]
    lines = []
    pairs = []  # each what-if row with the base row of its schedule and head (a policy may drop schedules)
    for a in after:
        b = next((b for b in before if (b["schedule"], b["head"]) == (a["schedule"], a["head"])), None)
        if b is not None:
            pairs.append((b, a))
    for b, a in pairs:
        delta = 100.0 * (a["decode_tok_s"] / b["decode_tok_s"] - 1) if b["decode_tok_s"] else None
        lines.append(
            [
                b["schedule"],
                b["head"] if b["head"] == a["head"] else f"{b['head']}->{a['head']}",
                _fmt(b["decode_tok_s"]),
                _fmt(a["decode_tok_s"]),
                _fmt(delta, 1) if delta is not None else "-",
                _fmt(b["acceptance"], 3),
                _fmt(a["acceptance"], 3),
            ]
        )
    return f"what-if: {change}\n" + render(headers, lines)


def write_outputs(out: Path, payload: dict, rows: list[dict], figures: dict) -> list[str]:
    """results.json, results.csv and the PNG figures into the folder `out`; returns their names."""
    written = []
    clean = [{k: v for k, v in row.items() if k != "rounds_detail"} for row in rows]
    payload = dict(payload, rows=clean)
    write_atomic(out / "results.json", json.dumps(payload, indent=2).encode())
    written.append("results.json")
    buffer = io.StringIO()
    flat_rows = [flat(row) for row in clean]
    fields = list(dict.fromkeys(k for row in flat_rows for k in row))
    writer = csv.DictWriter(buffer, fieldnames=fields)
    writer.writeheader()
    writer.writerows(flat_rows)
    write_atomic(out / "results.csv", buffer.getvalue().encode())
    written.append("results.csv")
    for name, png in figures.items():
        write_atomic(out / name, png)
        written.append(name)
    return written


def _png(fig) -> bytes:
    """The figure as PNG bytes; closed, so a long sweep does not keep every figure open."""
    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=120, bbox_inches="tight")
    plt.close(fig)
    return buffer.getvalue()


def phase_share_figure(rows: list[dict], title: str) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    phases = SIMULATED_PHASES
    labels = [f"{r['schedule']}\n{r['head']}" for r in rows]
    fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(rows)), 4))
    bottom = [0.0] * len(rows)
    for phase in phases:
        values = [100 * r["phase_share"][phase] for r in rows]
        ax.bar(labels, values, bottom=bottom, label=phase)
        bottom = [b + v for b, v in zip(bottom, values)]
    ax.set_ylabel("% of decode wall time (overlapped work can exceed 100%)")
    ax.set_title(title)
    ax.legend(fontsize=7, ncol=4)
    ax.tick_params(axis="x", labelsize=7, labelrotation=30)
    return _png(fig)


def sweep_figure(rows: list[dict], key: str, title: str) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4))
    series: dict[str, list] = {}
    for row in rows:
        series.setdefault(f"{row['schedule']} {row['head']}", []).append((row["sweep_value"], row["decode_tok_s"]))
    numeric = all(isinstance(x, (int, float)) for points in series.values() for x, _ in points)
    for name, points in series.items():
        xs, ys = zip(*points)
        ax.plot(xs if numeric else [str(x) for x in xs], ys, marker="o", label=name)
    ax.set_xlabel(key)
    ax.set_ylabel("decode tok/s (predicted)")
    ax.set_title(title)
    ax.legend(fontsize=7)
    return _png(fig)
