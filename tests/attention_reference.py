"""The attention the fused kernels are checked against, written once for the kernel tests."""

import torch
import torch.nn.functional as F


def reference_attention(q, k_cache, v_cache, mask, scale: float) -> torch.Tensor:
    """q [n, H, hd] over the caches [1, Hkv, S, hd] with a boolean mask [n, S] -> [n, H, hd], per query
    head through its KV head (the caches' unread slots may hold NaN: they are zeroed first)."""
    n_heads, n_kv = q.shape[1], k_cache.shape[1]
    heads = []
    for head in range(n_heads):
        kv = head // (n_heads // n_kv)
        out = F.scaled_dot_product_attention(
            q[None, None, :, head],
            k_cache[:, kv : kv + 1].nan_to_num(),
            v_cache[:, kv : kv + 1].nan_to_num(),
            attn_mask=mask,
            scale=scale,
        )
        heads.append(out[0, 0])
    return torch.stack(heads, dim=1)
