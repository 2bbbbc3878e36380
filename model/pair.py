"""A target and draft pair as the decoder uses them: placed, loaded, checked against each other,
caches sized, heads and acceptance control built. `python -m model`, `measure` and `validate` all
set up their models here."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from contracts import PLACEMENTS, UsageError
from contracts.heads import HeadSpec, check_assets, parse_head
from contracts.names import TENSOR_PARALLEL_PLACEMENT, tensor_parallel_size
from contracts.trees import CHAIN, TreeShape
from model import dense_gemv, persistent_body, tensor_parallel
from model.acceptance_control import AcceptanceControl
from model.decoder import Decoder, cache_room
from model.flashhead import Clustering, build_clustering, load_assets
from model.head_assets import load_router, load_shortlist
from model.heads import DenseHead, FlashHead, PositionalHead, RouterHead, ShortlistHead
from model.loading import Loaded, load_model
from model.memory import check_cache
from model.presets import PRESETS
from model.sampling import GREEDY, SamplingSettings
from model.tensor_parallel import DraftStandIn, TensorParallel
from model.tokenizer import check_compatible


def resolve_placement(placement: str | None) -> tuple[str, torch.device, torch.device]:
    """(placement, target device, draft device); None picks two-gpu with 2 GPUs, one-gpu with 1, else
    cpu. A placement this machine cannot run is bad input. A tensor-parallel placement (tpN) names
    no devices here: `load_pair` joins its process group, which gives this rank its device."""
    have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if placement is None:
        placement = "two-gpu" if have >= 2 else "one-gpu" if have == 1 else "cpu"
    if tensor_parallel_size(placement) is not None:
        return placement, None, None
    if placement not in PLACEMENTS:
        valid = ", ".join((*PLACEMENTS, f"{TENSOR_PARALLEL_PLACEMENT} (N >= 2, e.g. tp2)"))
        raise UsageError(f"unknown placement {placement!r}; valid: {valid}")
    if placement == "cpu":
        return placement, torch.device("cpu"), torch.device("cpu")
    need = 2 if placement == "two-gpu" else 1
    if have < need:
        raise UsageError(
            f"no GPU: placement {placement} needs {need} CUDA GPU{'s' * (need > 1)}, found {have} "
            f"(use --placement cpu{'' if have < 1 else ' or one-gpu'})"
        )
    return placement, torch.device("cuda", 0), torch.device("cuda", need - 1)


@dataclass
class Pair:
    """The loaded target, the draft (None when only the baseline runs) and what they share."""

    target: Loaded
    draft: Loaded | None
    placement: str
    seed: int
    clustering_folder: str | None = None  # FlashHead assets to load; None: build them from the draft's head
    head_assets: str | None = None  # shortlist / router assets (python -m model.build_head --out DIR)
    room: int = 0  # cache slots, once `size_caches` ran
    tensor_parallel: TensorParallel | None = None  # this rank's place when the target is tensor-parallel
    _clustering: Clustering | None = field(default=None, repr=False)

    @property
    def target_device(self) -> torch.device:
        return self.target.model.head_weight.device

    @property
    def draft_device(self) -> torch.device:
        return self.draft.model.head_weight.device if self.draft is not None else self.target_device

    @property
    def writes_outputs(self) -> bool:
        """Whether this process reports (a tensor-parallel run reports from its draft rank only)."""
        return self.tensor_parallel is None or self.tensor_parallel.runs_draft

    @property
    def weights(self) -> str:
        """ "synthetic" when either model has random weights, else "real"."""
        models = [m for m in (self.target, self.draft) if m is not None]
        return "synthetic" if any(m.info["weights"] == "synthetic" for m in models) else "real"

    def size_caches(self, prompt_lengths: list[int], new_tokens: int, K: int, nodes: int = 0) -> int:
        """Static caches big enough for the longest prompt, `new_tokens`, a K-token look-ahead and a
        tree verify of `nodes` nodes."""
        self.room = cache_room(max(prompt_lengths), new_tokens, K, nodes)
        for m in (self.target, self.draft):
            if m is not None:
                if not isinstance(m.model, DraftStandIn):
                    check_cache(m.model, self.room, m.info["name"])
                m.model.setup_cache(self.room)
        return self.room

    @property
    def clustering(self) -> Clustering:
        """The draft head's FlashHead clustering: loaded from its folder, or built (seeded) once."""
        if self._clustering is None:
            weight = self.draft.model.head_weight
            built = (
                load_assets(self.clustering_folder)
                if self.clustering_folder
                else build_clustering(weight, seed=self.seed)
            )
            self._clustering = built.to(weight.device)
        return self._clustering

    def head(self, spec: HeadSpec | str, probes: int | None = None):
        """The draft head of a head spec (contracts.heads), one head per draft position where its
        budgets differ; `probes` (the older --probes) sets a plain `flashhead`'s probes. A budget
        larger than the vocabulary or the clusters, or a missing asset, is bad input."""
        spec = parse_head(spec) if isinstance(spec, str) else spec
        weight = self.draft.model.head_weight
        if spec.kind == "dense" or isinstance(self.draft.model, DraftStandIn):  # a stand-in's head is never used
            return DenseHead(weight)
        vocab, d = weight.shape
        budgets = spec.budgets or (probes,)
        if spec.kind == "flashhead":
            spec.check_budgets(self.clustering.clusters, "FlashHead clusters")
            eos = self.draft.tokenizer.eos_token_id
            always = [eos] if eos is not None else ()
        elif spec.kind == "shortlist":
            spec.check_budgets(vocab, "tokens of the vocabulary")
            shortlist = load_shortlist(self._assets_folder(spec), vocab)
        else:
            router = load_router(self._assets_folder(spec), vocab, d)
            spec.check_budgets(router.clusters, "router clusters")
            embedding = self.draft.model.embed_tokens.weight
            previous = torch.zeros((1, d), dtype=weight.dtype, device=weight.device)  # shared by all positions

        def build(budget):
            if spec.kind == "flashhead":
                return FlashHead(weight, self.clustering, budget, always_tokens=always)
            if spec.kind == "shortlist":
                return ShortlistHead(weight, shortlist.top(budget))
            return RouterHead(weight, embedding, router, budget, previous=previous)

        heads = {b: build(b) for b in dict.fromkeys(budgets)}  # one head per distinct budget
        if len(heads) == 1:
            return heads[budgets[0]]
        return PositionalHead([heads[b] for b in budgets])

    def _assets_folder(self, spec: HeadSpec) -> str:
        check_assets(spec, self.head_assets)
        return self.head_assets

    def acceptance_control(self, spec: str | None) -> AcceptanceControl | None:
        """Acceptance control for synthetic weights (None or "none": the draft's own proposals)."""
        if spec in (None, "none"):
            return None
        if self.weights == "real":
            raise UsageError(
                "--acceptance replaces the draft's proposals; it is for synthetic weights only "
                "(use --acceptance none with real checkpoints)"
            )
        return AcceptanceControl(
            spec, self.target.model.config.vocab_size, self.room, self.draft_device, self.seed, self.target_device
        )

    def decoder(
        self,
        head=None,
        K: int = 6,
        graphs: bool = True,
        control=None,
        phases: bool = True,
        stop_at_eos: bool = False,
        timeline: bool = False,
        drafting=None,
        sampling: SamplingSettings = GREEDY,
        tree: TreeShape = CHAIN,
        min_rows: int = 0,
        router_side_stream: bool = True,
    ) -> Decoder:
        """A decoder over the pair (graphs captured now); `size_caches` must have run."""
        return Decoder(
            self.target.model,
            self.draft.model if self.draft else None,
            head,
            K=K,
            graphs=graphs,
            control=control,
            phases=phases,
            eos_id=self.target.tokenizer.eos_token_id,
            stop_at_eos=stop_at_eos,
            timeline=timeline,
            drafting=drafting,
            tensor_parallel=self.tensor_parallel,
            sampling=sampling,
            tree=tree,
            min_rows=min_rows,
            router_side_stream=router_side_stream,
        )


def load_pair(
    target: str,
    draft: str | None,
    placement: str | None = None,
    dtype: str | None = None,
    seed: int = 0,
    kernels: str | None = None,
    clustering: str | None = None,
    max_seq_len: int = 1,
    head_assets: str | None = None,
) -> Pair:
    """Both models (target seeded `seed`, draft `seed + 1`), on the placement's devices, checked to
    share one vocabulary and tokenizer. `max_seq_len` is the initial cache (see `Pair.size_caches`).
    With a tensor-parallel placement every rank calls this: each loads its target shard, the draft
    rank the draft and the others a stand-in (model/tensor_parallel.py)."""
    placement, target_device, draft_device = resolve_placement(placement)
    ranks = None
    if target_device is None:
        ranks, target_device = tensor_parallel.init(placement)
        draft_device = target_device
    loaded_target = load_model(
        target, target_device, dtype, seed, max_seq_len=max_seq_len, kernels=kernels, tensor_parallel=ranks
    )
    loaded_draft = None
    if draft is not None and ranks is not None and not ranks.runs_draft:
        weights = "synthetic" if draft.split("#")[0] in PRESETS else "real"
        stand_in = DraftStandIn(target_device, max_seq_len)
        loaded_draft = Loaded(stand_in, loaded_target.tokenizer, {"name": draft, "weights": weights, "stand_in": True})
    elif draft is not None:
        loaded_draft = load_model(draft, draft_device, dtype, seed + 1, max_seq_len=max_seq_len, kernels=kernels)
        draft_routes(loaded_draft.model)
        check_compatible(
            loaded_target.tokenizer,
            loaded_draft.tokenizer,
            loaded_target.model.config.vocab_size,
            loaded_draft.model.config.vocab_size,
        )
    return Pair(loaded_target, loaded_draft, placement, seed, clustering, head_assets, tensor_parallel=ranks)


def draft_routes(model) -> None:
    """A draft's default speed routes: the GEMV for few rows (model/dense_gemv.py) and the persistent
    kernel for one-token steps (model/persistent_body.py). Only drafts: they propose, so their rounding
    cannot change an output."""
    dense_gemv.attach(model, dense_gemv.DRAFT_ROWS)
    persistent_body.attach(model, persistent_body.DRAFT_PERSISTENT)
