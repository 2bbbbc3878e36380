"""torchrun --nproc-per-node N -m measure.tensor_parallel --placement tpN: what a tensor-parallel target
costs on these GPUs. Two tables, each rank running the same steps in lockstep:

- all_reduce: one in-place all-reduce of `rows` x hidden values in the target's dtype (the message a
  TP layer sends twice per forward, after o_proj and after down_proj), per row count;
- target_forward: the TP target's decode step as the decoder runs it (`Decoder.target_forward`: CUDA
  graph, fixed width on GPUs), per number of new tokens and context length.

On GPUs each measurement is a CUDA graph of `calls` operations, replayed after a barrier (so no rank
waits for another inside the timed window), timed with CUDA events and divided by `calls`. On the CPU
(gloo) the host clock times eager calls. Rank 0 writes one JSON file (weights synthetic). The cost
profile does not carry these tables yet (docs/contracts.md).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable

import torch
import torch.distributed as dist

from contracts import UsageError
from contracts.cli import OneLineParser
from contracts.files import write_atomic
from contracts.names import tensor_parallel_size
from measure.timing import at_least_one, check_out
from model import tensor_parallel
from model.cli import run_torch_command
from model.decoder import Decoder, cache_room
from model.loading import load_model


def parse_args(argv) -> argparse.Namespace:
    p = OneLineParser(prog="python -m measure.tensor_parallel", description=__doc__)
    add = p.add_argument
    add("--placement", default="tp2", help="tpN: the target over N ranks (launch N processes with torchrun)")
    add("--target", default="llama-3.3-70b", help="target preset or checkpoint folder (default llama-3.3-70b)")
    add("--dtype", default=None, help="float32, bfloat16 or float16 (default: bfloat16 on GPU, float32 on CPU)")
    add("--rows", default="1,2,4,7,8,16", help="all-reduce message rows, comma-separated (default 1,2,4,7,8,16)")
    add("--tokens", default="1,7", help="new tokens per target forward, comma-separated (default 1,7)")
    add("--contexts", default="128,1024", help="context lengths of the target forwards (default 128,1024)")
    add("--reps", type=at_least_one, default=20, help="timed repetitions per measurement (default 20)")
    add("--calls", type=at_least_one, default=16, help="operations per timed graph on GPUs (default 16)")
    add("--out", required=True, help="JSON file rank 0 writes")
    return p.parse_args(argv)


def _counts(text: str, what: str) -> list[int]:
    try:
        counts = [int(v) for v in text.split(",")]
    except ValueError:
        raise UsageError(f"--{what} must be positive integers joined by ',', got {text!r}") from None
    if not counts or min(counts) < 1:
        raise UsageError(f"--{what} must be positive integers joined by ',', got {text!r}")
    return counts


def _time(step: Callable[[], None], device: torch.device, reps: int, calls: int | None) -> dict:
    """Median and spread of one step's time in ms, every rank timing the same replays. `calls` steps
    are captured in one graph on GPUs; None: the step replays its own graph (timed one at a time)."""
    capture = device.type == "cuda" and calls is not None
    calls = calls or 1
    if capture:
        for _ in range(2):
            step()  # warm-up outside capture (creates what the step needs)
        torch.cuda.synchronize(device)
        graph, side = torch.cuda.CUDAGraph(), torch.cuda.Stream()
        with torch.cuda.graph(graph, stream=side):
            for _ in range(calls):
                step()
    times = []
    for _ in range(reps + 1):
        dist.barrier()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            if capture:
                graph.replay()
            else:
                step()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / calls)
        else:
            t0 = time.perf_counter()
            step()
            times.append((time.perf_counter() - t0) * 1e3)
    times = times[1:]  # the first replay warms up
    ordered = sorted(times)
    return {
        "median_ms": statistics.median(times),
        "p10_ms": ordered[len(ordered) // 10],
        "p90_ms": ordered[(9 * len(ordered)) // 10],
        "n": len(times),
    }


def run(args) -> int:
    if tensor_parallel_size(args.placement) is None:
        raise UsageError(f"--placement must be tpN with N >= 2 (e.g. tp2), got {args.placement!r}")
    rows, tokens, contexts = (
        _counts(args.rows, "rows"),
        _counts(args.tokens, "tokens"),
        _counts(args.contexts, "contexts"),
    )
    out = check_out(args.out)
    ranks, device = tensor_parallel.init(args.placement, "measure.tensor_parallel")
    room = cache_room(max(contexts), max(tokens), max(tokens))
    loaded = load_model(args.target, device, args.dtype, seed=0, max_seq_len=room, tensor_parallel=ranks)
    target = loaded.model
    hidden, dtype = target.config.hidden_size, target.embed_tokens.weight.dtype
    table = []
    for n in rows:
        message = torch.ones(n, hidden, device=device, dtype=dtype)
        cost = _time(lambda message=message: dist.all_reduce(message), device, args.reps, args.calls)
        table.append({"rows": n, "bytes": message.numel() * message.element_size(), **cost})
    decoder = Decoder(target, K=max(tokens), graphs=device.type == "cuda", phases=False)
    forwards = []
    for context in contexts:
        start = torch.tensor([context], device=device)
        for n in tokens:
            ids = torch.zeros(1, n, dtype=torch.long, device=device)
            cost = _time(lambda ids=ids, start=start: decoder.target_forward(ids, start), device, args.reps, None)
            forwards.append({"tokens": n, "context": context, **cost})
    if ranks.rank == 0:
        result = {
            "placement": args.placement,
            "target": {k: loaded.info[k] for k in ("name", "weights", "dtype", "kernels")},
            "devices": [torch.cuda.get_device_name(device)] if device.type == "cuda" else ["cpu"],
            "all_reduce": table,
            "target_forward": forwards,
        }
        write_atomic(out, json.dumps(result, indent=1) + "\n")
        print(f"wrote {out} ({loaded.info['weights']} weights)")
    dist.barrier()
    return 0


def main(argv=None) -> int:
    return run_torch_command(lambda: run(parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
