"""Held-out bug: GQA maps query head h to kv head h % Hkv (k.repeat) instead of h // (H // Hkv)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _dense import dense_attention  # noqa: E402


def attention(q, k, v, *, attn_mask=None, key_padding_mask=None, is_causal=False, scale=None):
    return dense_attention(q, k, v, attn_mask, key_padding_mask, is_causal, scale, modulo=True)


def correct(q, k, v, *, attn_mask=None, key_padding_mask=None, is_causal=False, scale=None):
    return dense_attention(q, k, v, attn_mask, key_padding_mask, is_causal, scale)
