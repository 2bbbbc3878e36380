"""python -m measure.device_copies: what handing a few tokens from one GPU to another costs, as the decoder's
two-GPU rounds do it (`copy_tokens`), with the GPU they go to busy or idle.

Why: on two H200s a peer copy waits for the kernels running on the destination GPU, even when PyTorch's
barrier there is taken on a stream with nothing queued; through pinned host memory it does not (docs/decoder-speed.md,
"Decoder speed: short first splits, and session 27's routes"). Where a round's copies fall against the
target's verify decides what they cost the round.

    python -m measure.device_copies --out copies.json [--device cuda:0 --peer cuda:1] [--reps 12]

No model weights, SYNTHETIC or real: COPY_TOKENS int64 tokens and spinning kernels (torch.cuda._sleep). Every
time is CUDA events (on the source's stream; the busy kernels alone on --peer's), or, for the hops, the host
clock over the whole chain; median [p10, p90] of --reps repetitions after one warm-up. Two tables:
- `wait`: --device copies the tokens to --peer while --peer runs BUSY_KERNELS spinning kernels (`busy`) or
  nothing (`idle`): the time the source's stream takes to pass the copy, for each of COPY_MODES: `peer`
  (PyTorch's `.to()`, a two-way barrier: the decoder's copy), `peer, side stream` (the barrier taken on a
  stream of --peer with nothing queued) and `pinned host` (into pinned host memory: a relay's first half).
  Then the busy kernels' own time on --peer.
- `hop`: the two GPUs run a HOP_CYCLES spinning kernel in turn, HOPS times, each handing the tokens to the
  other by `peer` or by `pinned relay` (through pinned host memory, the destination's stream waiting on the
  source's event); `hand_over_ms` is one hop less the kernel alone (its own row): what a hand-over costs
  when the GPUs take turns, as the draft and the target do in a round.
Needs two CUDA GPUs. Writes --out (JSON): `env` and `rows` (table, mode, destination or hops, the timing).
"""

from __future__ import annotations

import sys
import time

import torch

from contracts import UsageError
from model.cli import run_torch_command
from model.loading import parse_device

from .timing import gpu_command_parser, spread, start_gpu_command, write_result

COMMAND = "python -m measure.device_copies"
COPY_TOKENS = 7  # a look-ahead's K + 1 proposals at the study's K = 6
BUSY_KERNELS, BUSY_CYCLES = 8, 2_000_000  # about 8 ms on an H200's clock
HOP_CYCLES, HOPS = 1_000_000, 20  # about 0.5 ms a kernel
COPY_MODES = ("peer", "peer, side stream", "pinned host")
HOP_MODES = ("peer", "pinned relay")


def require_peer(command: str, source: torch.device, peer: str) -> torch.device:
    """The second GPU, checked before any work: two CUDA GPUs here, and --peer another one than --device."""
    count = torch.cuda.device_count()
    if count < 2:
        raise UsageError(f"{command} needs two CUDA GPUs (found {count})")
    parsed = parse_device(peer)
    if parsed.type != "cuda" or parsed.index in (None, source.index):
        raise UsageError(f"--peer {peer}: give another CUDA GPU than --device, as cuda:N (N < {count})")
    return parsed


def spin(device: torch.device, cycles: int, kernels: int = 1) -> None:
    with torch.cuda.device(device):
        for _ in range(kernels):
            torch.cuda._sleep(cycles)


class Hands:
    """Hands COPY_TOKENS tokens from one GPU to the other in each mode of COPY_MODES and HOP_MODES."""

    def __init__(self, devices: tuple[torch.device, torch.device]):
        self.side = {device: torch.cuda.Stream(device) for device in devices}
        self.pinned = {device: torch.empty(COPY_TOKENS, dtype=torch.long, pin_memory=True) for device in devices}

    def over(self, mode: str, tokens: torch.Tensor, destination: torch.device) -> torch.Tensor:
        if mode == "peer":
            return tokens.to(destination, non_blocking=True)
        if mode == "peer, side stream":
            with torch.cuda.stream(self.side[destination]):
                moved = tokens.to(destination, non_blocking=True)
            torch.cuda.current_stream(destination).wait_stream(self.side[destination])
            return moved
        buffer = self.pinned[destination]  # one per destination: a chain's next write to it comes two hops later
        buffer.copy_(tokens, non_blocking=True)
        if mode == "pinned host":
            return buffer
        written = torch.cuda.Event()
        written.record(torch.cuda.current_stream(tokens.device))
        torch.cuda.current_stream(destination).wait_event(written)
        with torch.cuda.device(destination):
            return buffer.to(destination, non_blocking=True)


def timed_on(device: torch.device, fn) -> float:
    """fn's work on `device`'s stream, in ms (CUDA events around it)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    stream = torch.cuda.current_stream(device)
    start.record(stream)
    fn()
    end.record(stream)
    end.synchronize()
    return start.elapsed_time(end)


def wait_rows(hands: Hands, source: torch.device, peer: torch.device, reps: int) -> list[dict]:
    tokens = torch.arange(COPY_TOKENS, device=source)
    rows = []
    for state in ("busy", "idle"):
        for mode in COPY_MODES:
            times = []
            for _ in range(reps + 1):  # the first warms up
                torch.cuda.synchronize(source)
                torch.cuda.synchronize(peer)
                if state == "busy":
                    spin(peer, BUSY_CYCLES, BUSY_KERNELS)
                times.append(timed_on(source, lambda mode=mode: hands.over(mode, tokens, peer)))
                torch.cuda.synchronize(peer)
            rows.append({"table": "wait", "mode": mode, "destination": state, **spread(times[1:])})
    busy = [timed_on(peer, lambda: spin(peer, BUSY_CYCLES, BUSY_KERNELS)) for _ in range(reps)]
    return [*rows, {"table": "wait", "mode": "busy kernels alone", "destination": "busy", **spread(busy)}]


def hop_rows(hands: Hands, source: torch.device, peer: torch.device, reps: int) -> list[dict]:
    kernel = spread([timed_on(source, lambda: spin(source, HOP_CYCLES)) for _ in range(reps)])
    rows = [{"table": "hop", "mode": "kernel alone", "hops": 1, **kernel}]
    for mode in HOP_MODES:
        laps = []
        for _ in range(reps + 1):
            torch.cuda.synchronize(source)
            torch.cuda.synchronize(peer)
            started, tokens = time.perf_counter(), torch.arange(COPY_TOKENS, device=source)
            for _ in range(HOPS):
                spin(tokens.device, HOP_CYCLES)
                tokens = hands.over(mode, tokens, peer if tokens.device == source else source)
            torch.cuda.synchronize(source)
            torch.cuda.synchronize(peer)
            laps.append((time.perf_counter() - started) * 1e3 / HOPS)
        timing = spread(laps[1:])
        rows.append({"table": "hop", "mode": mode, "hops": HOPS, **timing})
        rows[-1]["hand_over_ms"] = timing["median_ms"] - kernel["median_ms"]
    return rows


def format_row(row: dict) -> str:
    where = row["destination"] if "destination" in row else f"{row['hops']} hops"
    line = (
        f"{row['table']:5s} {row['mode']:18s} {where:8s} {row['median_ms']:8.3f} ms "
        f"[p10 {row['p10_ms']:.3f}, p90 {row['p90_ms']:.3f}]"
    )
    return line + (f", a hand-over {row['hand_over_ms']:.3f} ms" if "hand_over_ms" in row else "")


def parser():
    p = gpu_command_parser(COMMAND, __doc__, 12, "timed repetitions per timing")
    p.add_argument("--peer", default="cuda:1", help="the other CUDA GPU, where the tokens go (default cuda:1)")
    return p


def main(argv=None) -> int:
    def body():
        args = parser().parse_args(argv)
        out, source = start_gpu_command(COMMAND, args.out, args.device, modules=())
        source = torch.device("cuda", torch.cuda.current_device())  # `cuda` alone names the current one
        peer = require_peer(COMMAND, source, args.peer)
        environment = {
            "gpus": [torch.cuda.get_device_name(source), torch.cuda.get_device_name(peer)],
            "torch": torch.__version__,
            "peer_access": torch.cuda.can_device_access_peer(source.index, peer.index),
            "weights": "none",
        }
        print(
            f"{COMMAND}: {environment['gpus'][0]} -> {environment['gpus'][1]} (torch {torch.__version__}), "
            f"peer access {'on' if environment['peer_access'] else 'off'}; no model weights"
        )
        hands = Hands((source, peer))
        rows = [*wait_rows(hands, source, peer, args.reps), *hop_rows(hands, source, peer, args.reps)]
        for row in rows:
            print(format_row(row), flush=True)
        write_result(out, {"env": environment, "rows": rows})
        print(f"wrote {out}")

    return run_torch_command(body)


if __name__ == "__main__":
    sys.exit(main())
