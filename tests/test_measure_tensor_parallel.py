"""`python -m measure --placement tp2 --add-to PROFILE` on the CPU: two gloo processes stand for torchrun's
two GPUs. A one-process profile of an AWQ target (with the draft) gets a tp2 section for the dense
target, and the simulator compares the two placements from that one profile (the issue's question:
one-GPU AWQ against two-GPU TP), at the study's acceptance a = 0.77 and K = 6."""

import json
import os
import socket

import pytest
import torch.distributed as dist
import torch.multiprocessing as mp

from contracts.profile import read_profile
from measure.__main__ import main as measure_main
from sim.__main__ import main as sim_main
from sim.scenario import Scenario, run, with_change

SHAPES = ["--contexts", "16", "--prompt-lengths", "8", "--K-max", "1", "--reps", "2", "--warmup", "0"]
TP2 = ["--placement", "tp2", "--target", "tiny-llama", *SHAPES]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(rank: int, port: int, argv: list[str]) -> None:
    """One torchrun process: its rank and the rendezvous in the environment, as torchrun sets them."""
    os.environ.update(
        RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    try:
        assert measure_main(argv) == 0
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


@pytest.fixture(scope="module")
def both(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tp")
    one = folder / "awq.json"
    argv = ["--target", "tiny-llama-awq", "--draft", "tiny-llama-draft", "--placement", "cpu", *SHAPES]
    argv += ["--probes", "1,4", "--prompts", "per-category:1", "--agreement-max-len", "16", "--out", str(one)]
    assert measure_main(argv) == 0
    out = folder / "both.json"
    mp.spawn(_rank, args=(_free_port(), [*TP2, "--add-to", str(one), "--out", str(out)]), nprocs=2, join=True)
    return one, out


def test_the_section_is_added_and_the_rest_kept(both):
    one, out = both
    profile, base = read_profile(out), json.loads(one.read_text())
    section = profile.pop("tensor_parallel")["tp2"]
    assert profile == base  # the draft, host and one-process target costs are the base profile's
    assert section["ranks"] == 2 and section["backend"] == "gloo" and section["regime"] == "eager"
    assert section["target"]["name"] == "tiny-llama" and section["target"]["weights"] == "synthetic"
    assert (section["layers"], section["hidden_size"], section["dtype_bytes"]) == (4, 64, 4)
    sizes = [p["bytes"] for p in section["all_reduce_ms"]["points"]]
    assert sizes == [64 * 4 * rows for rows in (1, 2, 3, 8)]  # token counts 1..K_max+2 and the prompt's
    grid = {(p["n_tokens"], p["context"]) for p in section["forward_ms"]["points"]}
    assert grid == {(1, 16), (2, 16), (3, 16)}
    for table in ("all_reduce_ms", "forward_ms", "prefill_ms", "measured_forward_ms"):
        assert all(p["median_ms"] > 0 for p in section[table]["points"]), table


def test_the_simulator_compares_one_gpu_awq_with_tp2(both, capsys):
    _, out = both
    argv = ["--profile", str(out), "--acceptance", "0.77", "--K", "6", "--prompts", "2", "--no-ceiling"]
    assert sim_main([*argv, "--what-if", "placement=tp2"]) == 0
    printed = capsys.readouterr().out
    assert "what-if: placement=tp2" in printed and "tiny-llama (synthetic) over 2 ranks" in printed
    base = Scenario(profile=str(out), acceptance="0.77", K=6, prompts=2, schedules=("deferred",))
    one_gpu, _ = run(base, ceiling=False)
    tp2, resolved = run(with_change(base, "placement", "=", "tp2"), ceiling=False)
    assert "tiny-llama-awq" in resolved.profile.label()  # the draft and host costs stay the profile's
    assert tp2[0]["decode_ms"] != one_gpu[0]["decode_ms"]  # the target's costs are the section's


def test_refused_before_any_process_group(tmp_path, capsys):
    """A tpN measurement without --add-to, or with draft options, is refused in one line (exit 2)."""
    assert measure_main([*TP2, "--out", str(tmp_path / "x.json")]) == 2
    assert "give --add-to PROFILE" in capsys.readouterr().err
    assert not dist.is_initialized() and not list(tmp_path.iterdir())
