"""What an attention mask means, apart from any backend: the probe key of a call's masks
(`attention_kind`), which keys each query sees (`allowed_mask`, sliding windows, the decode
step's bottom-right causal rows), grouped KV heads read by the query heads (`expand_kv`), and
where a paged KV cache keeps its keys (`gather_pages`). The contracts' references and argument
checks, the backends and the ops all take them from here (backends/masks.py adds SDPA's plumbing)."""
from __future__ import annotations

from typing import Optional

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


# ----------------------------------------------------------------------------- decode: the KV cache
def decode_allowed(cache_seqlens: torch.Tensor, q_len: int, s_max: int) -> torch.Tensor:
    """(B, 1, Sq, S_max) bool: query i of item b sees key j when j < L_b - Sq + 1 + i
    (bottom-right causal, L_b = cache_seqlens[b] clamped to [0, S_max])."""
    lengths = cache_seqlens.to(torch.int64).clamp(0, s_max).view(-1, 1, 1, 1)
    rows = torch.arange(q_len, device=cache_seqlens.device).view(1, 1, q_len, 1)
    cols = torch.arange(s_max, device=cache_seqlens.device).view(1, 1, 1, s_max)
    return cols < lengths - q_len + 1 + rows


def gather_pages(pool: torch.Tensor, block_table: torch.Tensor) -> torch.Tensor:
    """A page pool (num_blocks, Hkv, page_size, D) read through block_table (B, max_blocks) into a
    contiguous (B, Hkv, max_blocks * page_size, D) cache (a copy: what the composed backends and
    the reference read; the Triton kernel reads the pages in place). Entries are clamped into the
    pool, as the kernel clamps them (tokens past an item's length are masked anyway)."""
    num_blocks, kv_heads, page, head_dim = pool.shape
    table = block_table.long().clamp(0, max(num_blocks - 1, 0))
    pages = pool[table.reshape(-1)]                       # (B * max_blocks, Hkv, page, D)
    pages = pages.view(block_table.shape[0], block_table.shape[1], kv_heads, page, head_dim)
    return pages.transpose(1, 2).reshape(block_table.shape[0], kv_heads, block_table.shape[1] * page, head_dim)
