"""LM heads for the draft: dense and FlashHead, with one interface.

`head.argmax(hidden [..., d]) -> LongTensor [...]` (greedy) and `head.logits(hidden) -> [n, V]`
(sampling; FlashHead's are -inf outside its shortlist) stay on the device with no host sync and no
data-dependent Python branching, so they can run inside CUDA-graph capture. Both heads pick the
highest logit in the head's dtype and the lowest token id among exact ties, so a FlashHead that
probes every cluster returns the dense head's token.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from contracts import UsageError
from model import flashhead_triton, triton_support
from model.flashhead import Clustering

_INDEX_BYTES = 8


def _check_weight(weight: torch.Tensor) -> None:
    if weight.dim() != 2:
        raise UsageError(f"head weight must be [vocab, hidden], got shape {tuple(weight.shape)}")


def _flat(hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """hidden [..., d] -> [n, d] in the head's dtype (what the dense logits are computed in)."""
    if hidden.shape[-1] != weight.shape[1]:
        raise UsageError(f"hidden size {hidden.shape[-1]} does not match the head's {weight.shape[1]}")
    return hidden.reshape(-1, weight.shape[1]).to(weight.dtype)


class DenseHead:
    """The full LM head: all V logits, then argmax (torch.argmax returns the first maximum)."""

    backend = "torch"
    work_ratio = 1.0

    def __init__(self, weight: torch.Tensor):
        _check_weight(weight)
        self.weight = weight
        self.vocab_size, self.hidden_size = weight.shape

    def argmax(self, hidden: torch.Tensor) -> torch.Tensor:
        return F.linear(_flat(hidden, self.weight), self.weight).argmax(dim=-1).reshape(hidden.shape[:-1])

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [..., d] -> float32 logits [n, V], for sampling (model/sampling.py)."""
        return F.linear(_flat(hidden, self.weight), self.weight).float()

    def bytes_per_call(self, rows: int = 1) -> int:
        """Bytes a call must read: the whole head plus the hidden states (the bandwidth floor)."""
        es = self.weight.element_size()
        return self.vocab_size * self.hidden_size * es + rows * self.hidden_size * es


class FlashHead:
    """Greedy multi-probe FlashHead: score all c centroids, keep the top `probes` clusters, score
    their probes * b tokens (and `always_tokens`) exactly, return the best.

    backend: "triton" (model/flashhead_triton.py: Triton kernels for both stages) or "torch"
    (cuBLAS centroid scores + torch.topk + a gather); None picks triton where it can run. The triton
    backend keeps device counters per number of hidden states (a flashhead_triton.Workspace), so
    calls on one head must run one after another, on one stream.
    """

    def __init__(
        self,
        weight: torch.Tensor,
        clustering: Clustering,
        probes: int | None = None,
        always_tokens=(),
        backend: str | None = None,
    ):
        _check_weight(weight)
        vocab, d = weight.shape
        if clustering.vocab_size != vocab or clustering.hidden_size != d:
            raise UsageError(
                f"clustering is for a {clustering.vocab_size} x {clustering.hidden_size} head, "
                f"the weight is {vocab} x {d}"
            )
        c = clustering.clusters
        probes = clustering.default_probes if probes is None else probes
        if not 1 <= probes <= c:
            raise UsageError(f"probes must be in [1, {c}] for {c} clusters, got {probes}")
        always = sorted(set(int(t) for t in always_tokens))
        if always and not (always[0] >= 0 and always[-1] < vocab):
            raise UsageError(f"always_tokens must be token ids in [0, {vocab - 1}], got {always}")
        can_fuse = triton_support.runs_on(weight.device)
        if backend is None:  # the interpreter (CPU) runs the kernels, but slowly: only when asked
            backend = "triton" if can_fuse and weight.is_cuda else "torch"
        if backend not in ("triton", "torch") or (backend == "triton" and not can_fuse):
            raise UsageError(
                f"backend {backend!r} is not usable here; choose from {['triton', 'torch'] if can_fuse else ['torch']}"
            )
        self.weight = weight
        self.vocab_size, self.hidden_size = vocab, d
        self.clusters, self.cluster_size, self.probes = c, clustering.cluster_size, probes
        self.backend = backend
        self.centroids = clustering.centroids.to(device=weight.device, dtype=weight.dtype).contiguous()
        self.members = clustering.members.to(device=weight.device, dtype=torch.long).contiguous()
        self.always = torch.tensor(always, dtype=torch.long, device=weight.device)
        self._workspaces: dict[int, flashhead_triton.Workspace] = {}  # per number of hidden states

    @property
    def scored_rows(self) -> int:
        """Rows scored per hidden state: centroids, probed tokens, always-scored tokens."""
        return self.clusters + self.probes * self.cluster_size + self.always.numel()

    @property
    def work_ratio(self) -> float:
        """rho = (c + p*b + always) / V: scored rows relative to the dense head."""
        return self.scored_rows / self.vocab_size

    def bytes_per_call(self, rows: int = 1) -> int:
        """Bytes a call must read: centroids once, then per hidden state its probed and always rows
        with their ids (an upper bound for rows > 1, as probed clusters may overlap)."""
        es = self.weight.element_size()
        d = self.hidden_size
        per_row = (self.probes * self.cluster_size + self.always.numel()) * (d * es + _INDEX_BYTES)
        return self.clusters * d * es + rows * (per_row + d * es + self.probes * _INDEX_BYTES)

    def argmax(self, hidden: torch.Tensor) -> torch.Tensor:
        h = _flat(hidden, self.weight)
        if self.backend == "triton":
            work = self._workspaces.get(h.shape[0])
            if work is None:
                work = self._workspaces[h.shape[0]] = flashhead_triton.Workspace(h.shape[0], h.device)
            cluster_ids = flashhead_triton.select_clusters(h, self.centroids, self.probes, work)
            token = flashhead_triton.stage2_argmax(h, cluster_ids, self.members, self.weight, self.always, work)
        else:
            cluster_ids = torch.topk(F.linear(h, self.centroids), self.probes, dim=-1, sorted=False).indices
            token = flashhead_triton.stage2_reference(h, cluster_ids, self.members, self.weight, self.always)
        return token.reshape(hidden.shape[:-1])

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [..., d] -> float32 logits [n, V] of the probed clusters' tokens (and always_tokens),
        -inf elsewhere: sampling draws from the shortlist only. The clusters are chosen by torch.topk
        on either backend (ties may pick other clusters than the Triton selection; any shortlist
        keeps sampling exact)."""
        h = _flat(hidden, self.weight)
        cluster_ids = torch.topk(F.linear(h, self.centroids), self.probes, dim=-1, sorted=False).indices
        tokens = self.members[cluster_ids].reshape(h.shape[0], -1)
        if self.always.numel():
            tokens = torch.cat([tokens, self.always.expand(h.shape[0], -1)], dim=1)
        scores = torch.bmm(self.weight[tokens], h.unsqueeze(-1)).squeeze(-1).float()
        # a padded cluster repeats its own tokens, and always_tokens may be probed too: same score, same slot
        return torch.full((h.shape[0], self.vocab_size), float("-inf"), device=h.device).scatter_(1, tokens, scores)


def flashhead_agreement(
    dense_head: DenseHead, flash_head: FlashHead, hidden_states: torch.Tensor, chunk: int = 256
) -> float:
    """Fraction of hidden states [..., d] where both heads pick the same token: r(p) at flash_head.probes.

    Runs `chunk` states at a time: the torch path gathers probes * b rows per state."""
    flat = hidden_states.reshape(-1, hidden_states.shape[-1])
    same = sum(int((dense_head.argmax(part) == flash_head.argmax(part)).sum()) for part in flat.split(chunk))
    return same / flat.shape[0]
