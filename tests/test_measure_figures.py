"""The measure commands' figures are written whole, through measure.figures.write_figure: a PNG at the final
path, and no temporary file left beside it."""

from pathlib import Path

import pytest

from measure.recall import adaptive_figure, agreement_figure

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _recall_result() -> dict:
    probes = [1, 2, 4]
    curve = {"probes": probes, "r": [0.5, 0.8, 0.95], "n": 12}
    return {
        "model_label": "a test model",
        "clustering": {"clusters": 8},
        "agreement": {**curve, "ci95": [[0.4, 0.7, 0.9], [0.6, 0.9, 1.0]], "per_category": {"qa": {**curve, "n": 6}}},
        "draft_agreement": {**curve, "layers": 2},
        "adaptive": {
            "points": [
                {"policy": "margin", "mean_probes": 1.5, "r": 0.7},
                {"policy": "window", "mean_probes": 2.5, "r": 0.9},
            ]
        },
    }


def test_recall_figures_are_whole_pngs_with_nothing_left_beside_them(tmp_path):
    (tmp_path / "adaptive.png").write_bytes(b"an older figure")
    result = _recall_result()
    agreement_figure(result, tmp_path / "agreement.png")
    adaptive_figure(result, tmp_path / "adaptive.png")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adaptive.png", "agreement.png"]
    for name in ("agreement.png", "adaptive.png"):
        assert (tmp_path / name).read_bytes().startswith(PNG_SIGNATURE)


def test_a_figure_that_fails_to_draw_leaves_the_older_file_whole(tmp_path, monkeypatch):
    import matplotlib.figure

    def failing_savefig(self, target, *args, **kwargs):
        if hasattr(target, "write"):
            target.write(b"half a figure")
        else:
            Path(target).write_bytes(b"half a figure")
        raise OSError("disk full")

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", failing_savefig)
    (tmp_path / "agreement.png").write_bytes(b"an older figure")
    with pytest.raises(OSError, match="disk full"):
        agreement_figure(_recall_result(), tmp_path / "agreement.png")
    assert (tmp_path / "agreement.png").read_bytes() == b"an older figure"
    assert [p.name for p in tmp_path.iterdir()] == ["agreement.png"]
