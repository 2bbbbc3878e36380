"""The draft's q over its head's scored tokens alone (model/draft_q.py) gives, bit for bit, what q laid
out over the whole vocabulary gives: the same probabilities at every scored token, the same drawn
token, and through the decoder the same sampled generations and accepted counts for every schedule
and every head that scores part of the vocabulary (FlashHead, per-position FlashHead, shortlist,
router). Controls show each comparison can fail: a float softmax's sum depends on the layout, and a
draw keyed by slot instead of token id draws other tokens."""

import pytest
import torch

from model import draft_q, sampling, triton_support
from model.decoder import Decoder
from model.flashhead import build_clustering
from model.heads import DenseHead, FlashHead, PositionalHead, RouterHead, ShortlistHead
from model.loading import load_model
from model.sampling import SamplingSettings
from model.sampling_noise import SamplingNoise
from tests.sampling_fixtures import small_router, tiny_pair
from tests.sync_watch import decode_watching_syncs

SETTINGS = (
    SamplingSettings(temperature=1.0, seed=4),
    SamplingSettings(temperature=0.7, top_k=40, seed=4),
    SamplingSettings(temperature=0.7, top_p=0.9, seed=4),
    SamplingSettings(temperature=1.3, top_k=200, top_p=0.8, seed=4),
)
SPECULATIVE = ("ordinary", "pipelined", "deferred", "pipelined-deferred")


def _scored_row(generator, vocab: int = 3000, scored: int = 700, repeats: int = 5):
    """Token ids [1, N] (the last `repeats` repeat earlier ones, at -inf, as a padded cluster does) and
    bf16-rounded logits [1, N], which tie often."""
    ids = torch.randperm(vocab, generator=generator)[:scored]
    logits = (torch.randn(scored, generator=generator) * 3).bfloat16().float()
    ids = torch.cat([ids, ids[:repeats]])
    logits = torch.cat([logits, torch.full((repeats,), float("-inf"))])
    return ids.view(1, -1), logits.view(1, -1)


@pytest.mark.parametrize("settings", SETTINGS, ids=lambda s: f"T{s.temperature}-k{s.top_k}-p{s.top_p}")
def test_scored_q_is_the_dense_q_bit_for_bit(settings):
    generator = torch.Generator().manual_seed(1)
    softmax_differs = 0
    for _ in range(20):
        ids, logits = _scored_row(generator)
        dense = draft_q.dense_layout(ids, logits, 3000, float("-inf"))
        full = draft_q.probabilities(dense, settings)[0]
        compact = draft_q.probabilities(logits, settings, ids)[0]
        first = logits[0] > float("-inf")
        assert torch.equal(compact[first], full[ids[0, first]])
        assert not compact[~first].any() and int((full > 0).sum()) == int((compact > 0).sum())
        assert abs(float(full.sum()) - 1) < 1e-5
        # the control: a float softmax over the same logits in the two layouts differs in its last bits
        scaled = dense / settings.temperature
        softmax_differs += not torch.equal(
            torch.softmax(scaled, -1)[0, ids[0, first]], torch.softmax(scaled[0, ids[0, first]], -1)
        )
    assert softmax_differs >= 5


def test_scored_draw_is_the_dense_draw():
    """The race over the scored tokens (noise keyed by token id) picks the token the race over the whole
    vocabulary picks; keyed by slot instead, it picks others (the control)."""
    generator = torch.Generator().manual_seed(2)
    noise = SamplingNoise("cpu", 3000, backend="torch")
    settings = SETTINGS[0]
    by_slot = 0
    for row in range(200):
        ids, logits = _scored_row(generator)
        q = draft_q.probabilities(logits, settings, ids)
        full = draft_q.dense_layout(ids, q, 3000, 0.0)
        seed, position = torch.tensor([sampling.generation_seed(9, row)]), torch.tensor([row + 3])
        drawn = noise.draw(q, seed, position, ids)
        assert drawn.item() == noise.draw(full, seed, position).item()
        by_slot += ids[0, noise.draw(q, seed, position)].item() != drawn.item()
    assert by_slot >= 150


class DenseLayout(DenseHead):
    """The reference: `head`'s scored logits laid out over the whole vocabulary (-inf elsewhere), so the
    decoder forms q over V, draws over V and verifies that q row, as it did before q went compact."""

    def __init__(self, head):
        super().__init__(head.weight)
        self.head = head

    def scored_logits(self, hidden, tokens=None):
        ids, logits = self.head.scored_logits(hidden, tokens)
        return None, draft_q.dense_layout(ids, logits, self.vocab_size, float("-inf"))


class KeyedBySlot:
    """A wrong draw for the control: the noise of a scored q keyed by its slots, not its token ids."""

    def __init__(self, noise):
        self.noise = noise

    def draw(self, probs, seed, position, tokens=None):
        slot = self.noise.draw(probs, seed, position)
        return slot if tokens is None else tokens[0].gather(0, slot)

    def __getattr__(self, name):
        return getattr(self.noise, name)


@pytest.fixture(scope="module")
def pair():
    return tiny_pair()


def _router(draft):
    return small_router(draft.head_weight, draft.embed_tokens.weight)


def _heads(draft) -> dict:
    weight = draft.head_weight
    clustering = build_clustering(weight, cluster_size=24, seed=0)  # 512 = 21 x 24 + 8: a padded cluster
    router = _router(draft)
    return {
        "flashhead": lambda: FlashHead(weight, clustering, probes=4, always_tokens=(0, 5)),
        "flashhead:6,3": lambda: PositionalHead([FlashHead(weight, clustering, probes=p) for p in (6, 3)]),
        "shortlist": lambda: ShortlistHead(
            weight, torch.randperm(512, generator=torch.Generator().manual_seed(0))[:256]
        ),
        "router": lambda: PositionalHead(
            [RouterHead(weight, draft.embed_tokens.weight, router, b) for b in (router.clusters // 2,)]
        ),
    }


def _layout(draft, make, dense: bool):
    head = make()
    if not dense:
        return head
    return (
        PositionalHead([DenseLayout(h) for h in head.heads]) if isinstance(head, PositionalHead) else DenseLayout(head)
    )


def _generations(decoder, schedules, samples) -> list:
    return [
        (g.tokens, [r.accepted for r in g.rounds])
        for schedule in schedules
        for g in (decoder.generate([7, 3], 10, schedule, sample) for sample in samples)
    ]


@pytest.mark.parametrize("head", ["flashhead", "flashhead:6,3", "shortlist", "router"])
def test_decoder_with_scored_q_emits_the_dense_q_tokens(pair, head):
    """Every speculative schedule, two transforms: the compact q gives the dense-q path's generations
    and accepted counts exactly; rounds both accept and reject, so the residual is exercised."""
    target, draft = pair
    make = _heads(draft)[head]
    accepted = proposed = 0
    for settings, names, samples in ((SETTINGS[0], SPECULATIVE, range(3)), (SETTINGS[3], ("deferred",), range(3))):
        compact = Decoder(
            target, draft, _layout(draft, make, False), K=2, graphs=False, phases=False, sampling=settings
        )
        dense = Decoder(target, draft, _layout(draft, make, True), K=2, graphs=False, phases=False, sampling=settings)
        assert compact.q_width < dense.vocab_size and dense.q_width is None
        got = _generations(compact, names, samples)
        assert got == _generations(dense, names, samples), head
        assert not compact._q_rows.any()  # the verify's row buffer is left zeroed
        accepted += sum(a for _, rounds in got for a in rounds)
        proposed += sum(2 * len(rounds) for _, rounds in got)
    assert 0 < accepted < proposed
    # the control: the same comparison catches a draw keyed by slot
    compact.noise_on_draft = KeyedBySlot(compact.noise_on_draft)
    assert _generations(compact, ("deferred",), range(3)) != _generations(dense, ("deferred",), range(3))


@pytest.mark.skipif(not triton_support.runs_on(torch.device("cpu")), reason="needs triton's interpreter")
def test_flashhead_triton_selection_scores_the_same_tokens():
    """The triton backend picks the probed clusters with its selection kernels (float32 here: the
    interpreter's bf16 is not exact): the same q laid out over the vocabulary as torch.topk's choice, and
    its workspace stays right for the greedy calls between sampled ones."""
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(1000, 32, generator=generator)
    clustering = build_clustering(weight, cluster_size=16, iters=2, seed=0)
    heads = [FlashHead(weight, clustering, probes=6, always_tokens=(3,), backend=b) for b in ("triton", "torch")]
    for _ in range(4):
        hidden = torch.randn(1, 32, generator=generator) * 0.2
        fused, reference = (draft_q.probabilities(h.logits(hidden), SETTINGS[2]) for h in heads)
        assert torch.equal(fused, reference) and int((fused > 0).sum()) > 1
        assert torch.equal(heads[0].argmax(hidden), heads[1].argmax(hidden))


def _syncs_in_the_decode_loop(decoder, prompt) -> tuple[int, int, int]:
    """(synchronizing calls flagged by CUDA's sync debug mode, round reads, rounds) of one deferred run."""
    syncs, reads, generation = decode_watching_syncs(decoder, prompt, 40, "deferred")
    return len(syncs), len(reads), len(generation.rounds)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (run on the GPU machine)")
def test_scored_q_in_cuda_graphs_equals_the_dense_q_with_no_extra_sync():
    """On a GPU, graphs on (the Triton selection, noise and verify kernels): a FlashHead and a router
    draft's compact q emit the dense-q layout's tokens, and the decode loop syncs only in its reads."""
    device = torch.device("cuda:0")
    target = load_model("tiny-qwen3", device, "float32", seed=1, max_seq_len=160).model
    draft = load_model("tiny-qwen3-draft", device, "float32", seed=2, max_seq_len=160).model
    settings = SamplingSettings(temperature=0.8, top_k=40, top_p=0.95, seed=3)
    prompt = list(b"Speculative decoding on the GPU.")
    weight = draft.head_weight
    router = _router(draft)
    makers = {
        "flashhead": lambda: FlashHead(weight, build_clustering(weight, seed=0), probes=4),
        "router": lambda: RouterHead(weight, draft.embed_tokens.weight, router, router.clusters // 2),
    }
    for name, make in makers.items():
        compact = Decoder(target, draft, make(), K=3, graphs=True, phases=False, sampling=settings)
        dense = Decoder(target, draft, DenseLayout(make()), K=3, graphs=True, phases=False, sampling=settings)
        for schedule in SPECULATIVE:
            for sample in (0, 1):
                got = compact.generate(prompt, 40, schedule, sample).tokens
                assert got == dense.generate(prompt, 40, schedule, sample).tokens, (name, schedule)
        syncs, reads, rounds = _syncs_in_the_decode_loop(compact, prompt)
        assert syncs == reads == rounds, name
