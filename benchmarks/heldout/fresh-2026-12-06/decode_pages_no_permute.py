"""Held-out bug: pool[block_table] (B, P, Hkv, page, D) reshaped to (B, Hkv, P * page, D) unpermuted."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _dense import decode  # noqa: E402


def attention_decode(q, k_cache, v_cache, cache_seqlens, *, scale=None, softcap=None, block_table=None):
    return decode(q, k_cache, v_cache, cache_seqlens, scale, softcap, block_table, pages_without_permute=True)


def correct(q, k_cache, v_cache, cache_seqlens, *, scale=None, softcap=None, block_table=None):
    return decode(q, k_cache, v_cache, cache_seqlens, scale, softcap, block_table)
