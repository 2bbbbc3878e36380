"""LM heads for the draft: dense, FlashHead, a static shortlist and a learned cluster router, with
one interface.

`head.argmax(hidden [..., d], tokens=None) -> LongTensor [...]` (greedy) and
`head.scored_logits(hidden, tokens=None) -> (token ids [n, N] or None, logits [n, N])` (sampling: the N
tokens the head scores, a repeated one at -inf; None for the dense head, whose N is the vocabulary)
stay on the device with no host sync and no data-dependent Python branching, so they can run inside
CUDA-graph capture; `tokens` is what the draft body was fed this step (only the router reads it).
Dense, FlashHead and shortlist heads also give `head.logits(hidden) -> [n, V]` (-inf outside the
tokens a head scores), which token trees rank. Every head
picks the highest logit in the head's dtype and the lowest token id among exact ties, so a head
whose budget covers the whole vocabulary returns the dense head's token. `PositionalHead` holds one
head per draft position (budgets per position); the decoder asks it for the head of each draft step.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from contracts import UsageError
from model import draft_q, flashhead_triton, triton_support
from model.flashhead import Clustering

_INDEX_BYTES = 8
SHORTLIST_CHUNK = 64  # shortlist tokens per program of the fused scoring kernel


def _check_weight(weight: torch.Tensor) -> None:
    if weight.dim() != 2:
        raise UsageError(f"head weight must be [vocab, hidden], got shape {tuple(weight.shape)}")


def _flat(hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """hidden [..., d] -> [n, d] in the head's dtype (what the dense logits are computed in)."""
    if hidden.shape[-1] != weight.shape[1]:
        raise UsageError(f"hidden size {hidden.shape[-1]} does not match the head's {weight.shape[1]}")
    return hidden.reshape(-1, weight.shape[1]).to(weight.dtype)


# On the CPU, MKL runs hidden @ weight.T for a few rows (a verify's k + 1) as a GEMM 2-4x slower than the
# same product taken as weight @ hidden.T (torch 2.13, 2 cores, a 262,144 x 640 float32 head: 3 rows
# 156 ms against 38 ms, 8 rows 125 against 52); one row is a GEMV either way.
CPU_TRANSPOSED_MAX_ROWS = 16


def dense_logits(flat: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """flat [n, d] -> logits [n, V] in the head's dtype, by the faster of two equal products."""
    if weight.device.type == "cpu" and 1 < flat.shape[0] <= CPU_TRANSPOSED_MAX_ROWS:
        return (weight @ flat.T).T
    return F.linear(flat, weight)


class DenseHead:
    """The full LM head: all V logits, then argmax (torch.argmax returns the first maximum)."""

    backend = "torch"
    work_ratio = 1.0
    budget = None

    def __init__(self, weight: torch.Tensor):
        _check_weight(weight)
        self.weight = weight
        self.vocab_size, self.hidden_size = weight.shape

    def argmax(self, hidden: torch.Tensor, tokens: torch.Tensor | None = None) -> torch.Tensor:
        return dense_logits(_flat(hidden, self.weight), self.weight).argmax(dim=-1).reshape(hidden.shape[:-1])

    @property
    def scored_width(self) -> int:
        return self.vocab_size

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [..., d] -> float32 logits [n, V], for sampling (model/sampling.py)."""
        return dense_logits(_flat(hidden, self.weight), self.weight).float().contiguous()

    def scored_logits(self, hidden: torch.Tensor, tokens: torch.Tensor | None = None):
        """(None, logits [n, V]): the dense head scores every token, in token id order."""
        return None, self.logits(hidden)

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
        self.backend = triton_support.choose_backend(backend, weight.device)
        self.weight = weight
        self.vocab_size, self.hidden_size = vocab, d
        self.clusters, self.cluster_size, self.probes = c, clustering.cluster_size, probes
        self.centroids = clustering.centroids.to(device=weight.device, dtype=weight.dtype).contiguous()
        self.members = clustering.members.to(device=weight.device, dtype=torch.long).contiguous()
        self.first_slots = first_occurrences(self.members)
        self.always = torch.tensor(always, dtype=torch.long, device=weight.device)
        self.always_clusters = clustering.assignments.to(weight.device)[self.always]
        self._workspaces: dict[int, flashhead_triton.Workspace] = {}  # per number of hidden states

    @property
    def budget(self) -> int:
        return self.probes

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

    def argmax(self, hidden: torch.Tensor, tokens: torch.Tensor | None = None) -> torch.Tensor:
        h = _flat(hidden, self.weight)
        if self.backend == "triton":
            work = _workspace(self._workspaces, h)
            cluster_ids = flashhead_triton.select_clusters(h, self.centroids, self.probes, work)
            token = flashhead_triton.stage2_argmax(h, cluster_ids, self.members, self.weight, self.always, work)
        else:
            cluster_ids = torch.topk(F.linear(h, self.centroids), self.probes, dim=-1, sorted=False).indices
            token = flashhead_triton.stage2_reference(h, cluster_ids, self.members, self.weight, self.always)
        return token.reshape(hidden.shape[:-1])

    @property
    def scored_width(self) -> int:
        """N, the slots of `scored_logits`: the probed clusters' tokens, then the always-scored ones."""
        return self.probes * self.cluster_size + self.always.numel()

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [..., d] -> float32 logits [n, V] of the probed clusters' tokens (and always_tokens),
        -inf elsewhere (`scored_logits` laid out over the vocabulary)."""
        tokens, scores = self.scored_logits(hidden)
        return draft_q.dense_layout(tokens, scores, self.vocab_size, float("-inf"))

    def scored_logits(self, hidden: torch.Tensor, tokens: torch.Tensor | None = None):
        """hidden [..., d] -> (token ids [n, N], float32 logits [n, N]) of the probed clusters' tokens
        and the always-scored ones: sampling draws from these only. A token in two slots (a padded
        cluster repeats its own tokens; an always-scored token may be probed too) is -inf in all but
        its first. The clusters are chosen as `argmax` chooses them (the Triton selection, or torch.topk:
        they differ only among tied clusters, and any choice keeps sampling exact)."""
        h = _flat(hidden, self.weight)
        if self.backend == "triton":
            work = _workspace(self._workspaces, h)
            cluster_ids = flashhead_triton.select_clusters(h, self.centroids, self.probes, work)
            flashhead_triton.end_call(work)
        else:
            cluster_ids = torch.topk(F.linear(h, self.centroids), self.probes, dim=-1, sorted=False).indices
        ids = self.members[cluster_ids].reshape(h.shape[0], -1)
        first = self.first_slots[cluster_ids].reshape(h.shape[0], -1)
        if self.always.numel():
            ids = torch.cat([ids, self.always.expand(h.shape[0], -1)], dim=1)
            probed = (cluster_ids[:, :, None] == self.always_clusters[None, None, :]).any(dim=1)
            first = torch.cat([first, ~probed], dim=1)
        return ids, _scores(h, self.weight, ids).masked_fill(~first, float("-inf"))


def first_occurrences(members: torch.Tensor) -> torch.Tensor:
    """members [c, m] -> bool [c, m]: whether each slot holds the first occurrence of its token in its
    row (a short cluster's row repeats its own ids)."""
    ordered, order = members.sort(dim=1, stable=True)
    repeated = torch.zeros_like(members, dtype=torch.bool)
    repeated[:, 1:] = ordered[:, 1:] == ordered[:, :-1]
    return torch.zeros_like(repeated).scatter_(1, order, ~repeated)


def _scores(h: torch.Tensor, weight: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """float32 logits [n, N] of tokens ids [n, N] for hidden states h [n, d]: a bmm in the head's dtype,
    rounded to it as the dense head's F.linear is (model/flashhead_triton.stage2_reference)."""
    return torch.bmm(weight[ids], h.unsqueeze(-1)).squeeze(-1).float()


def _workspace(workspaces: dict, h: torch.Tensor) -> flashhead_triton.Workspace:
    """The triton backend's device counters for calls on h.shape[0] hidden states (one per count)."""
    work = workspaces.get(h.shape[0])
    if work is None:
        work = workspaces[h.shape[0]] = flashhead_triton.Workspace(h.shape[0], h.device)
    return work


class ShortlistHead:
    """The head restricted to a fixed token shortlist (FR-Spec, VocabTrim): score those N rows exactly,
    return the best. A token outside the shortlist is never proposed.

    backend "torch" scores a sliced copy of the N rows with one GEMM (what FR-Spec ships); "triton"
    scores the rows in place with the fused gather-score-argmax kernel of FlashHead's stage 2 (no
    copy: the shortlist's ids are its always-scored tokens, no cluster is probed).
    """

    def __init__(self, weight: torch.Tensor, shortlist: torch.Tensor, backend: str | None = None):
        _check_weight(weight)
        vocab = weight.shape[0]
        ids = torch.unique(shortlist.to(device=weight.device, dtype=torch.long))  # ascending: ties -> lowest id
        if ids.numel() == 0 or int(ids[0]) < 0 or int(ids[-1]) >= vocab:
            raise UsageError(f"a shortlist must hold token ids in [0, {vocab - 1}]")
        self.weight, self.tokens = weight, ids
        self.vocab_size, self.hidden_size = weight.shape
        self.backend = triton_support.choose_backend(backend, weight.device)
        self.rows = weight[ids].contiguous() if self.backend == "torch" else None
        self._chunk = torch.empty((1, SHORTLIST_CHUNK), dtype=torch.long, device=weight.device)
        self._no_clusters = torch.empty((1, 0), dtype=torch.long, device=weight.device)
        self._workspaces: dict[int, flashhead_triton.Workspace] = {}

    @property
    def size(self) -> int:
        return self.tokens.numel()

    @property
    def budget(self) -> int:
        return self.size

    @property
    def work_ratio(self) -> float:
        return self.size / self.vocab_size

    def bytes_per_call(self, rows: int = 1) -> int:
        """The shortlist's rows (and, scored in place, their ids) plus the hidden states."""
        es = self.weight.element_size()
        ids = 0 if self.backend == "torch" else self.size * _INDEX_BYTES
        return self.size * self.hidden_size * es + ids + rows * self.hidden_size * es

    def argmax(self, hidden: torch.Tensor, tokens: torch.Tensor | None = None) -> torch.Tensor:
        h = _flat(hidden, self.weight)
        if self.backend == "torch":
            token = self.tokens[F.linear(h, self.rows).argmax(dim=-1)]
        else:
            no_clusters = self._no_clusters.expand(h.shape[0], 0)
            work = _workspace(self._workspaces, h)
            token = flashhead_triton.stage2_argmax(h, no_clusters, self._chunk, self.weight, self.tokens, work)
        return token.reshape(hidden.shape[:-1])

    @property
    def scored_width(self) -> int:
        return self.size

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [..., d] -> float32 logits [n, V] of the shortlist's tokens, -inf elsewhere."""
        tokens, scores = self.scored_logits(hidden)
        return draft_q.dense_layout(tokens, scores, self.vocab_size, float("-inf"))

    def scored_logits(self, hidden: torch.Tensor, tokens: torch.Tensor | None = None):
        """hidden [..., d] -> (the shortlist's ids [n, N], float32 logits [n, N]): sampling draws from
        the shortlist only (the residual restores the rest). Scored by one GEMM on the shortlist's rows
        (the triton backend, which keeps no copy of them, gathers them per call)."""
        h = _flat(hidden, self.weight)
        rows = self.rows if self.rows is not None else self.weight[self.tokens]
        return self.tokens.expand(h.shape[0], -1), F.linear(h, rows).float()


class RouterHead:
    """DynaSpec's learned router: a small MLP reads the embedding of the token the draft body was fed
    and the draft's previous hidden state (so it can run beside the body), picks its `budget` best
    clusters of an unbalanced clustering of the head, and their tokens are scored exactly
    (FlashHead's stage 2: gather, score, argmax; fused in one kernel with the triton backend).

    In the decoder the previous hidden state is kept on the device (`previous`, rewritten by every
    call): within a round it is the last step's state; the first step of a round sees the state of
    the last draft step run, which may belong to a rejected token (the router's input is then
    approximate; the head's exact scoring and the target's verification are not affected).
    """

    def __init__(
        self,
        weight: torch.Tensor,
        embedding: torch.Tensor,
        router,
        budget: int,
        backend: str | None = None,
        previous: torch.Tensor | None = None,
    ):
        _check_weight(weight)
        if router.vocab_size != weight.shape[0] or router.hidden_size != weight.shape[1]:
            raise UsageError(
                f"the router asset is for a {router.vocab_size} x {router.hidden_size} head, "
                f"the weight is {weight.shape[0]} x {weight.shape[1]}"
            )
        if not 1 <= budget <= router.clusters:
            raise UsageError(f"router budget must be in [1, {router.clusters}] clusters, got {budget}")
        device, dtype = weight.device, weight.dtype
        self.weight, self.embedding = weight, embedding
        self.vocab_size, self.hidden_size = weight.shape
        self.clusters, self.cluster_size, self.budget = router.clusters, router.members.shape[1], budget
        self.members = router.members.to(device=device, dtype=torch.long).contiguous()
        self.first_slots = first_occurrences(self.members)
        self.layers = [t.to(device=device, dtype=torch.float32) for t in router.layers]
        self.backend = triton_support.choose_backend(backend, weight.device)
        # the previous hidden state, shared by the heads of every draft position when given
        self.previous = torch.zeros((1, self.hidden_size), dtype=dtype, device=device) if previous is None else previous
        self.chosen = torch.zeros((1, budget), dtype=torch.long, device=device)  # `choose`'s clusters, fixed address
        self._workspaces: dict[int, flashhead_triton.Workspace] = {}

    @property
    def work_ratio(self) -> float:
        """Scored head rows (budget clusters of up to cluster_size tokens) relative to the dense head."""
        return self.budget * self.cluster_size / self.vocab_size

    @property
    def scored_width(self) -> int:
        """N, the slots of `scored_logits`: the chosen clusters' member slots."""
        return self.budget * self.cluster_size

    def bytes_per_call(self, rows: int = 1) -> int:
        """The router's weights once, then per hidden state its clusters' rows with their ids."""
        es = self.weight.element_size()
        d = self.hidden_size
        router = sum(t.numel() for t in self.layers) * 4
        per_row = self.budget * self.cluster_size * (d * es + _INDEX_BYTES) + 3 * d * es
        return router + rows * per_row

    def route(self, tokens: torch.Tensor, previous: torch.Tensor) -> torch.Tensor:
        """tokens [n] (fed to the body), previous hidden states [n, d] -> the budget best clusters [n, budget]."""
        w1, b1, w2, b2 = self.layers
        x = torch.cat([self.embedding[tokens].float(), previous.float()], dim=-1)
        logits = F.linear(F.gelu(F.linear(x, w1, b1)), w2, b2)
        return torch.topk(logits, self.budget, dim=-1, sorted=False).indices

    def score(self, hidden: torch.Tensor, cluster_ids: torch.Tensor) -> torch.Tensor:
        """hidden [n, d], cluster_ids [n, budget] -> the best token of those clusters [n]."""
        h = _flat(hidden, self.weight)
        if self.backend == "triton":
            work = _workspace(self._workspaces, h)
            return flashhead_triton.stage2_argmax(h, cluster_ids, self.members, self.weight, None, work)
        return flashhead_triton.stage2_reference(h, cluster_ids, self.members, self.weight)

    def choose(self, tokens: torch.Tensor) -> torch.Tensor:
        """A draft step's cluster choice, from the body's input (its last token is routed) and the
        previous hidden state only: it can run before or beside the body (model/router_stream.py).
        Written to `chosen` (a fixed address, for graphs), which `argmax_chosen` scores."""
        return self.chosen.copy_(self.route(tokens.reshape(-1)[-1:], self.previous))

    def argmax_chosen(self, hidden: torch.Tensor) -> torch.Tensor:
        """A draft step's token among the clusters of the last `choose` (hidden [1, d] or [d]); the
        hidden state becomes the next step's previous one."""
        h = _flat(hidden, self.weight)
        token = self.score(h, self.chosen)
        self.previous.copy_(h)
        return token.reshape(hidden.shape[:-1])

    def argmax(self, hidden: torch.Tensor, tokens: torch.Tensor | None = None) -> torch.Tensor:
        """One draft step, routed after the body (tokens: the body's input, its last one is routed)."""
        if tokens is None:
            raise UsageError("the router head needs the tokens fed to the draft body")
        self.choose(tokens)
        return self.argmax_chosen(hidden)

    def scored_logits(self, hidden: torch.Tensor, tokens: torch.Tensor | None = None):
        """One sampled draft step: (token ids [1, N], float32 logits [1, N]) of the routed clusters'
        tokens, a padded cluster's repeated slots at -inf. Sampling draws from these only, like a
        shortlist's, and the residual restores the rest. Routes as `argmax` does."""
        if tokens is None:
            raise UsageError("the router head needs the tokens fed to the draft body")
        self.choose(tokens)
        return self.scored_logits_chosen(hidden)

    def scored_logits_chosen(self, hidden: torch.Tensor):
        """scored_logits over the clusters of the last `choose`; the hidden state becomes the next
        step's previous one."""
        h = _flat(hidden, self.weight)
        self.previous.copy_(h)
        ids = self.members[self.chosen].reshape(1, -1)
        first = self.first_slots[self.chosen].reshape(1, -1)
        return ids, _scores(h, self.weight, ids).masked_fill(~first, float("-inf"))


class PositionalHead:
    """One head per draft position (0-based within a round); the last one serves every later position.
    Budgets per position (DynaSpec, PA-FR): more for the first positions, where acceptance is decided."""

    def __init__(self, heads: list):
        if not heads:
            raise UsageError("a positional head needs at least one head")
        self.heads = heads

    def at(self, position: int):
        return self.heads[min(position, len(self.heads) - 1)]

    def argmax(self, hidden: torch.Tensor, tokens: torch.Tensor | None = None) -> torch.Tensor:
        return self.heads[0].argmax(hidden, tokens)


def heads_by_position(head) -> list:
    """The head of each draft position for `head` (one entry: the same head at every position)."""
    return head.heads if isinstance(head, PositionalHead) else [head]


def flashhead_agreement(
    dense_head: DenseHead, flash_head: FlashHead, hidden_states: torch.Tensor, chunk: int = 256
) -> float:
    """Fraction of hidden states [..., d] where both heads pick the same token: r(p) at flash_head.probes.

    Runs `chunk` states at a time: the torch path gathers probes * b rows per state."""
    flat = hidden_states.reshape(-1, hidden_states.shape[-1])
    same = sum(int((dense_head.argmax(part) == flash_head.argmax(part)).sum()) for part in flat.split(chunk))
    return same / flat.shape[0]
