"""The draft's prefill in graphed chunks (model/prefill.py): the chunks cover the prompt, and the cache they
leave is the one a single forward of the whole prompt leaves (on the CPU, eager, SYNTHETIC tiny weights)."""

import pytest
import torch

from model.loading import load_model
from model.prefill import CHUNK_WIDTHS, GraphedPrefill, chunks, decoding_widths

ROOM = 64


@pytest.mark.parametrize("widths", [(1,), (4,), (7,), (4, 16), (2, 8, 16)])
@pytest.mark.parametrize("prompt_len", [1, 3, 16, 17, 23, 32, 47])
def test_chunks_cover_the_prompt_once_each_in_order_and_end_at_its_last_token(prompt_len, widths):
    pieces = chunks(prompt_len, widths)
    starts = [start for start, _ in pieces]
    assert starts == sorted(starts) and starts[0] == 0 and all(width in widths for _, width in pieces)
    assert pieces[-1][0] + pieces[-1][1] == max(prompt_len, pieces[-1][1])  # the prompt's end, or padded
    assert all(start + width <= prompt_len for start, width in pieces[:-1])
    covered = set().union(*(range(start, start + width) for start, width in pieces))
    assert covered >= set(range(prompt_len))
    assert sum(width for _, width in pieces[:-1]) < prompt_len  # no chunk but the last reaches the prompt's end


def test_the_widest_chunks_come_first_then_the_narrowest_that_holds_the_rest():
    assert chunks(300, CHUNK_WIDTHS) == [(0, 512)]  # padded
    assert chunks(1024, CHUNK_WIDTHS) == [(0, 1024)]
    assert chunks(2661, CHUNK_WIDTHS) == [(0, 1024), (1024, 1024), (1637, 1024)]
    assert chunks(1100, CHUNK_WIDTHS) == [(0, 1024), (972, 128)]


def test_a_decoder_chunks_only_in_graphs_on_a_gpu():
    assert decoding_widths(torch.device("cuda", 0), graphs=True) == CHUNK_WIDTHS
    assert decoding_widths(torch.device("cuda", 0), graphs=False) == ()
    assert decoding_widths(torch.device("cpu"), graphs=True) == ()


def _cache_after(widths, prompt, device="cpu"):
    draft = load_model("tiny-qwen3-draft", device, torch.float32, seed=2, max_seq_len=ROOM).model
    prompt = prompt.to(device)
    GraphedPrefill(draft, torch.device(device), widths)(prompt)
    next_position = torch.tensor([prompt.shape[1]], device=device)
    after = draft.forward_hidden(prompt[:, -1:] + 1, next_position)  # the next token's step
    layers = [layer.self_attn for layer in draft.layers]
    keys = torch.stack([a.k_cache[:, :, : prompt.shape[1]] for a in layers])
    values = torch.stack([a.v_cache[:, :, : prompt.shape[1]] for a in layers])
    return keys, values, after


@pytest.mark.parametrize("prompt_len", [3, 5, 12, 13, 20, 24, 29])
def test_chunked_prefill_leaves_the_cache_a_whole_prompt_forward_leaves(prompt_len):
    """Widths 4 and 12: short prompts are padded (3, 5), longer ones end with a chunk that reaches back."""
    prompt = torch.randint(0, 512, (1, prompt_len), generator=torch.Generator().manual_seed(prompt_len))
    keys, values, after = _cache_after((), prompt)
    chunked_keys, chunked_values, chunked_after = _cache_after((4, 12), prompt)
    torch.testing.assert_close(chunked_keys, keys, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(chunked_values, values, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(chunked_after, after, rtol=1e-5, atol=1e-5)


def test_a_chunk_left_out_shows_in_the_cache(monkeypatch):
    """Negative control: the comparison above sees a prefill that skips the last chunk."""
    prompt = torch.randint(0, 512, (1, 29), generator=torch.Generator().manual_seed(0))
    keys, _, _ = _cache_after((), prompt)
    monkeypatch.setattr("model.prefill.chunks", lambda length, widths: chunks(length, widths)[:-1])
    skipped, _, _ = _cache_after((4, 12), prompt)
    with pytest.raises(AssertionError):
        torch.testing.assert_close(skipped, keys, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (run on the GPU machine)")
def test_on_a_gpu_the_replayed_chunks_leave_the_eager_prefills_cache():
    """In graphs with the GPU kernels: the last chunk reaching back (29, 21: 16 then 8), or padded (11)."""
    for prompt_len in (29, 21, 11):
        prompt = torch.randint(0, 512, (1, prompt_len), generator=torch.Generator().manual_seed(prompt_len))
        keys, values, after = _cache_after((), prompt, "cuda")
        chunked_keys, chunked_values, chunked_after = _cache_after((8, 16), prompt, "cuda")
        torch.testing.assert_close(chunked_keys, keys, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(chunked_values, values, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(chunked_after, after, rtol=1e-4, atol=1e-4)
