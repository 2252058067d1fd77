"""Held-out bug (2026-12-06): GQA maps query head h to kv head h % Hkv (as k.repeat(1, g, 1, 1)
would) instead of h // (H // Hkv). Wrong whenever Hkv > 1 and H > Hkv."""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _dense import dense_core  # noqa: E402


def _attention(q, k, v, attn_mask, key_padding_mask, is_causal, scale, modulo):
    B, H, Sq, D = q.shape
    Hkv, Sk = k.shape[1], k.shape[2]
    heads = torch.arange(H, device=q.device)
    kv_index = heads % Hkv if modulo else heads // (H // Hkv)
    scale = D ** -0.5 if scale is None else scale
    allowed = torch.ones(1, 1, Sq, Sk, dtype=torch.bool, device=q.device)
    if is_causal:
        allowed = allowed & torch.ones(Sq, Sk, dtype=torch.bool, device=q.device).tril()
    float_mask = None
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            allowed = allowed & attn_mask
        else:
            float_mask = attn_mask
    if key_padding_mask is not None:
        allowed = allowed & ~key_padding_mask[:, None, None, :]
    return dense_core(q, k, v, allowed, scale, float_mask=float_mask, kv_index=kv_index)


def attention(q, k, v, *, attn_mask=None, key_padding_mask=None, is_causal=False, scale=None):
    return _attention(q, k, v, attn_mask, key_padding_mask, is_causal, scale, True)


def correct(q, k, v, *, attn_mask=None, key_padding_mask=None, is_causal=False, scale=None):
    return _attention(q, k, v, attn_mask, key_padding_mask, is_causal, scale, False)
