"""python -m measure.beta_plot BETA_JSON: the per-category figure of a beta result (python -m measure.beta),
drawn from its JSON into beta_by_category.png beside it.

Why: the overall figure (beta.png) pools the categories, and FlashHead's loss under sampling is not
the same in every category (summarization and rag lose most at low probe counts). One panel per
Spec-Bench category: FlashHead's beta per probe count (solid, with its bootstrap interval) against
the dense head's (dashed), one color per temperature.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

from contracts import UsageError
from contracts.cli import OneLineParser, run_command
from contracts.files import check_output_file, read_json

from .figures import write_figure

FILE = "beta_by_category.png"


def category_figure(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    categories = list(result["per_category"])
    columns = 3
    rows = math.ceil(len(categories) / columns)
    fig, axes = plt.subplots(rows, columns, figsize=(4 * columns, 3.2 * rows), sharex=True, sharey=True, squeeze=False)
    for ax, category in zip(axes.flat, categories):
        for index, (t, curve) in enumerate(result["per_category"][category].items()):
            color, flash = f"C{index}", curve["flashhead"]
            ax.plot(flash["probes"], flash["beta"], marker="o", markersize=3, color=color, label=f"FlashHead, T={t}")
            ax.fill_between(flash["probes"], flash["low"], flash["high"], color=color, alpha=0.12)
            ax.axhline(curve["dense"]["beta"], color=color, linestyle="--", label=f"dense head, T={t}")
        n = next(iter(result["per_category"][category].values()))["dense"]["n"]
        ax.set_title(f"{category} ({n} states)", fontsize=9)
        ax.set_xscale("log", base=2)
        ax.grid(alpha=0.3)
    for ax in axes.flat[len(categories) :]:
        ax.axis("off")
    for ax in axes[-1]:
        ax.set_xlabel("FlashHead probes p")
    for ax in axes[:, 0]:
        ax.set_ylabel("beta = sum min(p, q)")
    axes.flat[0].legend(fontsize=7)
    fig.suptitle(f"{result['model_label']} ({result['weights']} weights): beta per Spec-Bench category")
    fig.tight_layout()
    write_figure(fig, path, dpi=110)


def main(argv=None) -> int:
    def body():
        p = OneLineParser(prog="python -m measure.beta_plot", description=__doc__)
        p.add_argument("beta_json", help="a beta.json written by python -m measure.beta")
        args = p.parse_args(argv)
        result = read_json(args.beta_json, "beta result")
        out = Path(args.beta_json).with_name(FILE)
        check_output_file(out, "the figure", "figure")
        try:
            category_figure(result, out)
        except (KeyError, IndexError, TypeError, AttributeError, ValueError) as error:
            raise UsageError(
                f"{args.beta_json}: not a beta.json of python -m measure.beta (per_category, model_label and "
                f"weights as it writes them; {type(error).__name__}: {error})"
            ) from None
        print(f"wrote {out}")

    return run_command(body)


if __name__ == "__main__":
    sys.exit(main())
