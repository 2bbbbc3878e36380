"""The persistent draft step (model/persistent_body.py) against the fused kernels' step: on the GPU where there
is one (one program per SM, grid barriers between phases), else on the CPU under triton's interpreter (one
program doing every work item; float32: its bfloat16 dot is wrong)."""

import pytest
import torch

from model import dense_gemv, persistent_body, triton_support
from model.decoder import Decoder
from model.heads import DenseHead
from model.loading import load_model
from model.pair import load_pair
from model.presets import PRESETS

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
pytestmark = pytest.mark.skipif(
    not triton_support.runs_on(DEVICE), reason="needs triton (on the CPU, its interpreter runs the kernels)"
)
TOL = 1e-5 if DEVICE.type == "cpu" else 3e-3  # relative to the largest value (TF32 dots on a GPU)


def _fused(name: str) -> torch.nn.Module:
    return load_model(name, DEVICE, "float32", seed=1, max_seq_len=160, kernels="fused").model


@pytest.mark.parametrize("name", ["tiny-qwen3-draft", "tiny-llama-draft", "tiny-qwen3"])  # tiny-qwen3: 2 KV heads
def test_a_step_is_the_fused_kernels_step_and_writes_the_same_cache(name):
    persistent, fused = _fused(name), _fused(name)
    persistent_body.attach(persistent)
    body = persistent.persistent_body
    assert body is not None and fused.persistent_body is None
    prompt = torch.randint(0, 512, (1, 62), generator=torch.Generator().manual_seed(0)).to(DEVICE)
    positions = torch.arange(62, device=DEVICE)
    assert torch.equal(persistent.forward_hidden(prompt, positions), fused.forward_hidden(prompt, positions))
    for position in (62, 63, 64, 65):  # on a GPU, splits of 32 slots: 63 ends the second, 64 starts a third
        token = torch.tensor([[position * 7 % 512]], device=DEVICE)
        at = torch.tensor([position], device=DEVICE)
        want = fused.forward_hidden(token, at)
        got = persistent.forward_hidden(token, at)
        assert got.shape == want.shape == (1, 1, fused.config.hidden_size)
        assert (got - want).abs().max() <= TOL * want.abs().max(), position
        assert (persistent.kv_caches - fused.kv_caches).abs().max() <= TOL * fused.kv_caches.abs().max(), position
        assert body.counters.tolist() == [0, 0] and body.tickets.eq(0).all()  # ready for the next launch


def _prefilled_pair(length: int, seed: int) -> tuple[torch.nn.Module, torch.nn.Module]:
    """The tiny Qwen3 draft on the persistent step and on the fused kernels, both prefilled with the same
    random prompt of `length` tokens."""
    persistent, fused = _fused("tiny-qwen3-draft"), _fused("tiny-qwen3-draft")
    persistent_body.attach(persistent)
    prompt = torch.randint(0, 512, (1, length), generator=torch.Generator().manual_seed(seed)).to(DEVICE)
    positions = torch.arange(length, device=DEVICE)
    persistent.forward_hidden(prompt, positions)
    fused.forward_hidden(prompt, positions)
    return persistent, fused


def test_a_stale_cache_changes_the_step():
    """Negative control: the comparison above sees the cache the step reads (a slot of the prompt
    overwritten makes the persistent step differ from the fused one)."""
    persistent, fused = _prefilled_pair(40, seed=1)
    persistent.kv_caches[:, :, :, :, 3] += 1.0
    token, at = torch.tensor([[5]], device=DEVICE), torch.tensor([40], device=DEVICE)
    want = fused.forward_hidden(token, at)
    assert (persistent.forward_hidden(token, at) - want).abs().max() > 100 * TOL * want.abs().max()


def test_the_new_token_replaces_its_slot_s_stale_row_in_the_block_loaded_ahead():
    """A split's first block of keys and values is loaded before the step writes the new token's slot:
    whatever that slot held before (here a huge value) must not reach the step or the cache."""
    persistent, fused = _prefilled_pair(20, seed=2)
    persistent.kv_caches[:, :, :, :, 20] = 1e4  # position 20: inside the first block of 32 slots
    token, at = torch.tensor([[9]], device=DEVICE), torch.tensor([20], device=DEVICE)
    want = fused.forward_hidden(token, at)
    assert (persistent.forward_hidden(token, at) - want).abs().max() <= TOL * want.abs().max()
    assert (persistent.kv_caches - fused.kv_caches).abs().max() <= TOL * fused.kv_caches.abs().max()


def test_only_a_dense_fused_model_takes_it_and_wider_forwards_keep_the_fused_kernels(monkeypatch):
    for name, kernels in (("tiny-qwen3-awq", "fused"), ("tiny-qwen3-draft", "torch")):
        model = load_model(name, DEVICE, "float32", seed=1, max_seq_len=8, kernels=kernels).model
        persistent_body.attach(model)
        assert model.persistent_body is None, name
    model = _fused("tiny-qwen3-draft")
    persistent_body.attach(model, False)
    assert model.persistent_body is None
    persistent_body.attach(model)
    calls = []
    monkeypatch.setattr(model.persistent_body, "forward", lambda *args: calls.append(args))
    tokens = torch.zeros((1, 3), dtype=torch.long, device=DEVICE)
    model.forward_hidden(tokens, torch.arange(3, device=DEVICE))
    assert calls == []


def test_a_program_loads_its_columns_of_a_phase_ahead_within_the_register_budget():
    """Qwen3-0.6B's phases on 132 SMs: (columns a block, blocks loaded ahead, blocks after), every tile
    within MAX_AHEAD_ELEMENTS; a model whose phase cannot fit is left to the fused kernels."""
    assert persistent_body.phase_launch(4096, 1024, 132) == (32, 1, 0)  # q/k/v: 128 programs of 32 columns
    assert persistent_body.phase_launch(1024, 2048, 132) == (8, 1, 0)  # o
    assert persistent_body.phase_launch(3072, 1024, 132, halves=2) == (8, 2, 1)  # gate/up: 3 blocks a program
    assert persistent_body.phase_launch(1024, 3072, 132) == (8, 1, 0)  # down: inputs padded to 4,096
    assert persistent_body.phase_launch(96, 16, 1) == (32, 2, 1)  # one program: 96 columns, not a block of 128
    assert persistent_body.phase_launch(8192, 2048, 132, halves=2) is None  # Llama-3.2-1B's gate/up
    assert persistent_body.phase_launches(PRESETS["qwen3-0.6b"], 132) == {
        "qkv": (32, 1, 0),
        "o": (8, 1, 0),
        "gate_up": (8, 2, 1),
        "down": (8, 1, 0),
    }
    assert persistent_body.phase_launches(PRESETS["llama-3.2-1b"], 132) is None  # its draft keeps the fused kernels


def test_phase_times_are_the_slowest_program_and_the_barriers_own_latency():
    """Two programs, two layers: program 1 arrives 1 us after program 0 at every barrier, both leave
    0.5 us after the last arrival; phase k of layer l runs from the barrier before (layer 0's q/k/v has none)."""
    barriers = 2 * persistent_body.PHASES
    stamps = torch.zeros((2, barriers, 2), dtype=torch.int64)
    durations = [3_000, 7_000, 2_000, 5_000, 1_000] * 2  # ns from leaving the barrier before to arriving
    clock = 0
    for barrier, duration in enumerate(durations):
        clock += duration
        stamps[0, barrier, 0], stamps[1, barrier, 0] = clock - 1_000, clock
        stamps[:, barrier, 1] = clock + 500
        clock += 500
    times = persistent_body.phase_times(stamps)
    assert list(times) == list(persistent_body.PHASE_NAMES)
    assert [t["work_us"] for t in times.values()] == [3.0, 7.0, 2.0, 5.0, 1.0]
    assert all(t["wait_us"] == 0.5 for t in times.values())
    stamps[1, 0, 0] += 10_000_000  # layer 0's q/k/v has no barrier before it: left out
    assert persistent_body.phase_times(stamps)["q/k/v"]["work_us"] == 3.0


def test_a_draft_on_the_persistent_step_keeps_speculative_output_target_greedy(monkeypatch):
    monkeypatch.setattr(dense_gemv, "DRAFT_ROWS", None)
    monkeypatch.setattr(persistent_body, "DRAFT_PERSISTENT", True)
    placement = "one-gpu" if DEVICE.type == "cuda" else "cpu"
    pair = load_pair("tiny-qwen3", "tiny-qwen3-draft", placement, "float32", seed=1, kernels="fused", max_seq_len=48)
    target, draft = pair.target.model, pair.draft.model
    assert target.persistent_body is None and draft.persistent_body is not None
    prompt = list(b"Hi")
    want = Decoder(target, K=1, graphs=False).reference(prompt, 5)
    got = Decoder(target, draft, DenseHead(draft.head_weight), K=2, graphs=False).generate(prompt, 5, "deferred")
    assert got.tokens == want
