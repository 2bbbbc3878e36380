"""python -m validate: real end-to-end runs against the simulator's predictions (and, with --peers,
side by side with Hugging Face's own generation on the same weights)."""

from __future__ import annotations

import argparse
import shlex
import sys

from contracts import UsageError
from contracts.cli import OneLineParser, require_modules

require_modules("python -m validate", ("torch", "simpy"), "pip install torch, then pip install -e '.[model]'")

from model.cli import add_sampling_options, run_torch_command  # noqa: E402

from . import peers, pipeline, policies  # noqa: E402

EPILOG = """\
what a validation run does (default):
  For every configuration of the matrix (--schedules x --heads x --K, the baseline once) it runs the
  real decoder over the prompts (a warm-up generation first, not recorded), writes the trace and run
  summary, then runs the simulator on the same profile with that very trace (same schedule, head, K,
  probes, placement, regime) and the study's closed form TPOT = (T_p(K) + K*T_q + T_o) / E[R] on the
  same inputs; error = (predicted - measured) / measured decode tok/s. The report (report.md,
  results.csv, scatter.png, phases.png, traces/) appears all at once when everything succeeded.
  For one configuration (the first pipelined-deferred one, else the first speculative one) it also
  writes the first recorded generation's timeline as measured and as predicted (Chrome/Perfetto
  traces timeline-measured.json, timeline-predicted.json) and draws both in timeline.png; report.md
  then gives a verify's turnaround in each (from a verify's end to the next draft step or verify).

--trees (validate/trees.py):
  Each tree runs on the real tree decoder with ordinary and deferred and the dense head, and is predicted
  replaying its own trace (as every configuration) and, under acceptance control a=A, from the control's
  rule alone (a node's top-k children hold the target's token with probability 1-(1-a)^k): predicted
  against measured mean accepted length and tok/s. Every decoder runs at one fixed width on a GPU, the
  widest tree's node count + 1, which --measure times (python -m measure --tree-widths for --profile).
  With --temperature T the trees sample (multi-branch rejection); the control's rule holds unchanged.

--peers:
  Hugging Face generate (greedy) and assisted generation (same draft, K proposals a round), built over
  our own weight tensors, against ours in baseline and in one schedule (--schedule, or the fastest in a
  short trial) with each head; interleaved, warmed up, medians over prompts; outputs checked against
  our target's greedy output. Writes peers.md and peers.csv.

sampling (--temperature T > 0, --top-k, --top-p):
  Every run samples (one generation per prompt, seeded by --seed); the predictions charge the profile's
  sampling costs (python -m measure --temperature T; --measure times them). With synthetic weights the
  acceptance control sets which positions accept while the draft's sampling, the acceptance test and
  the residual sample all run; with real weights acceptance is real.

acceptance (--acceptance):
  a=0.43 | pattern=1,0,1   acceptance control for synthetic weights: the draft runs its real body and
                           head, its proposal follows the pattern against the target's greedy output
  a=0.8,0.7,0.6            a rate per draft position of a round (the last repeats; greedy)
  curve:a=0.77             per head: the rates times the head's agreement per draft position from
                           --profile's heads section (sim/heads.py), the rates the simulator draws
  none                     the draft's own proposals (real checkpoints; near zero for random weights)

--drafter / --policy (validate/policies.py):
  Per Spec-Bench category of the chosen prompts, on the deferred schedule: the baseline, every fixed arm
  (each drafter at each --K) and each online policy run for real, every output checked against target
  greedy; every drafter's match runs are recorded, and the simulator replays every arm, policy and the
  oracle on them (from --profile alone, and calibrated on a prompt of its own). Writes report.md,
  results.json, results.csv and traces/<category>/. The profile needs the drafters' costs (python -m
  measure --early-exit-layers L). With synthetic weights --lookup-acceptance sets prompt lookup's
  acceptance per category (its lookup still runs).

examples:
  python -m validate --target qwen3-32b-awq --draft qwen3-0.6b --placement two-gpu --measure \\
      --K 2,4,6,8 --n-prompts 8 --max-new-tokens 64
  python -m validate --profile reports/profile.json --schedules ordinary,deferred --heads dense --K 6
  python -m validate --target qwen3-32b-awq --draft qwen3-0.6b --placement one-gpu --measure \
      --schedules ordinary,deferred --heads dense --K 4 --trees chain,2x2x1,dynamic:4,16,4 --acceptance a=0.77
  python -m validate --peers --target qwen3-32b --draft qwen3-0.6b --placement one-gpu
  python -m validate --target tiny-qwen3 --draft tiny-qwen3-draft --placement cpu --measure \\
      --measure-args "--reps 5" --K 2,4 --n-prompts 2 --max-new-tokens 16
  python -m validate --profile P --drafter draft-model+prompt-lookup --policy all --K 2,4 \\
      --heads dense --acceptance a=0.6 --lookup-acceptance summarization=0.9,rag=0.8,*=0.1 \\
      --prompts summarization,rag,math_reasoning --n-prompts 6
"""


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = OneLineParser(
        prog="python -m validate",
        description=__doc__,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--profile",
        default=None,
        metavar="PATH",
        help="cost profile (python -m measure) the simulator reads; "
        "it must be measured on the same placement, with the regime of --graphs",
    )
    p.add_argument(
        "--measure",
        action="store_true",
        help="measure the profile now (same models, placement, regime; 4 contexts spread over the runs) "
        "into the output folder, after the real runs so they never share the GPU",
    )
    p.add_argument(
        "--measure-args",
        default="",
        metavar="ARGS",
        help="extra options for python -m measure with --measure, e.g. '--reps 10' (they override ours)",
    )
    p.add_argument(
        "--target", default="qwen3-32b-awq", help="target preset or checkpoint folder (default qwen3-32b-awq)"
    )
    p.add_argument("--draft", default="qwen3-0.6b", help="draft preset or checkpoint folder (default qwen3-0.6b)")
    p.add_argument(
        "--schedules",
        default="all",
        help="baseline, ordinary, pipelined, deferred, pipelined-deferred: comma-separated, or all (default)",
    )
    p.add_argument(
        "--heads",
        default="dense,flashhead",
        help="draft head specs joined by '+' or ',' (contracts/heads.py): dense, flashhead[:P], shortlist:N, "
        "router:C, KIND:B1,B2,... (default dense,flashhead); a profile must cost the budgeted ones "
        "(--measure times them)",
    )
    p.add_argument("--head-assets", default=None, metavar="DIR", help="shortlist/router assets (model.build_head)")
    p.add_argument(
        "--K", default="6", help="draft tokens per round, comma-separated for a sweep (default 6; --peers takes one)"
    )
    p.add_argument(
        "--trees",
        default="chain",
        help="token trees joined by '+' or ',' (contracts/trees.py): chain (the chains of --K), AxBxC, "
        "paths:..., dynamic:M,N,D; trees run with ordinary and deferred and the dense head (default chain)",
    )
    p.add_argument("--probes", type=int, default=None, help="FlashHead probes (default: clusters / 16)")
    p.add_argument(
        "--clustering",
        default=None,
        metavar="DIR",
        help="FlashHead assets to load (default: build them from the draft's head, seeded, as python -m measure does)",
    )
    p.add_argument(
        "--acceptance",
        default=None,
        metavar="SPEC",
        help="acceptance control (see below); default a=0.43 with synthetic weights (with --peers: "
        "for reference rows beside the uncontrolled ones), none with real ones",
    )
    p.add_argument(
        "--prompts",
        default="per-category:1",
        help="Spec-Bench selection: first:N, per-category:N, or "
        "categories / question ids, comma-separated (default per-category:1)",
    )
    p.add_argument(
        "--prompts-file", default=None, help="Spec-Bench question.jsonl (default: the copy shipped in model/data)"
    )
    p.add_argument(
        "--n-prompts",
        type=int,
        default=8,
        help="use at most this many prompts, spread evenly over the selection (default 8)",
    )
    p.add_argument(
        "--max-new-tokens", type=int, default=64, help="tokens generated per prompt, the first included (default 64)"
    )
    p.add_argument(
        "--placement",
        default=None,
        help="two-gpu, one-gpu or cpu (default: two-gpu with 2 GPUs, one-gpu with 1, else cpu)",
    )
    p.add_argument(
        "--graphs",
        default=None,
        choices=["on", "off"],
        help="CUDA graphs for our decoder (default on "
        "GPU, off on CPU); the simulator reads the profile's matching regime",
    )
    p.add_argument(
        "--dtype", default=None, help="float32, bfloat16 or float16 (default bfloat16 on GPU, float32 on CPU)"
    )
    p.add_argument(
        "--seed", type=int, default=0, help="seed of synthetic weights, clustering, acceptance control and sampling"
    )
    add_sampling_options(p)
    p.add_argument(
        "--warmup", type=int, default=1, help="untimed generations before each configuration / system (default 1)"
    )
    p.add_argument(
        "--out",
        default=None,
        metavar="DIR",
        help="report folder (default out/validation/"
        "<placement>-<gpu>-<date> under the current folder, with --peers out/peers/...)",
    )
    p.add_argument("--force", action="store_true", help="replace an existing report in the --out folder")
    p.add_argument(
        "--from-runs",
        default=None,
        metavar="DIR",
        help="run no model: predict again the runs recorded in DIR/traces (an earlier report's, or the "
        "folder a run left when it stopped before its prediction; a --drafter/--policy report's too) with "
        "--profile, into --out",
    )
    p.add_argument(
        "--drafter",
        default=None,
        help="validate drafters and policies per Spec-Bench category instead (see below): the arms' drafters "
        "joined by '+' (draft-model, prompt-lookup, early-exit; default draft-model+prompt-lookup)",
    )
    p.add_argument(
        "--policy",
        default=None,
        help="with --drafter: the online policies joined by '+' (heuristic, ucb1, thompson) or all (default); "
        "every fixed arm always runs",
    )
    p.add_argument("--early-exit-layers", type=int, default=None, help="the early-exit drafter's layers L")
    p.add_argument("--lookup-ngram", type=int, default=2, help="prompt lookup's max_matching_ngram_size (default 2)")
    p.add_argument(
        "--lookup-acceptance",
        default=None,
        metavar="SPEC",
        help="synthetic weights: prompt lookup's acceptance per category, e.g. summarization=0.9,rag=0.8,*=0.1",
    )
    p.add_argument(
        "--noise-seeds",
        type=int,
        default=None,
        metavar="N",
        help="with --drafter (or --from-runs of its runs): replays of each online policy under seeded timing noise "
        "as large as the calibration's rounds vary; the prediction is their median, with their range "
        f"(default {policies.NOISE_SEEDS}, odd; 0: one replay without noise)",
    )
    p.add_argument(
        "--repeats",
        type=int,
        default=None,
        metavar="N",
        help="runs of each configuration (odd): each run of every configuration before the next, the measurement "
        "their median run, with their range; the calibration pools its runs. With --drafter: per category "
        f"(default {policies.REPEATS}); otherwise per decoder instance (default {pipeline.REPEATS})",
    )
    p.add_argument("--peers", action="store_true", help="side by side with Hugging Face instead (see below)")
    p.add_argument(
        "--schedule", default=None, help="--peers: our speculative schedule (default: the fastest in a short trial)"
    )
    args = p.parse_args(argv)
    args.command = "python -m validate " + shlex.join(argv)
    return args


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)

    def body():
        args = parse_args(argv)
        if args.trees != "chain" and (args.peers or args.drafter is not None or args.policy is not None):
            raise UsageError("--trees: trees run in the default validation, not with --peers, --drafter or --policy")
        policy_run = args.drafter is not None or args.policy is not None
        if args.noise_seeds is not None and not (
            policy_run or (args.from_runs and policies.recorded_in(args.from_runs))
        ):
            raise UsageError(
                "--noise-seeds: online policies' replays; use it with --drafter/--policy or their --from-runs"
            )
        if args.repeats is not None and (args.peers or args.from_runs):
            raise UsageError(
                "--repeats: runs of each configuration, made by a validation; not with --peers or --from-runs"
            )
        if args.from_runs and policies.recorded_in(args.from_runs):
            policies.run_from_runs(args)
        elif args.from_runs:
            pipeline.run_from_runs(args)
        elif policy_run:
            policies.run(args)
        else:
            (peers if args.peers else pipeline).run(args)

    return run_torch_command(body)


if __name__ == "__main__":
    sys.exit(main())
