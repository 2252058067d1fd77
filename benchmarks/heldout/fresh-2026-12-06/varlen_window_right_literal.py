"""Held-out bug (2026-12-06): a window's right bound of -1 ("unbounded", FlashAttention's
window_size) is taken literally (keys up to one before the query's diagonal); the left -1 is
handled. Wrong for window=(left, -1), with or without causal."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from varlen_common import varlen  # noqa: E402


def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, causal=False, window=None,
                     softcap=None, scale=None):
    return varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, causal, window, softcap, scale, right_minus_one_literal=True)


def correct(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, causal=False, window=None,
            softcap=None, scale=None):
    return varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, causal, window, softcap, scale)
