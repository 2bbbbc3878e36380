"""Building the router head (DynaSpec): unbalanced spherical k-means of the head, and a small MLP
trained to predict the clusters that hold the draft's top tokens.

The clusters are not balanced (unlike FlashHead's): frequent and rare regions of the vocabulary get
clusters of their natural size. Clusters above `cap` tokens are split (by token id) so the gather
stays a dense [c, m] map, which is what keeps the head graph-capturable with fixed shapes.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from contracts import UsageError
from model.head_assets import Router

_CHUNK_ELEMENTS = 1 << 25  # scores materialized at once ([rows, clusters] floats)


def spherical_kmeans(weight: torch.Tensor, clusters: int, iters: int = 10, seed: int = 0) -> torch.Tensor:
    """Assignments [V] of the column-normalized head (each token's vector normalized, the columns of the [d, V] head) to
    `clusters` unit centroids, by cosine; no balance. An emptied cluster keeps its centroid."""
    vocab = weight.shape[0]
    if not 1 <= clusters <= vocab:
        raise UsageError(f"router clusters must be in [1, {vocab}], got {clusters}")
    x = F.normalize(weight.float(), dim=1)
    gen = torch.Generator().manual_seed(seed)
    centroids = x[torch.randperm(vocab, generator=gen)[:clusters].to(x.device)]
    assignments = None
    for _ in range(iters):
        new = _nearest(x, centroids)
        sums = torch.zeros_like(centroids).index_add_(0, new, x)
        filled = torch.bincount(new, minlength=clusters) > 0
        centroids = torch.where(filled[:, None], F.normalize(sums, dim=1), centroids)
        if assignments is not None and torch.equal(new, assignments):
            break
        assignments = new
    return new


def _nearest(x: torch.Tensor, centroids: torch.Tensor) -> torch.Tensor:
    rows = max(1, _CHUNK_ELEMENTS // centroids.shape[0])
    return torch.cat([(x[s : s + rows] @ centroids.T).argmax(1) for s in range(0, x.shape[0], rows)])


def split_clusters(assignments: torch.Tensor, cap: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Renumber clusters without empty ones, split each above `cap` tokens into pieces of at most
    `cap` (consecutive ids); -> (assignments [V], members [c, m]) with m the largest piece."""
    order = torch.argsort(assignments * assignments.numel() + torch.arange(assignments.numel()), stable=True)
    sorted_clusters = assignments[order]
    _, counts = torch.unique_consecutive(sorted_clusters, return_counts=True)
    pieces = []
    start = 0
    for count in counts.tolist():
        for offset in range(0, count, cap):
            pieces.append(order[start + offset : start + min(offset + cap, count)])
        start += count
    width = max(p.numel() for p in pieces)
    new = torch.empty_like(assignments)
    members = torch.empty((len(pieces), width), dtype=torch.long)
    for index, piece in enumerate(pieces):
        new[piece] = index
        members[index] = piece[torch.arange(width) % piece.numel()]
    return new, members


def cluster_targets(hidden: torch.Tensor, weight: torch.Tensor, assignments: torch.Tensor, clusters: int, top: int):
    """The router's training target per hidden state: a distribution over clusters, the draft's
    top-`top` token probabilities summed per cluster and renormalized (the top-1 token's cluster
    carries most of it)."""
    parts = []
    for part in hidden.float().split(256):  # [rows, V] probabilities at a time
        probs, tokens = torch.topk(torch.softmax(F.linear(part, weight.float()), dim=-1), top, dim=-1)
        parts.append(torch.zeros((part.shape[0], clusters)).scatter_add_(1, assignments[tokens], probs))
    target = torch.cat(parts)
    return target / target.sum(1, keepdim=True)


def train_router(
    embedding: torch.Tensor,
    weight: torch.Tensor,
    assignments: torch.Tensor,
    members: torch.Tensor,
    samples: dict,
    width: int = 256,
    epochs: int = 30,
    top: int = 8,
    seed: int = 0,
) -> tuple[list[torch.Tensor], dict]:
    """Fit the MLP [embedding(token), previous hidden] -> cluster logits on `samples` (tokens [N],
    previous [N, d], hidden [N, d]) with cross-entropy to `cluster_targets`; Adam, full batches of 512.
    -> (layers w1, b1, w2, b2; training record: loss first/last, top-1 cluster hit rate)."""
    torch.manual_seed(seed)
    clusters = members.shape[0]
    d = weight.shape[1]
    inputs = torch.cat([embedding[samples["tokens"]].float(), samples["previous"].float()], dim=1)
    targets = cluster_targets(samples["hidden"], weight, assignments, clusters, top)
    mlp = torch.nn.Sequential(torch.nn.Linear(2 * d, width), torch.nn.GELU(), torch.nn.Linear(width, clusters))
    optimizer = torch.optim.Adam(mlp.parameters(), lr=1e-3)
    losses = []
    for _ in range(epochs):
        order = torch.randperm(inputs.shape[0])
        total = 0.0
        for batch in order.split(512):
            loss = F.cross_entropy(mlp(inputs[batch]), targets[batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += loss.item() * batch.numel()
        losses.append(total / inputs.shape[0])
    with torch.no_grad():
        hit = float((mlp(inputs).argmax(1) == targets.argmax(1)).float().mean())
    layers = [mlp[0].weight.detach(), mlp[0].bias.detach(), mlp[2].weight.detach(), mlp[2].bias.detach()]
    record = {"loss_first": round(losses[0], 4), "loss_last": round(losses[-1], 4), "train_top1_cluster_hit": hit}
    return layers, record


def build_router(
    weight: torch.Tensor,
    embedding: torch.Tensor,
    samples: dict,
    clusters: int,
    cap: int | None = None,
    iters: int = 10,
    width: int = 256,
    epochs: int = 30,
    seed: int = 0,
    info: dict | None = None,
) -> Router:
    """Clusters, then the router trained on `samples`; `cap` defaults to twice the mean cluster size."""
    vocab = weight.shape[0]
    cap = cap or max(1, 2 * math.ceil(vocab / clusters))
    assignments, members = split_clusters(spherical_kmeans(weight.cpu(), clusters, iters, seed), cap)
    layers, record = train_router(
        embedding.cpu(), weight.cpu(), assignments, members, samples, width=width, epochs=epochs, seed=seed
    )
    sizes = torch.bincount(assignments)
    record.update(
        {
            "kmeans_clusters": clusters,
            "clusters": members.shape[0],
            "cap": cap,
            "cluster_size_max": int(sizes.max()),
            "cluster_size_median": int(sizes.median()),
            "samples": int(samples["tokens"].numel()),
        }
    )
    return Router(assignments, members, layers, weight.shape[1], {**(info or {}), **record})
