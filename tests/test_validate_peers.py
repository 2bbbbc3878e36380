"""python -m validate --peers on tiny models (CPU): Hugging Face's models over our weights, every greedy
output equal to our target's, and the rows the report promises."""

import csv

import torch

from model.loading import load_model
from validate.__main__ import main
from validate.hf import hf_twin


def test_hf_twin_shares_our_weights_and_computes_our_logits():
    for preset in ("tiny-qwen3", "tiny-gemma3", "tiny-llama", "tiny-llama-draft"):
        model = load_model(preset, "cpu", None, 1, 32).model
        twin = hf_twin(model, 32)
        ours = {p.data_ptr() for p in model.parameters()}
        assert all(p.data_ptr() in ours for p in twin.parameters())  # shared, not copied
        tokens = torch.randint(0, 512, (1, 12), generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            torch.testing.assert_close(twin(tokens).logits, model(tokens, torch.arange(12)), rtol=1e-4, atol=1e-4)


def test_peers_agree_with_our_target_greedy_output(tmp_path, capsys):
    out = tmp_path / "peers"
    assert (
        main(
            [
                "--peers",
                "--target",
                "tiny-qwen3",
                "--draft",
                "tiny-qwen3-draft",
                "--placement",
                "cpu",
                "--K",
                "3",
                "--prompts",
                "81,111",
                "--max-new-tokens",
                "8",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    rows = {r["system"]: r for r in csv.DictReader((out / "peers.csv").open())}
    schedule = next(
        r["schedule"]
        for r in rows.values()
        if r["head"] == "dense" and r["acceptance control"] == "none" and r["system"].startswith("ours-")
    )
    expected = {"hf-generate", "hf-assisted", "ours-baseline", f"ours-{schedule}-dense", f"ours-{schedule}-flashhead"}
    assert expected <= set(rows)
    assert any(name.endswith("+control") for name in rows)  # synthetic weights: reference rows under control
    for r in rows.values():
        assert r["agree"] == "2/2" and r["first divergence"] == "-", r
        assert float(r["decode tok/s"]) > 0
    assert float(rows["hf-assisted"]["tokens/round"]) >= 1.0
    report = (out / "peers.md").read_text()
    assert "**Weights: SYNTHETIC**" in report and "hf-assisted" in report and "Where the time goes" in report
    assert "hf-generate" in capsys.readouterr().out
