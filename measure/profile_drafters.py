"""python -m measure.profile_drafters: add the drafters beside the draft model to a profile measured without them.

    python -m measure.profile_drafters --profile cpu_profile.json --lookup-ngram 2 --early-exit-from-draft \\
        --out profile.json

Why: `python -m measure --early-exit-layers L` measures every drafter in one run, but on a slow or
loaded machine its target forwards take long. A profile already measured keeps its target, draft and
host costs and gets the other drafters' costs here:
- prompt lookup's search (`measure.benchmarks.drafter_costs`), timed now on the profile's target
  (`setup.target.name`, in its dtype) at the profile's contexts, for its K_max proposals;
- with --early-exit-from-draft, the early-exit drafter's body and head are the profile's draft body and
  dense head. That is the same computation only when the profile's draft is the target's first L
  layers and its head (`setup.draft.name` is `TARGET#layers=L`); any other profile is refused.
Every regime of the profile gets the same lookup costs (the lookup runs eagerly in each), and a note
says where the costs came from. --out is written whole, and only at the end.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from types import SimpleNamespace

import torch

from contracts import UsageError
from contracts.cli import OneLineParser
from contracts.files import check_output_file
from contracts.profile import read_profile, setup_K_max, write_profile
from model.cli import run_torch_command
from model.loading import load_model

from .benchmarks import Bench, drafter_costs
from .timing import at_least_one

COMMAND = "python -m measure.profile_drafters"


def check_setup(profile: dict, early_exit_from_draft: bool) -> dict:
    """The setup fields this command reads, present; the early-exit copy allowed only where it is right."""
    setup = profile["setup"]
    missing = [
        key
        for key, value in (("context_lengths", setup.get("context_lengths")), ("K_max", setup_K_max(setup)))
        if not value
    ]
    if missing:
        raise UsageError(f"--profile: its setup lacks {', '.join(missing)} (measure it with python -m measure)")
    target, draft = setup["target"]["name"], setup.get("draft", {}).get("name", "")
    if early_exit_from_draft and not draft.startswith(f"{target}#layers="):
        raise UsageError(
            f"--early-exit-from-draft: the profile's draft {draft!r} is not its target's first layers "
            f"({target}#layers=L), so its costs are not the early-exit drafter's"
        )
    return setup


def lookup_costs(setup: dict, ngram: int, reps: int, warmup: int, regimes) -> dict:
    """Prompt lookup's search on the profile's target, at its contexts, as `python -m measure` times it,
    per regime of `regimes` (graphs: its search replayed as a CUDA graph)."""
    device = torch.device("cpu" if setup.get("placement", "cpu") == "cpu" else "cuda:0")
    contexts, proposals = list(setup["context_lengths"]), setup_K_max(setup)
    target = load_model(
        setup["target"]["name"], device, setup["target"].get("dtype"), max_seq_len=max(contexts) + proposals + 8
    )
    bench = Bench(target, None, device, device, contexts, [], proposals, [], None, reps, warmup, lambda what: None)
    settings = SimpleNamespace(lookup_ngram=ngram, early_exit_layers=None)
    return {regime: drafter_costs(bench, regime == "graphs", settings)["lookup_ms"] for regime in regimes}


def with_drafters(profile: dict, lookup: dict, ngram: int, reps: int, early_exit_from_draft: bool) -> dict:
    """`lookup`: prompt lookup's cost per regime (`lookup_costs`)."""
    for name, regime in profile["regimes"].items():
        draft = regime["draft"]
        draft["lookup_ms"] = lookup[name]
        if early_exit_from_draft:
            draft["early_exit_body_ms"] = draft["body_ms"]
            draft["early_exit_head_ms"] = draft["head_dense_ms"]
    note = f"draft.lookup_ms timed by {COMMAND} (n-gram {ngram}, {reps} reps)"
    if early_exit_from_draft:
        note += "; draft.early_exit_body_ms and early_exit_head_ms are the draft's body_ms and head_dense_ms"
    profile["notes"] = [*profile.get("notes", []), note]
    return profile


def parser() -> OneLineParser:
    p = OneLineParser(prog=COMMAND, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--profile", required=True, help="the profile to add the drafters to (it is not changed)")
    p.add_argument("--out", required=True, help="the profile file to write")
    p.add_argument("--lookup-ngram", type=at_least_one, default=2, help="prompt lookup's n-gram (default 2)")
    p.add_argument(
        "--early-exit-from-draft",
        action="store_true",
        help="take the early-exit drafter's costs from the draft (only when the draft is TARGET#layers=L)",
    )
    p.add_argument("--reps", type=at_least_one, default=10, help="timed repetitions per context (default 10)")
    p.add_argument("--warmup", type=at_least_one, default=2, help="warm-up calls per context (default 2)")
    return p


def main(argv=None) -> int:
    def body():
        args = parser().parse_args(argv)
        check_output_file(Path(args.out), "--out")
        profile = read_profile(args.profile)
        setup = check_setup(profile, args.early_exit_from_draft)
        lookup = lookup_costs(setup, args.lookup_ngram, args.reps, args.warmup, profile["regimes"])
        added = with_drafters(profile, lookup, args.lookup_ngram, args.reps, args.early_exit_from_draft)
        write_profile(args.out, added)
        print(f"wrote {args.out}")

    return run_torch_command(body)


if __name__ == "__main__":
    sys.exit(main())
