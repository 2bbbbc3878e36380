"""Every drafter's match runs on a finished generation, so the simulator can replay any drafter and policy.

Under greedy decoding the output is the target's greedy output whichever drafter proposed, and a
drafter's proposal always conditions on the true prefix. So what a block begun at decode position q
would have had accepted (its match run, contracts.trace `runs`) is known after the generation for
every drafter, not only the one that drafted there:
- a model drafter (the draft model, the early exit) proposes output token i as its argmax after the
  true tokens before it; one teacher-forced forward over the prompt and the output gives every such
  argmax, and the run at q counts the leading positions q, q+1, ... whose argmax is the token;
- under acceptance control (synthetic weights) a controlled drafter's proposal at a position is
  accepted exactly where the control's bit says so, so its runs are the bits' runs;
- prompt lookup's runs come from its own rule (model.prompt_lookup.match_runs).
A model drafter keeps one head for every draft position here: a per-position head makes a token's
proposal depend on where in the block it falls, which one run per position cannot express.
"""

from __future__ import annotations

import torch

from contracts import UsageError
from contracts.trace import RUN_CAP
from model.heads import heads_by_position
from model.prompt_lookup import match_runs

ROWS_PER_HEAD_CALL = 16  # the head's logits over a 262,144-token vocabulary: 16 MB a row in float32


def runs_of_matches(matches: list[bool], cap: int = RUN_CAP) -> list[int]:
    """matches[i]: whether the drafter's proposal for output token i + 1 is that token -> the run of
    each decode position (how many leading matches from there, at most `cap`)."""
    runs, following = [0] * len(matches), 0
    for i in range(len(matches) - 1, -1, -1):
        following = following + 1 if matches[i] else 0
        runs[i] = min(following, cap)
    return runs


@torch.inference_mode()
def teacher_forced_matches(model, head, prompt: list[int], tokens: list[int]) -> list[bool]:
    """For output tokens 1.. of `tokens` (the first token first): whether `model` with `head` proposes
    each one after the true tokens before it. Overwrites the model's cache (a generation's prefill
    writes it again)."""
    device = model.head_weight.device
    ids = torch.tensor(prompt + tokens, dtype=torch.long, device=device).view(1, -1)
    hidden = model.forward_hidden(ids, torch.arange(ids.shape[1], device=device))[0]
    P = len(prompt)
    states = hidden[P : P + len(tokens) - 1]  # the state after output token i - 1 proposes token i
    fed = ids[0, P : P + len(tokens) - 1].view(-1, 1)
    proposals = (
        torch.cat(
            [
                head.argmax(states[i : i + ROWS_PER_HEAD_CALL], fed[i : i + ROWS_PER_HEAD_CALL])
                for i in range(0, states.shape[0], ROWS_PER_HEAD_CALL)
            ]
        )
        if states.shape[0]
        else states.new_zeros(0, dtype=torch.long)
    )
    return (proposals.view(-1) == ids[0, P + 1 :]).tolist()


def controlled_matches(control, prompt_len: int, decode_tokens: int) -> list[bool]:
    """The accept bits of output tokens 1..decode_tokens of the prompt `control` is bound to (the first
    draft position's stream: drafters and policies run i.i.d. controls)."""
    return control.accept[prompt_len + 1 : prompt_len + 1 + decode_tokens, 0].tolist()


def single_head(head, drafter: str):
    """The one head of a model drafter (UsageError for per-position heads, see the module docstring)."""
    heads = heads_by_position(head)
    if len({id(h) for h in heads}) > 1:
        raise UsageError(f"match runs of {drafter}: a head per draft position is not supported (give one head)")
    return heads[0]


def drafter_runs(dec, drafters: tuple[str, ...], prompt: list[int], tokens: list[int], controls: dict) -> dict:
    """{drafter: runs} of one generation of `dec` (a Decoder, with `drafting` for early exit and prompt
    lookup) for each of `drafters`. `controls`: drafter -> the AcceptanceControl bound to this prompt
    that replaces its proposals (absent: its own proposals)."""
    out = {}
    for drafter in drafters:
        if drafter in controls:
            matches = controlled_matches(controls[drafter], len(prompt), len(tokens) - 1)
        elif drafter == "prompt-lookup":
            out[drafter] = match_runs(prompt, tokens, dec.drafting.lookup_ngram)
            continue
        elif drafter == "early-exit":
            matches = teacher_forced_matches(dec.drafting.early, dec.drafting.head, prompt, tokens)
        else:
            matches = teacher_forced_matches(dec.draft, single_head(dec.draft_head, drafter), prompt, tokens)
        out[drafter] = runs_of_matches(matches)
    return out
