"""Tensor-parallel targets (dense and AWQ int4): two processes with the gloo backend on the CPU stand for two GPUs (and
with NCCL on two GPUs, CUDA graphs on, where there are two). A TP=2 target's logits equal the
single-process target's (to float tolerance: the o_proj and down_proj sums are split in two), its
greedy tokens are the same, and a TP=2 generation with the draft on rank 0 (a stand-in on rank 1)
equals single-process target-only greedy, token for token, in every schedule."""

import dataclasses
import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from contracts import UsageError
from contracts.names import tensor_parallel_size
from model.acceptance_control import AcceptanceControl
from model.decoder import Decoder
from model.heads import DenseHead
from model.loading import load_model
from model.presets import PRESETS
from model.tensor_parallel import DraftStandIn, TensorParallel

SCHEDULES = ("baseline", "ordinary", "pipelined", "deferred", "pipelined-deferred")
PROMPT = list(b"Tensor parallel")
MAX_NEW, K, ROOM = 12, 3, 64


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _close(got: torch.Tensor, want: torch.Tensor) -> None:
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    assert torch.equal(got.argmax(-1), want.argmax(-1))


def _forwards_match(spec: str, tp: TensorParallel, device: torch.device) -> None:
    """Prefill, one-token steps and a verify-like chunk: the shard's logits against the whole model's."""
    whole = load_model(spec, device, "float32", seed=1, max_seq_len=ROOM).model
    shard = load_model(spec, device, "float32", seed=1, max_seq_len=ROOM, tensor_parallel=tp).model
    assert shard.layers[0].self_attn.k_cache.shape[1] == whole.layers[0].self_attn.k_cache.shape[1] // tp.world
    tokens = torch.randint(0, whole.config.vocab_size, (1, 20), generator=torch.Generator().manual_seed(0))
    tokens = tokens.to(device)
    for start, end in ((0, 9), (9, 10), (10, 11), (11, 16), (16, 20)):
        pos = torch.arange(start, end, device=device)
        _close(shard(tokens[:, start:end], pos)[0], whole(tokens[:, start:end], pos)[0])
    for module in shard.modules():  # a control: without the all-reduces the shard computes something else
        module._forward_hooks.clear()
    pos = torch.arange(20, device=device)
    assert not torch.allclose(shard(tokens, pos)[0], whole(tokens, pos)[0], rtol=1e-2, atol=1e-3)


def _greedy_matches(spec: str, tp: TensorParallel, device: torch.device) -> None:
    """Target-only greedy generation of the shard equals the whole model's, token for token."""
    graphs = device.type == "cuda"
    whole = load_model(spec, device, "float32", seed=1, max_seq_len=ROOM).model
    shard = load_model(spec, device, "float32", seed=1, max_seq_len=ROOM, tensor_parallel=tp).model
    want = Decoder(whole, K=K, graphs=graphs).reference(PROMPT, MAX_NEW)
    assert Decoder(shard, K=K, graphs=graphs).reference(PROMPT, MAX_NEW) == want


def _generations_match(tp: TensorParallel, device: torch.device) -> None:
    """TP=2 baseline and every speculative schedule against single-process target-only greedy."""
    graphs = device.type == "cuda"
    whole = load_model("tiny-llama", device, "float32", seed=1, max_seq_len=ROOM).model
    want = Decoder(whole, K=K, graphs=graphs).reference(PROMPT, MAX_NEW + 2 * K + 2)
    shard = load_model("tiny-llama", device, "float32", seed=1, max_seq_len=ROOM, tensor_parallel=tp).model
    if tp.runs_draft:
        draft = load_model("tiny-llama-draft", device, "float32", seed=2, max_seq_len=ROOM).model
    else:
        draft = DraftStandIn(device, ROOM)
    head = DenseHead(draft.head_weight)
    for spec in (None, "a=0.6"):
        control = None if spec is None else AcceptanceControl(spec, 512, ROOM, device, seed=3)
        dec = Decoder(shard, draft, head, K=K, graphs=graphs, control=control, tensor_parallel=tp)
        if control is not None:
            control.bind(want, len(PROMPT), "p")
        for schedule in SCHEDULES:
            got = dec.generate(PROMPT, MAX_NEW, schedule)
            assert got.tokens == want[:MAX_NEW], (tp.rank, spec, schedule)
            if control is not None and schedule != "baseline":
                assert sum(r.accepted for r in got.rounds) > 0  # the broadcast proposals were verified


def _worker(rank: int, world: int, port: int, checkpoint: str | None, backend: str) -> None:
    device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    torch.set_num_threads(1)
    try:
        tp = TensorParallel(rank, world)
        _forwards_match("tiny-llama", tp, device)
        _forwards_match("tiny-qwen3", tp, device)
        _forwards_match("tiny-llama-awq", tp, device)
        _greedy_matches("tiny-llama-awq", tp, device)
        if checkpoint is not None:
            _forwards_match(checkpoint, tp, device)
        _generations_match(tp, device)
    finally:
        dist.destroy_process_group()


def _llama_checkpoint(folder) -> str | None:
    """A tiny untied Hugging Face Llama checkpoint, saved locally (the sharded load path)."""
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        vocab_size=320,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=256,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(folder)
    return str(folder)


def test_two_ranks_equal_one_process(tmp_path):
    checkpoint = _llama_checkpoint(tmp_path / "llama")
    mp.spawn(_worker, args=(2, _free_port(), checkpoint, "gloo"), nprocs=2, join=True)


def _gloo_threads_after_teardown(rank: int, rendezvous: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=1)
    load_model("tiny-llama", "cpu", "float32", seed=1, max_seq_len=ROOM)
    dist.destroy_process_group()
    names = [(task / "comm").read_text().strip() for task in Path("/proc/self/task").iterdir()]
    assert not [name for name in names if "gloo" in name], names


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads the process's threads from /proc")
def test_destroy_process_group_ends_the_gloo_threads_after_a_model_is_built(tmp_path):
    """Nothing a model build does keeps the process group alive past destroy_process_group: when
    something did (nn.Embedding's normal_ init on the meta device), its threads were torn down at
    interpreter exit and could abort a rank that had finished its work (SIGABRT, one CI run in ten)."""
    mp.spawn(_gloo_threads_after_teardown, args=(str(tmp_path / "rendezvous"),), nprocs=1, join=True)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")
def test_two_gpus_with_nccl_and_cuda_graphs_equal_one_gpu(tmp_path):
    """The all-reduces captured in the CUDA graphs (fused kernels where triton runs, fixed width)."""
    checkpoint = _llama_checkpoint(tmp_path / "llama")
    mp.spawn(_worker, args=(2, _free_port(), checkpoint, "nccl"), nprocs=2, join=True)


def test_shards_split_heads_and_mlp_and_refuse_what_does_not_divide():
    config = TensorParallel(1, 2).shard_config(PRESETS["llama-3.3-70b"])
    assert (config.n_heads, config.n_kv_heads, config.intermediate_size) == (32, 4, 14336)
    assert config.hidden_size == 8192 and config.vocab_size == 128256  # replicated embedding and head
    with pytest.raises(UsageError, match="divide the KV heads"):
        TensorParallel(0, 16).shard_config(PRESETS["llama-3.3-70b"])
    awq = TensorParallel(0, 2).shard_config(PRESETS["llama-3.3-70b-awq"])
    assert (awq.n_heads, awq.intermediate_size, awq.awq_group_size) == (32, 14336, 128)
    coarse = dataclasses.replace(PRESETS["tiny-llama-awq"], awq_group_size=64)  # o_proj's 32 inputs per rank
    with pytest.raises(UsageError, match=r"cannot split the o_proj input \(64\) on its 64-wide quantization groups"):
        TensorParallel(0, 2).shard_config(coarse)
    with pytest.raises(UsageError, match="KV width .* blocks of 8 columns"):
        TensorParallel(0, 2).shard_config(dataclasses.replace(PRESETS["tiny-llama-awq"], head_dim=4, n_heads=8))
    full = torch.arange(24).view(6, 4)
    assert torch.equal(TensorParallel(1, 2).shard("layers.0.self_attn.q_proj.weight", full), full[3:])
    assert torch.equal(TensorParallel(1, 2).shard("layers.0.mlp.down_proj.weight", full), full[:, 2:])
    assert torch.equal(TensorParallel(1, 2).shard("lm_head.weight", full), full)
    packed = torch.arange(48).view(4, 12)  # AWQ buffers are [in or groups, out]: the other dimension
    assert torch.equal(TensorParallel(1, 2).shard("layers.0.mlp.up_proj.qweight", packed), packed[:, 6:])
    assert torch.equal(TensorParallel(1, 2).shard("layers.0.mlp.down_proj.scales", packed), packed[2:])
    assert torch.equal(TensorParallel(0, 2).shard("layers.0.self_attn.o_proj.qzeros", packed), packed[:2])


@pytest.mark.parametrize("placement, ranks", [("tp2", 2), ("tp8", 8), ("tp1", None), ("tp02", None), ("tpx", None)])
def test_tensor_parallel_placement_names(placement, ranks):
    assert tensor_parallel_size(placement) == ranks
