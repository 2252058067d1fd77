"""Attention mask plumbing of the SDPA backends: turn (attn_mask, key_padding_mask, is_causal,
window) into one SDPA mask, and find the query rows that have no key left to attend to. What a
mask means (`allowed_mask`, the kinds, windows) is the contract's: contracts/masks.py."""
from __future__ import annotations

from typing import Optional, Tuple

import torch

from ..contracts.masks import allowed_mask


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
