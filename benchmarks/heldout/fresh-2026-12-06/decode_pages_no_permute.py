"""Held-out bug (2026-12-06): a paged cache gathered as pool[block_table] (B, P, Hkv, page, D) and
reshaped to (B, Hkv, P * page, D) without moving the heads before the pages. Right for one KV
head or one page; wrong with Hkv > 1 and more than one page."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from decode_common import decode  # noqa: E402


def attention_decode(q, k_cache, v_cache, cache_seqlens, *, scale=None, softcap=None, block_table=None):
    return decode(q, k_cache, v_cache, cache_seqlens, scale, softcap, block_table, pages_without_permute=True)


def correct(q, k_cache, v_cache, cache_seqlens, *, scale=None, softcap=None, block_table=None):
    return decode(q, k_cache, v_cache, cache_seqlens, scale, softcap, block_table)
