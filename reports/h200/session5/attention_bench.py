"""Fused attention (model/fused_ops.py) per call in a CUDA graph, L2 evicted, Qwen3-32B shapes
(64 q heads, 8 KV heads, head 128, bf16 cache of 1104 slots): rows per program (BLOCK_M) 16, 32, 64
for 1 and 8 query tokens at 300 and 1000 cached positions."""
import torch
import triton
from measure.timing import time_in_graph
from model import fused_ops

device = torch.device("cuda:0")
H, HKV, HD, S = 64, 8, 128, 1104
g = torch.Generator(device=device).manual_seed(0)
k_cache, v_cache = (torch.randn(1, HKV, S, HD, generator=g, device=device, dtype=torch.bfloat16) for _ in range(2))
print("n  context  block_m  us (median)  max |diff| vs block_m 64")
for n in (1, 8):
    for context in (300, 1000):
        q = torch.randn(n, H, HD, generator=g, device=device, dtype=torch.bfloat16)
        pos = torch.arange(context, context + n, device=device)
        outs = {}
        for block_m in (16, 32, 64):
            rows = (H // HKV) * n
            if block_m > max(16, triton.next_power_of_2(rows)):
                continue

            def call(q_):
                out = torch.empty((n, H * HD), dtype=q_.dtype, device=device)
                fused_ops._attention_kernel[(HKV, triton.cdiv(rows, block_m))](
                    q_, k_cache, v_cache, pos, out, n, S, 0.088, H, GROUP=H // HKV, HEAD_DIM=HD, BLOCK_M=block_m,
                    BLOCK_N=fused_ops.ATTENTION_BLOCK_N, num_warps=4)
                return out
            outs[block_m] = call(q)
            t = time_in_graph(call, [(q,)], device, reps=20, calls=10)
            ref = outs.get(64, outs.get(max(outs)))
            print(f"{n}  {context:5d}  {block_m:3d}  {t['median_ms'] * 1e3:7.2f}  {(outs[block_m] - ref).abs().max().item():.3g}",
                  flush=True)
