"""Built assets of the shortlist and router heads: saved, versioned and loaded like FlashHead's.

A head-assets folder (`python -m model.build_head --out DIR`, then `--head-assets DIR`) holds
`shortlist.safetensors` and/or `router.safetensors`. Each file carries its format and version in the
safetensors metadata, with the head's shape and the training prompts it was built from (so an
evaluation can prove it is kept apart from them). A missing file, another format version or another
head shape is bad input with one line saying how to rebuild.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch

from contracts import UsageError

SHORTLIST_FILE = "shortlist.safetensors"
ROUTER_FILE = "router.safetensors"
SHORTLIST_FORMAT = "specloop.shortlist/1"
ROUTER_FORMAT = "specloop.router/1"
ROUTER_LAYERS = ("w1", "b1", "w2", "b2")


@dataclass
class Shortlist:
    """`ranking` [V]: every token id, the most frequent first (ties: lower id first); `counts` [V] in
    that order. `info`: how it was built (draft, training prompt ids, tokens counted)."""

    ranking: torch.Tensor
    counts: torch.Tensor
    info: dict = field(default_factory=dict)

    @property
    def vocab_size(self) -> int:
        return self.ranking.numel()

    def top(self, n: int) -> torch.Tensor:
        return self.ranking[:n]


@dataclass
class Router:
    """An unbalanced clustering of the head (`assignments` [V], `members` [c, m]: each cluster's ids
    ascending, a short one padded by repeating its own ids) and the router MLP `layers`
    (w1 [h, 2d], b1 [h], w2 [c, h], b2 [c]; float32). `info`: how it was built."""

    assignments: torch.Tensor
    members: torch.Tensor
    layers: list[torch.Tensor]
    hidden_size: int
    info: dict = field(default_factory=dict)

    @property
    def clusters(self) -> int:
        return self.members.shape[0]

    @property
    def vocab_size(self) -> int:
        return self.assignments.numel()


def _write(path: Path, tensors: dict, metadata: dict) -> Path:
    from safetensors.torch import save_file

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    save_file({k: v.detach().contiguous().cpu() for k, v in tensors.items()}, str(tmp), metadata=metadata)
    tmp.chmod(0o644)
    os.replace(tmp, path)
    return path


def _read(folder, name: str, fmt: str, kind: str) -> tuple[dict, dict]:
    from safetensors import safe_open
    from safetensors.torch import load_file

    path = Path(folder) / name
    if not path.is_file():
        raise UsageError(
            f"no {kind} asset at {path}; build it with python -m model.build_head --kind {kind} --out {folder}"
        )
    with safe_open(str(path), framework="pt") as f:
        metadata = f.metadata() or {}
    tensors = load_file(str(path))
    if metadata.get("format") != fmt:
        raise UsageError(
            f"{path} is format {metadata.get('format')!r}, this version reads {fmt!r}; rebuild it with "
            f"python -m model.build_head --kind {kind}"
        )
    return tensors, metadata


def save_shortlist(shortlist: Shortlist, folder) -> Path:
    metadata = {"format": SHORTLIST_FORMAT, "vocab_size": str(shortlist.vocab_size), "info": json.dumps(shortlist.info)}
    return _write(Path(folder) / SHORTLIST_FILE, {"ranking": shortlist.ranking, "counts": shortlist.counts}, metadata)


def load_shortlist(folder, vocab_size: int | None = None) -> Shortlist:
    tensors, metadata = _read(folder, SHORTLIST_FILE, SHORTLIST_FORMAT, "shortlist")
    shortlist = Shortlist(tensors["ranking"].long(), tensors["counts"].long(), json.loads(metadata.get("info", "{}")))
    _check_vocab(shortlist.vocab_size, vocab_size, Path(folder) / SHORTLIST_FILE)
    return shortlist


def save_router(router: Router, folder) -> Path:
    metadata = {
        "format": ROUTER_FORMAT,
        "vocab_size": str(router.vocab_size),
        "hidden_size": str(router.hidden_size),
        "info": json.dumps(router.info),
    }
    tensors = {"assignments": router.assignments, "members": router.members}
    tensors.update({name: t.float() for name, t in zip(ROUTER_LAYERS, router.layers)})
    return _write(Path(folder) / ROUTER_FILE, tensors, metadata)


def load_router(folder, vocab_size: int | None = None, hidden_size: int | None = None) -> Router:
    tensors, metadata = _read(folder, ROUTER_FILE, ROUTER_FORMAT, "router")
    router = Router(
        tensors["assignments"].long(),
        tensors["members"].long(),
        [tensors[name] for name in ROUTER_LAYERS],
        int(metadata["hidden_size"]),
        json.loads(metadata.get("info", "{}")),
    )
    path = Path(folder) / ROUTER_FILE
    _check_vocab(router.vocab_size, vocab_size, path)
    if hidden_size is not None and hidden_size != router.hidden_size:
        raise UsageError(f"{path} is for hidden size {router.hidden_size}, the draft's is {hidden_size}; rebuild it")
    return router


def _check_vocab(have: int, want: int | None, path: Path) -> None:
    if want is not None and have != want:
        raise UsageError(f"{path} is for a vocabulary of {have}, the draft's is {want}; rebuild it for this draft")


def training_prompt_ids(folder) -> set[str]:
    """Prompt ids the assets in `folder` were built from (none without a folder), so an evaluation
    can keep apart from them."""
    from safetensors import safe_open

    ids: set[str] = set()
    for name in (SHORTLIST_FILE, ROUTER_FILE):
        path = Path(folder) / name if folder else None
        if path is not None and path.is_file():
            with safe_open(str(path), framework="pt") as f:
                ids |= set(json.loads((f.metadata() or {}).get("info", "{}")).get("train_prompts", []))
    return ids
