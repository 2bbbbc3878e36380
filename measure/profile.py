"""Assemble the measured costs into a cost profile (contracts.profile) and a Markdown summary."""

from __future__ import annotations

import datetime
import os
import platform
import socket
from pathlib import Path

import torch

from contracts.files import write_atomic
from contracts.profile import PROFILE_SCHEMA, SAMPLED_HEAD_KINDS, write_profile


def environment(devices: list[torch.device]) -> dict:
    import transformers

    gpus = [torch.cuda.get_device_name(d) for d in devices if d.type == "cuda"]
    driver = None
    if gpus:
        try:
            import subprocess

            driver = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=20,
            ).stdout.split()[0]
        except (OSError, IndexError, subprocess.SubprocessError):
            driver = None
    return {
        "gpus": gpus or ["none (cpu)"],
        "driver": driver,
        "cuda": torch.version.cuda,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "host": socket.gethostname(),
        "cpu": cpu_name(),
    }


def cpu_name() -> str:
    """The host CPU's model and core count: CPU timings move with it (a 2-core VM landed on an AMD host
    ran few-row GEMMs 2-4x slower than on the host a profile came from), and platform.processor() is
    empty on Linux."""
    name = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{name}, {os.cpu_count()} cores"


def assemble(
    *,
    target_info: dict,
    draft_info: dict,
    placement: str,
    contexts,
    prompt_lengths,
    K_max,
    cache_slots,
    fixed_width: int | None,
    regimes: dict,
    host: dict,
    clustering,
    agreement: dict | None,
    devices,
    notes: list[str],
) -> dict:
    """The profile dict; `host` costs are shared by both regimes (they involve no forward)."""
    synthetic = "synthetic" in (target_info["weights"], draft_info["weights"])
    return {
        "schema": PROFILE_SCHEMA,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "env": environment(devices),
        "setup": {
            "target": {
                k: target_info.get(k) for k in ("name", "weights", "dtype", "quantization", "kernel", "kernels")
            },
            "draft": {k: draft_info.get(k) for k in ("name", "weights", "dtype", "kernels")},
            "placement": placement,
            "context_lengths": list(contexts),
            "prompt_lengths": list(prompt_lengths),
            "K_max": K_max,
            "cache_slots": cache_slots,
            "fixed_width": fixed_width,
            "graphs": sorted(regimes),
            "default_regime": "graphs" if "graphs" in regimes else "eager",
        },
        "flashhead": {
            "clusters": clustering.clusters,
            "cluster_size": clustering.cluster_size,
            "default_probes": clustering.default_probes,
            **({"agreement": {**agreement, "synthetic": synthetic}} if agreement else {}),
        },
        "regimes": {name: {**costs, "host": host} for name, costs in regimes.items()},
        "notes": notes,
    }


def write(profile: dict, path: Path, floors: dict, command: str) -> tuple[Path, Path]:
    """The profile JSON and its summary `<name>.md` beside it, each written whole or not at all."""
    summary = path.with_suffix(".md")
    write_profile(path, profile)
    write_atomic(summary, markdown(profile, floors, command))
    return path, summary


def _ms(t: dict) -> str:
    return f"{t['median_ms']:.4f} [{t['p10_ms']:.4f}, {t['p90_ms']:.4f}] n={t['n']} host {t.get('host_ms', 0):.4f}"


def markdown(profile: dict, floors: dict, command: str) -> str:
    setup, env = profile["setup"], profile["env"]
    lines = [
        f"# Cost profile: {setup['target']['name']} + {setup['draft']['name']} ({setup['placement']})",
        "",
        f"Command: `{command}`",
        "",
        f"Weights: target {setup['target']['weights']}, draft {setup['draft']['weights']}"
        + (
            " (SYNTHETIC: real shapes, random values; costs are real, acceptance is not)"
            if "synthetic" in (setup["target"]["weights"], setup["draft"]["weights"])
            else ""
        ),
        f"Target: {setup['target']['dtype']}, quantization {setup['target']['quantization']}, "
        f"kernel {setup['target']['kernel']}. Environment: {', '.join(env['gpus'])}, driver {env['driver']}, "
        f"CUDA {env['cuda']}, torch {env['torch']}, transformers {env['transformers']}, host {env['host']}.",
        "",
        "Every timing: median [p10, p90] over n repetitions, ms; host = the host's issue time.",
        "",
    ]
    for regime, costs in profile["regimes"].items():
        lines += [f"## {regime}", "", "| cost | point | timing | floor ms |", "|---|---|---|---|"]
        for group in ("target", "draft", "host"):
            for name, cost in costs[group].items():
                for point in cost.get("points", [cost]):
                    where = ", ".join(
                        f"{k}={v}" for k, v in point.items() if k in ("n_tokens", "context", "prompt_len", "probes")
                    )
                    floor = floors.get(f"{group}.{name}")
                    lines.append(f"| {group}.{name} | {where} | {_ms(point)} | {floor if floor is not None else '-'} |")
        lines.append("")
    sampled = (profile.get("sampling") or {}).get("costs")
    if sampled:
        lines += [
            f"## sampling costs (temperature {sampled['temperature']:g}, top-k {sampled['top_k'] or 'off'}, "
            f"top-p {sampled['top_p']:g})",
            "",
            "| regime | cost | point | timing |",
            "|---|---|---|---|",
        ]
        for regime, costs in sampled["regimes"].items():
            kinds = costs.get(SAMPLED_HEAD_KINDS, {})
            named = [(name, cost.get("points", [cost])) for name, cost in costs.items() if name != SAMPLED_HEAD_KINDS]
            named += [(f"{SAMPLED_HEAD_KINDS}.{kind}", rows) for kind, rows in kinds.items()]
            for name, points in named:
                for point in points:
                    where = ", ".join(f"{k}={v}" for k, v in point.items() if k in ("n_tokens", "probes", "budget"))
                    lines.append(f"| {regime} | sampling.{name} | {where} | {_ms(point)} |")
        lines.append("")
    agreement = profile["flashhead"].get("agreement")
    if agreement:
        lines += [
            "## FlashHead agreement r(p) with the dense argmax",
            "",
            f"{agreement['n']} hidden states"
            + (" (SYNTHETIC weights: not real-language agreement)" if agreement["synthetic"] else ""),
            "",
            "| probes | r | " + " | ".join(agreement["per_category"]) + " |",
            "|---|---|" + "---|" * len(agreement["per_category"]),
        ]
        for i, p in enumerate(agreement["probes"]):
            cats = " | ".join(f"{v['r'][i]:.4f}" for v in agreement["per_category"].values())
            lines.append(f"| {p} | {agreement['r'][i]:.4f} | {cats} |")
        lines.append("")
    lines += ["## Notes", ""] + [f"- {n}" for n in profile["notes"]]
    return "\n".join(lines) + "\n"
