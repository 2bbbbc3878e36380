"""Where a draft step and a target step spend GPU time: torch.profiler's CUDA kernel table.

Synthetic qwen3-0.6b (one token) and qwen3-32b (fixed width 16) at a 1,104-slot static cache.
"""
import torch
from torch.profiler import ProfilerActivity, profile

from model.loading import load_model

for name, rows in (("qwen3-0.6b", 1), ("qwen3-32b", 16)):
    m = load_model(name, "cuda:0", "bfloat16", 0, max_seq_len=1104).model
    tokens = torch.zeros(1, rows, dtype=torch.long, device="cuda:0")
    pos = torch.arange(300, 300 + rows, device="cuda:0")
    for _ in range(3):
        m.forward_hidden(tokens, pos)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            m.forward_hidden(tokens, pos)
        torch.cuda.synchronize()
    print(f"== {name}, {rows} row(s), 5 forwards (synthetic weights)")
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=14, max_name_column_width=70))
    del m
    torch.cuda.empty_cache()
