"""Builds a ready-to-run Transformer from a synthetic preset or a local Hugging Face checkpoint.

Nothing is ever downloaded: a Hugging Face id is looked up in the local cache only.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from contracts import UsageError
from contracts.files import read_json
from model import awq_prefill, triton_support
from model.awq import AWQLinear
from model.config import ModelConfig
from model.early_exit import early_exit, split_spec
from model.memory import check_cache, check_fits, tensor_bytes
from model.presets import PRESETS
from model.tensor_parallel import TensorParallel
from model.tokenizer import HFTokenizer, SyntheticTokenizer, load_tokenizer
from model.transformer import GemmaRMSNorm, RMSNorm, Transformer

DEFAULT_MAX_SEQ_LEN = 2048
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_DTYPE_ALIASES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "half": "float16"}
_SYNTHETIC_WEIGHT_STD = 0.02
KERNEL_PATHS = ("fused", "torch")
# config.json's sizes: each a positive integer where given (ModelConfig.from_hf says which it requires),
# checked first so that a mistyped one is named, not met as a TypeError while the model is built.
_CONFIG_SIZES = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "sliding_window",
    "max_position_embeddings",
)


@dataclass
class Loaded:
    """A model with its KV cache set up, its tokenizer, and what it is.

    info: name, arch, weights ("synthetic" | "real"), dtype, quantization (None or e.g.
    "awq-int4-g128"), kernel (the AWQ kernel that runs, or "dense"), kernels ("fused" or "torch":
    the layer path), tokenizer (its name).
    """

    model: Transformer
    tokenizer: HFTokenizer | SyntheticTokenizer
    info: dict


def load_model(
    spec: str,
    device: str | torch.device = "cpu",
    dtype: str | torch.dtype | None = None,
    seed: int = 0,
    max_seq_len: int = DEFAULT_MAX_SEQ_LEN,
    kernels: str | None = None,
    tensor_parallel: TensorParallel | None = None,
) -> Loaded:
    """`spec` is a preset name (seeded random weights built directly on `device`), a local folder
    with config.json and *.safetensors, or a Hugging Face id already in the local cache; any of
    them followed by `#layers=N` gives its early-exit draft (the first N layers, final norm, head).
    `dtype` defaults to float32 on the CPU and bfloat16 on CUDA. `kernels`: "fused" (Triton,
    model/fused_ops.py) or "torch"; by default fused for Qwen3 on CUDA where triton imports.
    `tensor_parallel`: build only this rank's shard (model/tensor_parallel.py), with weights that are
    exactly the matching slices of the unsharded model's (synthetic ones included), and its all-reduces.
    Bad input raises UsageError."""
    device = parse_device(device)
    dtype = parse_dtype(dtype, device)
    if max_seq_len < 1:
        raise UsageError(f"max_seq_len must be positive, got {max_seq_len}")
    if kernels not in (None, *KERNEL_PATHS):
        raise UsageError(f"unknown kernels {kernels!r} (choices: {', '.join(KERNEL_PATHS)})")
    base, exit_layers = split_spec(spec)
    if exit_layers is not None:  # `SPEC#layers=N`: the first N layers of SPEC (model/early_exit.py)
        full = load_model(base, device, dtype, seed, max_seq_len=1, kernels="torch", tensor_parallel=tensor_parallel)
        draft = early_exit(full.model, exit_layers)
        check_cache(draft, max_seq_len, spec)
        draft.setup_cache(max_seq_len)
        info = {**full.info, "name": spec, "early_exit_layers": exit_layers, "kernels": _use_kernels(draft, kernels)}
        return Loaded(draft, full.tokenizer, info)
    try:
        if spec in PRESETS:
            config = PRESETS[spec]
            model = _empty_model(_shard_config(config, tensor_parallel), device, dtype, spec)
            _init_synthetic(model, seed, tensor_parallel)
            tokenizer, weights = SyntheticTokenizer(config.vocab_size), "synthetic"
        else:
            folder = _resolve_checkpoint(spec)
            config = _read_config(folder / "config.json")
            model = _empty_model(_shard_config(config, tensor_parallel), device, dtype, spec)
            _load_weights(model, folder, tensor_parallel)
            tokenizer, weights = load_tokenizer(folder, spec, config.vocab_size), "real"
        if tensor_parallel is not None:
            tensor_parallel.attach(model)
        model.requires_grad_(False).eval()
        check_cache(model, max_seq_len, spec)
        model.setup_cache(max_seq_len)
        paths = _use_kernels(model, kernels)
        kernel = _select_awq_kernels(model, dtype)
        awq_prefill.attach(model, dtype)
    except torch.cuda.OutOfMemoryError as error:
        raise UsageError(
            f"out of memory: {spec} in {_dtype_name(dtype)} with a {max_seq_len}-token cache does not fit on {device}"
        ) from error
    info = {
        "name": spec,
        "arch": config.arch,
        "weights": weights,
        "dtype": _dtype_name(dtype),
        "quantization": f"awq-int4-g{config.awq_group_size}" if config.quant == "awq" else None,
        "kernel": kernel,
        "kernels": paths,
        "tokenizer": tokenizer.name,
    }
    if tensor_parallel is not None:
        info["tensor_parallel"] = {"rank": tensor_parallel.rank, "world": tensor_parallel.world}
    return Loaded(model, tokenizer, info)


def _shard_config(config: ModelConfig, tensor_parallel: TensorParallel | None) -> ModelConfig:
    return config if tensor_parallel is None else tensor_parallel.shard_config(config)


def _use_kernels(model: Transformer, kernels: str | None) -> str:
    """Switches `model` to the fused kernels when asked, or by default where they apply."""
    if kernels is None:
        device = model.embed_tokens.weight.device
        fits = device.type == "cuda" and model.fused_kernels_cover and triton_support.runs_on(device)
        kernels = "fused" if fits else "torch"
    if kernels == "fused":
        model.use_fused_kernels()
    return kernels


def parse_device(device: str | torch.device) -> torch.device:
    """A usable torch.device, or UsageError naming what is available."""
    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError):
        raise UsageError(f"unknown device {device!r} (use cpu, cuda or cuda:N)") from None
    if parsed.type == "cpu":
        return parsed
    if parsed.type != "cuda":
        raise UsageError(f"unsupported device {device!r} (use cpu, cuda or cuda:N)")
    count = torch.cuda.device_count()
    index = parsed.index if parsed.index is not None else 0
    if index >= count:
        raise UsageError(f"device {device!r} is not available ({count} CUDA GPUs here)")
    return torch.device("cuda", index)


def parse_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    """float32 / bfloat16 / float16 (or fp32 / bf16 / fp16); the device's default when None."""
    if dtype is None:
        return torch.float32 if device.type == "cpu" else torch.bfloat16
    name = _dtype_name(dtype) if isinstance(dtype, torch.dtype) else _DTYPE_ALIASES.get(dtype, dtype)
    if name not in DTYPES:
        raise UsageError(f"unsupported dtype {dtype!r} (choices: {', '.join(DTYPES)})")
    if DTYPES[name] is torch.bfloat16 and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise UsageError(f"bfloat16 is not supported on {device} (use float16)")
    return DTYPES[name]


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _empty_model(config: ModelConfig, device: torch.device, dtype: torch.dtype, name: str) -> Transformer:
    """The model's tensors allocated on `device`, uninitialized (built on meta: no wasted init), once
    their size is known to fit."""
    with torch.device("meta"):
        model = Transformer(config, dtype)
    repacked = sum(m.qweight.numel() * m.qweight.element_size() for m in model.modules() if isinstance(m, AWQLinear))
    advice = "it needs a GPU" if device.type == "cpu" else "try another placement or a smaller model"
    prefill = awq_prefill.buffer_bytes(config, dtype)
    check_fits(f"{name} in {_dtype_name(dtype)}", tensor_bytes(model) + repacked + prefill, device, advice)
    return model.to_empty(device=device)


@torch.no_grad()
def _init_synthetic(model: Transformer, seed: int, tensor_parallel: TensorParallel | None = None) -> None:
    """Seeded finite weights of realistic scale; timing depends only on shapes. A tensor-parallel shard
    draws each full weight in turn and keeps its slice, so its weights are the unsharded model's."""
    generator = torch.Generator(device=model.embed_tokens.weight.device).manual_seed(seed)
    for name, module in model.named_modules():
        if isinstance(module, AWQLinear) and tensor_parallel is None:
            module.randomize_(generator, _SYNTHETIC_WEIGHT_STD)
        elif isinstance(module, AWQLinear):
            rows, packed = tensor_parallel.full_shape(f"{name}.qweight", module.qweight.shape)
            with torch.device(module.qweight.device):
                full = AWQLinear(rows, packed * 8, module.group_size)
            full.randomize_(generator, _SYNTHETIC_WEIGHT_STD)
            for buffer in ("qweight", "qzeros", "scales"):
                getattr(module, buffer).copy_(tensor_parallel.shard(f"{name}.{buffer}", getattr(full, buffer)))
        elif isinstance(module, (RMSNorm, GemmaRMSNorm)):
            module.reset_parameters()
        elif isinstance(module, (nn.Linear, nn.Embedding)) and tensor_parallel is None:
            module.weight.normal_(0.0, _SYNTHETIC_WEIGHT_STD, generator=generator)
        elif isinstance(module, (nn.Linear, nn.Embedding)):
            weight_name = f"{name}.weight"
            full = module.weight.new_empty(tensor_parallel.full_shape(weight_name, module.weight.shape))
            full.normal_(0.0, _SYNTHETIC_WEIGHT_STD, generator=generator)
            module.weight.copy_(tensor_parallel.shard(weight_name, full))


def _resolve_checkpoint(spec: str) -> Path:
    """The folder `spec` names. An empty `spec` is no folder (as a path it would be the current one): it
    falls through to the Hugging Face id check, which refuses it."""
    path = Path(spec).expanduser()
    if spec and path.is_dir():
        if (path / "config.json").is_file():
            return path
        raise UsageError(f"checkpoint not found: {spec} has no config.json")
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

    try:
        return Path(snapshot_download(spec, local_files_only=True))
    except (HFValidationError, LocalEntryNotFoundError):
        raise UsageError(
            f"checkpoint not found: {spec!r} is not a preset, a folder with config.json, or a Hugging Face "
            f"id in the local cache (presets: {', '.join(PRESETS)})"
        ) from None


def _read_config(path: Path) -> ModelConfig:
    """A checkpoint's config.json, read before any weights; whatever is wrong with it is one error naming it."""
    hf_config = read_json(path, "checkpoint config")
    if not isinstance(hf_config, dict):
        raise UsageError(f"{path}: not a model config (a JSON {type(hf_config).__name__}, not an object)")
    for key in _CONFIG_SIZES:
        value = hf_config.get(key)
        if value is not None and (type(value) is not int or value < 1):
            raise UsageError(f"{path}: not a model config ({key} is {value!r}, not a positive integer)")
    try:
        return ModelConfig.from_hf(hf_config)
    except UsageError as error:
        raise UsageError(f"{path}: {error}") from None
    except KeyError as error:
        raise UsageError(f"{path}: not a model config (missing {error.args[0]})") from None
    except (TypeError, ValueError, AttributeError) as error:  # e.g. a string where a number or an object belongs
        raise UsageError(f"{path}: not a model config ({type(error).__name__}: {error})") from None


def _checkpoint_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        content = read_json(index, "checkpoint index")
        weight_map = content.get("weight_map") if isinstance(content, dict) else None
        if not isinstance(weight_map, dict):
            raise UsageError(f"{index}: not a safetensors index (no weight_map object)")
        names = sorted({str(name) for name in weight_map.values()})
    else:
        names = sorted(path.name for path in folder.glob("*.safetensors"))
    if not names:
        raise UsageError(f"checkpoint {folder} has no *.safetensors weights")
    return [folder / name for name in names]


def _our_name(hf_name: str, tied: bool) -> str | None:
    """Our state-dict name for a checkpoint tensor; None for tensors we recompute or share."""
    if hf_name.endswith("rotary_emb.inv_freq") or (tied and hf_name == "lm_head.weight"):
        return None
    return hf_name.removeprefix("model.")


@torch.no_grad()
def _load_weights(model: Transformer, folder: Path, tensor_parallel: TensorParallel | None = None) -> None:
    """Copies every checkpoint tensor into the model (casting to its dtype; a tensor-parallel shard
    takes its slice); every weight must be present."""
    targets = model.state_dict()
    missing = set(targets)
    for file in _checkpoint_files(folder):
        with _open_weights(file) as reader:
            for hf_name in reader.keys():  # noqa: SIM118 (safetensors readers are not dicts)
                name = _our_name(hf_name, model.config.tie_word_embeddings)
                if name is None:
                    continue
                if name not in targets:
                    raise UsageError(f"unexpected weight {hf_name} in {file}")
                tensor = reader.get_tensor(hf_name)
                if tensor_parallel is not None:
                    tensor = tensor_parallel.shard(name, tensor)
                if tensor.shape != targets[name].shape:
                    raise UsageError(
                        f"weight {hf_name} in {file} has shape {tuple(tensor.shape)}, "
                        f"expected {tuple(targets[name].shape)}"
                    )
                targets[name].copy_(tensor)
                missing.discard(name)
    if missing:
        raise UsageError(f"checkpoint {folder} lacks {len(missing)} weights, e.g. {', '.join(sorted(missing)[:3])}")


def _open_weights(file: Path):
    """A safetensors reader of `file`; a truncated or corrupt file is bad input naming it."""
    from safetensors import SafetensorError, safe_open

    try:
        return safe_open(str(file), framework="pt", device="cpu")
    except (SafetensorError, OSError) as error:
        raise UsageError(f"{file}: not a readable safetensors file ({error})") from None


def _select_awq_kernels(model: Transformer, dtype: torch.dtype) -> str:
    """Picks each AWQ layer's kernel now (before any graph capture); names the kernels in use."""
    kernels = {module.select_kernel(dtype=dtype) for module in model.modules() if isinstance(module, AWQLinear)}
    return "+".join(sorted(kernels)) if kernels else "dense"
