"""What sampling adds to the loop's costs, timed the way the decoder pays them: `python -m measure
--temperature T` puts them in the profile's `sampling.costs` (contracts.profile.SAMPLING_COSTS).

Why: under sampling the target's step ends in its distributions instead of an argmax, and a round's
verify draws accept numbers and a race noise and runs the block verification (the fused Triton kernel
on a GPU, the torch reference elsewhere and for the baseline's K = 0); the draft's head forms q and
draws from it. The simulator charges the sampled verify less the greedy one on top of the target
forward, and the sampled heads in place of the greedy ones.

With --heads, every head kind given (shortlist, router, ...) is timed the same way at each budget
(SAMPLED_HEAD_KINDS), so that the simulator charges a sampled run of that head what its draft step pays.

Both verifies run the decoder's own code: its target pick (graph-captured with graphs on, as inside
the target step), then the settle's decision eagerly (as `Decoder.settle` runs it). Inputs are
SYNTHETIC (random hidden states and draft distributions): these costs do not depend on the values.
"""

from __future__ import annotations

from functools import partial
from types import SimpleNamespace

import torch

from contracts.profile import SAMPLED_HEAD_KINDS
from model.decoder import Decoder
from model.graphs import GraphedCall
from model.heads import DenseHead, FlashHead
from model.sampling import SamplingSettings, verify_block_reference

from .benchmarks import Bench, verify_widths
from .head_profile import cost_kinds
from .verify_speed import greedy_settle

VARIANTS = 4  # inputs rotated through the timed calls


def sampling_costs(b: Bench, graphs: bool, settings: SamplingSettings, heads: list | None = None) -> dict:
    """Every cost of SAMPLING_COSTS in one regime; given `heads` ((kind, head) per budget, from
    head_profile.budget_heads), SAMPLED_HEAD_KINDS too."""
    verify_greedy, verify_sampled = _verify_costs(b, graphs, settings)
    costs = {"verify_greedy_ms": verify_greedy, "verify_sampled_ms": verify_sampled}
    costs.update(_head_costs(b, graphs, settings, heads))
    return costs


def _verify_costs(b: Bench, graphs: bool, settings: SamplingSettings) -> tuple[dict, dict]:
    """Tables over n_tokens = K + 1 (K = 0 .. K_max, and every tree width: benchmarks.verify_widths) of the verify's
    decision, greedy and sampled. A tree's sampled settle (multi-branch rejection, model/tree_rounds.py)
    is costed by the chain's verification over as many rows: the target's distributions, the bulk of it,
    are the same. Both decisions at every width are timed interleaved (Bench.time_grid): the sampled one is
    host-bound, and timed width by width a slow spell of the host's landed on a few widths (one H200, session
    35: 0.9-1.1 ms at 5, 10, 11 and 30 tokens, 0.46-0.52 at the others) and on their difference from greedy."""
    model, device = b.target.model, b.target_device
    vocab, hidden_size = model.config.vocab_size, model.config.hidden_size
    widths = verify_widths(b.K_max, b.tree_widths)
    greedy = Decoder(model, K=widths[-1], graphs=False, fixed_width=False)
    sampled = Decoder(model, K=widths[-1], graphs=False, fixed_width=False, sampling=settings)
    greedy_pick = GraphedCall(greedy._pick, enabled=graphs)
    sampled_pick = GraphedCall(sampled._pick, enabled=graphs)
    at = torch.tensor([max(b.contexts)], device=device)
    run = SimpleNamespace(cursor=torch.cat([at, at, at]))  # what settle reads of a run: f's position

    def greedy_verify(hidden, draft_probs, drafts):
        return greedy_settle(drafts, greedy_pick(hidden))

    def sampled_verify(hidden, draft_probs, drafts):
        target_probs = sampled_pick(hidden)
        accept = sampled._accept_uniforms(run, drafts.numel())
        verify = sampled.verifier if drafts.numel() else verify_block_reference  # as Decoder.settle
        return verify(target_probs, draft_probs, drafts, accept, sampled._race_noise(run.cursor[2:3]))

    generator = torch.Generator().manual_seed(0)
    operations = []
    for n in widths:
        inputs = []
        for _ in range(VARIANTS):
            hidden = torch.randn(n, hidden_size, generator=generator).to(device, model.head_weight.dtype)
            draft_probs = torch.softmax(torch.randn(n - 1, vocab, generator=generator), -1)
            drafts = torch.multinomial(draft_probs, 1, generator=generator).view(n - 1) if n > 1 else _no_tokens()
            inputs.append((hidden, draft_probs.to(device), drafts.to(device)))
        operations += [(greedy_verify, inputs), (sampled_verify, inputs)]
    points = [{"n_tokens": n} for n in widths for _ in ("greedy", "sampled")]
    timed = b.time_grid(points, operations, device, "sampling verify (greedy, then sampled)")
    return {"points": timed[0::2]}, {"points": timed[1::2]}


def _no_tokens() -> torch.Tensor:
    return torch.zeros(0, dtype=torch.long)


def _head_costs(b: Bench, graphs: bool, settings: SamplingSettings, heads: list | None) -> dict:
    """The draft's heads under sampling, as the decoder's draft step runs them (its head function): the
    dense head and FlashHead per probe count, and every head of `heads` per budget."""
    model, device = b.draft.model, b.draft_device
    decoder = Decoder(model, K=1, graphs=False, fixed_width=False, sampling=settings)
    hidden_size = model.config.hidden_size
    generator = torch.Generator().manual_seed(1)
    inputs = [
        (
            torch.randn(1, hidden_size, generator=generator).to(device, model.head_weight.dtype),
            torch.tensor([i], device=device),
            torch.zeros(1, 1, dtype=torch.long, device=device),
        )
        for i in range(VARIANTS)
    ]

    def timed(head):
        return b.time(GraphedCall(partial(decoder._head_fn, head=head), enabled=graphs), inputs, device)

    dense = timed(DenseHead(model.head_weight))
    b.tick("sampled dense head")
    flash = []
    for p in b.probes:
        flash.append({"probes": p, **timed(FlashHead(model.head_weight, b.clustering, probes=p))})
        b.tick(f"sampled FlashHead p={p}")
    costs = {"head_dense_ms": dense, "head_flashhead_ms": {"points": flash}}
    if heads:
        costs[SAMPLED_HEAD_KINDS] = cost_kinds(b, heads, timed, "sampled draft head")
    return costs


def section(costs: dict, settings: SamplingSettings) -> dict:
    """The profile's `sampling.costs`: the settings timed and the costs per regime."""
    return {
        "temperature": settings.temperature,
        "top_k": settings.top_k,
        "top_p": settings.top_p,
        "regimes": costs,
    }
