"""Per-kernel GPU time of a synthetic Qwen3-32B-AWQ target forward of 8 tokens (our Triton GEMM,
fused kernels, CUDA graphs), by torch.profiler over graph replays."""
import torch
from torch.profiler import ProfilerActivity, profile
from model.decoder import Decoder
from model.loading import load_model

device = torch.device("cuda:0")
loaded = load_model("qwen3-32b-awq", device, "bfloat16", 0, 1104)
step = Decoder(loaded.model, K=7).target_forward
tokens = torch.randint(0, 1000, (1, 8), device=device)
pos = torch.tensor([300], device=device)
for _ in range(5):
    step(tokens, pos)
torch.cuda.synchronize()
with profile(activities=[ProfilerActivity.CUDA]) as prof:
    for _ in range(10):
        step(tokens, pos)
    torch.cuda.synchronize()
print("== qwen3-32b-awq (SYNTHETIC), 8 tokens, 10 forwards,", loaded.info)
print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=25, max_name_column_width=90))
