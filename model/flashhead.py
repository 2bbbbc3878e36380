"""FlashHead clustering: equal-size spherical k-means over LM-head rows, and its published asset format.

FlashHead (arXiv 2603.14591) replaces the dense LM head of a draft model by a two-stage search:
score c centroids, then score exactly the b tokens of each of the p best clusters. Equal-size
clusters make the cluster-to-token map a dense [c, b] tensor, so stage 2 is a plain gather.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from contracts import UsageError

ASSET_DIR = "flash_head_assets"
ASSET_FILE = "clustering_cache.safetensors"
CONFIG_KEY = "flash_head_cache_dir"

# Scores materialized at once while clustering ([rows, clusters] floats): bounds memory on big heads.
_CHUNK_ELEMENTS = 1 << 25


@dataclass
class Clustering:
    """Centroids G [c, d] (float32, unit rows), dense map M `members` [c, b] and `assignments` [V].

    Every token belongs to exactly one cluster. When V is not a multiple of b, the last cluster holds
    only V - (c - 1) * b tokens and its row of `members` is padded by repeating its own token ids
    (a repeated id scores the same, so padding never changes an argmax).
    """

    centroids: torch.Tensor
    members: torch.Tensor
    assignments: torch.Tensor

    @property
    def clusters(self) -> int:
        return self.members.shape[0]

    @property
    def cluster_size(self) -> int:
        return self.members.shape[1]

    @property
    def vocab_size(self) -> int:
        return self.assignments.shape[0]

    @property
    def hidden_size(self) -> int:
        return self.centroids.shape[1]

    @property
    def default_probes(self) -> int:
        """The public plugin's default, p = c / 16 (593 for Qwen3-0.6B)."""
        return max(1, self.clusters // 16)

    def to(self, device) -> Clustering:
        return Clustering(self.centroids.to(device), self.members.to(device), self.assignments.to(device))


def build_clustering(
    head_weight: torch.Tensor, cluster_size: int = 16, iters: int = 10, seed: int = 0, candidates: int = 8
) -> Clustering:
    """Balanced spherical k-means of the LM-head rows, on the weight's device.

    c = ceil(V / b) centroids start at distinct random rows (seeded, so the result is deterministic
    per seed on a given device). Each iteration assigns tokens under a capacity of b per cluster
    (the last cluster gets the remainder) with `_balanced_assign`, then moves every centroid to the
    normalized mean of its members. Stops early once assignments no longer change.
    """
    if head_weight.dim() != 2:
        raise UsageError(f"head weight must be [vocab, hidden], got shape {tuple(head_weight.shape)}")
    if cluster_size < 1 or iters < 1 or candidates < 1:
        raise UsageError("cluster_size, iters and candidates must all be >= 1")
    if not torch.isfinite(head_weight).all():
        raise UsageError("head weight has NaN or infinite entries; cannot cluster it")
    vocab = head_weight.shape[0]
    b = min(cluster_size, vocab)
    c = math.ceil(vocab / b)
    device = head_weight.device
    x = torch.nn.functional.normalize(head_weight.float(), dim=1)
    capacity = torch.full((c,), b, dtype=torch.long, device=device)
    capacity[-1] = vocab - (c - 1) * b
    gen = torch.Generator().manual_seed(seed)
    centroids = x[torch.randperm(vocab, generator=gen)[:c].to(device)]
    assignments = None
    for _ in range(iters):
        new = _balanced_assign(x, centroids, capacity, min(candidates, c))
        members = _members_from_assignments(new, c, b)
        centroids = _centroids(x, members, capacity)
        if assignments is not None and torch.equal(new, assignments):
            break
        assignments = new
    return Clustering(centroids, members, new)


def _scores_topk(x: torch.Tensor, centroids: torch.Tensor, k: int, floor: torch.Tensor | None = None):
    """Top-k (score, cluster) per row of x, in row chunks; clusters whose score <= floor are excluded."""
    rows = max(1, _CHUNK_ELEMENTS // centroids.shape[0])
    values, indices = [], []
    for start in range(0, x.shape[0], rows):
        s = x[start : start + rows] @ centroids.T
        if floor is not None:
            s = s.masked_fill(s <= floor, -math.inf)
        v, i = torch.topk(s, k, dim=1)
        values.append(v)
        indices.append(i)
    return torch.cat(values), torch.cat(indices)


def _balanced_assign(x: torch.Tensor, centroids: torch.Tensor, capacity: torch.Tensor, k: int) -> torch.Tensor:
    """Assign every row to a cluster with at most capacity[j] rows, by deferred acceptance.

    Unassigned rows propose, in parallel, to their best cluster that would still take them; each
    cluster keeps its best `capacity` rows among those it holds and the new proposals (score
    descending, lower token id first on ties) and rejects the rest, which propose again. Since all
    rows rank clusters and clusters rank rows by the same score, the result is the unique stable
    assignment, i.e. the one a global greedy fill in descending score order gives (up to exact
    ties). A full cluster only takes rows scoring above its weakest member (`floor`), which only
    rises, so every rejection is final and the loop ends. Candidates come from a cached top-k per
    row, refreshed (masked by the floors) only for rows whose k candidates are all closed.
    """
    vocab, c = x.shape[0], centroids.shape[0]
    device = x.device
    cand_s, cand_i = _scores_topk(x, centroids, k)
    floor = torch.full((c,), -math.inf, device=device)
    owner = torch.full((vocab,), -1, dtype=torch.long, device=device)
    held = torch.full((vocab,), -math.inf, device=device)
    while True:
        free = torch.nonzero(owner < 0).squeeze(1)
        if free.numel() == 0:
            return owner
        open_ = cand_s[free] > floor[cand_i[free]]
        stale = ~open_.any(1)
        if stale.any():
            rows = free[stale]
            cand_s[rows], cand_i[rows] = _scores_topk(x[rows], centroids, k, floor)
            open_ = cand_s[free] > floor[cand_i[free]]
        pick = open_.to(torch.int8).argmax(1)
        prop_c = cand_i[free, pick]
        prop_s = cand_s[free, pick]
        touched = torch.zeros(c, dtype=torch.bool, device=device)
        touched[prop_c] = True
        rivals = torch.nonzero((owner >= 0) & touched[owner.clamp(min=0)]).squeeze(1)
        tokens = torch.cat([rivals, free])
        clusters = torch.cat([owner[rivals], prop_c])
        scores = torch.cat([held[rivals], prop_s])
        # Order by cluster, then score descending, then token id: three stable sorts, last key first.
        order = torch.argsort(tokens, stable=True)
        order = order[torch.argsort(-scores[order], stable=True)]
        order = order[torch.argsort(clusters[order], stable=True)]
        tokens, clusters, scores = tokens[order], clusters[order], scores[order]
        first = torch.searchsorted(clusters, clusters)
        rank = torch.arange(tokens.numel(), device=device) - first
        keep = rank < capacity[clusters]
        owner[tokens] = torch.where(keep, clusters, -1)
        held[tokens] = torch.where(keep, scores, -math.inf)
        last = rank == capacity[clusters] - 1
        floor[clusters[last]] = scores[last]


def _members_from_assignments(assignments: torch.Tensor, c: int, b: int) -> torch.Tensor:
    """Dense map M [c, b]: each cluster's token ids ascending; a short cluster repeats its own ids."""
    counts = torch.bincount(assignments, minlength=c)
    order = torch.argsort(assignments, stable=True)
    start = torch.cumsum(counts, 0) - counts
    slot = torch.arange(b, device=assignments.device)
    idx = start[:, None] + slot[None, :] % counts.clamp(min=1)[:, None]
    return order[idx]


def _centroids(x: torch.Tensor, members: torch.Tensor, capacity: torch.Tensor) -> torch.Tensor:
    """Normalized member means; a gather-sum rather than index_add so the result is deterministic on GPU."""
    real = torch.arange(members.shape[1], device=x.device)[None, :] < capacity[:, None]
    sums = (x[members] * real[..., None]).sum(1)
    return torch.nn.functional.normalize(sums, dim=1)


def save_assets(clustering: Clustering, folder: str | os.PathLike) -> Path:
    """Write the published FlashHead asset layout into `folder` (a model folder); returns the asset file.

    `folder/flash_head_assets/clustering_cache.safetensors` holds `centroids` [d, c] float32 and
    `cluster_assignments` [V] int64; `folder/config.json` is created or updated with
    `"flash_head_cache_dir": "flash_head_assets"`. Each file is written under a temporary name then renamed.
    """
    from safetensors.torch import save_file

    folder = Path(folder)
    assets = folder / ASSET_DIR
    assets.mkdir(parents=True, exist_ok=True)
    target = assets / ASSET_FILE
    tmp = target.with_name(f".{ASSET_FILE}.{os.getpid()}.tmp")
    save_file(
        {
            "centroids": clustering.centroids.detach().float().T.contiguous().cpu(),
            "cluster_assignments": clustering.assignments.detach().long().contiguous().cpu(),
        },
        str(tmp),
    )
    os.replace(tmp, target)
    config_path = folder / "config.json"
    config = json.loads(config_path.read_text()) if config_path.exists() else {}
    config[CONFIG_KEY] = ASSET_DIR
    tmp = config_path.with_name(f".config.json.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(config, indent=2) + "\n")
    os.replace(tmp, config_path)
    return target


def load_assets(folder: str | os.PathLike) -> Clustering:
    """Read a FlashHead clustering from a model folder in the published layout (see `save_assets`).

    Accepts centroids shaped [d, c] with any number of leading singleton dims. Rebuilds `members`
    from the assignments and rejects unbalanced clusterings: all clusters must hold b tokens except
    at most one holding fewer (the padding convention of `Clustering`).
    """
    from safetensors.torch import load_file

    folder = Path(folder)
    config_path = folder / "config.json"
    sub = ASSET_DIR
    if config_path.exists():
        sub = json.loads(config_path.read_text()).get(CONFIG_KEY, ASSET_DIR)
    path = folder / sub / ASSET_FILE
    if not path.exists():
        raise UsageError(f"no FlashHead assets at {path} (expected {ASSET_DIR}/{ASSET_FILE} in the model folder)")
    tensors = load_file(str(path))
    missing = {"centroids", "cluster_assignments"} - tensors.keys()
    if missing:
        raise UsageError(f"{path} lacks tensor(s) {sorted(missing)}; it holds {sorted(tensors)}")
    centroids, assignments = tensors["centroids"], tensors["cluster_assignments"]
    if centroids.dim() < 2 or any(n != 1 for n in centroids.shape[:-2]):
        raise UsageError(f"centroids must be [d, c] (optionally with leading 1s), got {tuple(centroids.shape)}")
    if assignments.dim() != 1 or assignments.dtype.is_floating_point or assignments.numel() == 0:
        raise UsageError(
            f"cluster_assignments must be a non-empty integer vector, got "
            f"{assignments.dtype} {tuple(assignments.shape)}"
        )
    centroids = centroids.reshape(centroids.shape[-2:]).T.float().contiguous()
    assignments = assignments.long()
    c = centroids.shape[0]
    if assignments.min() < 0 or assignments.max() >= c:
        raise UsageError(f"cluster_assignments must lie in [0, {c - 1}] for {c} centroids")
    counts = torch.bincount(assignments, minlength=c)
    b = int(counts.max())
    short = int((counts != b).sum())
    if short > 1 or int(counts.min()) == 0:
        raise UsageError(
            f"unbalanced FlashHead clusters in {path}: sizes range {int(counts.min())}..{b}; "
            "all clusters must hold the same number of tokens (one may hold fewer)"
        )
    return Clustering(centroids, _members_from_assignments(assignments, c, b), assignments)
