"""The speculative decoder on CUDA (skipped without a GPU): graphs on and off, one and two GPUs, dense and
FlashHead drafts emit exactly target greedy; graphs are all captured up front; at most one host sync a round."""

import pytest
import torch

from model.acceptance_control import AcceptanceControl
from model.decoder import Decoder
from model.pair import resolve_placement
from model.sampling import GREEDY, SamplingSettings
from tests.sync_watch import decode_watching_syncs
from tests.tiny_pair import gpu_decoder, tiny_pair

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (run on the GPU machine)")

SPECULATIVE = ("ordinary", "pipelined", "deferred", "pipelined-deferred")
PLACEMENTS = ["one-gpu"] + (["two-gpu"] if torch.cuda.is_available() and torch.cuda.device_count() >= 2 else [])
PROMPT = list(b"Speculative decoding on the GPU.")
MAX_NEW, ROOM, K = 40, 160, 3


def _decoder(placement, head="dense", graphs=True, spec="a=0.5", phases=True, sampling=GREEDY):
    """Tiny float32 models (exact argmax comparisons need more than bfloat16's 8 bits)."""
    options = dict(K=K, graphs=graphs, phases=phases, sampling=sampling)
    return gpu_decoder(placement, PROMPT, MAX_NEW, ROOM, head, spec, **options)


@pytest.mark.parametrize("placement", PLACEMENTS)
@pytest.mark.parametrize("graphs", [True, False])
@pytest.mark.parametrize("head", ["dense", "flashhead"])
@pytest.mark.parametrize("spec", [None, "a=0.5", "a=1"])
def test_every_schedule_equals_target_greedy(placement, graphs, head, spec):
    dec, want = _decoder(placement, head, graphs, spec)
    for schedule in ("baseline",) + SPECULATIVE:
        g = dec.generate(PROMPT, MAX_NEW, schedule)
        assert g.tokens == want, schedule
        assert sum(r.emitted for r in g.rounds) == MAX_NEW - 1
        if spec == "a=1" and schedule != "baseline":
            assert all(r.accepted == K for r in g.rounds), schedule
        assert all(min(r.phases_ms.values()) >= 0 for r in g.rounds)


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_graphs_are_captured_up_front(placement):
    dec, _ = _decoder(placement)

    def captured():
        return (
            dec._target.captured,
            dec._body.captured,
            sum(h.captured for h in dec._heads),
            dec.draft_prefill.captured,
        )

    counts = captured()
    # target n = 1, K, K+1; draft body n = 1, 2; draft head; the draft's prefill chunks (128 and ROOM = 160 tokens)
    assert counts == (3, 2, 1, 2)
    for schedule in ("baseline",) + SPECULATIVE:
        dec.generate(PROMPT, MAX_NEW, schedule)
    assert captured() == counts


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_phase_timing_events_are_reused_by_each_generation(placement):
    """Every generation takes its phases' CUDA events from the start of one pool per device
    (`PhaseClock.recycle`): a second generation of the same rounds makes none, and each generation's
    phase times are its own (the same rounds timed twice agree within the host's noise)."""
    dec, want = _decoder(placement)
    first = dec.generate(PROMPT, MAX_NEW, "pipelined-deferred")
    pools = {device: len(events) for device, events in dec.clock.event_pool.items()}
    second = dec.generate(PROMPT, MAX_NEW, "pipelined-deferred")
    assert first.tokens == second.tokens == want
    assert pools and {device: len(events) for device, events in dec.clock.event_pool.items()} == pools
    for a, b in zip(first.rounds, second.rounds):
        assert a.phases_ms["verify"] > 0 and b.phases_ms["verify"] > 0
        assert 0.2 < a.phases_ms["verify"] / b.phases_ms["verify"] < 5


SAMPLING = SamplingSettings(temperature=0.8, top_k=40, top_p=0.95, seed=3)


@pytest.mark.parametrize("placement", PLACEMENTS)
@pytest.mark.parametrize("head", ["dense", "flashhead"])
def test_sampling_in_graphs_equals_eager(placement, head):
    """Sampled tokens with CUDA graphs equal the eager run's for the same seed: the random numbers are
    computed inside the graphs from the seed tensor, and replay reproduces them; samples differ."""
    graphed, _ = _decoder(placement, head, graphs=True, spec=None, sampling=SAMPLING)
    eager, _ = _decoder(placement, head, graphs=False, spec=None, sampling=SAMPLING)
    for schedule in ("baseline",) + SPECULATIVE:
        runs = [graphed.generate(PROMPT, MAX_NEW, schedule, sample) for sample in (0, 1)]
        assert [g.tokens for g in runs] == [eager.generate(PROMPT, MAX_NEW, schedule, s).tokens for s in (0, 1)]
        assert runs[0].tokens != runs[1].tokens, schedule
        assert sum(r.emitted for r in runs[0].rounds) == MAX_NEW - 1


@pytest.mark.parametrize("placement", PLACEMENTS)
@pytest.mark.parametrize("sampling", [GREEDY, SAMPLING], ids=["greedy", "sampling"])
@pytest.mark.parametrize("schedule", SPECULATIVE + ("baseline",))
def test_every_host_sync_is_a_round_read(placement, sampling, schedule):
    """CUDA's sync debug mode flags every synchronizing call; the decode loop's only ones are its reads."""
    dec, _ = _decoder(placement, phases=False, spec="a=0.5" if sampling.greedy else None, sampling=sampling)
    syncs, reads, g = decode_watching_syncs(dec, PROMPT, MAX_NEW, schedule)
    assert len(syncs) == len(reads), [str(w.message) for w in syncs[:3]]
    if schedule == "baseline":
        assert reads == []
    elif schedule in ("deferred", "pipelined-deferred"):
        assert len(reads) == len(g.rounds)
    else:  # the ordinary schedules learn the counter a round late: an extra read at the generation's end
        assert len(g.rounds) <= len(reads) <= len(g.rounds) + 2


def _router_head(draft, budget=3):
    """A router over the draft's head (untrained MLP weights: the choice still varies with its input)."""
    from model.head_assets import Router
    from model.heads import RouterHead
    from model.router import spherical_kmeans, split_clusters

    w = draft.head_weight
    assignments, members = split_clusters(spherical_kmeans(w.cpu(), 16, iters=3), 64)
    g = torch.Generator().manual_seed(0)
    layers = [torch.randn(32, 2 * w.shape[1], generator=g), torch.zeros(32)]
    layers += [torch.randn(members.shape[0], 32, generator=g), torch.zeros(members.shape[0])]
    router = Router(assignments, members, layers, w.shape[1], {"weights": "synthetic"})
    return RouterHead(w, draft.embed_tokens.weight, router, budget)


@pytest.mark.parametrize("spec", [None, "a=0.5"])
def test_router_beside_the_body_in_graphs_equals_sequential(spec):
    """The router's choice on a side stream (a graph of its own, forked and joined by events) emits the
    same tokens and rounds as the sequential router, graphs on and off, equal to target greedy; and one
    draft step captured as one graph with the fork and join inside equals the sequential step graph."""
    from model.graphs import GraphedCall
    from model.router_stream import SideStream, routed_step

    _, device, _ = resolve_placement("one-gpu")
    target, draft = tiny_pair(ROOM, device, device, "float32")
    runs = []
    for graphs, beside in ((True, True), (True, False), (False, True)):
        control = AcceptanceControl(spec, 512, ROOM, device, seed=0) if spec else None
        dec = Decoder(
            target, draft, _router_head(draft), K=K, graphs=graphs, control=control, router_side_stream=beside
        )
        want = dec.reference(PROMPT, MAX_NEW + 2 * K + 2)
        if control is not None:
            control.bind(want, len(PROMPT), "p")
        gens = [dec.generate(PROMPT, MAX_NEW, schedule) for schedule in SPECULATIVE]
        assert all(g.tokens == want[:MAX_NEW] for g in gens), (graphs, beside)
        runs.append([[(r.proposed, r.accepted) for r in g.rounds] for g in gens])
    assert runs[0] == runs[1] == runs[2]
    fused, split, side = _router_head(draft), _router_head(draft), SideStream(device)

    def body(tokens, position):
        return draft.forward_hidden(tokens, position)[0, -1:]

    sequential = GraphedCall(lambda tokens, position: fused.argmax(body(tokens, position), tokens))
    beside = GraphedCall(lambda tokens, position: routed_step(body, split, side, tokens, position))
    for token in range(40):
        inputs = (torch.tensor([[token * 7 % 500]], device=device), torch.tensor([len(PROMPT) + token], device=device))
        assert sequential(*inputs).item() == beside(*inputs).item()
