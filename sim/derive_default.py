"""Build the simulator's default profile from the one measured on our GPUs.

    python -m sim.derive_default     # rewrites sim/data/default_profile.json

The measured profile (reports/profiles/qwen3-32b-awq_qwen3-0.6b_two-gpu_triton.json: synthetic weights
on two H200s, the decoder with its fused kernels and Triton w4a16 GEMM, graphs on) carries costs; its
agreement curve was measured on random weights, which the simulator ignores. The default swaps in
the real-weight curve the study-derived profile uses (Gemma 3 270M, mapped to 9,496 clusters by the
fraction of clusters probed), so `python -m sim --what-if probes=2` changes acceptance as a real
head would. Both facts are written into the profile's notes.
"""
from __future__ import annotations

import json
from pathlib import Path

from .derive_study import DATA, agreement

MEASURED = (Path(__file__).resolve().parent.parent / "reports" / "profiles"
            / "qwen3-32b-awq_qwen3-0.6b_two-gpu_triton.json")


def default_profile(measured: dict) -> dict:
    fh = measured["flashhead"]
    probes = sorted({*fh["agreement"]["probes"], fh["default_probes"]}) if "agreement" in fh else [fh["default_probes"]]
    return {**measured,
            "flashhead": {**{k: v for k, v in fh.items() if k != "agreement"}, "agreement": agreement(probes)},
            "notes": measured["notes"] + [
                f"DEFAULT PROFILE: the costs above as measured ({MEASURED.name}); flashhead.agreement replaced "
                "by the real-weight curve of Gemma 3 270M mapped by p/c (python -m sim.derive_default), since "
                "the measured one came from random weights."]}


def main() -> None:
    out = DATA / "default_profile.json"
    out.write_text(json.dumps(default_profile(json.loads(MEASURED.read_text())), indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
