"""AWQ int4 linear layer holding AutoAWQ's GEMM checkpoint layout, with the fastest forward that works.

Layout, exactly as AutoAWQ GEMM checkpoints store it (W has shape [in, out], y = x @ W):
  qweight int32 [in, out/8]        eight 4-bit codes q per int32
  qzeros  int32 [in/group, out/8]  eight 4-bit zero points z per int32
  scales  fp16  [in/group, out]    W = (q - z) * s, one (z, s) per group of `group` input rows
Within an int32, nibble i (bits 4i..4i+3) holds column AWQ_PACK_ORDER[i] of its block of 8 columns.

From model/awq_prefill.PREFILL_ROWS rows up (prefill), a layer that load_model prepared dequantizes into
a buffer its model shares and calls torch.matmul instead (model/awq_prefill.py says why).

Forward kernels, tried in this order by `select_kernel` (the first that runs here and agrees with
the dequantized reference on a probe input wins; `kernel` names it):
  triton         our Triton w4a16 GEMM (model/awq_triton.py) after a one-time repack into planes, on
                 CUDA; on the CPU under triton's interpreter only when named (slow, for tests; not
                 bfloat16)
  awq_ext        AutoAWQ's compiled CUDA GEMM, when `awq_ext` is installed (fp16 activations)
  int4pack_cuda  torch.ops.aten._weight_int4pack_mm after a one-time repack (bf16 activations)
  int4pack_cpu   torch.ops.aten._weight_int4pack_mm_for_cpu after a one-time repack
  dequant        dequantize to a dense weight, then matmul: the reference, works everywhere
torch's int4pack ("tinygemm") computes W = (q - 8) * s + zero, so the repack stores
zero = (8 - z) * s, which equals AWQ's (q - z) * s.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from model import awq_prefill, awq_triton, fused_ops, triton_support

AWQ_PACK_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
_NIBBLE_OF_COLUMN = tuple(AWQ_PACK_ORDER.index(column) for column in range(8))
KERNELS = ("triton", "awq_ext", "int4pack_cuda", "int4pack_cpu", "dequant")
_TINYGEMM_MIDPOINT = 8
_TINYGEMM_GROUP_SIZES = (32, 64, 128, 256)


class KernelUnavailable(RuntimeError):
    """The kernel cannot run for this layer here (missing library, wrong device or shape)."""


def pack_int4(values: torch.Tensor) -> torch.Tensor:
    """[rows, cols] codes in 0..15 -> int32 [rows, cols/8] in AWQ's interleaved nibble order."""
    rows, cols = values.shape
    blocks = values.to(torch.int64).view(rows, cols // 8, 8)
    packed = torch.zeros(rows, cols // 8, dtype=torch.int64, device=values.device)
    for nibble, column in enumerate(AWQ_PACK_ORDER):
        packed |= blocks[:, :, column] << (4 * nibble)
    return awq_triton.int32_bits(packed)


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """int32 [rows, cols/8] in AWQ's nibble order -> int32 [rows, cols] codes in 0..15."""
    shifts = torch.tensor([4 * n for n in _NIBBLE_OF_COLUMN], dtype=torch.int32, device=packed.device)
    return ((packed.unsqueeze(-1) >> shifts) & 0xF).view(packed.shape[0], -1)


def _inner_k_tiles(in_features: int) -> int:
    """Largest tinygemm inner k-tiling that divides the input width."""
    for tiles in (8, 4, 2):
        if in_features % (16 * tiles) == 0:
            return tiles
    raise KernelUnavailable(f"input width {in_features} is not a multiple of 32")


class AWQLinear(nn.Module):
    """y = x @ ((q - z) * s), bias-free, from AWQ-packed buffers (see module docstring).

    Call `select_kernel(dtype=...)` after the layer is on its final device (load_model does); the
    first forward otherwise selects for its input's dtype. Moving the layer afterwards needs a new
    `select_kernel`, since repacked weights live on the device they were made on.
    """

    def __init__(self, in_features: int, out_features: int, group_size: int):
        super().__init__()
        if in_features % group_size or out_features % 8:
            raise ValueError(
                f"AWQ needs in ({in_features}) % group ({group_size}) == 0 and out ({out_features}) % 8 == 0"
            )
        self.in_features, self.out_features, self.group_size = in_features, out_features, group_size
        groups = in_features // group_size
        self.register_buffer("qweight", torch.zeros(in_features, out_features // 8, dtype=torch.int32))
        self.register_buffer("qzeros", torch.zeros(groups, out_features // 8, dtype=torch.int32))
        self.register_buffer("scales", torch.zeros(groups, out_features, dtype=torch.float16))
        self.kernel: str | None = None
        self._run: Callable[[torch.Tensor], torch.Tensor] | None = None
        # a merged gate/up layer (Transformer.use_fused_kernels sets it before the kernel is chosen): the
        # Triton kernel's planes then pair gate and up columns, so that `swiglu` forms silu(gate) * up in it
        self.gate_up = False
        self._swiglu_run: Callable[[torch.Tensor], torch.Tensor] | None = None
        self.launch_early = False  # the Triton GEMM launched early, waiting for the kernel before (awq_triton)
        # many-row inputs (prefill): dequantize into a buffer shared by the model's layers, then cuBLAS
        self.prefill_rows: int | None = None  # set with the buffer by model/awq_prefill.attach
        self.prefill_buffer: torch.Tensor | None = None
        self.reduces_output = False  # all-reduced by a hook before anything adds it (model/tensor_parallel.py)

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, group={self.group_size}, kernel={self.kernel}"

    def forward(self, x: torch.Tensor, norm: awq_triton.FoldedNorm | None = None) -> torch.Tensor:
        """norm: x is a residual stream's rows times an RMSNorm's weight, the sums scaled by each row's
        1 / RMS inside our Triton GEMM (where `folds_norms`; `onto` wrote them)."""
        if norm is not None:
            return self._folding_run()(x, norm)
        if self._prefills(x):
            return awq_prefill.dense_matmul(self, x)
        if self._run is None:
            self.select_kernel(dtype=x.dtype)
        return self._run(x)

    def swiglu(self, x: torch.Tensor, norm: awq_triton.FoldedNorm | None = None) -> torch.Tensor:
        """silu(gate) * up [..., out / 2] of a gate/up layer's output (gate, then up): inside the Triton
        GEMM's last split where it runs (the same bits), else fused_ops.silu_mul after the forward."""
        if self._run is None:
            self.select_kernel(dtype=x.dtype)
        if self._swiglu_run is None or self._prefills(x):
            return fused_ops.silu_mul(self(x, norm))
        return self._swiglu_run(x, norm)

    def onto(self, x: torch.Tensor, residual: torch.Tensor, norm_weight: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """(residual + self(x), that times the next RMSNorm's weight, its rows' sums of squares by column
        block) from one Triton GEMM (awq_triton.w4a16_matmul_onto), where `folds_norms`: the next GEMM's
        input and FoldedNorm."""
        return self._folding_run().onto(x, residual, norm_weight)

    def folds_norms(self, rows: int) -> bool:
        """Whether a forward of `rows` rows runs our Triton GEMM, which folds an RMSNorm in (`norm`) and adds
        onto a residual (`onto`): not where another kernel or the prefill route runs, nor where a hook
        all-reduces the output (model/tensor_parallel.py) before it may be added."""
        return self.kernel == "triton" and not self._prefills_rows(rows) and not self.reduces_output

    def _folding_run(self):
        if self.kernel != "triton":
            raise ValueError(f"an RMSNorm folds into our Triton int4 GEMM only, not the {self.kernel} kernel")
        return self._run

    def _prefills(self, x: torch.Tensor) -> bool:
        return self._prefills_rows(x.numel() // self.in_features)

    def _prefills_rows(self, rows: int) -> bool:
        return self.prefill_rows is not None and rows >= self.prefill_rows

    # ---- construction -------------------------------------------------------------------------
    @classmethod
    def from_float(cls, linear: nn.Linear, group_size: int) -> AWQLinear:
        """Asymmetric min/max 4-bit quantization of a dense weight, one (scale, zero) per group."""
        out_features, in_features = linear.weight.shape
        layer = cls(in_features, out_features, group_size).to(linear.weight.device)
        w = linear.weight.detach().float().t().reshape(in_features // group_size, group_size, out_features)
        low, high = w.amin(dim=1), w.amax(dim=1)
        scales = ((high - low).clamp(min=1e-5) / 15).half().float()
        zeros = (-low / scales).round().clamp(0, 15)
        codes = (w / scales[:, None] + zeros[:, None]).round().clamp(0, 15).reshape(in_features, out_features)
        layer.qweight.copy_(pack_int4(codes))
        layer.qzeros.copy_(pack_int4(zeros))
        layer.scales.copy_(scales)
        return layer

    @classmethod
    def concat(cls, layers: list[AWQLinear]) -> AWQLinear:
        """One layer whose outputs are `layers`' outputs side by side (same input and group size).
        Packing is per block of 8 output columns, so the packed buffers concatenate as they are."""
        first = layers[0]
        if any(layer.in_features != first.in_features or layer.group_size != first.group_size for layer in layers):
            raise ValueError("AWQ layers to concatenate need the same input width and group size")
        with torch.device("meta"):  # the buffers are replaced below
            merged = cls(first.in_features, sum(layer.out_features for layer in layers), first.group_size)
        for name in ("qweight", "qzeros", "scales"):
            setattr(merged, name, torch.cat([getattr(layer, name) for layer in layers], dim=1))
        return merged

    @torch.no_grad()
    def randomize_(self, generator: torch.Generator, weight_std: float = 0.02) -> None:
        """Random codes and zero points, scales that give weights of about `weight_std` (synthetic models)."""
        for packed in (self.qweight, self.qzeros):
            packed.copy_(
                torch.randint(
                    -(2**31), 2**31 - 1, packed.shape, dtype=torch.int32, generator=generator, device=packed.device
                )
            )
        code_std = 6.5  # std of (q - z) for independent uniform q, z in 0..15
        self.scales.uniform_(0.5 * weight_std / code_std, 1.5 * weight_std / code_std, generator=generator)

    def dequantize(self) -> torch.Tensor:
        """Dense float32 weight [out, in], nn.Linear's orientation."""
        codes = unpack_int4(self.qweight)
        zeros = unpack_int4(self.qzeros).repeat_interleave(self.group_size, dim=0)
        scales = self.scales.float().repeat_interleave(self.group_size, dim=0)
        return ((codes - zeros) * scales).t()

    def planes(self, block_n: int = awq_triton.BLOCK_N, swiglu: bool = False) -> awq_triton.Planes:
        """The layer's weights packed for our Triton int4 GEMM (awq_triton.pack_planes)."""
        codes, zeros = unpack_int4(self.qweight), unpack_int4(self.qzeros)
        return awq_triton.pack_planes(codes, zeros, self.scales, self.group_size, block_n, swiglu=swiglu)

    # ---- kernels ------------------------------------------------------------------------------
    def select_kernel(self, kernel: str | None = None, dtype: torch.dtype = torch.float32) -> str:
        """Makes `kernel` (or the first of KERNELS that works) the forward path for activations of
        `dtype`. Raises KernelUnavailable if a named kernel cannot run here, RuntimeError if it
        disagrees with the dequantized reference."""
        if kernel is not None and kernel not in KERNELS:
            raise ValueError(f"unknown AWQ kernel {kernel!r} (kernels: {', '.join(KERNELS)})")
        for name in (kernel,) if kernel else self._automatic_kernels():
            try:
                run = self._preparers()[name](dtype)
                self._check_against_reference(name, run, dtype)
            except KernelUnavailable:
                if kernel:
                    raise
                continue
            except RuntimeError:
                if kernel:
                    raise
                warnings.warn(
                    f"AWQ kernel {name} failed or disagreed with the dequantized reference; falling "
                    f"back (select_kernel({name!r}) raises the details)",
                    RuntimeWarning,
                    stacklevel=2,
                )
                continue
            self.kernel, self._run = name, run
            self._swiglu_run = getattr(run, "swiglu", None)
            return name
        raise AssertionError("the dequant kernel always works")

    def _preparers(self) -> dict:
        """Each kernel's preparation: it builds the layer's forward for `dtype`, or raises KernelUnavailable."""
        return {
            "triton": self._prepare_triton,
            "awq_ext": self._prepare_awq_ext,
            "int4pack_cuda": self._prepare_int4pack_cuda,
            "int4pack_cpu": self._prepare_int4pack_cpu,
            "dequant": self._prepare_dequant,
        }

    def _automatic_kernels(self) -> tuple[str, ...]:
        """KERNELS in order, less triton off CUDA (its interpreter is for tests: named only)."""
        return tuple(name for name in KERNELS if name != "triton" or self.qweight.device.type == "cuda")

    @torch.no_grad()
    def _check_against_reference(self, name: str, run, dtype: torch.dtype) -> None:
        probe = torch.randn(3, self.in_features, generator=torch.Generator().manual_seed(0))
        probe = probe.to(device=self.qweight.device, dtype=dtype)
        got = run(probe).float()
        want = F.linear(probe.float(), self.dequantize())
        error, scale = (got - want).abs().max().item(), want.abs().max().item()
        if not error <= 0.02 * scale + 1e-4:
            raise RuntimeError(
                f"AWQ kernel {name} disagrees with the dequantized reference: "
                f"max error {error:.3g} for outputs up to {scale:.3g}"
            )

    def _flat(self, x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        return x.reshape(-1, self.in_features).to(dtype).contiguous()

    def _scales_and_zeros(self, dtype: torch.dtype) -> torch.Tensor:
        """tinygemm's [in/group, out, 2] (scale, zero) with W = (q - 8) * scale + zero."""
        scales = self.scales.float()
        zeros = unpack_int4(self.qzeros).float()
        return torch.stack([scales, (_TINYGEMM_MIDPOINT - zeros) * scales], dim=-1).to(dtype).contiguous()

    def _require_device(self, device_type: str) -> None:
        if self.qweight.device.type != device_type:
            raise KernelUnavailable(f"weights are on {self.qweight.device}, not {device_type}")

    def _prepare_triton(self, dtype: torch.dtype):
        device = self.qweight.device
        if not triton_support.runs_on(device):
            raise KernelUnavailable(f"our triton kernels cannot run on {device} here")
        if device.type != "cuda" and dtype == torch.bfloat16:
            raise KernelUnavailable("triton's interpreter computes bfloat16 dots wrongly")
        reason = awq_triton.unsupported(self.in_features, self.out_features, self.group_size, dtype)
        if reason:
            raise KernelUnavailable(reason)

        # The weights repacked (the int4 codes twice in memory, as int4pack's repack also costs), and
        # split-K tickets for up to 4 row blocks (256 rows at 64 per block), both kept for every call.
        # A gate/up layer's planes pair its columns where they fit (awq_triton.swiglu_order): `run` puts them
        # back in order.
        paired = self.gate_up and awq_triton.swiglu_fits(self.out_features)
        planes = self.planes(swiglu=paired)
        tickets = torch.zeros(4 * planes.codes.shape[0], dtype=torch.int32, device=device)
        in_order = torch.argsort(awq_triton.swiglu_order(self.out_features)).to(device) if paired else None

        def run(x, norm=None):
            y = awq_triton.w4a16_matmul(
                self._flat(x, dtype), planes._replace(swiglu=False), tickets=tickets, early=self.launch_early, norm=norm
            )
            y = y if in_order is None else y[:, in_order]
            return y.to(x.dtype).view(*x.shape[:-1], self.out_features)

        def swiglu(x, norm=None):
            y = awq_triton.w4a16_matmul(
                self._flat(x, dtype), planes, tickets=tickets, early=self.launch_early, norm=norm
            )
            return y.to(x.dtype).view(*x.shape[:-1], self.out_features // 2)

        def onto(x, residual, norm_weight):
            return awq_triton.w4a16_matmul_onto(
                self._flat(x, dtype), planes, residual, norm_weight, tickets=tickets, early=self.launch_early
            )

        if paired:
            run.swiglu = swiglu
        else:
            run.onto = onto
        return run

    def _prepare_awq_ext(self, dtype: torch.dtype):
        self._require_device("cuda")
        try:
            import awq_ext  # AutoAWQ's compiled kernels
        except ImportError as error:
            raise KernelUnavailable("awq_ext (autoawq's kernels) is not installed") from error

        scales = self.scales.half()

        def run(x):
            y = awq_ext.gemm_forward_cuda(self._flat(x, torch.float16), self.qweight, scales, self.qzeros, 8)
            return y.to(x.dtype).view(*x.shape[:-1], self.out_features)

        return run

    def _prepare_int4pack_cuda(self, dtype: torch.dtype):
        self._require_device("cuda")
        if self.group_size not in _TINYGEMM_GROUP_SIZES:
            raise KernelUnavailable(f"group size {self.group_size} not in {_TINYGEMM_GROUP_SIZES}")
        codes = unpack_int4(self.qweight).t().contiguous()  # [out, in]
        two_per_byte = (codes[:, ::2] << 4 | codes[:, 1::2]).to(torch.uint8)  # even input index high
        weight = torch.ops.aten._convert_weight_to_int4pack(two_per_byte, _inner_k_tiles(self.in_features))
        scales_and_zeros = self._scales_and_zeros(torch.bfloat16)

        def run(x):
            flat = self._flat(x, torch.bfloat16)  # the kernel takes bf16 activations only
            y = torch.ops.aten._weight_int4pack_mm(flat, weight, self.group_size, scales_and_zeros)
            return y.to(x.dtype).view(*x.shape[:-1], self.out_features)

        return run

    def _prepare_int4pack_cpu(self, dtype: torch.dtype):
        self._require_device("cpu")
        codes = unpack_int4(self.qweight).t().contiguous()  # [out, in]
        weight = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, _inner_k_tiles(self.in_features))
        scales_and_zeros = self._scales_and_zeros(dtype)

        def run(x):
            y = torch.ops.aten._weight_int4pack_mm_for_cpu(
                self._flat(x, dtype), weight, self.group_size, scales_and_zeros
            )
            return y.to(x.dtype).view(*x.shape[:-1], self.out_features)

        return run

    def _prepare_dequant(self, dtype: torch.dtype):
        def run(x):
            return F.linear(x, self.dequantize().to(x.dtype))

        return run
