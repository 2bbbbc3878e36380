"""The tiny target and draft that the decoder tests share (SYNTHETIC weights: the tiny-qwen3 presets,
target seed 1, draft seed 2), their draft heads and drafters, and a decoder on a GPU placement whose
acceptance control is bound to the target's own greedy continuation."""

import torch

from contracts.policies import make_policy
from model.acceptance_control import AcceptanceControl
from model.decoder import Decoder
from model.drafting import Drafting
from model.early_exit import early_exit
from model.flashhead import build_clustering
from model.heads import DenseHead, FlashHead, ShortlistHead
from model.loading import load_model
from model.pair import resolve_placement

VOCAB = 512  # the tiny presets' vocabulary


def tiny_pair(room: int, target_device="cpu", draft_device="cpu", dtype=None):
    """(target, draft), their caches `room` positions long."""
    target = load_model("tiny-qwen3", target_device, dtype, seed=1, max_seq_len=room).model
    draft = load_model("tiny-qwen3-draft", draft_device, dtype, seed=2, max_seq_len=room).model
    return target, draft


def target_references(target, prompts: dict, length: int) -> dict:
    """Per prompt name, the target's own greedy continuation of `length` tokens."""
    reference = Decoder(target, K=1, graphs=False, phases=False)
    return {name: reference.reference(ids, length) for name, ids in prompts.items()}


def tiny_early_exit(target, room: int):
    """The target's first layer as an early-exit drafter, with its own cache."""
    early = early_exit(target, 1)
    early.setup_cache(room, "cpu")
    return early


def tiny_head(draft, kind: str):
    """The draft's head: `dense`, `shortlist` (every second token) or else FlashHead at 4 probes."""
    w = draft.head_weight
    if kind == "dense":
        return DenseHead(w)
    if kind == "shortlist":
        return ShortlistHead(w, torch.arange(0, VOCAB, 2))
    return FlashHead(w, build_clustering(w, seed=0), probes=4)


def drafting_decoder(target, draft, early, policy: str, choices, K: int, control=None) -> Decoder:
    """A CPU decoder whose drafter each round is `policy`'s pick among `choices` (arms; prompt lookup
    matches 2-grams)."""
    drafting = Drafting(make_policy(policy, choices, seed=0), early=early, lookup_ngram=2)
    return Decoder(target, draft, DenseHead(draft.head_weight), K=K, graphs=False, control=control, drafting=drafting)


def gpu_decoder(placement, prompt, max_new: int, room: int, head="dense", spec="a=0.5", dtype="float32", **options):
    """The pair on `placement` in a decoder (`options` go to Decoder); acceptance control `spec` (None: the
    real draft) is bound to the target's greedy continuation of `prompt`, of which the first `max_new`
    tokens come back with the decoder."""
    _, target_device, draft_device = resolve_placement(placement)
    target, draft = tiny_pair(room, target_device, draft_device, dtype)
    control = AcceptanceControl(spec, VOCAB, room, draft_device, seed=0, verify_device=target_device) if spec else None
    dec = Decoder(target, draft, tiny_head(draft, head), control=control, **options)
    reference = dec.reference(prompt, max_new + 2 * dec.K + 2)
    if control is not None:
        control.bind(reference, len(prompt), "p")
    return dec, reference[:max_new]
