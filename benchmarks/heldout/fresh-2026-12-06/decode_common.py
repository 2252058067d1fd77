"""A user's plain-PyTorch attention_decode: the (paged) cache gathered into (B, Hkv, S, D), then the
dense core under each item's length mask. Flags plant the held-out bugs."""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _dense import dense_core  # noqa: E402


def decode(q, k_cache, v_cache, cache_seqlens, scale, softcap, block_table, *, max_length_offset=False,
           pages_without_permute=False):
    B, H, Sq, D = q.shape
    if block_table is not None:
        pool_k, pool_v = k_cache, v_cache
        n_blocks, Hkv, page, _ = pool_k.shape
        pages = block_table.long().clamp(0, n_blocks - 1)          # (B, P)
        P = pages.shape[1]
        if pages_without_permute:   # (B, P, Hkv, page, D) read as (B, Hkv, P * page, D)
            k_cache = pool_k[pages].reshape(B, Hkv, P * page, D)
            v_cache = pool_v[pages].reshape(B, Hkv, P * page, D)
        else:
            k_cache = pool_k[pages].permute(0, 2, 1, 3, 4).reshape(B, Hkv, P * page, D)
            v_cache = pool_v[pages].permute(0, 2, 1, 3, 4).reshape(B, Hkv, P * page, D)
    Hkv, S = k_cache.shape[1], k_cache.shape[2]
    kv_index = torch.arange(H, device=q.device) // (H // Hkv)
    scale = D ** -0.5 if scale is None else scale
    lengths = cache_seqlens.to(q.device).long().clamp(0, S)                    # (B,)
    # query i of item b sees keys j < L_b - Sq + 1 + i
    last = lengths.max().expand(B) if max_length_offset else lengths
    limit = last[:, None] - Sq + 1 + torch.arange(Sq, device=q.device)[None, :]     # (B, Sq)
    allowed = torch.arange(S, device=q.device)[None, None, :] < limit[:, :, None]   # (B, Sq, S)
    allowed = allowed & (torch.arange(S, device=q.device)[None, None, :] < lengths[:, None, None])
    return dense_core(q, k_cache, v_cache, allowed[:, None], scale, softcap=softcap, kv_index=kv_index)
