"""python -m measure: microbenchmark every cost of the speculative loop and write a cost profile."""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import sys
from pathlib import Path

from contracts import PLACEMENTS, UsageError
from contracts.cli import OneLineParser, require_modules

require_modules("python -m measure", ("torch",), "pip install torch, then pip install -e '.[model]'")

from model.cli import add_sampling_options, run_torch_command  # noqa: E402

from .profiling import MeasureSettings, measure_profile  # noqa: E402

DEFAULTS = MeasureSettings()


def _parser(overrides_only: bool) -> OneLineParser:
    """The options; with `overrides_only` (validate's --measure-args) nothing has a default and --out is
    not taken, so only the options given replace validate's settings."""
    p = OneLineParser(
        prog="python -m measure", description=__doc__, argument_default=argparse.SUPPRESS if overrides_only else None
    )
    add = p.add_argument
    add("--target", help=f"target preset or checkpoint folder (default {DEFAULTS.target})")
    add("--draft", help=f"draft preset or checkpoint folder (default {DEFAULTS.draft})")
    add(
        "--placement",
        choices=PLACEMENTS,
        help="where the models run (default: two-gpu with 2 GPUs, one-gpu with 1, else cpu)",
    )
    add("--dtype", help="activation/weight dtype (default bf16 on GPU, float32 on CPU)")
    add("--contexts", help="context lengths for forward and body costs (default 256,1024)")
    add("--prompt-lengths", help="prompt lengths for prefill costs (default 128,512)")
    add("--K-max", type=int, help=f"largest K: target forwards are timed for n = 1..K+2 (default {DEFAULTS.K_max})")
    add("--probes", help="FlashHead probe counts (default 1,2,4,... up to c/4, and c/16)")
    add("--clustering", help="load FlashHead assets from this folder (default: build from the draft's head)")
    add("--graphs", help="regimes: on, off or on,off (default on,off on GPU, off on CPU)")
    add("--kernels", choices=["fused", "torch"], help="layer kernels (default fused for Qwen3 on GPU)")
    add("--prompts", help=f"Spec-Bench prompts for the agreement r(p) (default {DEFAULTS.prompts})")
    add("--prompts-file", help="question.jsonl (default: the copy shipped in model/data)")
    add("--agreement-max-len", type=int, help=f"tokens per prompt for r(p) (default {DEFAULTS.agreement_max_len})")
    add("--reps", type=int, help=f"timed repetitions per point (default {DEFAULTS.reps})")
    add("--warmup", type=int, help=f"warm-up runs per point (default {DEFAULTS.warmup})")
    add("--seed", type=int, help="seed of synthetic weights, the clustering and sampling (default 0)")
    add_sampling_options(p, defaults=False)
    add("--early-exit-layers", type=int, help="also time the early-exit drafter of the target's first L layers")
    add("--lookup-ngram", type=int, help="prompt lookup's max_matching_ngram_size for its timing (default 2)")
    if not overrides_only:
        add("--out", required=True, help="the profile JSON to write (a Markdown summary goes beside it)")
    return p


def _ints(text: str, option: str) -> tuple[int, ...]:
    try:
        return tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise UsageError(f"{option}: expected comma-separated integers, got {text!r}") from None


def settings_from(argv: list[str], base: MeasureSettings = DEFAULTS, overrides_only: bool = False):
    """(settings, out path or None) from command-line options, over `base`."""
    given = {k: v for k, v in vars(_parser(overrides_only).parse_args(argv)).items() if v is not None}
    out = given.pop("out", None)
    for option in ("contexts", "prompt_lengths", "probes"):
        if option in given:
            given[option] = _ints(given[option], "--" + option.replace("_", "-"))
    if "graphs" in given:
        given["graphs"] = tuple(v.strip() for v in given["graphs"].split(","))
    return dataclasses.replace(base, **given), out


def command_line(settings: MeasureSettings, out: Path) -> str:
    """The `python -m measure` command that measures `settings` into `out`."""
    parts = ["python -m measure"]
    for field in dataclasses.fields(settings):
        value = getattr(settings, field.name)
        if value != getattr(DEFAULTS, field.name) and value is not None:
            text = ",".join(map(str, value)) if isinstance(value, tuple) else str(value)
            parts += ["--" + field.name.replace("_", "-"), shlex.quote(text)]
    return " ".join(parts + ["--out", shlex.quote(str(out))])


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)

    def body():
        settings, out = settings_from(argv)
        for path in measure_profile(settings, Path(out), "python -m measure " + shlex.join(argv)):
            print(f"wrote {path}")

    return run_torch_command(body)


if __name__ == "__main__":
    sys.exit(main())
