"""Architecture of a Qwen3, Gemma3 or Llama 3 decoder, read from a Hugging Face config.json or a preset."""

from __future__ import annotations

from dataclasses import dataclass

from contracts import UsageError

ARCHS = ("qwen3", "gemma3", "llama")
FULL, SLIDING = "full_attention", "sliding_attention"
ACTIVATIONS = ("silu", "gelu_pytorch_tanh")
_DEFAULT_ROPE_THETA = {"qwen3": 10_000.0, "gemma3": 1_000_000.0, "llama": 10_000.0}
_DEFAULT_GEMMA_LOCAL_ROPE_THETA = 10_000.0
_DEFAULT_GEMMA_SLIDING_PATTERN = 6  # 5 sliding layers, then 1 full layer


@dataclass(frozen=True)
class Llama3RopeScaling:
    """Llama 3.1's RoPE frequency scaling: wavelengths longer than original_max_positions / low_freq_factor
    are stretched by `factor`, those shorter than original_max_positions / high_freq_factor are kept,
    and the band between is interpolated (Hugging Face's `rope_type: llama3`)."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_positions: int

    @classmethod
    def from_hf(cls, entry: dict) -> Llama3RopeScaling:
        return cls(
            float(entry["factor"]),
            float(entry["low_freq_factor"]),
            float(entry["high_freq_factor"]),
            int(entry["original_max_position_embeddings"]),
        )


@dataclass(frozen=True)
class ModelConfig:
    """Shapes and constants of one decoder; everything the forward pass depends on.

    `layer_types[i]` is FULL or SLIDING ("full_attention" / "sliding_attention", Hugging Face's words);
    sliding layers see the last `sliding_window` positions (their own included) and use RoPE base
    `rope_local_base_freq`. `query_pre_attn_scalar` sets the attention scale (Gemma3); None means
    head_dim (Qwen3, Llama). Llama has no per-head q/k norm; `rope_scaling` is its llama3 frequency
    scaling (None: plain RoPE). `quant="awq"` makes every projection inside the layers an AWQ int4 linear with
    groups of `awq_group_size` input features; embeddings, norms and the LM head stay dense.
    """

    arch: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    rope_theta: float
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    hidden_activation: str = "silu"
    layer_types: tuple[str, ...] = ()
    sliding_window: int | None = None
    rope_local_base_freq: float | None = None
    query_pre_attn_scalar: float | None = None
    quant: str | None = None
    awq_group_size: int | None = None
    max_positions: int = 40960  # the longest sequence the model is made for (max_position_embeddings)
    rope_scaling: Llama3RopeScaling | None = None

    def __post_init__(self):
        if not self.layer_types:
            object.__setattr__(self, "layer_types", (FULL,) * self.n_layers)
        object.__setattr__(self, "layer_types", tuple(self.layer_types))
        self._validate()

    def _validate(self):
        if self.arch not in ARCHS:
            raise UsageError(f"unsupported architecture {self.arch!r} (supported: {', '.join(ARCHS)})")
        if self.hidden_activation not in ACTIVATIONS:
            raise UsageError(f"unsupported activation {self.hidden_activation!r} (supported: {', '.join(ACTIVATIONS)})")
        if self.n_heads % self.n_kv_heads:
            raise UsageError(f"{self.n_heads} attention heads are not a multiple of {self.n_kv_heads} KV heads")
        if len(self.layer_types) != self.n_layers or set(self.layer_types) - {FULL, SLIDING}:
            raise UsageError(f"layer_types must name {FULL!r} or {SLIDING!r} for each of {self.n_layers} layers")
        if SLIDING in self.layer_types and not self.sliding_window:
            raise UsageError("sliding-window layers need a sliding_window size")
        if self.quant not in (None, "awq"):
            raise UsageError(f"unsupported quantization {self.quant!r} (supported: awq)")
        if self.quant == "awq":
            group = self.awq_group_size
            dims = (self.hidden_size, self.intermediate_size, self.n_heads * self.head_dim)
            if not group or any(d % group for d in dims):
                raise UsageError(f"AWQ group size {group} must divide the layer widths {dims}")

    @property
    def qk_norm(self) -> bool:
        """Whether each attention head's q and k are RMS-normalized before RoPE (not in Llama)."""
        return self.arch != "llama"

    @property
    def attention_scale(self) -> float:
        return (self.query_pre_attn_scalar or self.head_dim) ** -0.5

    @property
    def local_rope_theta(self) -> float:
        return self.rope_local_base_freq or self.rope_theta

    @classmethod
    def from_hf(cls, cfg: dict) -> ModelConfig:
        """Reads a Hugging Face config.json dict (Qwen3ForCausalLM, Gemma3ForCausalLM or LlamaForCausalLM,
        AWQ GEMM included). Raises UsageError for anything our forward would not compute exactly."""
        model_type = cfg.get("model_type")
        if model_type in ("qwen3", "llama"):
            arch = model_type
        elif model_type == "gemma3_text":
            arch = "gemma3"
        elif model_type == "gemma3":
            raise UsageError("multimodal Gemma3 checkpoints are not supported; use a text-only Gemma3ForCausalLM")
        else:
            raise UsageError(f"unsupported model_type {model_type!r} (supported: qwen3, gemma3_text, llama)")
        _reject_unsupported(cfg)
        n_layers = cfg["num_hidden_layers"]
        n_heads = cfg["num_attention_heads"]
        full_theta, local_theta = _rope_thetas(cfg, arch)
        rope_scaling = _llama3_scaling(cfg) if arch == "llama" else None
        layer_types = cfg.get("layer_types") or _default_layer_types(cfg, arch, n_layers)
        sliding_window = cfg.get("sliding_window") if SLIDING in layer_types else None
        quant, group = _quantization(cfg)
        return cls(
            arch=arch,
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            n_layers=n_layers,
            n_heads=n_heads,
            n_kv_heads=cfg.get("num_key_value_heads") or n_heads,
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // n_heads,
            rope_theta=full_theta,
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            tie_word_embeddings=cfg.get("tie_word_embeddings", arch == "gemma3"),
            hidden_activation=cfg.get("hidden_activation") or cfg.get("hidden_act") or "silu",
            layer_types=tuple(layer_types),
            sliding_window=sliding_window,
            rope_local_base_freq=local_theta if arch == "gemma3" else None,
            query_pre_attn_scalar=cfg.get("query_pre_attn_scalar", 256) if arch == "gemma3" else None,
            quant=quant,
            awq_group_size=group,
            max_positions=cfg.get("max_position_embeddings") or 40960,
            rope_scaling=rope_scaling,
        )


def _reject_unsupported(cfg: dict) -> None:
    for key in ("attention_bias", "mlp_bias"):
        if cfg.get(key):
            raise UsageError(f"{key}=true is not supported")
    if cfg.get("pretraining_tp", 1) != 1:
        raise UsageError("pretraining_tp other than 1 is not supported")
    for key in ("final_logit_softcapping", "attn_logit_softcapping"):
        if cfg.get(key) is not None:
            raise UsageError(f"{key} is not supported")
    if cfg.get("use_bidirectional_attention"):
        raise UsageError("use_bidirectional_attention=true is not supported")


def _rope_type(entry: dict | None) -> str:
    entry = entry or {}
    return entry.get("rope_type", entry.get("type", "default"))


def _rope_theta_of(entry: dict | None, default: float, arch: str) -> float:
    """RoPE base of one rope_parameters / rope_scaling entry; plain RoPE, and in Llama llama3 scaling
    (whose parameters `_llama3_scaling` reads)."""
    entry = entry or {}
    rope_type = _rope_type(entry)
    supported = ("default", "llama3") if arch == "llama" else ("default",)
    if rope_type not in supported:
        raise UsageError(f"RoPE type {rope_type!r} is not supported for {arch} (supported: {', '.join(supported)})")
    return float(entry.get("rope_theta", default))


def _llama3_scaling(cfg: dict) -> Llama3RopeScaling | None:
    """The llama3 frequency scaling of a Llama config (transformers 5's rope_parameters, or rope_scaling)."""
    entry = cfg.get("rope_parameters") or cfg.get("rope_scaling")
    return Llama3RopeScaling.from_hf(entry) if _rope_type(entry) == "llama3" else None


def _rope_thetas(cfg: dict, arch: str) -> tuple[float, float]:
    """(full-attention base, sliding-attention base) from either config format: transformers 5's
    `rope_parameters` (per layer type for Gemma3) or the older `rope_theta` / `rope_local_base_freq`."""
    default_full = _DEFAULT_ROPE_THETA[arch]
    params = cfg.get("rope_parameters")
    if params:
        if FULL in params or SLIDING in params:
            full = _rope_theta_of(params.get(FULL), default_full, arch)
            return full, _rope_theta_of(params.get(SLIDING), _DEFAULT_GEMMA_LOCAL_ROPE_THETA, arch)
        theta = _rope_theta_of(params, default_full, arch)
        return theta, theta
    full = _rope_theta_of(cfg.get("rope_scaling"), float(cfg.get("rope_theta", default_full)), arch)
    local_default = _DEFAULT_GEMMA_LOCAL_ROPE_THETA if arch == "gemma3" else full
    return full, float(cfg.get("rope_local_base_freq", local_default))


def _default_layer_types(cfg: dict, arch: str, n_layers: int) -> list[str]:
    """Hugging Face's rule when config.json has no layer_types."""
    if arch == "gemma3":
        pattern = (
            cfg.get("sliding_window_pattern") or cfg.get("_sliding_window_pattern") or _DEFAULT_GEMMA_SLIDING_PATTERN
        )
        return [SLIDING if (i + 1) % pattern else FULL for i in range(n_layers)]
    if cfg.get("use_sliding_window") and cfg.get("sliding_window"):
        first_sliding = cfg.get("max_window_layers", n_layers)
        return [SLIDING if i >= first_sliding else FULL for i in range(n_layers)]
    return [FULL] * n_layers


def _quantization(cfg: dict) -> tuple[str | None, int | None]:
    qc = cfg.get("quantization_config")
    if not qc:
        return None, None
    method = qc.get("quant_method")
    if method != "awq":
        raise UsageError(f"unsupported quantization method {method!r} (supported: awq)")
    version = str(qc.get("version", "gemm")).lower()
    if qc.get("bits", 4) != 4 or version != "gemm" or not qc.get("zero_point", True):
        raise UsageError(
            f"only 4-bit AWQ GEMM checkpoints with zero points are supported "
            f"(got bits={qc.get('bits')}, version={version}, zero_point={qc.get('zero_point')})"
        )
    return "awq", int(qc.get("group_size", 128))
