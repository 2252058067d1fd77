"""Held-out bug: a float attn_mask added before the scale, (q k^T + mask) * scale: harmless for
0 / -inf masks, wrong for a finite bias."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _dense import dense_attention  # noqa: E402


def attention(q, k, v, *, attn_mask=None, key_padding_mask=None, is_causal=False, scale=None):
    return dense_attention(q, k, v, attn_mask, key_padding_mask, is_causal, scale, mask_then_scale=True)


def correct(q, k, v, *, attn_mask=None, key_padding_mask=None, is_causal=False, scale=None):
    return dense_attention(q, k, v, attn_mask, key_padding_mask, is_causal, scale)
