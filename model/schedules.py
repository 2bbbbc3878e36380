"""The five schedules of docs/design.md, in the simulator's names and event order.

Each function decodes one generation after its first token with the decoder's operations:
`propose` / `lookahead` (draft_step x n), `to_target` / `to_draft` (copy_tokens, two devices only),
`read` and `resolve`'s read (sync), `verify`, `append` and the cursor move of `settle` (finalize:
the standalone append and the crop of both caches); `Decoder.generate` ends with one more read. They
match `sim/schedules.py` function for function and event for event (docs/contracts.md, "Schedule
event order"; `Decoder(events=[])` logs them, tests/test_schedule_parity.py compares the logs);
the comments name the events.
"""

from __future__ import annotations

import torch

from contracts.policies import Arm


def baseline(dec, run) -> None:
    """verify(1) per token on the target device; tokens stay on the device until the end. The
    forwards count as append calls, as the study's Table 4.9 and the simulator count them."""
    while run.more():
        dec.begin_round(run, proposed=0)
        f = run.cursor[1:2]
        dec.settle(run, f, dec.verify(run, f, run.cursor[2:3], standalone=True))  # append(1), verify phase
        run.issued(1, 1)
        dec.resolve(run)


def _ordinary_rounds(dec, run, pipelined: bool) -> None:
    K = dec.K
    while run.more():
        host = dec.begin_round(run, proposed=K)
        if run.pending is None:
            run.pending = dec.append(run)  # the initial append(1) of the first token gives t*
        drafts = dec.to_target(dec.propose(run))  # draft_step x K (the first feeds [prev, f]), copy_tokens(K)
        same, n, eos = dec.read(dec.first_accepted(run, drafts), run.n, run.eos)  # sync: skip test of d1 vs t*
        run.known(n, eos)
        host.verify_skipped = not same
        if host.verify_skipped:  # no verify: accepted 0, f = t* (sampling: f from the residual of p_1 and q_1)
            preds = run.pending.expand(drafts.numel() + 1, *run.pending.shape[1:])
        else:
            preds = torch.cat([run.pending, dec.verify(run, drafts.tokens, run.cursor[2:3] + 1)])  # verify(K)
        dec.settle(run, torch.cat([run.cursor[1:2], drafts.tokens]), preds, drafts)
        if pipelined:  # finalize: f goes to the draft first, so its next steps need not wait for the append
            dec.to_draft(run)
            run.pending = dec.append(run)
        else:  # finalize: append(1), crop, copy_tokens of f to the draft device
            run.pending = dec.append(run)
            dec.to_draft(run)
        run.issued(1, 1 if host.verify_skipped else K + 1)
        dec.resolve(run)  # sync when unsure whether max_new is reached (the read above was a round late)


def ordinary(dec, run) -> None:
    """Draft K, skip test, verify K, standalone append of f before the next round drafts."""
    _ordinary_rounds(dec, run, pipelined=False)


def pipelined(dec, run) -> None:
    """As ordinary, but the draft proposes round r+1 while the target appends round r's f."""
    _ordinary_rounds(dec, run, pipelined=True)


def _deferred_rounds(dec, run, lookahead: bool) -> None:
    drafting = dec.drafting  # None: the draft model at the decoder's K every round
    block = block_on_draft = seq = None
    arm = drafting.choose() if drafting is not None and run.more() else Arm("draft-model", dec.K)
    while run.more():
        K, played, before, context = arm.K, arm, run.least, run.prompt_len + run.least
        host = dec.begin_round(run, proposed=K, drafter=arm.drafter if drafting else None, chain=block is not None)
        on_draft = arm.drafter == "draft-model"
        if drafting is not None:
            drafting.begin()
        if block is None:
            block_on_draft = dec.propose(run, arm if drafting else None)  # draft_step x K (prompt lookup: lookup)
            block = dec.to_target(block_on_draft) if on_draft else block_on_draft  # copy_tokens(K)
            seq = torch.cat([run.cursor[1:2], block.tokens])
        preds = dec.verify(run, seq, run.cursor[2:3])  # verify(K+1) over [f, d1..dK]
        ahead = dec.lookahead(run, block_on_draft) if lookahead and on_draft else None  # draft_step x (K+1)
        a, f = dec.settle(run, seq, preds, block)
        packed = [run.n, run.eos]
        if ahead is not None:
            ahead_on_target = dec.to_target(ahead)  # copy_tokens(K+1)
            # valid for the token actually emitted: whole block (tree: guessed path) accepted, bonus == e1
            packed.append(dec.lookahead_valid(run, a, f, ahead_on_target))
            # (the copy holds all K+1 proposals, so the read waits for the whole look-ahead)
        early = dec.trees is None and (drafting is None or drafting.policy.plays("draft-model"))
        cursor_on_draft = dec.cursor_to_draft(run) if early else None  # copy_tokens(3): f before the read
        n, eos, *used = dec.read(*packed)  # sync
        run.known(n, eos)
        used = bool(used and used[0])
        host.lookahead_used = used if lookahead else None
        if drafting is not None:
            drafting.observe(run, played, before)
        dec.drafted(run, played, context, K if used else n - before - 1, fed_last=ahead is not None)
        if used:  # round r+1 verifies e2..e(K+1) (after a tree round: as a chain); the draft stands past them
            block_on_draft, block = ahead[1:], ahead_on_target[1:]
            seq = ahead_on_target.tokens  # [f, e2..e(K+1)] as copied, f being e1: no launch before the verify
            dec.past_lookahead_of(run, K)
        else:  # after the read, the next arm; f to the draft model when it drafts next (a tree: copy_tokens)
            block = None
            arm = drafting.choose() if drafting is not None and run.more() else arm
            if arm.drafter == "draft-model":
                dec.to_draft(run, cursor_on_draft)
        dec.resolve(run)  # certain here: the read above gave n
    if run.rounds:
        dec.append(run)  # finalize: the generation's one standalone append(1)


def deferred(dec, run) -> None:
    """The round's final token opens the next verify ([f, d1..dK]); one append at the end."""
    _deferred_rounds(dec, run, lookahead=False)


def pipelined_deferred(dec, run) -> None:
    """Deferred, and the draft keeps proposing during the verify as if the block is accepted."""
    _deferred_rounds(dec, run, lookahead=True)


RUNNERS = {
    "baseline": baseline,
    "ordinary": ordinary,
    "pipelined": pipelined,
    "deferred": deferred,
    "pipelined-deferred": pipelined_deferred,
}
