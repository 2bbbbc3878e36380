"""FlashHead: balanced clustering, asset round trip, exactness against the dense head, Triton kernel."""

import json

import pytest
import torch

from contracts import UsageError
from model import flashhead_triton
from model.flashhead import Clustering, build_clustering, load_assets, save_assets
from model.heads import DenseHead, FlashHead, flashhead_agreement

needs_gpu = pytest.mark.skipif(
    not (flashhead_triton.AVAILABLE and torch.cuda.is_available()),
    reason="needs CUDA and triton (the lead runs it on the GPU machine)",
)


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _random_head(vocab=1000, d=32, seed=0):
    return torch.randn(vocab, d, generator=_gen(seed))


def _structured_head(seed=1, directions=256, per_direction=16, d=64):
    """Rows drawn around a few hundred directions, as real heads cluster; returns (weight, directions)."""
    g = _gen(seed)
    dirs = torch.nn.functional.normalize(torch.randn(directions, d, generator=g), dim=1)
    labels = torch.arange(directions * per_direction) % directions
    return dirs[labels] * 4 + 0.3 * torch.randn(labels.numel(), d, generator=g), dirs


@pytest.fixture(scope="module")
def structured():
    w, dirs = _structured_head()
    return w, dirs, build_clustering(w, cluster_size=16)


@pytest.fixture(scope="module")
def head_and_clustering():
    w = _random_head()
    return w, build_clustering(w, cluster_size=16)


def test_clusters_are_balanced_and_cover_every_token_once(head_and_clustering):
    w, cl = head_and_clustering
    vocab, b = w.shape[0], 16
    assert (cl.clusters, cl.cluster_size, cl.vocab_size, cl.hidden_size) == (63, b, vocab, 32)
    assert cl.default_probes == 3
    counts = torch.bincount(cl.assignments, minlength=cl.clusters)
    assert counts[:-1].eq(b).all() and counts[-1] == vocab - 62 * b  # documented: the last cluster is short
    for j in range(cl.clusters):
        assert set(cl.members[j].tolist()) == set(torch.nonzero(cl.assignments == j).squeeze(1).tolist())
    assert sorted(set(cl.members.flatten().tolist())) == list(range(vocab))
    norms = cl.centroids.norm(dim=1)
    assert torch.allclose(norms, torch.ones_like(norms), atol=1e-5)


def test_clustering_is_deterministic_per_seed(head_and_clustering):
    w, cl = head_and_clustering
    again = build_clustering(w, cluster_size=16)
    assert torch.equal(again.assignments, cl.assignments) and torch.equal(again.centroids, cl.centroids)
    other = build_clustering(w, cluster_size=16, seed=1)
    assert not torch.equal(other.assignments, cl.assignments)


def test_exact_multiple_has_no_padding_and_structured_rows_cluster_together(structured):
    w, _, cl = structured
    assert cl.clusters == 256 and torch.bincount(cl.assignments).eq(16).all()
    labels = torch.arange(w.shape[0]) % 256
    pure = sum(torch.bincount(labels[cl.members[j]]).max().item() for j in range(cl.clusters))
    assert pure / w.shape[0] > 0.95


def test_clustering_rejects_non_finite_heads():
    w = _random_head(vocab=64, d=8)
    w[3, 2] = float("nan")
    with pytest.raises(UsageError, match="NaN"):
        build_clustering(w)


def test_tiny_vocab_clamps_cluster_size():
    cl = build_clustering(_random_head(vocab=5, d=8), cluster_size=16)
    assert (cl.clusters, cl.cluster_size) == (1, 5)


def test_full_probes_match_dense_exactly(head_and_clustering):
    w, cl = head_and_clustering
    dense, flash = DenseHead(w), FlashHead(w, cl, probes=cl.clusters)
    assert flash.backend == "torch"
    h = torch.randn(600, 32, generator=_gen(2))
    assert torch.equal(flash.argmax(h), dense.argmax(h))
    batched = h[:60].reshape(3, 4, 5, 32)
    out = flash.argmax(batched)
    assert out.shape == (3, 4, 5) and out.dtype == torch.long
    assert torch.equal(out, dense.argmax(batched))
    single = flash.argmax(h[0])
    assert single.shape == () and single == dense.argmax(h[0])
    assert flashhead_agreement(dense, flash, h) == 1.0


def test_full_probes_match_dense_in_bfloat16(head_and_clustering):
    w, cl = head_and_clustering
    w = w.to(torch.bfloat16)
    h = torch.randn(300, 32, generator=_gen(3))
    assert torch.equal(FlashHead(w, cl, probes=cl.clusters).argmax(h), DenseHead(w).argmax(h))


def test_ties_pick_the_lowest_token_id_in_both_heads(head_and_clustering):
    w, cl = head_and_clustering
    w = w.clone()
    u = torch.nn.functional.normalize(torch.randn(32, generator=_gen(4)), dim=0)
    for t in (700, 41, 555):  # identical rows -> identical scores
        w[t] = 50 * u
    h = u.expand(4, 32)
    assert DenseHead(w).argmax(h).tolist() == [41] * 4
    assert FlashHead(w, cl, probes=cl.clusters, always_tokens=[700]).argmax(h).tolist() == [41] * 4
    assert FlashHead(w, cl, probes=1, always_tokens=[700, 41]).argmax(h).tolist() == [41] * 4


def _bf16_rounding_tie(device="cpu"):
    """Two rows whose fp32 scores differ (18.84 for id 9, 18.91 for id 40) but round to the same bf16 logit."""
    w = torch.zeros(64, 4, dtype=torch.bfloat16, device=device)
    w[40, :2] = torch.tensor([18.875, 0.0390625])
    w[9, :2] = torch.tensor([18.75, 0.09375])
    h = torch.tensor([[1.0, 1.0, 0.0, 0.0]], dtype=torch.bfloat16, device=device)
    members = torch.arange(64, device=device).reshape(4, 16)
    return w, h, members, torch.tensor([[2, 0]], device=device)


def test_scores_tie_in_the_head_dtype_like_dense_logits():
    w, h, members, ids = _bf16_rounding_tie()
    assert DenseHead(w).argmax(h).item() == 9
    assert flashhead_triton.stage2_reference(h, ids, members, w).item() == 9


def test_probes_out_of_range_are_rejected(head_and_clustering):
    w, cl = head_and_clustering
    for bad in (0, cl.clusters + 1):
        with pytest.raises(UsageError, match=r"\[1, 63\]"):
            FlashHead(w, cl, probes=bad)
    with pytest.raises(UsageError, match="always_tokens"):
        FlashHead(w, cl, always_tokens=[w.shape[0]])
    with pytest.raises(UsageError, match="backend"):
        FlashHead(w, cl, backend="triton" if not flashhead_triton.AVAILABLE else "cuda")
    with pytest.raises(UsageError, match="clustering is for"):
        FlashHead(w[:-1], cl)


def test_work_ratio_and_bytes(head_and_clustering):
    w, cl = head_and_clustering
    flash = FlashHead(w, cl, probes=4, always_tokens=(1, 2, 2))
    assert flash.probes == 4 and flash.scored_rows == 63 + 4 * 16 + 2
    assert flash.work_ratio == pytest.approx((63 + 64 + 2) / 1000)
    assert FlashHead(w, cl).probes == cl.default_probes
    dense = DenseHead(w)
    assert dense.work_ratio == 1.0 and dense.bytes_per_call() == (1000 * 32 + 32) * 4
    assert flash.bytes_per_call() < dense.bytes_per_call()
    assert flash.bytes_per_call(rows=2) > flash.bytes_per_call(rows=1)


def test_agreement_grows_with_probes_on_a_structured_head(structured):
    w, dirs, cl = structured
    g = _gen(5)
    h = dirs[torch.randint(0, 256, (600,), generator=g)] * 3 + torch.randn(600, 64, generator=g)
    dense = DenseHead(w)
    r = [flashhead_agreement(dense, FlashHead(w, cl, probes=p), h) for p in (1, 2, 4, 8, 16, 32)]
    assert all(later >= earlier - 0.01 for earlier, later in zip(r, r[1:])), r
    assert r[0] < 0.9 < r[3] and r[-1] > 0.98, r


def test_always_tokens_are_returned_when_they_are_the_true_argmax(head_and_clustering):
    w, cl = head_and_clustering
    w = w.clone()
    special = 123
    u = torch.nn.functional.normalize(torch.randn(32, generator=_gen(6)), dim=0)
    w[special] = 40 * u  # after clustering: its cluster's centroid knows nothing of this direction
    h = u + 0.1 * torch.randn(50, 32, generator=_gen(7))
    assert DenseHead(w).argmax(h).eq(special).all()
    assert not FlashHead(w, cl, probes=1).argmax(h).eq(special).all()
    assert FlashHead(w, cl, probes=1, always_tokens=[0, special]).argmax(h).eq(special).all()


def test_save_then_load_round_trip(tmp_path, head_and_clustering):
    w, cl = head_and_clustering
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    save_assets(cl, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config == {"model_type": "qwen3", "flash_head_cache_dir": "flash_head_assets"}
    assert sorted(p.name for p in (tmp_path / "flash_head_assets").iterdir()) == ["clustering_cache.safetensors"]
    loaded = load_assets(tmp_path)
    for name in ("centroids", "members", "assignments"):
        assert torch.equal(getattr(loaded, name), getattr(cl, name)), name
    h = torch.randn(200, 32, generator=_gen(8))
    assert torch.equal(FlashHead(w, loaded, probes=3).argmax(h), FlashHead(w, cl, probes=3).argmax(h))


def _write_asset(folder, centroids, assignments):
    from safetensors.torch import save_file

    (folder / "flash_head_assets").mkdir()
    save_file(
        {"centroids": centroids, "cluster_assignments": assignments},
        str(folder / "flash_head_assets" / "clustering_cache.safetensors"),
    )


def test_load_accepts_leading_singleton_dims_and_creates_no_config(tmp_path, head_and_clustering):
    w, cl = head_and_clustering
    _write_asset(
        tmp_path, cl.centroids.T.reshape(1, 1, 32, cl.clusters).to(torch.bfloat16).contiguous(), cl.assignments.int()
    )
    loaded = load_assets(tmp_path)
    assert loaded.centroids.shape == (cl.clusters, 32) and loaded.centroids.dtype == torch.float32
    assert torch.equal(loaded.members, cl.members)


def test_load_rejects_unbalanced_and_missing_assets(tmp_path):
    with pytest.raises(UsageError, match="no FlashHead assets"):
        load_assets(tmp_path)
    assignments = torch.cat([torch.zeros(16), torch.ones(10), torch.full((12,), 2)]).long()
    _write_asset(tmp_path, torch.randn(8, 3), assignments)
    with pytest.raises(UsageError, match="unbalanced"):
        load_assets(tmp_path)


def test_stage2_reference_scores_only_the_probed_clusters(head_and_clustering):
    w, cl = head_and_clustering
    h = torch.randn(40, 32, generator=_gen(9))
    ids = torch.randint(0, cl.clusters, (40, 3), generator=_gen(10))
    got = flashhead_triton.stage2_reference(h, ids, cl.members, w)
    for i in range(40):
        tokens = cl.members[ids[i]].flatten()
        assert got[i] == tokens[(w[tokens] @ h[i]).argmax()]


def test_clustering_dataclass_moves_devices(head_and_clustering):
    _, cl = head_and_clustering
    moved = cl.to("cpu")
    assert isinstance(moved, Clustering) and torch.equal(moved.members, cl.members)


@needs_gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_triton_stage2_matches_reference(dtype):
    g = torch.Generator(device="cuda").manual_seed(0)
    vocab, d, c, b, n, p = 8192, 1000, 512, 16, 8, 37  # d not a multiple of the kernel's BLOCK_D
    members = torch.randperm(vocab, device="cuda", generator=g).reshape(c, b)
    ids = torch.randint(0, c, (n, p), device="cuda", generator=g)
    always = torch.tensor([3, 8000], device="cuda")
    # Small integers: every dot is exact in any summation order, and exact ties abound.
    w = torch.randint(0, 2, (vocab, d), device="cuda", generator=g).to(dtype)
    h = torch.randint(0, 2, (n, d), device="cuda", generator=g).to(dtype)
    for a in (None, always):
        assert torch.equal(
            flashhead_triton.stage2_argmax(h, ids, members, w, a),
            flashhead_triton.stage2_reference(h, ids, members, w, a),
        )
    w[8000] = h[0] * 2
    assert flashhead_triton.stage2_argmax(h, ids, members, w, always)[0] == 8000
    # Random values: summation order differs from cuBLAS, so a mismatch is allowed only at a near-tie.
    w = torch.randn(vocab, d, device="cuda", generator=g).to(dtype)
    h = torch.randn(n, d, device="cuda", generator=g).to(dtype)
    ref = flashhead_triton.stage2_reference(h, ids, members, w, always)
    got = flashhead_triton.stage2_argmax(h, ids, members, w, always)

    def exact(tokens):
        return (w[tokens].double() * h.double()).sum(-1)

    assert torch.allclose(exact(got), exact(ref), rtol=1e-2 if dtype != torch.float32 else 1e-5)
    assert (got == ref).float().mean() >= 0.99


@needs_gpu
def test_triton_rounds_scores_to_the_head_dtype_before_breaking_ties():
    w, h, members, ids = _bf16_rounding_tie("cuda")
    assert flashhead_triton.stage2_argmax(h, ids, members, w).item() == 9
    assert DenseHead(w).argmax(h).item() == 9


@needs_gpu
def test_triton_flashhead_on_gpu_full_probes_backends_and_cuda_graph():
    g = torch.Generator(device="cuda").manual_seed(0)
    w = torch.randn(32768, 1024, device="cuda", generator=g).to(torch.bfloat16)
    cl = build_clustering(w, cluster_size=16, iters=3)
    assert torch.equal(build_clustering(w, cluster_size=16, iters=3).assignments, cl.assignments)
    assert torch.bincount(cl.assignments).eq(16).all()
    h = torch.randn(64, 1024, device="cuda", generator=g).to(torch.bfloat16)
    full = FlashHead(w, cl, probes=cl.clusters)
    assert full.backend == "triton"
    # cuBLAS and the kernel sum in different orders: a bf16 rounding boundary may rarely flip a near-tie.
    assert flashhead_agreement(DenseHead(w), full, h) >= 0.98
    flash, slow = FlashHead(w, cl), FlashHead(w, cl, backend="torch")
    eager = torch.stack([flash.argmax(row) for row in h[:8]])
    assert sum(int(flash.argmax(row) == slow.argmax(row)) for row in h[:8]) >= 7
    static_h = h[0].clone()
    flash.argmax(static_h)  # compile before capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = flash.argmax(static_h)
    for i in range(8):
        static_h.copy_(h[i])
        graph.replay()
        assert static_out == eager[i]
