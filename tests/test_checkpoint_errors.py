"""A broken checkpoint, an empty checkpoint name or a broken prompts file is one error line naming the file
(and its line), exit code 2, and no output: never a traceback."""

import json
import shutil

import pytest

from contracts import UsageError
from model.__main__ import main
from model.prompts import load_questions
from tests.test_model_cli import checkpoint  # noqa: F401 (a tiny real-format checkpoint, a pytest fixture)


def _broken(source, folder, config=None, cut_weights: int = 0):
    """A copy of the tiny checkpoint `source` with its config.json replaced by `config` (text, or a dict of
    keys changed) and its weights' last `cut_weights` bytes cut off."""
    shutil.copytree(source, folder)
    if isinstance(config, dict):
        config = json.dumps({**json.loads((folder / "config.json").read_text()), **config})
    if config is not None:
        (folder / "config.json").write_text(config)
    if cut_weights:
        weights = folder / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[:-cut_weights])
    return folder


def _refused(args, tmp_path, capsys) -> str:
    """Runs `python -m model ARGS` into a fresh --out folder; returns its one error line."""
    out = tmp_path / "runs" / "out"
    rc = main(["--placement", "cpu", "--prompts", "first:1", "--warmup", "0", "--out", str(out), *args])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.startswith("error: ") and err.count("\n") == 1
    assert not (tmp_path / "runs").exists()
    return err


@pytest.mark.parametrize(
    "config, problem",
    [
        ('{"model_type": "qw', "not valid JSON"),
        ("", "not valid JSON"),
        ("[1]", "not a model config (a JSON list, not an object)"),
        ('{"model_type": "qwen3"}', "not a model config (missing num_hidden_layers)"),
        ({"num_hidden_layers": "2"}, "not a model config (num_hidden_layers is '2', not a positive integer)"),
        ({"rope_scaling": "yarn"}, "not a model config (AttributeError"),
        ({"model_type": "bert"}, "unsupported model_type 'bert'"),
    ],
    ids=["truncated", "empty", "list", "missing-key", "string-size", "string-rope-scaling", "unsupported"],
)
def test_a_bad_config_json_is_named(config, problem, checkpoint, tmp_path, capsys):  # noqa: F811
    folder = _broken(checkpoint, tmp_path / "ckpt", config)
    err = _refused(["--target", str(folder)], tmp_path, capsys)
    assert f"error: {folder / 'config.json'}: {problem}" in err


def test_truncated_weights_are_named(checkpoint, tmp_path, capsys):  # noqa: F811
    folder = _broken(checkpoint, tmp_path / "ckpt", cut_weights=100)
    err = _refused(["--target", str(folder), "--draft", str(folder)], tmp_path, capsys)
    assert f"error: {folder / 'model.safetensors'}: not a readable safetensors file" in err


@pytest.mark.parametrize("option", ["--target", "--draft"])
def test_an_empty_checkpoint_name_is_quoted(option, tmp_path, capsys):
    err = _refused([option, ""], tmp_path, capsys)
    assert "checkpoint not found: '' is not a preset" in err


@pytest.mark.parametrize(
    "lines, problem",
    [
        (
            [
                '{"question_id": 1, "category": "qa", "turns": ["hi"]}',
                '{"question_id": 2, "category": "qa", "turns": []}',
            ],
            'line 2: "turns" is empty',
        ),
        (
            ['{"question_id": 1, "category": "qa", "turns": ["hi"]}', "", "[1]", '{"question_id": 3, "turns": ["'],
            "line 3: not a JSON object",
        ),
        (
            ['{"question_id": 1, "category": "qa", "turns": ["hi"]}', "", "", '{"question_id": 3, "turns": ["'],
            "line 4: not valid JSON (Unterminated string starting at at column 30)",
        ),
        (['{"question_id": 1, "turns": ["hi"]}'], "line 1: missing category"),
    ],
    ids=["empty-turns", "list", "truncated", "missing-key"],
)
def test_a_bad_prompts_line_is_named_by_its_line_number(lines, problem, tmp_path):
    path = tmp_path / "f.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(UsageError) as refused:
        load_questions(path)
    assert str(refused.value) == f"{path} is not a Spec-Bench question file ({problem})"
