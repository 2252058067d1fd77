"""Attention mask plumbing shared by the torch backends: turn (attn_mask, key_padding_mask,
is_causal) into one SDPA mask, and find the query rows that have no key left to attend to."""
from __future__ import annotations

from typing import Optional, Tuple

import torch


def mask_kind(attn_mask, key_padding_mask, is_causal) -> str:
    """The probe key for a call: which mask machinery a backend must get right."""
    parts = []
    if key_padding_mask is not None:
        parts.append("key_padding")
    if attn_mask is not None:
        parts.append("bool_mask" if attn_mask.dtype == torch.bool else "float_mask")
    if is_causal:
        parts.append("causal")
    return "+".join(parts) or "none"


def attention_kind(attn_mask, key_padding_mask, is_causal, window=None, softcap=None) -> str:
    """The probe key of an attention call: the mask kind, then "+window" and "+softcap" when
    set, so that backend="auto" only uses backends verified for them."""
    kind = mask_kind(attn_mask, key_padding_mask, is_causal)
    if window is not None:
        kind += "+window"
    if softcap is not None:
        kind += "+softcap"
    return kind


def window_allowed(q_len: int, k_len: int, window, device="cpu", row_offset: int = 0) -> torch.Tensor:
    """Bool (Sq, Sk): query i sees key j when i - left <= j <= i + right (-1: that side unbounded).
    row_offset: the rows are queries row_offset .. row_offset + Sq - 1 (a block of rows)."""
    left, right = window
    offset = (torch.arange(k_len, device=device).view(1, k_len)
              - torch.arange(row_offset, row_offset + q_len, device=device).view(q_len, 1))
    keep = torch.ones(q_len, k_len, dtype=torch.bool, device=device)
    if left >= 0:
        keep &= offset >= -left
    if right >= 0:
        keep &= offset <= right
    return keep


def window_mask(q_len: int, k_len: int, window, device) -> torch.Tensor:
    """Bool (1, 1, Sq, Sk): query i sees key j when i - left <= j <= i + right (FlashAttention's
    window_size; -1 = unbounded on that side), top-left aligned as SDPA's is_causal."""
    return window_allowed(q_len, k_len, window, device).view(1, 1, q_len, k_len)


def allowed_mask(q_len: int, k_len: int, device, *, attn_mask=None, key_padding_mask=None,
                 is_causal=False, window=None) -> Optional[torch.Tensor]:
    """Bool mask broadcastable to (B, H, Sq, Sk), True = attend; None when nothing is masked."""
    allowed = None
    if is_causal:
        allowed = torch.ones(q_len, k_len, dtype=torch.bool, device=device).tril().view(1, 1, q_len, k_len)
    if window is not None:
        keep = window_mask(q_len, k_len, window, device)
        allowed = keep if allowed is None else allowed & keep
    if attn_mask is not None:
        m = attn_mask if attn_mask.dtype == torch.bool else ~torch.isneginf(attn_mask)
        while m.dim() < 4:
            m = m.unsqueeze(0)
        allowed = m if allowed is None else allowed & m
    if key_padding_mask is not None:
        keep = ~key_padding_mask.view(key_padding_mask.shape[0], 1, 1, k_len)
        allowed = keep if allowed is None else allowed & keep
    return allowed


def expand_kv(q, k, v):
    """k and v with their heads repeated to q's (GQA/MQA: head h reads kv head h // group)."""
    heads, kv_heads = q.shape[1], k.shape[1]
    if heads == kv_heads:
        return k, v
    group = heads // kv_heads
    return k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)


def sdpa_arguments(q, k, attn_mask=None, key_padding_mask=None, is_causal=False, window=None
                   ) -> Tuple[Optional[torch.Tensor], bool, Optional[torch.Tensor]]:
    """(mask for SDPA, is_causal for SDPA, empty rows (B|1, H|1, Sq, 1) or None).

    Empty rows get key 0 unmasked in the returned mask so no backend ever sees an all -inf
    row (the source of NaN forward and NaN gradients); callers zero those rows afterwards.
    """
    q_len, k_len = q.shape[-2], k.shape[-2]
    if k_len == 0:
        # No keys: every row is empty (zero). SDPA's own answer there is NaN once q holds a NaN.
        return None, False, torch.ones(1, 1, q_len, 1, dtype=torch.bool, device=q.device)
    if attn_mask is None and key_padding_mask is None and window is None:
        return None, bool(is_causal), None
    allowed = allowed_mask(q_len, k_len, q.device, attn_mask=attn_mask,
                           key_padding_mask=key_padding_mask, is_causal=is_causal, window=window)
    # Unconditionally, not behind `if empty.any()`: that test is a device-to-host sync on every
    # call (and inside a compiled graph's custom op, on every layer); with no empty row each step
    # below leaves the mask and the output as they were.
    empty = ~allowed.any(-1, keepdim=True)
    first_key = torch.zeros(1, 1, 1, k_len, dtype=torch.bool, device=q.device)
    first_key[..., 0] = True
    safe_allowed = allowed | (empty & first_key)
    if attn_mask is not None and attn_mask.dtype != torch.bool:
        # Additive mask in q's dtype (a mismatched mask dtype gave NaN on ROCm: SDPA-MASK-DTYPE-ROCM).
        additive = attn_mask.to(q.dtype)
        # the key unmasked for an empty row must add 0, not -inf
        additive = torch.where(safe_allowed & ~allowed, torch.zeros((), dtype=q.dtype, device=q.device), additive)
        neg_inf = torch.full((), float("-inf"), dtype=q.dtype, device=q.device)
        return torch.where(safe_allowed, additive, neg_inf), False, empty
    return safe_allowed, False, empty


def zero_empty_rows(out: torch.Tensor, empty: Optional[torch.Tensor]) -> torch.Tensor:
    if empty is None:
        return out
    return out.masked_fill(empty, 0.0)
