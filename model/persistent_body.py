"""A dense draft's one-token step as one persistent kernel: every layer in one launch.

Why: a draft step of the fused kernels is 7 launches a layer (196 for Qwen3-0.6B), and each pays a
ramp, a drain and a split-K tail: its GEMVs take 5 us where their bytes take 1-3 (docs/decoder-speed.md,
"Decoder speed: the draft step's attention"). Here one program per SM walks all the layers. Within a
layer the phases are separated by grid barriers instead of launches:

1. every program normalizes the residual stream (held whole in its registers) and computes its column
   blocks of the merged q/k/v projection;
2. attention, one work item per (KV head, split of the cache): the split's size grows with the context
   so that the items stay at most the programs; each item's first block of keys and values is loaded
   before the barrier in front of the attention (no slot below the new token's changes in the step),
   the new token's key and value go into that block in registers as well as into the cache (by the
   item whose split holds them); each item's query heads are normed and rotated as
   fused_ops.qkv_attention does, its partial softmax stored, and the last split of a KV head to finish
   merges them all at once;
3. o_proj's column blocks (the residual's update);
4. the residual added and normed again by every program, then gate/up's column blocks, each program
   taking matching gate and up columns so that it writes silu(gate) * up itself;
5. down_proj's column blocks (the next update).

Weights do not depend on the activations, so each program loads its weights for a phase (as many as
MAX_AHEAD_ELEMENTS allows; the rest as the phase starts) between its arrival at the barrier in front of
that phase and its wait there: the wait overlaps their arrival (loaded before the arrival, they held it
back, since thread 0's release waits for that thread's loads); so do the norms' weights. A phase's blocks
after those loaded ahead are asked for as soon as the program leaves the barrier, before it reads the
phase's input (Qwen3-0.6B on 132 SMs has such blocks in gate/up only; one H200, against them asked for after
the norm: faster in 7 of 8 pairs measured in one process, by 1-5%, the medians 1.8% at context 300 and 2.2%
at 4,000). A GEMV tile is [blocks, columns, the
whole input] (masked up to a power of two), summed in float32 on the CUDA cores (`phase_launch`).
Tried and not kept (measure.routes' route `draft-persistent`, one H200): each program asking L2 for
its slices of the layer's later weights as the attention starts (Hopper's bulk prefetch) made the
attention phase 1.6-3.3x slower, its loads queued behind the prefetches, and the GEMVs barely faster;
all of a phase's weights loaded ahead (up to 65,536 elements a program, at 16 warps) spilled registers
and made the phase before it wait for them. Session 24 (one H100): the programs without an attention item
asking L2 for the layer's o and gate/up weights (or all its later ones) made those phases 0.3-0.5 us
faster and the attention 1-2 us slower at 300 and 3-10 us at 4,000; every thread polling the barrier's
count (not thread 0 alone) made the barriers 0.5-1.3 us slower. Session 25 (one H200; docs/decoder-speed.md,
"Decoder speed: session 25's routes"): o_proj as (KV head, columns) items that merge the attention's
splits themselves (no ticket) made the step 3-6% slower; the residual's updates written with an epoch in
each value, so that programs read them with no barrier, left it level (within 1.3%); the q/k/v output read
so by the attention items made it 2-7% slower (and was wrong on the GPU: a race not chased); warp 0 loading
its share of the next weights after thread 0's poll left it level; each program asking L2 for its weights
of the phase after next made it 1-4% slower. Session 26 (one H200; docs/decoder-speed.md, "Decoder speed: the target
at 8 rows, and session 26's routes"): the attention's softmax kept per (query head, slot) row on the CUDA
cores made it 8-20% slower, and the attention's loop pipelined through shared memory 0-9% slower (spills).

The barrier is a counter in global memory that each program increments once and then polls; it needs
every program resident at once, so the grid is at most one program per SM (measure.routes' route
`draft-persistent` checks the step against the fused kernels). Buffers written by other programs are
read past L1 (`.cg`). The last program out resets the counters, so a CUDA graph can replay the launch.
`PersistentBody.trace` reads the GPU's clock at every barrier: `phase_times` gives each phase's time
and each barrier's, which measure.routes prints.
Triton's interpreter runs programs one after another: there the grid is one program, which does
every work item, and the CPU tests check the kernel's values against the fused kernels that way (the
GPU tests, with a program per SM, also the splits and barriers).

Only drafts take it (`attach`, through model.pair.draft_routes and the speed commands), for forwards of one token
without a tree: the draft only proposes, so its rounding cannot change any output. Numerics follow
fused_ops (float32 sums, rounded to the dtype where torch rounds), but GEMV sums run in another order.
Where the kernels run: model/triton_support.py.
"""

from __future__ import annotations

import torch

from model import fused_ops
from model.triton_support import INTERPRETED, launching_on, tl, triton

BLOCK_SLOTS = 32  # cache slots per attention loop step (the next step's load in flight); a split is a whole number
MAX_SPLITS = 16  # splits a KV head's attention takes at most (fewer where the programs are fewer)
# query rows an attention item holds (a KV head's group fills some; tl.dot pads them for the tensor cores):
# one H200, the step with 8 against 16 at context 4,000 0.935-0.938 ms against 0.962-0.967 (attention 12.3 us
# against 13.1-13.3), level at 300 (0.743-0.745 against 0.749-0.799); 2 rows level at 300 too, 0.937-0.940 at
# 4,000 (session 26, the kernels in one process)
ATTENTION_BLOCK_M = 8
# the weights a program loads for a GEMV phase before the barrier in front of it (in registers: 64 a thread
# at 8 warps, in bfloat16); the rest of its blocks load as the phase starts
MAX_AHEAD_ELEMENTS = 32768
NUM_WARPS = 8
PHASE_NAMES = ("q/k/v", "attention", "o", "gate/up", "down")  # a layer's phases, each ended by a grid barrier
PHASES = len(PHASE_NAMES)
# drafts' default (model/pair.py, measure/speed*.py); False: the fused kernels' 7 launches a layer
DRAFT_PERSISTENT = True


def covers(model) -> bool:
    """Whether the kernel can run `model`'s one-token steps: a dense model on the fused kernels whose
    hidden size and head size are powers of two (a tile spans the whole input) and whose KV heads serve
    at most ATTENTION_BLOCK_M query heads each."""
    config = model.config
    return (
        model.kernels == "fused"
        and config.quant != "awq"
        and _power_of_two(config.hidden_size)
        and _power_of_two(config.head_dim)
        and config.n_heads // config.n_kv_heads <= ATTENTION_BLOCK_M
    )


def _power_of_two(value: int) -> bool:
    return value > 0 and value & (value - 1) == 0


def phase_launch(out_features: int, in_features: int, programs: int, halves: int = 1) -> tuple[int, int, int] | None:
    """(columns a block, blocks ahead, blocks after) of a GEMV phase. Program p takes blocks p, p + programs,
    ...: the first `ahead` of them it loads before the barrier in front of the phase, as one tile [ahead,
    columns, the input padded to a power of two] (`halves` such tiles: gate/up has 2) within
    MAX_AHEAD_ELEMENTS, the rest (as many at most) as the phase starts. The launch that gives a program
    the fewest columns at most, then the fewest blocks after, then the widest block; None where none fits
    (the fused kernels then run the model)."""
    width = triton.next_power_of_2(in_features)
    launches = []
    for columns in (1 << b for b in range(triton.next_power_of_2(out_features).bit_length())):
        blocks = triton.cdiv(triton.cdiv(out_features, columns), programs)
        fit = MAX_AHEAD_ELEMENTS // (columns * width * halves)
        if fit == 0:
            continue
        ahead = 1 << (min(blocks, fit).bit_length() - 1)
        after = triton.next_power_of_2(blocks - ahead) if blocks > ahead else 0
        if after <= fit:  # the blocks after fit the same budget
            launches.append((blocks * columns, after, -columns, ahead))
    if not launches:
        return None
    _, after, columns, ahead = min(launches)
    return -columns, ahead, after


def phase_launches(config, programs: int) -> dict[str, tuple[int, int, int]] | None:
    """phase_launch of each GEMV phase of `config`'s layers, by name; None where one does not fit."""
    heads_width = config.n_heads * config.head_dim
    shapes = {  # (out, in) of each phase's weight (gate/up: of its gate and of its up half)
        "qkv": (heads_width + 2 * config.n_kv_heads * config.head_dim, config.hidden_size),
        "o": (config.hidden_size, heads_width),
        "gate_up": (config.intermediate_size, config.hidden_size),
        "down": (config.hidden_size, config.intermediate_size),
    }
    launches = {
        name: phase_launch(out, width, programs, 2 if name == "gate_up" else 1) for name, (out, width) in shapes.items()
    }
    return None if None in launches.values() else launches


def program_count(device: torch.device) -> int:
    """One program per SM (on the interpreter, which runs programs one after another, one in all)."""
    return 1 if INTERPRETED else torch.cuda.get_device_properties(device).multi_processor_count


class PersistentBody:
    """The stacked weights and scratch buffers of one model's persistent step (made by `attach`)."""

    def __init__(self, model, programs: int, launches: dict[str, tuple[int, int, int]]):
        config, device = model.config, model.embed_tokens.weight.device
        layers = model.layers
        self.model, self.programs, self.launches = model, programs, launches
        self.qkv = _stacked([layer.self_attn.qkv_proj for layer in layers])
        self.o = _stacked([layer.self_attn.o_proj for layer in layers])
        self.gate_up = _stacked([layer.mlp.gate_up_proj for layer in layers])
        self.down = _stacked([layer.mlp.down_proj for layer in layers])
        self.input_norms = _stacked([layer.input_layernorm for layer in layers])
        self.post_norms = _stacked([layer.post_attention_layernorm for layer in layers])
        if config.qk_norm:
            self.q_norms = _stacked([layer.self_attn.q_norm for layer in layers])
            self.k_norms = _stacked([layer.self_attn.k_norm for layer in layers])
        else:  # never read (NORM off): any pointer of the dtype
            self.q_norms = self.k_norms = self.input_norms
        dtype = self.qkv.dtype
        heads_width = config.n_heads * config.head_dim
        self.qkv_out = torch.empty(self.qkv.shape[1], device=device, dtype=dtype)
        self.attention_out = torch.empty(heads_width, device=device, dtype=dtype)
        self.activation = torch.empty(config.intermediate_size, device=device, dtype=dtype)
        self.delta = torch.zeros(config.hidden_size, device=device, dtype=dtype)
        self.counters = torch.zeros(2, device=device, dtype=torch.int32)  # barrier arrivals, programs out
        self.tickets = torch.zeros(config.n_kv_heads, device=device, dtype=torch.int32)
        rows = config.n_kv_heads * (config.n_heads // config.n_kv_heads) * MAX_SPLITS
        self.sums = torch.empty((rows, config.head_dim), device=device, dtype=torch.float32)
        self.stats = torch.empty((rows, 2), device=device, dtype=torch.float32)
        self.no_stamps = torch.zeros(1, device=device, dtype=torch.int64)

    def forward(self, tokens: torch.Tensor, pos: torch.Tensor, stamps: torch.Tensor | None = None) -> torch.Tensor:
        """tokens [1, 1], pos [1] -> the final-normed hidden state [1, 1, hidden]; writes every layer's
        key and value at `pos`, as Transformer.forward_hidden does. `stamps` (int64 [programs, layers *
        PHASES, 2], GPU only): each program's clock at each barrier, arriving and leaving (`phase_times`)."""
        model, config = self.model, self.model.config
        out = torch.empty((1, 1, config.hidden_size), device=tokens.device, dtype=self.qkv.dtype)
        cos, sin = model.rope_cos_full, model.rope_sin_full  # full attention's tables (covers: no sliding)
        group = config.n_heads // config.n_kv_heads
        with launching_on(tokens.device):
            _body_kernel[(self.programs,)](
                tokens,
                pos,
                model.embed_tokens.weight,
                self.input_norms,
                self.post_norms,
                self.q_norms,
                self.k_norms,
                model.norm.weight,
                self.qkv,
                self.o,
                self.gate_up,
                self.down,
                model.kv_caches,
                cos,
                sin,
                self.qkv_out,
                self.attention_out,
                self.activation,
                self.delta,
                self.sums,
                self.stats,
                self.tickets,
                self.counters,
                self.no_stamps if stamps is None else stamps,
                out,
                model.max_seq_len,
                model.kv_caches[0].numel(),  # one layer's keys and values
                config.rms_norm_eps,
                model.layers[0].self_attn.scale,
                len(model.layers),
                config.intermediate_size,
                HIDDEN=config.hidden_size,
                INTER_WIDTH=triton.next_power_of_2(config.intermediate_size),
                H=config.n_heads,
                HKV=config.n_kv_heads,
                GROUP=group,
                HEAD_DIM=config.head_dim,
                BLOCK_SLOTS=BLOCK_SLOTS,
                MAX_SPLITS=MAX_SPLITS,
                BLOCK_M=ATTENTION_BLOCK_M,
                QKV=self.launches["qkv"],
                O=self.launches["o"],
                GATE_UP=self.launches["gate_up"],
                DOWN=self.launches["down"],
                NORM=config.qk_norm,
                PHASES=PHASES,
                TRACE=stamps is not None,
                num_warps=NUM_WARPS,
            )
        return out

    def trace(self, tokens: torch.Tensor, pos: torch.Tensor) -> dict[str, dict[str, float]]:
        """One step with the clock read at every barrier: `phase_times` of it (GPU only)."""
        shape = (self.programs, PHASES * len(self.model.layers), 2)
        stamps = torch.zeros(shape, device=tokens.device, dtype=torch.int64)
        self.forward(tokens, pos, stamps)
        return phase_times(stamps.cpu())


def phase_times(stamps: torch.Tensor) -> dict[str, dict[str, float]]:
    """Each phase's medians over the layers (microseconds) from a traced step's stamps [programs,
    barriers, 2]: `work`, from the first program leaving the barrier before to the last arriving at the
    one after (layer 0's q/k/v, with no barrier before, is left out), and `wait`, from that last
    arrival to the first program leaving (the barrier's own cost, the next phase's weights issued in it)."""
    arrive, leave = stamps[..., 0].double(), stamps[..., 1].double()
    last_arrival, first_leave = arrive.max(0).values, leave.min(0).values
    wait = (first_leave - last_arrival) / 1e3
    work = torch.cat([torch.full((1,), float("nan"), dtype=torch.float64), last_arrival[1:] - first_leave[:-1]]) / 1e3
    times = {}
    for index, name in enumerate(PHASE_NAMES):
        phase_work = work[index :: len(PHASE_NAMES)]
        times[name] = {
            "work_us": phase_work[~phase_work.isnan()].median().item(),
            "wait_us": wait[index :: len(PHASE_NAMES)].median().item(),
        }
    return times


def _stacked(modules: list) -> torch.Tensor:
    """The modules' weights as one tensor [layers, ...]; each module's weight becomes a view into it (no
    second copy), so the torch and fused paths keep reading the same values."""
    stacked = torch.stack([module.weight.detach() for module in modules])
    for module, weight in zip(modules, stacked):
        module.weight = torch.nn.Parameter(weight, requires_grad=False)
    return stacked


def attach(model, on: bool | None = DRAFT_PERSISTENT) -> None:
    """Gives `model` (a Transformer) the persistent step for its one-token forwards, where `covers` says
    it can run and each phase's weights fit a program (otherwise, or with `on` false, the fused kernels
    run them)."""
    model.persistent_body = None
    if on and covers(model):
        programs = program_count(model.embed_tokens.weight.device)
        launches = phase_launches(model.config, programs)
        if launches is not None:
            model.persistent_body = PersistentBody(model, programs, launches)


if triton is not None:

    @triton.jit
    def _now():
        """The GPU's global nanosecond clock (%globaltimer), the same on every SM."""
        return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)

    @triton.jit
    def _arrive(counter_ptr, stamps_ptr, done, TRACE: tl.constexpr):
        """This program's arrival at the grid's barrier after `done` others: its writes before are released
        to every program that leaves the barrier. Split from `_leave` so that a program loads its next
        weights between the two: thread 0's release would otherwise wait for its share of them. TRACE: the
        clock at arrival, in this program's stamps [barrier, 2]."""
        if TRACE:
            tl.store(stamps_ptr + done * 2, _now())
        tl.debug_barrier()
        tl.atomic_add(counter_ptr, 1, sem="release", scope="gpu")

    @triton.jit
    def _leave(counter_ptr, stamps_ptr, done, programs, TRACE: tl.constexpr):
        """Wait until every program has arrived at the barrier after `done` others, so that their writes
        before it are visible to this program's reads after; returns done + 1. TRACE: the clock when it
        leaves."""
        arrivals = (done + 1) * programs
        seen = tl.atomic_add(counter_ptr, 0, sem="acquire", scope="gpu")
        while seen < arrivals:
            seen = tl.atomic_add(counter_ptr, 0, sem="acquire", scope="gpu")
        tl.debug_barrier()
        if TRACE:
            tl.store(stamps_ptr + done * 2 + 1, _now())
        return done + 1

    @triton.jit
    def _updated(h, delta_ptr, HIDDEN: tl.constexpr):
        """The residual h plus the update other programs wrote (read past L1), rounded as torch adds."""
        delta = tl.load(delta_ptr + tl.arange(0, HIDDEN), cache_modifier=".cg").to(tl.float32)
        return fused_ops._rounded(h + delta, delta_ptr)

    @triton.jit
    def _normed(h, w, eps, out_ptr, HIDDEN: tl.constexpr):
        """fused_ops' RMSNorm of the residual h [HIDDEN] (float32, rounded to the dtype): x / rms(x) * w, the
        norm's weights w [HIDDEN] loaded (before the barrier in front of the phase)."""
        normed = fused_ops._rounded(h * tl.rsqrt(tl.sum(h * h, axis=0) / HIDDEN + eps), out_ptr)
        return fused_ops._rounded(normed * w.to(tl.float32), out_ptr)

    @triton.jit
    def _phase_columns(pid, programs, first, BLOCK_N: tl.constexpr, ITEMS: tl.constexpr):
        """The output columns of this program's blocks first, first + 1, ... (ITEMS of them): [ITEMS, BLOCK_N]."""
        return (pid + programs * (first + tl.arange(0, ITEMS)))[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]

    @triton.jit
    def _phase_tile(w_ptr, pid, programs, first, N, K, BLOCK_N: tl.constexpr, ITEMS: tl.constexpr, WIDTH: tl.constexpr):
        """Rows of the weight [N, K] for _phase_columns' columns, in one load: [ITEMS, BLOCK_N, WIDTH] (rows
        past N, inputs past K: zeros)."""
        cols = _phase_columns(pid, programs, first, BLOCK_N, ITEMS)
        k = tl.arange(0, WIDTH)[None, None, :]
        mask = (cols < N)[:, :, None] & (k < K)
        return tl.load(w_ptr + cols.to(tl.int64)[:, :, None] * K + k, mask=mask, other=0.0)

    @triton.jit
    def _rest_tile(w_ptr, pid, programs, N, K, LAUNCH: tl.constexpr, WIDTH: tl.constexpr):
        """A phase's blocks after those loaded ahead (_phase_tile's [AFTER, BLOCK_N, WIDTH]; [1, 1, 1] zeros
        where there are none)."""
        if LAUNCH[2] > 0:
            tile = _phase_tile(w_ptr, pid, programs, LAUNCH[1], N, K, LAUNCH[0], LAUNCH[2], WIDTH)
        else:
            tile = tl.zeros([1, 1, 1], dtype=w_ptr.dtype.element_ty)
        return tile

    @triton.jit
    def _project(x, ahead, rest, y_ptr, pid, programs, N, LAUNCH: tl.constexpr):
        """y = W x over this program's blocks: the tile loaded ahead (before the barrier), then the rest
        (_rest_tile, asked for as the program left the barrier, so that the sums of the first tile run while
        it arrives). LAUNCH: phase_launch's."""
        BLOCK_N: tl.constexpr = LAUNCH[0]
        AHEAD: tl.constexpr = LAUNCH[1]
        AFTER: tl.constexpr = LAUNCH[2]
        y = tl.sum(ahead.to(tl.float32) * x[None, None, :], axis=2)
        cols = _phase_columns(pid, programs, 0, BLOCK_N, AHEAD)
        tl.store(y_ptr + cols, y.to(y_ptr.dtype.element_ty), mask=cols < N)
        if AFTER > 0:
            y = tl.sum(rest.to(tl.float32) * x[None, None, :], axis=2)
            cols = _phase_columns(pid, programs, AHEAD, BLOCK_N, AFTER)
            tl.store(y_ptr + cols, y.to(y_ptr.dtype.element_ty), mask=cols < N)

    @triton.jit
    def _swiglu(x, gate, up, act_ptr, cols, I):
        """silu(gate) * up for the tiles' columns, rounded as fused_ops.silu_mul rounds it."""
        g = fused_ops._rounded(tl.sum(gate.to(tl.float32) * x[None, None, :], axis=2), act_ptr)
        u = fused_ops._rounded(tl.sum(up.to(tl.float32) * x[None, None, :], axis=2), act_ptr)
        tl.store(act_ptr + cols, fused_ops.swiglu(g, u, act_ptr).to(act_ptr.dtype.element_ty), mask=cols < I)

    @triton.jit
    def _project_swiglu(x, gate, up, rest_gate, rest_up, act_ptr, pid, programs, I, LAUNCH: tl.constexpr):
        """_project for the merged gate/up weight [2I, HIDDEN]: its gate and up tiles of the same columns, those
        loaded ahead and those after."""
        BLOCK_N: tl.constexpr = LAUNCH[0]
        AHEAD: tl.constexpr = LAUNCH[1]
        AFTER: tl.constexpr = LAUNCH[2]
        _swiglu(x, gate, up, act_ptr, _phase_columns(pid, programs, 0, BLOCK_N, AHEAD), I)
        if AFTER > 0:
            _swiglu(x, rest_gate, rest_up, act_ptr, _phase_columns(pid, programs, AHEAD, BLOCK_N, AFTER), I)

    @triton.jit
    def _split_geometry(p, programs, HKV: tl.constexpr, BLOCK_SLOTS: tl.constexpr, MAX_SPLITS: tl.constexpr):
        """A split's slots and the splits a KV head takes at position p: a whole number of BLOCK_SLOTS
        slots, as few as keep every KV head at most MAX_SPLITS splits (and the items at most the programs):
        at context 300, 10 of 32 slots; at 4,000, 16 of 256."""
        most = tl.maximum(tl.minimum(programs // HKV, MAX_SPLITS), 1)
        split_slots = tl.cdiv(p // BLOCK_SLOTS + 1, most) * BLOCK_SLOTS
        return split_slots, p // split_slots + 1

    @triton.jit
    def _first_block(
        k_ptr,
        v_ptr,
        item,
        p,
        split_slots,
        splits,
        S,
        HKV: tl.constexpr,
        HEAD_DIM: tl.constexpr,
        BLOCK_SLOTS: tl.constexpr,
    ):
        """The keys and values of work item `item`'s first block of slots [BLOCK_SLOTS, HEAD_DIM] (zeros
        past the split, or for no item), loaded before the barrier in front of the attention: no slot
        below p changes in this step, and slot p's stale row is replaced in registers (_attention_items)."""
        kv = item // splits
        first = (item % splits) * split_slots
        slot = first + tl.arange(0, BLOCK_SLOTS)
        visible = (slot < tl.minimum(first + split_slots, p + 1)) & (item < HKV * splits)
        at = (kv * S).to(tl.int64) * HEAD_DIM + slot[:, None] * HEAD_DIM + tl.arange(0, HEAD_DIM)[None, :]
        k = tl.load(k_ptr + at, mask=visible[:, None], other=0.0)
        v = tl.load(v_ptr + at, mask=visible[:, None], other=0.0)
        return k, v

    @triton.jit
    def _attention_items(
        qkv_ptr,
        k_ptr,
        v_ptr,
        qw_ptr,
        kw_ptr,
        cos_ptr,
        sin_ptr,
        p,
        split_slots,
        splits,
        k_first,
        v_first,
        sums_ptr,
        stats_ptr,
        ticket_ptr,
        o_ptr,
        pid,
        programs,
        S,
        eps,
        scale,
        H: tl.constexpr,
        HKV: tl.constexpr,
        GROUP: tl.constexpr,
        HEAD_DIM: tl.constexpr,
        BLOCK_SLOTS: tl.constexpr,
        MAX_SPLITS: tl.constexpr,
        BLOCK_M: tl.constexpr,
        NORM: tl.constexpr,
    ):
        """This program's (KV head, split) items of one token's attention at position p (module docstring):
        fused_ops._attention_split_kernel's work for one token, the merged q/k/v output as its input, the
        splits as _split_geometry gives them, and the first item's first block of keys and values (k_first,
        v_first: _first_block) already loaded. On a GPU a program has at most one item; on the interpreter's
        one program, each later item loads its own first block."""
        m = tl.arange(0, BLOCK_M)
        valid = m < GROUP
        d = tl.arange(0, HEAD_DIM)
        new = tl.full([1, 1], 0, tl.int64) + p
        for item in range(pid, HKV * splits, programs):
            if item != pid:
                k_first, v_first = _first_block(
                    k_ptr, v_ptr, item, p, split_slots, splits, S, HKV, HEAD_DIM, BLOCK_SLOTS
                )
            kv = item // splits
            split = item % splits
            first = split * split_slots
            # the query heads and the new token's key and value, their loads issued together
            head = kv * GROUP + tl.where(valid, m, 0)
            positions = tl.full([BLOCK_M], 0, tl.int64) + p
            q = _joined(
                *fused_ops._prepared_heads(
                    qkv_ptr,
                    (head * HEAD_DIM)[:, None],
                    valid[:, None],
                    qw_ptr,
                    cos_ptr,
                    sin_ptr,
                    positions[:, None],
                    eps,
                    o_ptr,
                    HEAD_DIM,
                    NORM,
                ),
                BLOCK_M,
                HEAD_DIM,
            ).to(o_ptr.dtype.element_ty)
            key = _joined(
                *fused_ops._prepared_heads(
                    qkv_ptr, (H + kv) * HEAD_DIM, new >= 0, kw_ptr, cos_ptr, sin_ptr, new, eps, k_ptr, HEAD_DIM, NORM
                ),
                1,
                HEAD_DIM,
            ).to(k_ptr.dtype.element_ty)
            value = tl.load(qkv_ptr + (H + HKV + kv) * HEAD_DIM + d[None, :], cache_modifier=".cg")
            slot = (kv * S + new) * HEAD_DIM + d[None, :]
            holds_new = split == splits - 1  # the split whose slots hold the new token writes it to the cache
            tl.store(k_ptr + slot, key, mask=holds_new)
            tl.store(v_ptr + slot, value, mask=holds_new)
            is_new = (first + tl.arange(0, BLOCK_SLOTS) == p)[:, None]
            k_first = tl.where(is_new, key, k_first)
            v_first = tl.where(is_new, value, v_first)
            tl.debug_barrier()  # later blocks' reads of the new slot come after every thread's writes
            stop = tl.minimum(first + split_slots, p + 1)
            running_max, total, acc = _split_softmax(
                q,
                k_first,
                v_first,
                k_ptr,
                v_ptr,
                (kv * S).to(tl.int64) * HEAD_DIM,
                first,
                stop,
                scale,
                BLOCK_M,
                HEAD_DIM,
                BLOCK_SLOTS,
            )
            rows = ((kv * GROUP + m) * MAX_SPLITS + split).to(tl.int64)
            tl.store(sums_ptr + rows[:, None] * HEAD_DIM + d[None, :], acc, mask=valid[:, None])
            tl.store(stats_ptr + rows * 2, running_max, mask=valid)
            tl.store(stats_ptr + rows * 2 + 1, total, mask=valid)
            tl.debug_barrier()  # every thread's partial sums are written before the ticket says so
            if tl.atomic_add(ticket_ptr + kv, 1, sem="acq_rel", scope="gpu") == splits - 1:
                _merge_splits(sums_ptr, stats_ptr, o_ptr, kv, splits, GROUP, HEAD_DIM, MAX_SPLITS)
                tl.store(ticket_ptr + kv, 0)

    @triton.jit
    def _joined(r1, r2, ROWS: tl.constexpr, HEAD_DIM: tl.constexpr):
        """Rotated halves [ROWS, HEAD_DIM // 2] each, side by side: the heads [ROWS, HEAD_DIM]."""
        return tl.reshape(tl.permute(tl.join(r1, r2), (0, 2, 1)), (ROWS, HEAD_DIM))

    @triton.jit
    def _split_softmax(
        q,
        k,
        v,
        k_ptr,
        v_ptr,
        cache,
        first,
        stop,
        scale,
        BLOCK_M: tl.constexpr,
        HEAD_DIM: tl.constexpr,
        BLOCK_N: tl.constexpr,
    ):
        """fused_ops._causal_softmax over the slots first .. stop - 1 (all visible: below the query's position
        or at it), the first block's keys and values given, each later block's loaded while the block
        before is summed."""
        d = tl.arange(0, HEAD_DIM)[None, :]
        running_max = tl.full([BLOCK_M], -1e30, tl.float32)
        total = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
        for start in range(first, stop, BLOCK_N):
            following = start + BLOCK_N + tl.arange(0, BLOCK_N)
            ahead = (following < stop)[:, None]
            next_k = tl.load(k_ptr + cache + following[:, None] * HEAD_DIM + d, mask=ahead, other=0.0)
            next_v = tl.load(v_ptr + cache + following[:, None] * HEAD_DIM + d, mask=ahead, other=0.0)
            visible = (start + tl.arange(0, BLOCK_N) < stop)[None, :]
            running_max, total, acc = fused_ops._online_softmax_step(q, k, v, visible, scale, running_max, total, acc)
            k, v = next_k, next_v
        return running_max, total, acc

    @triton.jit
    def _merge_splits(
        sums_ptr, stats_ptr, o_ptr, kv, splits, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, MAX_SPLITS: tl.constexpr
    ):
        """A KV head's query heads: every split's partial softmax loaded at once (past L1: other programs
        wrote them) and merged, rescaled to their common max."""
        GROUP_WIDTH: tl.constexpr = triton.next_power_of_2(GROUP)
        g = tl.arange(0, GROUP_WIDTH)[:, None]
        split = tl.arange(0, MAX_SPLITS)[None, :]
        take = (g < GROUP) & (split < splits)
        rows = ((kv * GROUP + g) * MAX_SPLITS + split).to(tl.int64)
        split_max = tl.load(stats_ptr + rows * 2, mask=take, other=float("-inf"), cache_modifier=".cg")
        split_total = tl.load(stats_ptr + rows * 2 + 1, mask=take, other=0.0, cache_modifier=".cg")
        d = tl.arange(0, HEAD_DIM)
        at = sums_ptr + rows[:, :, None] * HEAD_DIM + d[None, None, :]
        sums = tl.load(at, mask=take[:, :, None], other=0.0, cache_modifier=".cg")
        weight = tl.exp(split_max - tl.max(split_max, axis=1)[:, None])
        total = tl.sum(weight * split_total, axis=1)
        out = tl.sum(weight[:, :, None] * sums, axis=1) / tl.where(g < GROUP, total[:, None], 1.0)
        heads = (kv * GROUP + g).to(tl.int64)
        tl.store(o_ptr + heads * HEAD_DIM + d[None, :], out.to(o_ptr.dtype.element_ty), mask=g < GROUP)

    @triton.jit(do_not_specialize=["S", "layer_cache"])
    def _body_kernel(
        token_ptr,
        pos_ptr,
        embed_ptr,
        input_norm_ptr,
        post_norm_ptr,
        qw_ptr,
        kw_ptr,
        final_norm_ptr,
        qkv_w_ptr,
        o_w_ptr,
        gate_up_w_ptr,
        down_w_ptr,
        kv_ptr,
        cos_ptr,
        sin_ptr,
        qkv_ptr,
        attention_ptr,
        act_ptr,
        delta_ptr,
        sums_ptr,
        stats_ptr,
        ticket_ptr,
        counter_ptr,
        stamps_ptr,
        out_ptr,
        S,
        layer_cache,
        eps,
        scale,
        LAYERS,
        I,
        HIDDEN: tl.constexpr,
        INTER_WIDTH: tl.constexpr,
        H: tl.constexpr,
        HKV: tl.constexpr,
        GROUP: tl.constexpr,
        HEAD_DIM: tl.constexpr,
        BLOCK_SLOTS: tl.constexpr,
        MAX_SPLITS: tl.constexpr,
        BLOCK_M: tl.constexpr,
        QKV: tl.constexpr,
        O: tl.constexpr,
        GATE_UP: tl.constexpr,
        DOWN: tl.constexpr,
        NORM: tl.constexpr,
        PHASES: tl.constexpr,
        TRACE: tl.constexpr,
    ):
        """Program pid of the persistent step (module docstring): embedding, LAYERS layers, final norm."""
        pid = tl.program_id(0)
        programs = tl.num_programs(0)
        QKV_N: tl.constexpr = (H + 2 * HKV) * HEAD_DIM
        HEADS_WIDTH: tl.constexpr = H * HEAD_DIM
        hidden = tl.arange(0, HIDDEN)
        p = tl.load(pos_ptr)
        token = tl.load(token_ptr).to(tl.int64)
        h = tl.load(embed_ptr + token * HIDDEN + hidden).to(tl.float32)
        done = pid * 0  # barriers passed (a tensor: the loop carries it)
        split_slots, splits = _split_geometry(p, programs, HKV, BLOCK_SLOTS, MAX_SPLITS)
        stamps = stamps_ptr + pid * PHASES * LAYERS * 2
        qkv_tile = _phase_tile(qkv_w_ptr, pid, programs, 0, QKV_N, HIDDEN, QKV[0], QKV[1], HIDDEN)
        qkv_rest = _rest_tile(qkv_w_ptr, pid, programs, QKV_N, HIDDEN, QKV, HIDDEN)
        norm_w = tl.load(input_norm_ptr + hidden)
        for layer in range(LAYERS):
            o_w = o_w_ptr + layer * HIDDEN * HEADS_WIDTH
            gate_up_w = gate_up_w_ptr + layer * 2 * I * HIDDEN
            down_w = down_w_ptr + layer * HIDDEN * I
            if layer > 0:  # the residual's update from the last layer's down_proj
                h = _updated(h, delta_ptr, HIDDEN)
            x = _normed(h, norm_w, eps, delta_ptr, HIDDEN)
            _project(x, qkv_tile, qkv_rest, qkv_ptr, pid, programs, QKV_N, QKV)
            _arrive(counter_ptr, stamps, done, TRACE)
            k_cache = kv_ptr + tl.multiple_of(layer * layer_cache, HEAD_DIM)  # whole heads: 16-byte loads
            v_cache = k_cache + HKV * S * HEAD_DIM
            k_first, v_first = _first_block(
                k_cache, v_cache, pid, p, split_slots, splits, S, HKV, HEAD_DIM, BLOCK_SLOTS
            )
            done = _leave(counter_ptr, stamps, done, programs, TRACE)
            _attention_items(
                qkv_ptr,
                k_cache,
                v_cache,
                qw_ptr + layer * HEAD_DIM,
                kw_ptr + layer * HEAD_DIM,
                cos_ptr,
                sin_ptr,
                p,
                split_slots,
                splits,
                k_first,
                v_first,
                sums_ptr,
                stats_ptr,
                ticket_ptr,
                attention_ptr,
                pid,
                programs,
                S,
                eps,
                scale,
                H,
                HKV,
                GROUP,
                HEAD_DIM,
                BLOCK_SLOTS,
                MAX_SPLITS,
                BLOCK_M,
                NORM,
            )
            _arrive(counter_ptr, stamps, done, TRACE)
            o_tile = _phase_tile(o_w, pid, programs, 0, HIDDEN, HEADS_WIDTH, O[0], O[1], HEADS_WIDTH)
            done = _leave(counter_ptr, stamps, done, programs, TRACE)
            o_rest = _rest_tile(o_w, pid, programs, HIDDEN, HEADS_WIDTH, O, HEADS_WIDTH)
            heads = tl.load(attention_ptr + tl.arange(0, HEADS_WIDTH), cache_modifier=".cg").to(tl.float32)
            _project(heads, o_tile, o_rest, delta_ptr, pid, programs, HIDDEN, O)
            _arrive(counter_ptr, stamps, done, TRACE)
            gate_tile = _phase_tile(gate_up_w, pid, programs, 0, I, HIDDEN, GATE_UP[0], GATE_UP[1], HIDDEN)
            up_w = gate_up_w + I * HIDDEN
            up_tile = _phase_tile(up_w, pid, programs, 0, I, HIDDEN, GATE_UP[0], GATE_UP[1], HIDDEN)
            norm_w = tl.load(post_norm_ptr + layer * HIDDEN + hidden)
            done = _leave(counter_ptr, stamps, done, programs, TRACE)
            rest_gate = _rest_tile(gate_up_w, pid, programs, I, HIDDEN, GATE_UP, HIDDEN)
            rest_up = _rest_tile(up_w, pid, programs, I, HIDDEN, GATE_UP, HIDDEN)
            h = _updated(h, delta_ptr, HIDDEN)
            x = _normed(h, norm_w, eps, delta_ptr, HIDDEN)
            _project_swiglu(x, gate_tile, up_tile, rest_gate, rest_up, act_ptr, pid, programs, I, GATE_UP)
            _arrive(counter_ptr, stamps, done, TRACE)
            down_tile = _phase_tile(down_w, pid, programs, 0, HIDDEN, I, DOWN[0], DOWN[1], INTER_WIDTH)
            done = _leave(counter_ptr, stamps, done, programs, TRACE)
            down_rest = _rest_tile(down_w, pid, programs, HIDDEN, I, DOWN, INTER_WIDTH)
            k = tl.arange(0, INTER_WIDTH)
            act = tl.load(act_ptr + k, mask=k < I, other=0.0, cache_modifier=".cg").to(tl.float32)
            _project(act, down_tile, down_rest, delta_ptr, pid, programs, HIDDEN, DOWN)
            _arrive(counter_ptr, stamps, done, TRACE)
            next_qkv = qkv_w_ptr + (layer + 1) * QKV_N * HIDDEN
            next_columns = tl.where(layer + 1 < LAYERS, QKV_N, 0)  # the last layer: none
            qkv_tile = _phase_tile(next_qkv, pid, programs, 0, next_columns, HIDDEN, QKV[0], QKV[1], HIDDEN)
            norm_w = tl.load(input_norm_ptr + (layer + 1) * HIDDEN + hidden, mask=layer + 1 < LAYERS, other=0.0)
            done = _leave(counter_ptr, stamps, done, programs, TRACE)
            qkv_rest = _rest_tile(next_qkv, pid, programs, next_columns, HIDDEN, QKV, HIDDEN)
        if pid == 0:
            h = _updated(h, delta_ptr, HIDDEN)
            final = _normed(h, tl.load(final_norm_ptr + hidden), eps, out_ptr, HIDDEN)
            tl.store(out_ptr + hidden, final.to(out_ptr.dtype.element_ty))
        tl.debug_barrier()
        if tl.atomic_add(counter_ptr + 1, 1, sem="acq_rel", scope="gpu") == programs - 1:  # the last out
            tl.atomic_xchg(counter_ptr, 0, sem="relaxed", scope="gpu")
            tl.atomic_xchg(counter_ptr + 1, 0, sem="relaxed", scope="gpu")
