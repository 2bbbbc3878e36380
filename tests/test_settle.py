"""The fused settle (model/settle.py) against its torch reference: every output equal (a, f, the new
cursor, the output buffer, the counter, the EOS flag, the accepted counts) on random rounds and on the
edges (nothing drafted, a = 0, a = K, EOS before, at and past a, an expanded preds, a sampling verdict),
with a control showing the comparison can fail; and decoders settling through the kernel emit what the
reference decoders emit. On a GPU-less machine the kernel runs under triton's interpreter
(tests/conftest.py)."""

import pytest
import torch

from model import triton_support
from model.decoder import Decoder
from model.heads import DenseHead
from model.settle import RoundSettler, settle_fused, settle_reference
from tests.tiny_pair import target_references, tiny_pair

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
pytestmark = pytest.mark.skipif(
    not triton_support.runs_on(DEVICE), reason="needs triton (on the CPU, its interpreter runs the kernels)"
)
VOCAB = 50


def _round(generator, drafted: int, accepted: int, eos_at: int | None, verdict: bool):
    """One round's inputs (seq, preds, verdict, out, n, eos, accepted counts, index, cursor), drafts that
    match the target's tokens up to `accepted`, and the EOS token put at block position `eos_at`."""
    seq = torch.randint(0, VOCAB, (drafted + 1,), generator=generator)
    preds = torch.randint(0, VOCAB, (8 + drafted,), generator=generator)  # graph outputs run past K + 1
    if eos_at is not None and eos_at != accepted and eos_at < drafted:
        seq[eos_at + 1] = VOCAB  # an accepted draft, or one past a
    preds[:accepted] = seq[1 : accepted + 1]
    if accepted < drafted:
        preds[accepted] = (seq[accepted + 1] + 1) % VOCAB
    if eos_at == accepted:
        preds[accepted] = VOCAB  # f (greedy)
    chosen = None
    if verdict:
        chosen = (torch.tensor([accepted]), torch.randint(0, VOCAB + 1, (1,), generator=generator))
    out = torch.randint(0, VOCAB, (40,), generator=generator)
    n = torch.randint(0, 20, (1,), generator=generator)
    eos = torch.tensor([False])
    counts = torch.randint(0, 9, (16,), generator=generator)
    index = int(torch.randint(0, 16, (1,), generator=generator))
    cursor = torch.randint(0, 100, (3,), generator=generator)
    tensors = (seq, preds, out, n, eos, counts, cursor)
    seq, preds, out, n, eos, counts, cursor = (t.to(DEVICE) for t in tensors)
    if chosen is not None:
        chosen = tuple(t.to(DEVICE) for t in chosen)
    return seq, preds, chosen, out, n, eos, counts, index, cursor


def _outputs(settle, inputs, eos_id):
    """Everything a settle returns or writes, from fresh copies of the inputs."""
    seq, preds, verdict, out, n, eos, counts, index, cursor = inputs
    copies = [t.clone() for t in (out, n, eos, counts)]
    a, f, new_cursor = settle(seq, preds, verdict, *copies, index, cursor, eos_id)
    return [a, f, new_cursor, *copies]


def _differences(want, got) -> list[int]:
    return [i for i, (w, g) in enumerate(zip(want, got)) if w.dtype != g.dtype or not torch.equal(w, g)]


def test_random_rounds_equal_the_reference():
    generator = torch.Generator().manual_seed(0)
    seen = {"a=0": 0, "0<a<K": 0, "a=K": 0, "eos hit": 0, "eos past a": 0, "verdict": 0}
    for case in range(60):
        drafted = [0, 1, 3, 6, 15][case % 5]
        accepted = int(torch.randint(0, drafted + 1, (1,), generator=generator))
        eos_at = None if case % 3 == 0 else int(torch.randint(0, drafted + 1, (1,), generator=generator))
        verdict = case % 4 == 3
        inputs = _round(generator, drafted, accepted, eos_at, verdict)
        eos_id = None if case % 7 == 6 else VOCAB
        want = _outputs(settle_reference, inputs, eos_id)
        assert not _differences(want, _outputs(settle_fused, inputs, eos_id)), (case, drafted, accepted, eos_at)
        assert int(want[0]) == accepted
        seen["a=0" if accepted == 0 else "a=K" if accepted == drafted else "0<a<K"] += 1
        seen["eos hit"] += bool(want[5])
        seen["eos past a"] += eos_at is not None and accepted < eos_at < drafted and eos_id is not None
        seen["verdict"] += verdict
    assert min(seen.values()) >= 3, seen  # every path was taken, several times


def test_an_expanded_preds_and_nothing_drafted():
    """The ordinary schedules' skipped verify settles on pending.expand(K + 1) (stride 0); the baseline on
    seq = [f] alone."""
    generator = torch.Generator().manual_seed(1)
    seq, _, _, out, n, eos, counts, index, cursor = _round(generator, 4, 0, None, False)
    preds = torch.tensor([7], device=DEVICE).expand(5)
    inputs = (seq, preds, None, out, n, eos, counts, index, cursor)
    want = _outputs(settle_reference, inputs, VOCAB)
    assert not _differences(want, _outputs(settle_fused, inputs, VOCAB)) and int(want[1]) == 7
    inputs = (seq[:1], preds, None, out, n, eos, counts, index, cursor)
    want = _outputs(settle_reference, inputs, VOCAB)
    assert not _differences(want, _outputs(settle_fused, inputs, VOCAB)) and int(want[0]) == 0


def test_the_comparison_catches_a_wrong_output():
    """Control: an EOS past a must not set the flag, and a settle that lets it is caught."""
    generator = torch.Generator().manual_seed(2)
    inputs = _round(generator, 6, 2, 4, False)

    def eos_anywhere(seq, preds, verdict, out, n, eos, counts, index, cursor, eos_id):
        eos |= (seq == eos_id).any(0, keepdim=True)
        return settle_reference(seq, preds, verdict, out, n, eos, counts, index, cursor, eos_id)

    want = _outputs(settle_reference, inputs, VOCAB)
    assert not want[5] and _differences(want, _outputs(eos_anywhere, inputs, VOCAB)) == [5]


@pytest.mark.parametrize("schedule", ["baseline", "ordinary", "pipelined-deferred"])
def test_decoders_settling_through_the_kernel_emit_the_reference(schedule):
    target, draft = tiny_pair(96, DEVICE, DEVICE, torch.float32)
    prompts = {"p": list(range(3, 19))}
    want = target_references(target, prompts, 24)["p"]
    dec = Decoder(target, draft, DenseHead(draft.head_weight), K=3, graphs=False, phases=False, fixed_width=False)
    dec.settler = RoundSettler(DEVICE, dec.eos_id, backend="triton")
    assert dec.settler.backend == "triton"
    assert dec.generate(prompts["p"], 24, schedule).tokens == want
