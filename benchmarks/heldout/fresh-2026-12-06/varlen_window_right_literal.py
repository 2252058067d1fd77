"""Held-out bug: a window's right -1 (unbounded) taken literally; the left -1 is handled."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _dense import varlen  # noqa: E402


def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, causal=False, window=None,
                     softcap=None, scale=None):
    return varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, causal, window, softcap, scale, right_minus_one_literal=True)


def correct(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, causal=False, window=None,
            softcap=None, scale=None):
    return varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, causal, window, softcap, scale)
