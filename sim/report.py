"""Tables on stdout and files (JSON, CSV, PNG) for simulated results; files written atomically."""
from __future__ import annotations

import csv
import io
import json
from pathlib import Path

from contracts.files import write_atomic
from contracts.names import SIMULATED_PHASES

SHARE_COLUMNS = (("draft_body", "body%"), ("draft_head", "head%"), ("sync", "sync%"),
                 ("verify", "verify%"), ("finalize", "final%"))


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
    text = ["  ".join(h.rjust(w) for h, w in zip(headers, widths)),
            "  ".join("-" * w for w in widths)]
    text += ["  ".join(c.rjust(w) for c, w in zip(line, widths)) for line in lines]
    return "\n".join(text)


def results_table(rows: list[dict], label: str | None = None) -> str:
    headers = ([label] if label else []) + ["schedule", "head", "K", "tok/s", "speedup", "TTFT ms", "TPOT ms",
                                            "accept", "emit/rd", "verify", "append"]
    headers += [name for _, name in SHARE_COLUMNS] + ["draft%", "head-free tok/s", "ceiling x"]
    lines = []
    for row in rows:
        line = ([_fmt(row.get("label"))] if label else []) + [
            row["schedule"], row["head"], str(row["K"]), _fmt(row["decode_tok_s"]), _fmt(row["speedup"], 3),
            _fmt(row["ttft_ms"], 1), _fmt(row["tpot_ms"], 2), _fmt(row["acceptance"], 3),
            _fmt(row["mean_emitted"], 3), str(row["verify_calls"]), str(row["append_calls"])]
        line += [f"{100 * row['phase_share'][phase]:.1f}" for phase, _ in SHARE_COLUMNS]
        line += [f"{100 * row['draft_path_share']:.1f}", _fmt(row["head_only_tok_s"]),
                 _fmt(row["head_only_ratio"], 3)]
        lines.append(line)
    return render(headers, lines)


def comparison_table(before: list[dict], after: list[dict], change: str) -> str:
    headers = ["schedule", "head", "base tok/s", "what-if tok/s", "delta %", "base speedup",
               "what-if speedup", "base accept", "what-if accept"]
    lines = []
    for b, a in zip(before, after):
        delta = 100.0 * (a["decode_tok_s"] / b["decode_tok_s"] - 1) if b["decode_tok_s"] else None
        lines.append([b["schedule"], b["head"] if b["head"] == a["head"] else f"{b['head']}->{a['head']}",
                      _fmt(b["decode_tok_s"]), _fmt(a["decode_tok_s"]), _fmt(delta, 1) if delta is not None else "-",
                      _fmt(b["speedup"], 3), _fmt(a["speedup"], 3), _fmt(b["acceptance"], 3),
                      _fmt(a["acceptance"], 3)])
    return f"what-if: {change}\n" + render(headers, lines)


def write_outputs(out: Path, payload: dict, rows: list[dict], figures: dict) -> list[Path]:
    """results.json, results.csv and the PNG figures, each written whole or not at all."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    clean = [{k: v for k, v in row.items() if k != "rounds_detail"} for row in rows]
    payload = dict(payload, rows=clean)
    write_atomic(out / "results.json", json.dumps(payload, indent=2).encode())
    written.append(out / "results.json")
    buffer = io.StringIO()
    flat_rows = [flat(row) for row in clean]
    fields = list(dict.fromkeys(k for row in flat_rows for k in row))
    writer = csv.DictWriter(buffer, fieldnames=fields)
    writer.writeheader()
    writer.writerows(flat_rows)
    write_atomic(out / "results.csv", buffer.getvalue().encode())
    written.append(out / "results.csv")
    for name, png in figures.items():
        write_atomic(out / name, png)
        written.append(out / name)
    return written


def _png(fig) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=120, bbox_inches="tight")
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
    data = _png(fig)
    plt.close(fig)
    return data


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
    data = _png(fig)
    plt.close(fig)
    return data
