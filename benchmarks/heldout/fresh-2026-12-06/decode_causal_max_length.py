"""Held-out bug (2026-12-06): with several new queries (Sq > 1), the causal offset of every item is
taken from the longest cache (cache_seqlens.max()), not the item's own length: a shorter item's
queries see keys past their own positions (still within its length). Needs Sq > 1 and items of
different lengths."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from decode_common import decode  # noqa: E402


def attention_decode(q, k_cache, v_cache, cache_seqlens, *, scale=None, softcap=None, block_table=None):
    return decode(q, k_cache, v_cache, cache_seqlens, scale, softcap, block_table, max_length_offset=True)


def correct(q, k_cache, v_cache, cache_seqlens, *, scale=None, softcap=None, block_table=None):
    return decode(q, k_cache, v_cache, cache_seqlens, scale, softcap, block_table)
