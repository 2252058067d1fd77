"""Backend "composition" of op "attention_varlen": each packed sequence through the dense
composition with its bottom-right aligned mask, the trusted fallback of the varlen kernels; and
the per-sequence packing the op's float64 reference (contracts/varlen.py) runs too."""
from __future__ import annotations

from typing import Optional

import torch

from .registry import Backend, register
from .sdpa import composition


def bottom_right_allowed(q_len: int, k_len: int, causal: bool, window, device) -> Optional[torch.Tensor]:
    """Bool (Sq, Sk), True = attend, or None when nothing is masked. Bottom-right aligned as
    FlashAttention's varlen: query i sits at key position i + Sk - Sq, so with causal it sees keys
    j <= i + Sk - Sq and with window (left, right) keys i + Sk - Sq - left <= j <= i + Sk - Sq + right
    (-1: that side unbounded)."""
    if not causal and window is None:
        return None
    # key position relative to the query's own position on the diagonal
    offset = (torch.arange(k_len, device=device).view(1, k_len)
              - torch.arange(q_len, device=device).view(q_len, 1) - (k_len - q_len))
    keep = torch.ones(q_len, k_len, dtype=torch.bool, device=device)
    if causal:
        keep &= offset <= 0
    if window is not None:
        left, right = window
        if left >= 0:
            keep &= offset >= -left
        if right >= 0:
            keep &= offset <= right
    return keep


def packed(dense, q, k, v, cu_seqlens_q, cu_seqlens_k, causal, window, scale, softcap):
    """Run `dense` (q, k, v as (1, H, S, D), attn_mask=, scale=, softcap=) on each sequence and
    pack the outputs back into (total_q, H, D); an empty sequence contributes nothing."""
    starts_q = cu_seqlens_q.tolist()
    starts_k = cu_seqlens_k.tolist()
    pieces = []
    for b in range(len(starts_q) - 1):
        qs, qe, ks, ke = starts_q[b], starts_q[b + 1], starts_k[b], starts_k[b + 1]
        if qe == qs:
            continue
        q_i, k_i, v_i = (t.transpose(0, 1).unsqueeze(0) for t in (q[qs:qe], k[ks:ke], v[ks:ke]))
        if ke == ks:  # no key: the rows are empty, zero
            pieces.append(torch.zeros_like(q[qs:qe]))
            continue
        mask = bottom_right_allowed(qe - qs, ke - ks, causal, window, q.device)
        kwargs = {"softcap": softcap} if softcap is not None else {}
        pieces.append(dense(q_i, k_i, v_i, attn_mask=mask, scale=scale, **kwargs)[0].transpose(0, 1))
    if not pieces:
        return torch.zeros_like(q)
    return torch.cat(pieces, dim=0)


def composition_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, causal=False,
                       window=None, softcap=None, scale=None):
    """Matmul-softmax-matmul per sequence in q's dtype (softmax in fp32); max_seqlen_* unused."""
    return packed(composition, q, k, v, cu_seqlens_q, cu_seqlens_k, causal, window, scale, softcap)


def empty_rows(cu_seqlens_q, cu_seqlens_k, *, causal=False, window=None) -> torch.Tensor:
    """Bool (total_q,): the rows that see no key (their output and gradients must be exactly 0)."""
    starts_q, starts_k = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    rows = []
    for b in range(len(starts_q) - 1):
        q_len, k_len = starts_q[b + 1] - starts_q[b], starts_k[b + 1] - starts_k[b]
        allowed = bottom_right_allowed(q_len, k_len, causal, window, "cpu")
        if allowed is None:
            allowed = torch.ones(q_len, k_len, dtype=torch.bool)
        rows.append(~allowed.any(-1))
    return torch.cat(rows) if rows else torch.zeros(0, dtype=torch.bool)


register(Backend("composition", "attention_varlen", composition_varlen,
                 "each packed sequence through the dense matmul-softmax-matmul composition (one host sync)",
                 fallback=True))
