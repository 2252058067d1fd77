"""Held-out bug (2026-12-06): an additive float attn_mask is added to the raw q @ k^T and the sum
scaled, (q k^T + mask) * scale, instead of q k^T * scale + mask. Harmless for 0 / -inf masks;
wrong for a finite bias (ALiBi-like, relative position) in a float mask."""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _dense import dense_core  # noqa: E402


def _attention(q, k, v, attn_mask, key_padding_mask, is_causal, scale, bug):
    B, H, Sq, D = q.shape
    Hkv, Sk = k.shape[1], k.shape[2]
    kv_index = torch.arange(H, device=q.device) // (H // Hkv)
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
    return dense_core(q, k, v, allowed, scale, float_mask=float_mask, kv_index=kv_index, mask_then_scale=bug)


def attention(q, k, v, *, attn_mask=None, key_padding_mask=None, is_causal=False, scale=None):
    return _attention(q, k, v, attn_mask, key_padding_mask, is_causal, scale, True)


def correct(q, k, v, *, attn_mask=None, key_padding_mask=None, is_causal=False, scale=None):
    return _attention(q, k, v, attn_mask, key_padding_mask, is_causal, scale, False)
