"""Early-exit drafts (tiny presets, always run), the recall arithmetic, and Gemma 3 270M on real
weights (skipped unless the optional package is installed: CI does not install it)."""

from pathlib import Path

import pytest
import torch

from contracts import UsageError
from measure.recall import STUDY_CATEGORIES, margin_policy, rank_states, study_category, study_prompts, window_policy
from measure.recall import main as recall_main
from model import gemma_gguf
from model.decoder import Decoder
from model.early_exit import early_exit, split_spec
from model.flashhead import ASSET_DIR, ASSET_FILE, Clustering, build_clustering, load_assets
from model.heads import DenseHead, FlashHead
from model.loading import load_model


def _after_layers(model, tokens, n):
    """The full model's hidden state after its first n layers, final norm applied (via a hook)."""
    captured = {}
    hook = model.layers[n - 1].register_forward_hook(lambda _m, _i, out: captured.setdefault("x", out))
    try:
        model.forward_hidden(tokens, torch.arange(tokens.shape[1]))
    finally:
        hook.remove()
    return model.norm(captured["x"])


@pytest.mark.parametrize("preset", ["tiny-gemma3", "tiny-qwen3"])
def test_early_exit_states_equal_the_full_model_after_n_layers(preset):
    full = load_model(preset, max_seq_len=32).model
    tokens = torch.randint(0, 256, (1, 12), generator=torch.Generator().manual_seed(0))
    for n in range(1, full.config.n_layers):
        draft = load_model(f"{preset}#layers={n}", max_seq_len=32).model
        assert draft.config.n_layers == n and draft.config.layer_types == full.config.layer_types[:n]
        got = draft.forward_hidden(tokens, torch.arange(12))
        assert torch.equal(got, _after_layers(full, tokens, n))


def test_early_exit_shares_weights_and_owns_its_cache():
    full = load_model("tiny-gemma3", max_seq_len=16).model
    draft = early_exit(full, 2)
    draft.setup_cache(16)
    assert draft.head_weight.data_ptr() == full.head_weight.data_ptr()
    assert draft.layers[1].mlp.up_proj.weight.data_ptr() == full.layers[1].mlp.up_proj.weight.data_ptr()
    assert draft.norm.weight.data_ptr() == full.norm.weight.data_ptr()
    before = full.layers[0].self_attn.k_cache.clone()
    draft.forward_hidden(torch.tensor([[5, 6, 7]]), torch.arange(3))
    assert torch.equal(full.layers[0].self_attn.k_cache, before)
    assert draft.layers[0].self_attn.k_cache.data_ptr() != full.layers[0].self_attn.k_cache.data_ptr()


def test_early_exit_spec_errors():
    assert split_spec("tiny-gemma3#layers=2") == ("tiny-gemma3", 2)
    assert split_spec("some/folder") == ("some/folder", None)
    for bad in ("tiny-gemma3#layers=0", "tiny-gemma3#layers=x", "tiny-gemma3#layers=4"):
        with pytest.raises(UsageError):
            load_model(bad)


@pytest.mark.parametrize("schedule", ["ordinary", "deferred", "pipelined-deferred"])
def test_speculation_with_an_early_exit_draft_is_exact(schedule):
    target = load_model("tiny-gemma3", max_seq_len=96).model
    draft = early_exit(target, 2)
    draft.setup_cache(96)
    clustering = build_clustering(target.head_weight, cluster_size=16, iters=3)
    prompt = [2, 40, 41, 42, 43, 44, 45]
    for head in (DenseHead(target.head_weight), FlashHead(target.head_weight, clustering, probes=2)):
        dec = Decoder(target, draft, head, K=4, graphs=False)
        want = dec.reference(prompt, 40)
        assert dec.generate(prompt, 40, schedule).tokens == want


# ---- the recall arithmetic ----------------------------------------------------------------------
def test_cluster_rank_below_p_is_exactly_flashhead_agreement():
    g = torch.Generator().manual_seed(3)
    weight = torch.randn(2048, 32, generator=g)
    clustering = build_clustering(weight, cluster_size=16, iters=4)
    states = torch.randn(300, 32, generator=g) * 3
    ranked = rank_states(weight, clustering, states)
    dense = DenseHead(weight).argmax(states)
    assert torch.equal(ranked["tokens"], dense)
    for p in (1, 2, 5, 16, 64, 128):
        flash = FlashHead(weight, clustering, probes=p).argmax(states)
        assert torch.equal(flash == dense, ranked["ranks"] < p)


def test_adaptive_policies():
    top = torch.tensor([[5.0, 1.0, 0.9, 0.8], [5.0, 4.9, 4.8, 1.0]])
    assert margin_policy(top, 1, 64, threshold=1.0).tolist() == [1, 64]
    assert window_policy(top, delta=0.5, least=1, most=4).tolist() == [1, 3]
    assert window_policy(top, delta=0.5, least=2, most=2).tolist() == [2, 2]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--out", "/proc/specloop/recall"], "error: --out /proc/specloop/recall: /proc is not writable"),
        (["--sim-agreement", "/proc/a.json"], "error: --sim-agreement /proc/a.json: /proc is not writable"),
        (["--threads", "0"], "error: argument --threads: must be at least 1, got 0"),
        (["--exit-layers", "6,x"], "error: argument --exit-layers: expected an integer, got 'x'"),
        (["--new-tokens", "-1"], "error: argument --new-tokens: must be at least 1, got -1"),
        (["--new-tokens", "100000000"], "error: --new-tokens must be in 1..4,096, got 100000000"),
        (["--threads", "100000"], "error: --threads must be in 1..1,024, got 100000"),
        (["--seed", str(2**64)], "error: --seed must be in 0..4,294,967,295"),
    ],
)
def test_recall_refuses_bad_input_before_loading_anything(argv, message, tmp_path, capsys):
    """A missing model is not what stops these: every check comes before the model is read."""
    if "/proc" in " ".join(argv) and not Path("/proc/self").is_dir():
        pytest.skip("needs /proc (Linux)")
    args = [
        "--model",
        str(tmp_path / "no-model"),
        *(["--out", str(tmp_path / "r")] if "--out" not in argv else []),
        *argv,
    ]
    assert recall_main(args) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(message)


def test_study_prompts_cover_the_six_categories():
    prompts = study_prompts(3)
    assert [study_category(p.category) for p in prompts] == [c for c in STUDY_CATEGORIES for _ in range(3)]
    assert [p.category for p in prompts[:3]] == ["writing", "roleplay", "reasoning"]


# ---- Gemma 3 270M, real weights (optional extra) ------------------------------------------------
needs_gemma = pytest.mark.skipif(
    not (gemma_gguf.converted() or gemma_gguf.installed()),
    reason=f"Gemma 3 270M is an optional extra, not installed here ({gemma_gguf.PIP_INSTALL})",
)


@pytest.fixture(scope="module")
def gemma():
    torch.set_num_threads(min(2, torch.get_num_threads()))
    return load_model(str(gemma_gguf.convert()), "cpu", max_seq_len=64)


def _published_or_contiguous(weight):
    """The clustering `python -m measure.recall` cached beside the model, else a cheap balanced one
    (tokens in id order, 16 per cluster): the claim holds for any clustering."""
    folder = gemma_gguf.convert()
    if (folder / ASSET_DIR / ASSET_FILE).is_file():
        return load_assets(folder)
    members = torch.arange(weight.shape[0]).view(-1, 16)
    centroids = torch.nn.functional.normalize(torch.nn.functional.normalize(weight, dim=1)[members].sum(1), dim=1)
    return Clustering(centroids, members, torch.arange(weight.shape[0]) // 16)


@needs_gemma
def test_gemma_flashhead_probing_every_cluster_is_the_dense_argmax(gemma):
    """On real hidden states (a real prompt), for any clustering: all clusters probed == dense."""
    weight = gemma.model.head_weight
    ids = gemma.tokenizer.encode("The capital of France is Paris. The capital of Germany is")
    hidden = gemma.model.forward_hidden(torch.tensor([ids]), torch.arange(len(ids)))[0, -4:]
    clustering = _published_or_contiguous(weight)
    flash = FlashHead(weight, clustering, probes=clustering.clusters)
    assert torch.equal(torch.cat([flash.argmax(h) for h in hidden.split(1)]), DenseHead(weight).argmax(hidden))


@needs_gemma
def test_gemma_early_exit_equals_its_first_layers(gemma):
    draft = early_exit(gemma.model, 6)
    draft.setup_cache(64)
    ids = gemma.tokenizer.encode("Translate German to English: Guten Morgen")
    tokens = torch.tensor([ids])
    got = draft.forward_hidden(tokens, torch.arange(len(ids)))
    assert torch.equal(got, _after_layers(gemma.model, tokens, 6))
