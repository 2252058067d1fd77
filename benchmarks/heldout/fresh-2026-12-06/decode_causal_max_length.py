"""Held-out bug: with Sq > 1, every item's causal offset from cache_seqlens.max(), not its own length."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _dense import decode  # noqa: E402


def attention_decode(q, k_cache, v_cache, cache_seqlens, *, scale=None, softcap=None, block_table=None):
    return decode(q, k_cache, v_cache, cache_seqlens, scale, softcap, block_table, max_length_offset=True)


def correct(q, k_cache, v_cache, cache_seqlens, *, scale=None, softcap=None, block_table=None):
    return decode(q, k_cache, v_cache, cache_seqlens, scale, softcap, block_table)
