"""python -m measure.verify_speed: the sampling verify's fused Triton kernel on one CUDA GPU, against the
greedy settle it replaces.

Why: under sampling a round's verify does more than compare K tokens: the acceptance test of every
position and a race over the whole vocabulary for the residual or bonus token
(model/sampling_triton.py, one launch). This command says what that costs next to the greedy
decision, and whether it runs near the bytes it reads.

    python -m measure.verify_speed --out verify_bench.json
    python -m measure.verify_speed --out verify_bench.json --reps 40

Rounds are SYNTHETIC (seeded random probabilities; no model weights are involved), at the vocabularies
of Qwen3 (151,936) and Gemma 3 (262,144) and K = 1, 4, 8, rejecting at position K // 2 + 1, so the
residual row is raced (the most bytes: p, q and the noise rows). Times are CUDA-event timings,
median [p10, p90] of --reps repetitions after warm-up (measure.timing): device time per call inside
a CUDA graph with L2 evicted (`time_in_graph`), and one eager call (`time_op`, launches included):
1. a launch-shape sweep of VERIFY_LAUNCH (BLOCK_V x num_warps) at V = 262,144, K = 8, in a graph;
   the fastest is kept;
2. per vocabulary and K: the greedy settle (Decoder.settle's decision: leading matches of K drafts
   with K + 1 target tokens, and the next token), the fused Triton verify with its bandwidth floor
   (bytes read once / the measured copy rate), and the torch reference verify;
3. a check: the Triton kernel equals the torch reference on random rounds (on the GPU's own
   arithmetic), as a share.

Prints each result as it comes and writes --out (JSON): `env` (GPU, versions, copy rate, weights
"synthetic"), `rows` (sweep rows: sweep "launch", launch, timing; op rows: op, vocab, K, graphs
"in graph" or false, floor_ms, timing), `chosen` (the launch shape kept) and
`triton_equal_reference` (the share of rounds that agree). Needs a CUDA GPU and triton.
docs/benchmarks.md describes it.
"""

from __future__ import annotations

import json
import sys

import torch

from contracts.cli import OneLineParser
from model import sampling_triton
from model.cli import run_torch_command
from model.sampling import verify_block_reference

from .benchmarks import copy_bandwidth_gbs
from .head_speed import best_shape, every_combination, sweep
from .timing import (
    environment_header,
    floor_ms,
    gpu_command_parser,
    gpu_environment,
    start_gpu_command,
    time_in_graph,
    time_op,
    write_result,
)

COMMAND = "python -m measure.verify_speed"
DEVICE = "cuda:0"
VOCABULARIES = (151_936, 262_144)  # Qwen3, Gemma 3
POSITIONS = (1, 4, 8)
SWEPT = (262_144, 8)  # vocabulary and K of the launch-shape sweep
SHAPES = every_combination(BLOCK_V=[512, 1024, 2048, 4096, 8192], num_warps=[2, 4, 8])
ROUNDS = 4  # inputs rotated through the timed calls
CHECKED_ROUNDS = 200  # per vocabulary
SHORTLIST_SHARE = 0.1  # of the vocabulary where q is positive (FlashHead's probed clusters)


def greedy_settle(drafts: torch.Tensor, target_tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Decoder.settle's decision under greedy decoding: accepted = the leading drafts [K] that match the
    target's tokens [K+1], and the target's token after them. The sampling verify replaces this."""
    accepted = (drafts == target_tokens[:-1]).long().cumprod(0).sum(0, keepdim=True)
    return accepted, target_tokens.gather(0, accepted)


def synthetic_round(
    generator: torch.Generator, K: int, vocab: int, device, reject_at: int | None = None, ties: bool = False
) -> tuple:
    """One round's verify inputs (synthetic): p [K+1, V], q [K, V] positive on a shortlist, drafts drawn
    from q, uniforms, Exp(1) noise. With reject_at < K, the drafts before it accept (where p(d) > 0) and
    it rejects; with reject_at = K, all accept. With ties, p takes 5 levels and the noise is 1, so the
    race has exact ties."""
    p = torch.softmax(2 * torch.randn(K + 1, vocab, device=device, generator=generator), dim=-1)
    if ties:
        p = (4 * p / p.amax(dim=-1, keepdim=True)).round()
    shortlist = torch.rand(K, vocab, device=device, generator=generator) < SHORTLIST_SHARE
    shortlist[:, 0] = True
    q = torch.softmax((2 * torch.randn(K, vocab, device=device, generator=generator)).masked_fill(~shortlist, -1e9), -1)
    q = q * shortlist  # exactly zero outside the shortlist
    drafts = torch.multinomial(q, 1, generator=generator).view(K)
    uniforms = torch.rand(K, device=device, generator=generator)
    if reject_at is not None:
        uniforms[:reject_at] = 0.0  # 0 < p(d): accepts
        p[reject_at:-1].scatter_(1, drafts[reject_at:, None], 0.0)  # u q(d) < 0 is false: rejects
    noise = torch.empty(vocab, device=device).exponential_(generator=generator)
    if ties:
        noise.fill_(1.0)
    return p, q, drafts, uniforms, noise


def verify_rows(device: torch.device, vocab: int, K: int, reps: int, bandwidth_gbs: float) -> list[dict]:
    """The greedy settle, the Triton verify and the torch reference at one vocabulary and K."""
    generator = torch.Generator(device=device).manual_seed(vocab + K)
    rounds = [synthetic_round(generator, K, vocab, device, reject_at=K // 2) for _ in range(ROUNDS)]
    mismatch, one = torch.tensor([K // 2], device=device), torch.ones(1, dtype=torch.long, device=device)
    greedy = [(drafts, torch.cat([drafts, drafts[:1]]).index_add_(0, mismatch, one)) for _, _, drafts, _, _ in rounds]
    verifier = sampling_triton.BlockVerifier(device, backend="triton")
    floor = floor_ms(sampling_triton.verify_bytes(K, vocab), bandwidth_gbs)
    rows = []
    for op, fn, inputs, op_floor in (
        ("greedy settle", greedy_settle, greedy, None),
        ("sampling verify triton", verifier, rounds, floor),
        ("sampling verify torch", verify_block_reference, rounds, None),
    ):
        for graphs in ("in graph", False):
            try:
                if graphs:
                    timing = time_in_graph(fn, inputs, device, reps=reps)
                else:
                    timing = time_op(fn, inputs, device, reps=reps)
            except Exception as error:  # e.g. a reference that syncs cannot be captured: say so, go on
                print(f"{op} V={vocab} K={K} graphs={graphs}: failed ({type(error).__name__}: {str(error)[:120]})")
                continue
            row = {"op": op, "vocab": vocab, "K": K, "graphs": graphs, "floor_ms": op_floor, **timing}
            rows.append(row)
            print(format_row(row), flush=True)
    return rows


def format_row(row: dict) -> str:
    """One printed line: op, vocabulary, K, graphs, median [p10, p90] in us, and the floor with the ratio."""
    floor = (
        f"floor {row['floor_ms'] * 1e3:.2f} us ({row['median_ms'] / row['floor_ms']:.1f}x)" if row["floor_ms"] else ""
    )
    graphs = row["graphs"] or "eager"
    return (
        f"{row['op']:<24} V={row['vocab']:<7} K={row['K']:<2} {graphs:<8} {row['median_ms'] * 1e3:8.2f} us "
        f"[{row['p10_ms'] * 1e3:.2f}, {row['p90_ms'] * 1e3:.2f}]  {floor}"
    )


def agreement(device: torch.device) -> float:
    """The share of random rounds (every K of POSITIONS, every number accepted, a quarter with exact ties,
    both vocabularies) on which the Triton kernel and the torch reference give the same (accepted, final)."""
    generator = torch.Generator(device=device).manual_seed(1)
    same = total = 0
    for vocab in VOCABULARIES:
        for index in range(CHECKED_ROUNDS):
            K = POSITIONS[index % len(POSITIONS)]
            inputs = synthetic_round(generator, K, vocab, device, reject_at=index % (K + 1), ties=index % 4 == 0)
            got = torch.cat(sampling_triton.verify_block(*inputs))
            same += int(torch.equal(got, torch.cat(verify_block_reference(*inputs))))
            total += 1
    return same / total


def measure_verify(device: torch.device, reps: int) -> dict:
    bandwidth_gbs = copy_bandwidth_gbs(device)
    environment = gpu_environment(device, bandwidth_gbs, "seeded random probabilities; no model weights")
    print(environment_header(COMMAND, environment), flush=True)
    result = {"env": environment, "rows": []}

    vocab, K = SWEPT
    generator = torch.Generator(device=device).manual_seed(0)
    rounds = [synthetic_round(generator, K, vocab, device, reject_at=K // 2) for _ in range(ROUNDS)]
    verifier = sampling_triton.BlockVerifier(device, backend="triton")
    rows = sweep("launch", "VERIFY_LAUNCH", SHAPES, verifier, rounds, device, reps, kernels=sampling_triton)
    result["rows"] += rows
    sampling_triton.VERIFY_LAUNCH = best_shape(rows, sampling_triton.VERIFY_LAUNCH)
    result["chosen"] = sampling_triton.VERIFY_LAUNCH
    print("chosen:", json.dumps(result["chosen"]), flush=True)

    for vocab in VOCABULARIES:
        for K in POSITIONS:
            result["rows"] += verify_rows(device, vocab, K, reps, bandwidth_gbs)
    result["triton_equal_reference"] = agreement(device)
    print(
        f"Triton verify == torch reference on {CHECKED_ROUNDS * len(VOCABULARIES)} random rounds: "
        f"{result['triton_equal_reference']:.4f}",
        flush=True,
    )
    return result


def parser() -> OneLineParser:
    return gpu_command_parser(COMMAND, __doc__, 20, "timed repetitions per row", device_option=False)


def main(argv=None) -> int:
    def body():
        args = parser().parse_args(argv)
        out, device = start_gpu_command(COMMAND, args.out, DEVICE)
        write_result(out, measure_verify(device, args.reps))
        print(f"wrote {out}")

    return run_torch_command(body)


if __name__ == "__main__":
    sys.exit(main())
