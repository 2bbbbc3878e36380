"""Build the simulator's default profile from the one measured on our GPUs.

    python -m sim.derive_default [--measured PROFILE] [--out PATH]   # default: rewrites sim/data/default_profile.json

The measured profile (reports/profiles/qwen3-32b-awq_qwen3-0.6b_two-gpu_triton.json: synthetic weights
on two H200s, the decoder with its fused kernels and Triton w4a16 GEMM, graphs on) carries costs; its
agreement curve was measured on random weights, which the simulator ignores. The default swaps in
the real-weight curve the study-derived profile uses (Gemma 3 270M, mapped to 9,496 clusters by the
fraction of clusters probed), so `python -m sim --what-if probes=2` changes acceptance as a real
head would. Both facts are written into the profile's notes.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from contracts.cli import OneLineParser, run_command
from contracts.files import check_output_file
from contracts.profile import PROFILE_SCHEMA, read_profile, write_profile

from .derive_study import DATA, agreement

MEASURED = (
    Path(__file__).resolve().parent.parent / "reports" / "profiles" / "qwen3-32b-awq_qwen3-0.6b_two-gpu_triton.json"
)


def default_profile(measured: dict) -> dict:
    fh = measured["flashhead"]
    probes = sorted({*fh["agreement"]["probes"], fh["default_probes"]}) if "agreement" in fh else [fh["default_probes"]]
    return {
        **measured,
        "schema": PROFILE_SCHEMA,
        "flashhead": {**{k: v for k, v in fh.items() if k != "agreement"}, "agreement": agreement(probes)},
        "notes": measured["notes"]
        + [
            f"DEFAULT PROFILE: the costs above as measured ({MEASURED.name}); flashhead.agreement replaced "
            "by the real-weight curve of Gemma 3 270M mapped by p/c (python -m sim.derive_default), since "
            "the measured one came from random weights."
        ],
    }


def main(argv=None) -> int:
    return run_command(lambda: _derive(argv))


def _derive(argv) -> int:
    parser = OneLineParser(
        prog="python -m sim.derive_default", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--measured", default=str(MEASURED), help=f"the measured profile (default {MEASURED})")
    parser.add_argument("--out", default=str(DATA / "default_profile.json"), help="where to write the default profile")
    args = parser.parse_args(argv)
    check_output_file(Path(args.out), "--out", "profile")
    write_profile(args.out, default_profile(read_profile(args.measured)))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
