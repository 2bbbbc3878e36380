"""Our own Qwen3 / Gemma3 / Llama 3 decoder (gpt-fast style) with a static KV cache that we own.

Hugging Face's modeling code is not used at run time: a static cache indexed by device-side
positions is what lets the speculative decoder run without host syncs and under CUDA graphs.
Module and weight names follow Hugging Face's (minus the "model." prefix), so checkpoints map 1:1.
Numerics follow Hugging Face's order of operations (norms in float32, RoPE tables cast to the
activation dtype, Gemma's embedding scale rounded to the weight dtype) so float32 logits match.
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F
from torch import nn

from contracts import UsageError
from model import dense_gemv, fused_ops, triton_support
from model.awq import AWQLinear
from model.awq_triton import FoldedNorm
from model.config import SLIDING, Llama3RopeScaling, ModelConfig


def _rms_normalized(x: torch.Tensor, eps: float) -> torch.Tensor:
    """x / rms(x) in float32, as both families compute it."""
    xf = x.float()
    return xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)


class RMSNorm(nn.Module):
    """Qwen3's RMSNorm: normalize in float32, cast back, then multiply by the weight."""

    def __init__(self, dim: int, eps: float, dtype: torch.dtype | None = None):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim, dtype=dtype))

    def reset_parameters(self) -> None:
        nn.init.ones_(self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * _rms_normalized(x, self.eps).to(x.dtype)


class GemmaRMSNorm(nn.Module):
    """Gemma3's RMSNorm: scales by (1 + weight) in float32, then casts back."""

    def __init__(self, dim: int, eps: float, dtype: torch.dtype | None = None):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(dim, dtype=dtype))

    def reset_parameters(self) -> None:
        nn.init.zeros_(self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (_rms_normalized(x, self.eps) * (1.0 + self.weight.float())).to(x.dtype)


def _norm(config: ModelConfig, dim: int, dtype: torch.dtype | None) -> nn.Module:
    norm = GemmaRMSNorm if config.arch == "gemma3" else RMSNorm
    return norm(dim, config.rms_norm_eps, dtype)


def _linear(config: ModelConfig, in_features: int, out_features: int, dtype: torch.dtype | None) -> nn.Module:
    if config.quant == "awq":
        return AWQLinear(in_features, out_features, config.awq_group_size)
    return nn.Linear(in_features, out_features, bias=False, dtype=dtype)


def rope_tables(
    theta: float, head_dim: int, max_seq_len: int, scaling: Llama3RopeScaling | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [max_seq_len, head_dim] in float32, computed like Hugging Face's default or llama3
    RoPE (on the CPU, so every device gets the same table)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float, device="cpu") / head_dim))
    if scaling is not None:
        inv_freq = _llama3_frequencies(inv_freq, scaling)
    freqs = torch.arange(max_seq_len, device="cpu").float()[:, None] * inv_freq[None, :]
    angles = torch.cat((freqs, freqs), dim=-1)
    return angles.cos(), angles.sin()


def _llama3_frequencies(inv_freq: torch.Tensor, scaling: Llama3RopeScaling) -> torch.Tensor:
    """Llama 3.1's scaled frequencies, in Hugging Face's order of float32 operations: low frequencies
    divided by the factor, high ones kept, the band between interpolated smoothly."""
    low_freq_wavelen = scaling.original_max_positions / scaling.low_freq_factor
    high_freq_wavelen = scaling.original_max_positions / scaling.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / scaling.factor, inv_freq)
    smooth = (scaling.original_max_positions / wavelen - scaling.low_freq_factor) / (
        scaling.high_freq_factor - scaling.low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(medium, smoothed, scaled)


def tree_visible(slots: torch.Tensor, ancestors: torch.Tensor, base: torch.Tensor) -> torch.Tensor:
    """The tree rule as a boolean mask [n, slots]: query i sees every slot below `base` (the committed
    context and the round's root token) and the slots base + j whose bit j is set in `ancestors[i]`
    (its ancestors and itself among the tree's nodes, one slot per node in breadth-first order)."""
    offset = slots[None, :] - base
    inside = (offset >= 0) & (offset < 64)
    bits = (ancestors[:, None] >> offset.clamp(0, 63)) & 1
    return (offset < 0) | (inside & (bits == 1))


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def _rope_name(table: str, sliding: bool) -> str:
    return f"rope_{table}_{'sliding' if sliding else 'full'}"


@functools.cache
def _rounded(value: float, dtype: torch.dtype) -> float:
    """`value` as `dtype` stores it (Gemma's embedding scale is applied in the weight dtype)."""
    return torch.tensor(value, dtype=dtype, device="cpu").item()


def _merged(layers: list[nn.Module]) -> nn.Module:
    """One projection whose outputs are the given projections' outputs side by side (one GEMM)."""
    if all(isinstance(layer, AWQLinear) for layer in layers):
        return AWQLinear.concat(layers)
    weight = torch.cat([layer.weight for layer in layers])
    merged = nn.Linear(weight.shape[1], weight.shape[0], bias=False, device="meta", dtype=weight.dtype)
    merged.weight = nn.Parameter(weight, requires_grad=False)
    return merged


class MLP(nn.Module):
    def __init__(self, config: ModelConfig, dtype: torch.dtype | None):
        super().__init__()
        self.gate_proj = _linear(config, config.hidden_size, config.intermediate_size, dtype)
        self.up_proj = _linear(config, config.hidden_size, config.intermediate_size, dtype)
        self.down_proj = _linear(config, config.intermediate_size, config.hidden_size, dtype)
        self.tanh_gelu = config.hidden_activation == "gelu_pytorch_tanh"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = self.gate_proj(x)
        gate = F.gelu(gate, approximate="tanh") if self.tanh_gelu else F.silu(gate)
        return self.down_proj(gate * self.up_proj(x))


class Attention(nn.Module):
    """Grouped-query attention with per-head q/k RMSNorm (not in Llama), RoPE, and a static KV cache.

    The cache [1, n_kv_heads, max_seq_len, head_dim] is indexed by absolute position. The query
    heads that share a KV head are stacked along the query axis ([1, n_kv, group * n, head_dim]),
    so SDPA reads the cache once per KV head instead of from a repeated copy.
    """

    def __init__(self, config: ModelConfig, layer_idx: int, dtype: torch.dtype | None):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = config.n_heads, config.n_kv_heads, config.head_dim
        self.scale = config.attention_scale
        self.sliding = config.layer_types[layer_idx] == SLIDING
        self.q_proj = _linear(config, config.hidden_size, config.n_heads * config.head_dim, dtype)
        self.k_proj = _linear(config, config.hidden_size, config.n_kv_heads * config.head_dim, dtype)
        self.v_proj = _linear(config, config.hidden_size, config.n_kv_heads * config.head_dim, dtype)
        self.o_proj = _linear(config, config.n_heads * config.head_dim, config.hidden_size, dtype)
        self.q_norm = _norm(config, config.head_dim, dtype) if config.qk_norm else nn.Identity()
        self.k_norm = _norm(config, config.head_dim, dtype) if config.qk_norm else nn.Identity()
        self.register_buffer("k_cache", None, persistent=False)  # allocated by setup_cache
        self.register_buffer("v_cache", None, persistent=False)

    def use_cache(self, k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
        """This layer's caches [1, n_kv_heads, max_seq_len, head_dim]: views into the model's `kv_caches`."""
        self.register_buffer("k_cache", k_cache, persistent=False)
        self.register_buffer("v_cache", v_cache, persistent=False)

    def forward(self, x, pos, cos, sin, mask) -> torch.Tensor:
        n = x.shape[1]
        q = self.q_norm(self.q_proj(x).view(1, n, self.n_heads, self.head_dim)).transpose(1, 2)
        k = self.k_norm(self.k_proj(x).view(1, n, self.n_kv_heads, self.head_dim)).transpose(1, 2)
        v = self.v_proj(x).view(1, n, self.n_kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        self.k_cache.index_copy_(2, pos, k.to(self.k_cache.dtype))
        self.v_cache.index_copy_(2, pos, v.to(self.v_cache.dtype))
        q = q.reshape(1, self.n_kv_heads, -1, self.head_dim)  # row r*n + i: head (kv*group + r), token i
        slots = mask.shape[-1]  # the whole cache, or on the CPU the prefix any query sees (_attention_inputs)
        keys, values = self.k_cache[:, :, :slots], self.v_cache[:, :, :slots]
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=self.scale)
        out = out.reshape(1, self.n_heads, n, self.head_dim).transpose(1, 2).reshape(1, n, -1)
        return self.o_proj(out)


class Qwen3Block(nn.Module):
    """Pre-norm block (Qwen3 and Llama): x + attn(norm(x)), then h + mlp(norm(h))."""

    def __init__(self, config: ModelConfig, layer_idx: int, dtype: torch.dtype | None):
        super().__init__()
        self.self_attn = Attention(config, layer_idx, dtype)
        self.mlp = MLP(config, dtype)
        self.input_layernorm = _norm(config, config.hidden_size, dtype)
        self.post_attention_layernorm = _norm(config, config.hidden_size, dtype)

    def forward(self, x, pos, cos, sin, mask):
        h = x + self.self_attn(self.input_layernorm(x), pos, cos, sin, mask)
        return h + self.mlp(self.post_attention_layernorm(h))


class Gemma3Block(nn.Module):
    """Sandwich-norm block: the attention and MLP outputs are normalized again before the residual."""

    def __init__(self, config: ModelConfig, layer_idx: int, dtype: torch.dtype | None):
        super().__init__()
        self.self_attn = Attention(config, layer_idx, dtype)
        self.mlp = MLP(config, dtype)
        self.input_layernorm = _norm(config, config.hidden_size, dtype)
        self.post_attention_layernorm = _norm(config, config.hidden_size, dtype)
        self.pre_feedforward_layernorm = _norm(config, config.hidden_size, dtype)
        self.post_feedforward_layernorm = _norm(config, config.hidden_size, dtype)

    def forward(self, x, pos, cos, sin, mask):
        h = x + self.post_attention_layernorm(self.self_attn(self.input_layernorm(x), pos, cos, sin, mask))
        return h + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(h)))


class Transformer(nn.Module):
    """A decoder-only LM for batch size 1 whose KV cache is a static buffer indexed by position.

    Cache and position contract (what the speculative decoder relies on):
    - `setup_cache(max_seq_len)` allocates, per layer, K and V of [1, n_kv_heads, max_seq_len,
      head_dim]; slot p holds the token at absolute position p. Positions run 0 .. max_seq_len-1.
    - `forward_hidden(tokens, pos)` writes the new tokens' K/V at slots `pos`, then every query at
      position p attends over the whole cache with the mask `slot <= p` (and `slot > p - window` in
      Gemma's sliding layers). Slots below p must hold the tokens the caller means to precede p.
    - Nothing else is state: slots above a query's position are masked, whatever they hold. So
      "cropping" after a rejected speculation costs nothing: the caller writes the next tokens at
      the right positions and the stale slots are overwritten or masked.
    - `pos` is a device tensor: no `.item()`, no value-dependent Python branch, no value-dependent
      shape. A call is CUDA-graph capturable, one graph per number of new tokens n. On the CPU,
      which captures no graphs, attention reads the cache only up to the last slot the mask lets
      any query see: the masked tail adds exact zeros, and reading it made every step's cost grow
      with the cache's size rather than the context (Gemma 3 270M: about 11 ms more a step at
      4,200 slots than at 1,100).
    """

    def __init__(self, config: ModelConfig, dtype: torch.dtype | None = None):
        super().__init__()
        self.config = config
        block = Gemma3Block if config.arch == "gemma3" else Qwen3Block
        # Left uninitialized (loading fills it): nn.Embedding's own normal_ init, run on the meta device,
        # keeps the gloo process group alive past destroy_process_group (torch 2.13), and its threads
        # then abort the process at exit.
        table = torch.empty(config.vocab_size, config.hidden_size, dtype=dtype)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, _weight=table)
        self.layers = nn.ModuleList(block(config, i, dtype) for i in range(config.n_layers))
        self.norm = _norm(config, config.hidden_size, dtype)
        self.lm_head = (
            None
            if config.tie_word_embeddings
            else nn.Linear(config.hidden_size, config.vocab_size, bias=False, dtype=dtype)
        )
        self.max_seq_len = 0
        self.kernels = "torch"  # or "fused": see use_fused_kernels
        # fused attention's split-KV (None: off)
        self.attention_split_slots = fused_ops.split_slots_for(config.n_heads, config.n_kv_heads)
        self.qkv_in_attention = True  # decode widths: q/k norms, RoPE, cache write in the attention (qkv_attention)
        self.gemv_route = dense_gemv.OFF  # fused projections of few rows through model/dense_gemv.py (attach)
        self.persistent_body = None  # one-token forwards in one kernel (model/persistent_body.py, attach)
        # an int4 model's decode forwards: each layer's RMSNorms folded into the GEMMs around them (_folds_norms)
        self.norms_in_gemms = True
        self._fused_projections: tuple[nn.Module, ...] = ()  # every layer's four projections (use_fused_kernels)
        self._layer_kinds = sorted({layer.self_attn.sliding for layer in self.layers})  # False: full, True: sliding

    def setup_cache(
        self, max_seq_len: int, device: torch.device | str | None = None, dtype: torch.dtype | None = None
    ) -> None:
        """Allocates zeroed K/V caches, RoPE tables and slot indices for positions < max_seq_len on
        `device` in `dtype` (the model's, by default). Replaces any earlier cache, so graphs
        captured before must be captured again. Every layer's K and V cache is a view into one tensor,
        `kv_caches` [layers, 2, 1, n_kv_heads, max_seq_len, head_dim], so that moving slots in all of
        them (a tree round's compaction, model/tree_rounds.py) is one copy, not four per layer."""
        device = torch.device(device) if device is not None else self.embed_tokens.weight.device
        dtype = dtype or self.embed_tokens.weight.dtype
        first = self.layers[0].self_attn
        shape = (len(self.layers), 2, 1, first.n_kv_heads, max_seq_len, first.head_dim)
        self.register_buffer("kv_caches", torch.zeros(shape, device=device, dtype=dtype), persistent=False)
        for layer, (k_cache, v_cache) in zip(self.layers, self.kv_caches):
            layer.self_attn.use_cache(k_cache, v_cache)
        self.register_buffer("slots", torch.arange(max_seq_len, device=device), persistent=False)
        tickets = fused_ops.attention_tickets(self.config.n_heads, self.config.n_kv_heads, device)
        self.register_buffer("attention_tickets", tickets, persistent=False)
        for sliding in self._layer_kinds:
            theta = self.config.local_rope_theta if sliding else self.config.rope_theta
            cos, sin = rope_tables(theta, self.config.head_dim, max_seq_len, self.config.rope_scaling)
            self.register_buffer(_rope_name("cos", sliding), cos.to(device, dtype), persistent=False)
            self.register_buffer(_rope_name("sin", sliding), sin.to(device, dtype), persistent=False)
        self.max_seq_len = max_seq_len

    def _attention_inputs(self, pos: torch.Tensor, sliding: bool, tree=None) -> tuple[torch.Tensor, ...]:
        """(cos, sin, mask) for one kind of layer: RoPE rows [n, head_dim] of the positions, and the
        boolean mask [group * n, slots] (the whole cache; on the CPU up to the last visible slot) in
        Attention's stacked-query order (with `tree`, the explicit form of the tree rule: the
        reference the fused kernel is tested against)."""
        rope = pos if tree is None else tree[0]
        if tree is None:
            allowed = self.slots[None, :] <= pos[:, None]
        else:
            allowed = tree_visible(self.slots, tree[1], tree[2])
        if sliding:  # tree slots hold positions within MAX_NODES of their queries: inside any real window
            near = self.slots[None, :] > rope[:, None] - self.config.sliding_window
            allowed = allowed & (near if tree is None else near | (self.slots >= tree[2])[None, :])
        group = self.config.n_heads // self.config.n_kv_heads
        cos = getattr(self, _rope_name("cos", sliding))[rope]
        sin = getattr(self, _rope_name("sin", sliding))[rope]
        if pos.device.type == "cpu":  # no graph to keep static: up to the last slot any query sees
            allowed = allowed[:, : int(allowed.any(0).nonzero()[-1]) + 1]
        return cos, sin, allowed.repeat(group, 1)

    def forward_hidden(self, tokens: torch.Tensor, pos: torch.Tensor, tree=None, split_kv: bool = True) -> torch.Tensor:
        """tokens LongTensor [1, n], pos LongTensor [n] (on the model's device) -> hidden states
        [1, n, hidden] after the final norm. Writes the tokens' K/V at slots `pos`; see the class
        docstring for the cache contract. `tree` (rope [n], ancestors [n], base [1]): tree attention
        instead of the causal rule (`tree_visible`); the tokens are rotated at positions `rope`.
        `split_kv` False: the fused attention runs path-ordered whatever `attention_split_slots` says
        (a tree decoder's choice per forward, so that other decoders on the same model keep theirs)."""
        if self.max_seq_len == 0:
            raise RuntimeError("call setup_cache() before forward_hidden()")
        if tokens.dim() != 2 or tokens.shape[0] != 1 or pos.shape != (tokens.shape[1],):
            raise ValueError(f"expected tokens [1, n] and pos [n], got {tuple(tokens.shape)} and {tuple(pos.shape)}")
        if self.kernels == "fused":
            return self._forward_fused(tokens, pos, tree, self.attention_split_slots if split_kv else None)
        attention_inputs = {sliding: self._attention_inputs(pos, sliding, tree) for sliding in self._layer_kinds}
        x = self.embed_tokens(tokens)
        if self.config.arch == "gemma3":
            x = x * _rounded(self.config.hidden_size**0.5, x.dtype)
        for layer in self.layers:
            x = layer(x, pos, *attention_inputs[layer.self_attn.sliding])
        return self.norm(x)

    @property
    def fused_kernels_cover(self) -> bool:
        """Whether model/fused_ops.py implements this architecture (Qwen3 and Llama, full attention only)."""
        return self.config.arch in ("qwen3", "llama") and self._layer_kinds == [False]

    def use_fused_kernels(self) -> None:
        """Runs forward_hidden through model/fused_ops.py (Qwen3 and Llama). Merges each layer's q/k/v
        projections into `qkv_proj` and gate/up into `gate_up_proj`, one GEMM each; the separate
        modules are removed, so load weights (and quantize) first."""
        if not self.fused_kernels_cover:
            raise UsageError(f"fused kernels cover Qwen3 and Llama with full attention only, not {self.config.arch}")
        device = self.embed_tokens.weight.device
        if not triton_support.runs_on(device):
            raise UsageError(f"fused kernels need triton and CUDA; they cannot run on {device} here")
        projections = []
        for layer in self.layers:
            attn, mlp = layer.self_attn, layer.mlp
            attn.qkv_proj = _merged([attn.q_proj, attn.k_proj, attn.v_proj])
            mlp.gate_up_proj = _merged([mlp.gate_proj, mlp.up_proj])
            if isinstance(mlp.gate_up_proj, AWQLinear):
                mlp.gate_up_proj.gate_up = True
            for early in (attn.qkv_proj, mlp.gate_up_proj, mlp.down_proj):  # launched early (awq_triton: not o)
                if isinstance(early, AWQLinear):
                    early.launch_early = True
            del attn.q_proj, attn.k_proj, attn.v_proj, mlp.gate_proj, mlp.up_proj
            projections += [attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj]
        self._fused_projections = tuple(projections)  # _folds_norms reads them each eager forward
        self.kernels = "fused"

    def checkpoint_state_dict(self) -> dict[str, torch.Tensor]:
        """The state dict under the checkpoint's (Hugging Face's) names: with fused kernels, each merged
        projection is split back into views of its tensors (no copy)."""
        c = self.config
        parts = {
            "self_attn.qkv_proj": {
                "q_proj": c.n_heads * c.head_dim,
                "k_proj": c.n_kv_heads * c.head_dim,
                "v_proj": c.n_kv_heads * c.head_dim,
            },
            "mlp.gate_up_proj": {"gate_proj": c.intermediate_size, "up_proj": c.intermediate_size},
        }
        out = {}
        for name, tensor in self.state_dict().items():
            merged = next((m for m in parts if f".{m}." in name), None)
            if merged is None:
                out[name] = tensor
                continue
            prefix, field = name.split(f"{merged}.")
            module = merged.split(".")[0]
            # nn.Linear weights are [out, in]; AWQ buffers are [in or groups, out], packed 8 per int32.
            dim, per = (0, 1) if field == "weight" else (1, 8 if field in ("qweight", "qzeros") else 1)
            pieces = tensor.split([size // per for size in parts[merged].values()], dim=dim)
            out.update({f"{prefix}{module}.{part}.{field}": piece for part, piece in zip(parts[merged], pieces)})
        return out

    def _forward_fused(self, tokens: torch.Tensor, pos: torch.Tensor, tree=None, split_slots=None) -> torch.Tensor:
        """forward_hidden in a few launches per layer (model/fused_ops.py): at decode widths the q/k norms,
        RoPE and cache write run inside the attention kernel, otherwise in their own; each residual add is
        fused into the next norm, or on an int4 model both into its GEMMs (_folds_norms). A one-token
        forward without a tree takes the persistent kernel where one is attached (model/persistent_body.py)."""
        if self.persistent_body is not None and tokens.shape[1] == 1 and tree is None:
            return self.persistent_body.forward(tokens, pos)
        eps, route = self.config.rms_norm_eps, self.gemv_route
        cos, sin = getattr(self, _rope_name("cos", False)), getattr(self, _rope_name("sin", False))
        qk_norms = self.config.qk_norm
        one_launch = self.qkv_in_attention and fused_ops.takes_qkv(tokens.shape[1], split_slots, tree)
        folds = self._folds_norms(tokens.shape[1])
        h, delta, squares = self.embed_tokens(tokens[0]), None, None
        next_norms = [layer.input_layernorm.weight for layer in self.layers[1:]] + [self.norm.weight]
        for layer, next_norm in zip(self.layers, next_norms):
            attn, mlp = layer.self_attn, layer.mlp
            if squares is None:
                h, x = fused_ops.rms_norm(h, layer.input_layernorm.weight, eps, delta)
                qkv = route.project(attn.qkv_proj, x)
            else:
                qkv = attn.qkv_proj(x, FoldedNorm(eps, squares))
            prepare = (
                attn.q_norm.weight if qk_norms else None,
                attn.k_norm.weight if qk_norms else None,
                cos,
                sin,
                pos,
                attn.k_cache,
                attn.v_cache,
                attn.n_heads,
                eps,
            )
            if one_launch:
                out = fused_ops.qkv_attention(qkv, *prepare, attn.scale, split_slots, self.attention_tickets)
            else:
                q = fused_ops.qk_norm_rope_cache(qkv, *prepare, rope=None if tree is None else tree[0])
                out = fused_ops.attention(
                    q, attn.k_cache, attn.v_cache, pos, attn.scale, split_slots, tree, self.attention_tickets
                )
            if folds:
                h, x, squares = attn.o_proj.onto(out, h, layer.post_attention_layernorm.weight)
                activation = mlp.gate_up_proj.swiglu(x, FoldedNorm(eps, squares))
                h, x, squares = mlp.down_proj.onto(activation, h, next_norm)
            else:
                h, x = fused_ops.rms_norm(
                    h, layer.post_attention_layernorm.weight, eps, route.project(attn.o_proj, out)
                )
                delta = route.mlp(mlp, x)
        return fused_ops.rms_norm(h, self.norm.weight, eps, delta)[1][None]

    def _folds_norms(self, rows: int) -> bool:
        """Whether a fused forward of `rows` rows folds each layer's RMSNorms into its int4 GEMMs: o_proj and
        down_proj add onto the residual stream and write its rows times the next norm's weight with their sums
        of squares; the q/k/v and gate/up GEMMs after them take those rows and scale their sums by each row's
        1 / RMS (awq_triton.FoldedNorm). The first layer's input norm and the last norm stay kernels. Every
        projection must run our Triton GEMM at these rows (AWQLinear.folds_norms)."""
        if not self.norms_in_gemms or self.config.quant != "awq":
            return False
        projections = self._fused_projections
        return bool(projections) and all(isinstance(p, AWQLinear) and p.folds_norms(rows) for p in projections)

    @property
    def head_weight(self) -> torch.Tensor:
        """LM head [vocab, hidden]: the embedding table when tied."""
        return self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[..., hidden] -> [..., vocab] (Gemma3 has no final logit softcapping; configs with one are rejected)."""
        return F.linear(hidden, self.head_weight)

    def forward(self, tokens: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        return self.logits(self.forward_hidden(tokens, pos))

    def body_parameters_bytes(self) -> int:
        """Bytes of weights one forward streams without the head: the layers and the final norm.
        The embedding table is left out (a step reads only its tokens' rows)."""
        tensors = [*self.layers.state_dict().values(), *self.norm.state_dict().values()]
        return sum(t.numel() * t.element_size() for t in tensors)

    def head_bytes(self) -> int:
        return self.head_weight.numel() * self.head_weight.element_size()
