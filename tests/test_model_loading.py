"""load_model: presets, real configs, checkpoints (AWQ included), tokenizers and clear usage errors.
Nothing here downloads: checkpoints are written to tmp_path by the tests themselves."""

import json

import pytest
import torch
from torch import nn

from contracts import UsageError
from model.awq import AWQLinear
from model.config import FULL, SLIDING, ModelConfig
from model.loading import load_model, parse_dtype
from model.presets import PRESETS
from model.tokenizer import HFTokenizer, SyntheticTokenizer, check_compatible, load_tokenizer

QWEN3_32B_CONFIG = {  # Qwen/Qwen3-32B config.json
    "architectures": ["Qwen3ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 5120,
    "initializer_range": 0.02,
    "intermediate_size": 25600,
    "max_position_embeddings": 40960,
    "max_window_layers": 64,
    "model_type": "qwen3",
    "num_attention_heads": 64,
    "num_hidden_layers": 64,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}
QWEN3_32B_AWQ_CONFIG = {  # Qwen/Qwen3-32B-AWQ config.json
    **QWEN3_32B_CONFIG,
    "torch_dtype": "float16",
    "quantization_config": {
        "bits": 4,
        "group_size": 128,
        "modules_to_not_convert": None,
        "quant_method": "awq",
        "version": "gemm",
        "zero_point": True,
    },
}
QWEN3_SMALL_CONFIGS = {  # Qwen/Qwen3-0.6B and Qwen/Qwen3-1.7B differ from 32B in these fields
    "qwen3-0.6b": {
        "hidden_size": 1024,
        "intermediate_size": 3072,
        "num_hidden_layers": 28,
        "num_attention_heads": 16,
        "max_window_layers": 28,
        "tie_word_embeddings": True,
    },
    "qwen3-1.7b": {
        "hidden_size": 2048,
        "intermediate_size": 6144,
        "num_hidden_layers": 28,
        "num_attention_heads": 16,
        "max_window_layers": 28,
        "tie_word_embeddings": True,
    },
}
GEMMA3_270M_CONFIG = {  # google/gemma-3-270m config.json (pre-transformers-5 format)
    "_sliding_window_pattern": 6,
    "architectures": ["Gemma3ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "attn_logit_softcapping": None,
    "bos_token_id": 2,
    "eos_token_id": 1,
    "final_logit_softcapping": None,
    "head_dim": 256,
    "hidden_activation": "gelu_pytorch_tanh",
    "hidden_size": 640,
    "initializer_range": 0.02,
    "intermediate_size": 2048,
    "layer_types": (["sliding_attention"] * 5 + ["full_attention"]) * 3,
    "max_position_embeddings": 32768,
    "model_type": "gemma3_text",
    "num_attention_heads": 4,
    "num_hidden_layers": 18,
    "num_key_value_heads": 1,
    "pad_token_id": 0,
    "query_pre_attn_scalar": 256,
    "rms_norm_eps": 1e-06,
    "rope_local_base_freq": 10000.0,
    "rope_scaling": None,
    "rope_theta": 1000000.0,
    "sliding_window": 512,
    "torch_dtype": "bfloat16",
    "use_bidirectional_attention": False,
    "use_cache": True,
    "vocab_size": 262144,
}

LLAMA_31_8B_CONFIG = {  # meta-llama/Llama-3.1-8B config.json
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 128000,
    "eos_token_id": 128001,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 14336,
    "max_position_embeddings": 131072,
    "mlp_bias": False,
    "model_type": "llama",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "vocab_size": 128256,
}
_LLAMA_32_ROPE = {**LLAMA_31_8B_CONFIG["rope_scaling"], "factor": 32.0}
LLAMA_CONFIGS = {  # the other Llama 3 configs differ from 3.1-8B in these fields
    "llama-3.2-1b": {
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_attention_heads": 32,
        "num_hidden_layers": 16,
        "head_dim": 64,
        "rope_scaling": _LLAMA_32_ROPE,
        "tie_word_embeddings": True,
    },
    "llama-3.2-3b": {
        "hidden_size": 3072,
        "intermediate_size": 8192,
        "num_attention_heads": 24,
        "num_hidden_layers": 28,
        "head_dim": 128,
        "rope_scaling": _LLAMA_32_ROPE,
        "tie_word_embeddings": True,
    },
    "llama-3.1-8b": {},
    "llama-3.3-70b": {
        "hidden_size": 8192,
        "intermediate_size": 28672,
        "num_attention_heads": 64,
        "num_hidden_layers": 80,
        "eos_token_id": [128001, 128008, 128009],
    },
    "llama-3.3-70b-awq": {  # an AWQ GEMM export of Llama-3.3-70B-Instruct
        "hidden_size": 8192,
        "intermediate_size": 28672,
        "num_attention_heads": 64,
        "num_hidden_layers": 80,
        "quantization_config": {
            "bits": 4,
            "group_size": 128,
            "quant_method": "awq",
            "version": "gemm",
            "zero_point": True,
        },
    },
}


# ---- configs and presets ------------------------------------------------------------------------
def test_presets_are_the_real_architectures():
    assert ModelConfig.from_hf(QWEN3_32B_CONFIG) == PRESETS["qwen3-32b"]
    assert ModelConfig.from_hf(QWEN3_32B_AWQ_CONFIG) == PRESETS["qwen3-32b-awq"]
    for name, fields in QWEN3_SMALL_CONFIGS.items():
        assert ModelConfig.from_hf({**QWEN3_32B_CONFIG, **fields}) == PRESETS[name]
    assert ModelConfig.from_hf(GEMMA3_270M_CONFIG) == PRESETS["gemma3-270m"]
    for name, fields in LLAMA_CONFIGS.items():
        assert ModelConfig.from_hf({**LLAMA_31_8B_CONFIG, **fields}) == PRESETS[name]


def test_llama_configs_read_the_same_in_the_transformers5_format():
    transformers = pytest.importorskip("transformers")
    fields = {k: v for k, v in LLAMA_31_8B_CONFIG.items() if k not in ("architectures", "model_type", "torch_dtype")}
    fields["rope_parameters"] = {**fields.pop("rope_scaling"), "rope_theta": fields.pop("rope_theta")}
    saved = transformers.LlamaConfig(**fields).to_dict()
    assert ModelConfig.from_hf(saved) == PRESETS["llama-3.1-8b"]


def test_gemma3_config_without_layer_types_uses_the_sliding_pattern():
    config = ModelConfig.from_hf({k: v for k, v in GEMMA3_270M_CONFIG.items() if k != "layer_types"})
    assert config.layer_types == PRESETS["gemma3-270m"].layer_types
    assert config.layer_types[5] == FULL and config.layer_types.count(SLIDING) == 15


def test_transformers5_config_format_reads_the_same():
    transformers = pytest.importorskip("transformers")
    fields = {k: v for k, v in GEMMA3_270M_CONFIG.items() if not k.startswith("rope") and k != "torch_dtype"}
    fields.pop("_sliding_window_pattern")
    fields.pop("architectures")
    fields.pop("model_type")
    saved = transformers.Gemma3TextConfig(**fields).to_dict()  # rope bases move into rope_parameters
    assert ModelConfig.from_hf(saved) == PRESETS["gemma3-270m"]


@pytest.mark.parametrize(
    "change, message",
    [
        ({"model_type": "mistral"}, "model_type"),
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "RoPE"),
        ({"rope_scaling": LLAMA_31_8B_CONFIG["rope_scaling"]}, "RoPE type 'llama3' is not supported for qwen3"),
        ({"attention_bias": True}, "attention_bias"),
        ({"quantization_config": {"quant_method": "gptq", "bits": 4}}, "gptq"),
        ({"quantization_config": {"quant_method": "awq", "bits": 4, "version": "gemv", "group_size": 128}}, "GEMM"),
    ],
)
def test_unsupported_configs_are_usage_errors(change, message):
    with pytest.raises(UsageError, match=message):
        ModelConfig.from_hf({**QWEN3_32B_CONFIG, **change})


@pytest.mark.parametrize(
    "change, message",
    [
        ({"mlp_bias": True}, "mlp_bias"),
        ({"pretraining_tp": 2}, "pretraining_tp"),
        ({"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, "RoPE type 'dynamic'"),
    ],
)
def test_unsupported_llama_configs_are_usage_errors(change, message):
    with pytest.raises(UsageError, match=message):
        ModelConfig.from_hf({**LLAMA_31_8B_CONFIG, **change})


def test_big_presets_have_the_published_parameter_counts():
    from model.transformer import Transformer

    published = {
        "qwen3-32b": 32.8e9,
        "qwen3-0.6b": 0.6e9,
        "qwen3-1.7b": 1.7e9,
        "gemma3-270m": 0.268e9,
        "llama-3.2-1b": 1.24e9,
        "llama-3.2-3b": 3.21e9,
        "llama-3.1-8b": 8.03e9,
        "llama-3.3-70b": 70.6e9,
    }
    for name, count in published.items():
        with torch.device("meta"):
            model = Transformer(PRESETS[name], torch.bfloat16)
        assert sum(p.numel() for p in model.parameters()) == pytest.approx(count, rel=0.02)


# ---- synthetic presets and usage errors -------------------------------------------------------
def test_synthetic_presets_are_seeded_and_labeled():
    first = load_model("tiny-qwen3", seed=3, max_seq_len=16)
    again = load_model("tiny-qwen3", seed=3, max_seq_len=16)
    other = load_model("tiny-qwen3", seed=4, max_seq_len=16)
    assert first.info == {
        "name": "tiny-qwen3",
        "arch": "qwen3",
        "weights": "synthetic",
        "dtype": "float32",
        "quantization": None,
        "kernel": "dense",
        "kernels": "torch",
        "tokenizer": "synthetic-bytes-512",
    }
    tokens = torch.tensor([first.tokenizer.encode("abc")])
    logits = [loaded.model(tokens, torch.arange(3)) for loaded in (first, again, other)]
    assert torch.isfinite(logits[0]).all()
    assert torch.equal(logits[0], logits[1]) and not torch.equal(logits[0], logits[2])


@pytest.mark.parametrize(
    "name", ["tiny-qwen3-draft", "tiny-gemma3", "tiny-qwen3-awq", "tiny-llama", "tiny-llama-draft", "tiny-llama-awq"]
)
def test_every_tiny_preset_runs(name):
    loaded = load_model(name, dtype="bf16", max_seq_len=16)
    assert loaded.info["dtype"] == "bfloat16"
    hidden = loaded.model.forward_hidden(torch.tensor([[1, 2, 3]]), torch.arange(3))
    assert hidden.dtype == torch.bfloat16 and torch.isfinite(hidden).all()


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"spec": "qwen3-7b"}, "checkpoint not found.*presets: qwen3-32b"),
        ({"spec": "/no/such/folder"}, "checkpoint not found"),
        ({"spec": "tiny-qwen3", "dtype": "int3"}, "unsupported dtype .* float32, bfloat16, float16"),
        ({"spec": "tiny-qwen3", "device": "tpu"}, "device"),
        ({"spec": "tiny-qwen3", "device": f"cuda:{torch.cuda.device_count()}"}, "not available"),
    ],
)
def test_bad_input_is_a_usage_error(kwargs, message):
    with pytest.raises(UsageError, match=message):
        load_model(**kwargs)


def test_folder_without_config_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError, match="no config.json"):
        load_model(str(tmp_path))


def test_dtype_defaults_follow_the_device():
    assert parse_dtype(None, torch.device("cpu")) == torch.float32
    assert parse_dtype("bf16", torch.device("cpu")) == torch.bfloat16
    assert parse_dtype(torch.float16, torch.device("cpu")) == torch.float16


# ---- real checkpoints -------------------------------------------------------------------------
def _tiny_hf_qwen3(seed: int):
    transformers = pytest.importorskip("transformers")
    config = transformers.Qwen3Config(
        vocab_size=320,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
    )
    torch.manual_seed(seed)
    hf_model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    with torch.no_grad():
        for param in hf_model.parameters():
            if param.dim() == 2:
                param.normal_(0.0, 0.1)
    return hf_model


def _write_awq_checkpoint(hf_model, folder, group_size: int) -> None:
    """AutoAWQ's on-disk form: each layer projection as qweight/qzeros/scales, the rest in fp16.
    The HF model's projections are replaced by their dequantized weights: the exact reference."""
    from safetensors.torch import save_file

    tensors = {}
    for name, module in hf_model.named_modules():
        if isinstance(module, nn.Linear) and ".layers." in name:
            awq = AWQLinear.from_float(module, group_size)
            tensors |= {f"{name}.{buffer}": getattr(awq, buffer) for buffer in ("qweight", "qzeros", "scales")}
            with torch.no_grad():
                module.weight.copy_(awq.dequantize())
    quantized = {key.rsplit(".", 1)[0] for key in tensors}
    for name, param in hf_model.named_parameters():
        if name.rsplit(".", 1)[0] not in quantized:
            tensors[name] = param.detach().half()
            with torch.no_grad():
                param.copy_(param.half().float())
    save_file(tensors, str(folder / "model.safetensors"))
    config = hf_model.config.to_dict() | {
        "torch_dtype": "float16",
        "quantization_config": {
            "bits": 4,
            "group_size": group_size,
            "quant_method": "awq",
            "version": "gemm",
            "zero_point": True,
        },
    }
    (folder / "config.json").write_text(json.dumps(config))


def test_awq_checkpoint_round_trip_matches_the_dequantized_model(tmp_path):
    hf_model = _tiny_hf_qwen3(seed=5)
    _write_awq_checkpoint(hf_model, tmp_path, group_size=32)
    loaded = load_model(str(tmp_path), max_seq_len=16)
    assert loaded.info["weights"] == "real" and loaded.info["quantization"] == "awq-int4-g32"
    tokens = torch.randint(0, 320, (1, 12), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        want = hf_model(tokens).logits
    torch.testing.assert_close(loaded.model(tokens, torch.arange(12)), want, rtol=1e-3, atol=1e-3)
    for module in loaded.model.modules():
        if isinstance(module, AWQLinear):
            module.select_kernel("dequant")
    torch.testing.assert_close(loaded.model(tokens, torch.arange(12)), want, rtol=1e-4, atol=1e-4)


def test_checkpoint_with_missing_or_unexpected_weights_is_a_usage_error(tmp_path):
    from safetensors.torch import load_file, save_file

    hf_model = _tiny_hf_qwen3(seed=7)
    hf_model.save_pretrained(tmp_path)
    tensors = load_file(str(tmp_path / "model.safetensors"))
    save_file({k: v for k, v in tensors.items() if "layers.1.mlp" not in k}, str(tmp_path / "model.safetensors"))
    with pytest.raises(UsageError, match="lacks 3 weights"):
        load_model(str(tmp_path))
    save_file(tensors | {"model.extra.weight": torch.zeros(2)}, str(tmp_path / "model.safetensors"))
    with pytest.raises(UsageError, match="unexpected weight model.extra.weight"):
        load_model(str(tmp_path))


# ---- tokenizers -------------------------------------------------------------------------------
def test_synthetic_tokenizer_round_trips_text_and_marks_other_ids():
    tokenizer = SyntheticTokenizer(512)
    ids = tokenizer.encode("héllo")
    assert ids == list("héllo".encode()) and tokenizer.decode(ids) == "héllo"
    assert tokenizer.decode([104, 300, 105]) == "h<300>i"


def _write_hf_tokenizer(folder, words):
    transformers = pytest.importorskip("transformers")
    from tokenizers import Tokenizer, models, pre_tokenizers

    backend = Tokenizer(models.WordLevel({word: i for i, word in enumerate(words)}, unk_token=words[0]))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    transformers.PreTrainedTokenizerFast(tokenizer_object=backend, unk_token=words[0]).save_pretrained(folder)


def test_real_tokenizer_is_loaded_from_the_checkpoint_folder(tmp_path):
    _write_hf_tokenizer(tmp_path, ["[UNK]", "hello", "world"])
    tokenizer = load_tokenizer(tmp_path, "tiny", 320)
    assert isinstance(tokenizer, HFTokenizer) and not tokenizer.synthetic and tokenizer.name == "tiny"
    assert tokenizer.encode("hello world") == [1, 2] and tokenizer.decode([1, 2]) == "hello world"
    assert isinstance(load_tokenizer(tmp_path / "missing", "x", 320), SyntheticTokenizer)


def test_check_compatible_compares_vocab_sizes_and_tokenizers(tmp_path):
    _write_hf_tokenizer(tmp_path / "a", ["[UNK]", "hello", "world"])
    _write_hf_tokenizer(tmp_path / "b", ["[UNK]", "hello", "world"])
    _write_hf_tokenizer(tmp_path / "c", ["[UNK]", "world", "hello"])
    a, b, c = (load_tokenizer(tmp_path / name, name, 320) for name in "abc")
    check_compatible(a, b, 320, 320)
    check_compatible(SyntheticTokenizer(512), SyntheticTokenizer(512), 512, 512)
    with pytest.raises(UsageError, match="vocabularies differ"):
        check_compatible(a, b, 320, 512)
    with pytest.raises(UsageError, match="tokenizers differ"):
        check_compatible(a, c, 320, 320)
    with pytest.raises(UsageError, match="tokenizers differ"):
        check_compatible(a, SyntheticTokenizer(320), 320, 320)
