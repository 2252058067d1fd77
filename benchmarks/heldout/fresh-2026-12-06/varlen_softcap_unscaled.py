"""Held-out bug (2026-12-06): softcap applied to the raw logits and scaled after,
scale * c * tanh(q k^T / c), instead of c * tanh(scale * q k^T / c) (Gemma-2's order)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from varlen_common import varlen  # noqa: E402


def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, causal=False, window=None,
                     softcap=None, scale=None):
    return varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, causal, window, softcap, scale, softcap_unscaled=True)


def correct(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, causal=False, window=None,
            softcap=None, scale=None):
    return varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, causal, window, softcap, scale)
