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

from contracts.names import tensor_parallel_size  # noqa: E402
from model.cli import add_sampling_options, run_torch_command  # noqa: E402

from . import tensor_parallel  # noqa: E402
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
        help=f"where the models run: {', '.join(PLACEMENTS)} or tpN (default: two-gpu with 2 GPUs, one-gpu with 1, "
        "else cpu); tpN times a target tensor-parallel over N GPUs (under torchrun) into --add-to's profile",
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
    add(
        "--passes",
        type=int,
        help="time the target and draft grid this many times in turn, each point the median of its passes "
        f"(default {DEFAULTS.passes}, at most 9)",
    )
    add("--seed", type=int, help="seed of synthetic weights, the clustering and sampling (default 0)")
    add_sampling_options(p, defaults=False)
    add("--early-exit-layers", type=int, help="also time the early-exit drafter of the target's first L layers")
    add(
        "--tree-widths",
        help="token trees: also time the target forward and the draft body at these token counts (node count + 1 "
        "of each tree's verify, its frontier widths), e.g. 4,8,16,32,48,64,65; the decoder's fixed width grows to "
        "the largest",
    )
    add("--lookup-ngram", type=int, help="prompt lookup's max_matching_ngram_size for its timing (default 2)")
    add(
        "--heads",
        help="also time these head specs into the profile's heads section (e.g. shortlist:8192+router:128); with "
        "--temperature, their sampled step too (sampling.costs.regimes.R.head_kinds_ms)",
    )
    add("--head-assets", help="the shortlist/router assets of --heads (python -m model.build_head)")
    if not overrides_only:
        add("--add-to", help="with --placement tpN: the profile (with the draft's costs) that the section is added to")
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
    given.pop("add_to", None)
    for option in ("contexts", "prompt_lengths", "probes", "tree_widths"):
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
        command = "python -m measure " + shlex.join(argv)
        if tensor_parallel_size(settings.placement or "") is not None:
            args = _parser(False).parse_args(argv)
            given = {k for k, v in vars(args).items() if v is not None}
            base = tensor_parallel.check_request(settings, given, args.add_to, out)
            written = tensor_parallel.measure_into(settings, base, Path(out), command)
            if written is not None:
                print(f"wrote {written} (tensor_parallel.{settings.placement} added to {args.add_to})")
            return
        if "--add-to" in argv:
            raise UsageError("--add-to adds a tensor-parallel section: it goes with --placement tpN (e.g. tp2)")
        for path in measure_profile(settings, Path(out), command):
            print(f"wrote {path}")

    return run_torch_command(body)


if __name__ == "__main__":
    sys.exit(main())
