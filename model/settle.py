"""A chain round's settle (`Decoder.settle`) in one Triton launch: the accepted count and final token
(greedy) or the sampling verifier's, the emitted block written to the output, the EOS flag, the
counter, the round's accepted count and the new cursor.

Why: in torch this bookkeeping is about fifteen launches of one-element kernels, a few microseconds
each on the GPU, and in a deferred round all of them lie between the verify's end and the host's read
(docs/decoder-speed.md, "Decoder speed: the round's settle in one launch"). The values are integers, so the
kernel equals `settle_reference` exactly (tests/test_settle.py compares every output). Where the kernel
runs: model/triton_support.py.
"""

from __future__ import annotations

import torch

from model import triton_support
from model.triton_support import launching_on, tl, triton


def settle_reference(seq, preds, verdict, out, n, eos, accepted, index, cursor, eos_id):
    """seq = [f, d1..dk] on the target device; preds: the target's tokens after each of seq (greedy;
    unread with a `verdict`); verdict: the sampling verifier's (a, f), or None. Writes the block
    [d1..da, f] into out at n, ORs EOS among them into eos (eos_id None: never), adds a + 1 to n and
    stores a in accepted[index]. Returns (a, f, the new cursor [seq[a], f, p + a + 1])."""
    drafted = seq.numel() - 1
    if verdict is None:
        a = (seq[1:] == preds[:drafted]).long().cumprod(0).sum(0, keepdim=True)
        f = preds.gather(0, a)
    else:
        a, f = verdict
    positions = torch.arange(drafted + 1, device=seq.device)
    block = torch.cat([seq[1:], f]).scatter_(0, a, f)
    out.index_copy_(0, n + positions, block)
    if eos_id is not None:
        eos |= ((block == eos_id) & (positions <= a)).any(0, keepdim=True)
    n += a + 1
    accepted[index : index + 1] = a
    return a, f, torch.cat([seq.gather(0, a), f, cursor[2:3] + a + 1])


def settle_fused(seq, preds, verdict, out, n, eos, accepted, index, cursor, eos_id):
    """`settle_reference` in one launch, with its arguments and results (no sync)."""
    drafted = seq.numel() - 1
    if verdict is None:
        a = torch.empty(1, dtype=torch.long, device=seq.device)
        f = torch.empty(1, dtype=torch.long, device=seq.device)
        a_in, f_in, preds_in, preds_stride = a, f, preds, preds.stride(0)
    else:
        a, f = verdict
        a_in, f_in, preds_in, preds_stride = a, f, seq, 0  # preds unread
    new_cursor = torch.empty(3, dtype=torch.long, device=seq.device)
    with launching_on(seq.device):
        _settle_kernel[(1,)](
            seq,
            preds_in,
            preds_stride,
            a_in,
            f_in,
            out,
            n,
            eos,
            accepted,
            index,
            cursor,
            new_cursor,
            drafted,
            -1 if eos_id is None else eos_id,
            BLOCK=triton.next_power_of_2(drafted + 1),
            GREEDY=verdict is None,
            HAS_EOS=eos_id is not None,
            num_warps=1,
        )
    return a, f, new_cursor


class RoundSettler:
    """A decoder's settle on its target device: the fused kernel where it can run, else the reference.
    backend: "triton" or "torch"; None picks triton on CUDA (model/triton_support.choose_backend)."""

    def __init__(self, device: torch.device, eos_id: int | None, backend: str | None = None):
        self.backend = triton_support.choose_backend(backend, torch.device(device))
        self.eos_id = eos_id

    def __call__(self, seq, preds, verdict, out, n, eos, accepted, index, cursor):
        settle = settle_fused if self.backend == "triton" else settle_reference
        return settle(seq, preds, verdict, out, n, eos, accepted, index, cursor, self.eos_id)


if triton is not None:

    @triton.jit(do_not_specialize=["index"])
    def _settle_kernel(
        seq_ptr,
        preds_ptr,
        preds_stride,
        a_ptr,
        f_ptr,
        out_ptr,
        n_ptr,
        eos_ptr,
        accepted_ptr,
        index,
        cursor_ptr,
        new_cursor_ptr,
        drafted,
        eos_id,
        BLOCK: tl.constexpr,
        GREEDY: tl.constexpr,
        HAS_EOS: tl.constexpr,
    ):
        """One program. Greedy: a = the first position whose draft differs from the target's token
        (drafted if none), f = the target's token there, both stored to a_ptr / f_ptr; else both are
        read from there."""
        i = tl.arange(0, BLOCK)
        drafts = tl.load(seq_ptr + 1 + i, mask=i < drafted, other=0)
        if GREEDY:
            targets = tl.load(preds_ptr + i * preds_stride, mask=i < drafted, other=0)
            a = tl.min(tl.where((i < drafted) & (drafts != targets), i, drafted), axis=0).to(tl.int64)
            f = tl.load(preds_ptr + a * preds_stride)
            tl.store(a_ptr, a)
            tl.store(f_ptr, f)
        else:
            a = tl.load(a_ptr)
            f = tl.load(f_ptr)
        block = tl.where((i == a) | (i == drafted), f, drafts)  # [d1..dk, f] with f also at a
        n = tl.load(n_ptr)
        tl.store(out_ptr + n + i, block, mask=i <= drafted)
        if HAS_EOS:
            hit = tl.max(((block == eos_id) & (i <= a)).to(tl.int32), axis=0)
            tl.store(eos_ptr, (tl.load(eos_ptr).to(tl.int32) | hit).to(tl.int1))
        tl.store(n_ptr, n + a + 1)
        tl.store(accepted_ptr + index, a)
        tl.store(new_cursor_ptr, tl.load(seq_ptr + a))
        tl.store(new_cursor_ptr + 1, f)
        tl.store(new_cursor_ptr + 2, tl.load(cursor_ptr + 2) + a + 1)
