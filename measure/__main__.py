"""python -m measure: microbenchmark every cost of the speculative loop and write a cost profile."""
from __future__ import annotations

import shlex
import sys
from pathlib import Path

import torch
from tqdm import tqdm

from model.cli import OneLineParser, run_command
from model.decoder import cache_room, placement_devices, width
from model.errors import UsageError
from model.flashhead import build_clustering, load_assets
from model.heads import DenseHead, FlashHead
from model.loading import load_model
from model.prompts import select_prompts
from model.tokenizer import check_compatible

from . import profile as profile_io
from .agreement import agreement_curve, draft_hidden_states
from .benchmarks import BOOKKEEPING_NEW_TOKENS, Bench, copy_bandwidth_gbs, draft_costs, host_costs, round_bookkeeping, target_costs


def parse_args(argv):
    p = OneLineParser(prog="python -m measure", description=__doc__)
    p.add_argument("--target", default="qwen3-32b-awq", help="target preset or checkpoint folder (default qwen3-32b-awq)")
    p.add_argument("--draft", default="qwen3-0.6b", help="draft preset or checkpoint folder (default qwen3-0.6b)")
    p.add_argument("--placement", default=None, choices=["two-gpu", "one-gpu", "cpu"],
                   help="where the models run (default: two-gpu with 2 GPUs, one-gpu with 1, else cpu)")
    p.add_argument("--dtype", default=None, help="activation/weight dtype (default bf16 on GPU, float32 on CPU)")
    p.add_argument("--contexts", default="256,1024", help="context lengths for forward and body costs")
    p.add_argument("--prompt-lengths", default="128,512", help="prompt lengths for prefill costs")
    p.add_argument("--k-max", type=int, default=8, help="largest K: target forwards are timed for n = 1..K+2")
    p.add_argument("--probes", default=None, help="FlashHead probe counts (default 1,2,4,... up to c/4, and c/16)")
    p.add_argument("--clustering", default=None, help="load FlashHead assets from this folder (default: build)")
    p.add_argument("--graphs", default=None, help="regimes: on, off or on,off (default on,off on GPU, off on CPU)")
    p.add_argument("--kernels", default=None, choices=["fused", "torch"],
                   help="layer kernels: fused (Triton) or torch (default fused for Qwen3 on GPU)")
    p.add_argument("--prompts", default="per-category:2", help="Spec-Bench prompts for the agreement r(p)")
    p.add_argument("--prompts-file", default=None, help="question.jsonl (default ../shared/data/spec_bench)")
    p.add_argument("--agreement-max-len", type=int, default=256, help="tokens per prompt for r(p)")
    p.add_argument("--reps", type=int, default=20, help="timed repetitions per point (default 20)")
    p.add_argument("--warmup", type=int, default=3, help="warm-up runs per point (default 3)")
    p.add_argument("--seed", type=int, default=0, help="seed of synthetic weights and the clustering")
    p.add_argument("--out", required=True, help="the profile JSON to write (a Markdown summary goes beside it)")
    return p.parse_args(argv)


def _ints(text: str, what: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise UsageError(f"{what}: expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise UsageError(f"{what}: expected positive integers, got {text!r}")
    return values


def default_probes(clusters: int) -> list[int]:
    probes, p = [], 1
    while p <= clusters // 4:
        probes.append(p)
        p *= 2
    return sorted(set(probes + [max(1, clusters // 16), max(1, clusters // 4)]))


def run(args) -> tuple[Path, Path]:
    placement = args.placement or {2: "two-gpu", 1: "one-gpu"}.get(min(torch.cuda.device_count(), 2), "cpu")
    td, dd = placement_devices(placement)
    regimes = (args.graphs or ("on,off" if td.type == "cuda" else "off")).split(",")
    if set(regimes) - {"on", "off"}:
        raise UsageError(f"--graphs takes on, off or on,off, got {args.graphs!r}")
    if "on" in regimes and td.type != "cuda":
        raise UsageError("--graphs on needs a GPU placement (CUDA graphs)")
    contexts, prompt_lengths = _ints(args.contexts, "--contexts"), _ints(args.prompt_lengths, "--prompt-lengths")
    if args.k_max < 1:
        raise UsageError(f"--k-max must be at least 1, got {args.k_max}")
    longest = max(max(contexts) + width(args.k_max + 1), max(prompt_lengths), args.agreement_max_len,
                  cache_room(min(prompt_lengths), BOOKKEEPING_NEW_TOKENS, min(6, args.k_max)))
    max_seq = -(-longest // 16) * 16
    prompts = select_prompts(args.prompts, args.prompts_file)
    target = load_model(args.target, td, args.dtype, args.seed, max_seq, kernels=args.kernels)
    draft = load_model(args.draft, dd, args.dtype, args.seed + 1, max_seq, kernels=args.kernels)
    check_compatible(target.tokenizer, draft.tokenizer, target.model.config.vocab_size, draft.model.config.vocab_size)
    head_weight = draft.model.head_weight
    clustering = load_assets(args.clustering) if args.clustering else build_clustering(head_weight, seed=args.seed)
    clustering = clustering.to(dd)
    probes = _ints(args.probes, "--probes") if args.probes else default_probes(clustering.clusters)
    if max(probes) > clustering.clusters:
        raise UsageError(f"probes {max(probes)} exceed the {clustering.clusters} clusters (valid: 1..{clustering.clusters})")
    points = len(regimes) * (len(range(args.k_max + 2)) * len(contexts) + 2 * len(prompt_lengths) + len(contexts)
                             + 1 + len(probes) + 1) + 2
    with tqdm(total=points, desc="measure", unit="point", file=sys.stderr) as bar:
        bench = Bench(target, draft, td, dd, contexts, prompt_lengths, args.k_max, probes, clustering,
                      args.reps, args.warmup, lambda what: (bar.set_postfix_str(what), bar.update()))
        host = host_costs(bench)
        costs = {}
        for regime in regimes:
            graphs = regime == "on"
            costs["graphs" if graphs else "eager"] = {"target": target_costs(bench, graphs),
                                                      "draft": draft_costs(bench, graphs)}
        host["round_bookkeeping_ms"] = round_bookkeeping(bench, prompts[0])
        bar.update()
        states = draft_hidden_states(draft, prompts, dd, args.agreement_max_len)
        agreement = agreement_curve(head_weight, clustering, probes, states)
        agreement["source"] = f"{args.draft} draft hidden states, Spec-Bench {args.prompts}"
        bar.update()
    bandwidth = copy_bandwidth_gbs(td)
    floors = bandwidth_floors(target, draft, clustering, probes, bandwidth)
    backend = FlashHead(head_weight, clustering).backend
    notes = notes_for(target.info, draft.info, placement, bandwidth, backend)
    profile = profile_io.assemble(target_info=target.info, draft_info=draft.info, placement=placement,
                                  contexts=contexts, prompt_lengths=prompt_lengths, k_max=args.k_max,
                                  cache_slots=max_seq, regimes=costs,
                                  host=host, clustering=clustering, agreement=agreement, devices=[td, dd], notes=notes)
    command = "python -m measure " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    return profile_io.write(profile, Path(args.out), floors, command)


def bandwidth_floors(target, draft, clustering, probes, bandwidth_gbs) -> dict:
    """ms a cost cannot beat: the bytes it must read once, at the measured copy bandwidth."""
    if not bandwidth_gbs:
        return {}
    ms = lambda nbytes: round(nbytes / (bandwidth_gbs * 1e9) * 1e3, 4)
    t, d = target.model, draft.model
    flash = FlashHead(d.head_weight, clustering, probes=clustering.default_probes)
    return {"target.forward_ms": ms(t.body_parameters_bytes() + t.head_bytes()),
            "draft.body_ms": ms(d.body_parameters_bytes()), "draft.head_dense_ms": ms(DenseHead(d.head_weight).bytes_per_call()),
            "draft.head_flashhead_ms": f"{ms(flash.bytes_per_call())} at p={flash.probes}"}


def notes_for(target_info, draft_info, placement, bandwidth, backend) -> list[str]:
    notes = [f"Measured by python -m measure on {placement}: every cost timed as the decoder runs it "
             "(GraphedCall per shape, static caches, device-side positions), CUDA events on GPU, "
             "perf_counter on CPU; each repetition starts from an idle device.",
             "target.forward_ms is the decoder's own target step (dense argmax head included; fixed width on GPU, see model/decoder.py); prefills are eager, as in the decoder; draft.body_ms is one draft step "
             "without its head; draft.append_ms is the same operation as one body step.",
             f"FlashHead head backend: {backend}.",
             "host.round_bookkeeping_ms: median per-round host time outside device phases and the read, "
             "from a short real deferred run (Python bookkeeping, launch gaps, token copies).",
             "kv_crop_ms: our caches are cropped by moving a device-side cursor (one small copy).",
             f"Layer kernels: target {target_info['kernels']}, draft {draft_info['kernels']}. "
             + ("Fused attention reads cache slots up to the last position only, so costs follow the context."
                if "torch" not in (target_info["kernels"], draft_info["kernels"]) else
                "The torch path attends over all static-cache slots (setup.cache_slots), so its costs depend on "
                "the cache size more than on the context: measure with the cache size your runs use.")]
    if "synthetic" in (target_info["weights"], draft_info["weights"]):
        notes.insert(0, "SYNTHETIC weights (real architectures, seeded random values): costs are real, "
                        "the agreement r(p) is not real-language agreement.")
    if bandwidth:
        notes.append(f"Bandwidth floors use the measured device copy rate {bandwidth:.0f} GB/s (read + write).")
    return notes


def main(argv=None) -> int:
    def body():
        for path in run(parse_args(sys.argv[1:] if argv is None else argv)):
            print(f"wrote {path}")
    return run_command(body)


if __name__ == "__main__":
    sys.exit(main())
