"""Attention implementations right on the float64 cases they are checked on here and wrong on
the other side of one equivalence relation (checks/relations.py): each relation's test shows
it kills its bug where the float64 case at the same size passes."""
from __future__ import annotations

import torch

from gpuparity.contracts.attention import composition


def _correct(q, k, v, attn_mask=None, key_padding_mask=None, is_causal=False, scale=None):
    return composition(q, k, v, attn_mask=attn_mask, key_padding_mask=key_padding_mask, is_causal=is_causal,
                       scale=scale)


def batch_of_one_ignores_padding(q, k, v, *, attn_mask=None, key_padding_mask=None, is_causal=False, scale=None):
    """A batch of one takes a path that forgets the key padding mask."""
    if q.shape[0] == 1:
        key_padding_mask = None
    return _correct(q, k, v, attn_mask, key_padding_mask, is_causal, scale)


def padding_taken_as_suffix(q, k, v, *, attn_mask=None, key_padding_mask=None, is_causal=False, scale=None):
    """The key padding mask read as a length per item (right where the padding is a suffix)."""
    if key_padding_mask is not None:
        lengths = (~key_padding_mask).sum(-1, keepdim=True)
        key_padding_mask = torch.arange(k.shape[-2], device=k.device).view(1, -1) >= lengths
    return _correct(q, k, v, attn_mask, key_padding_mask, is_causal, scale)


def scale_clamped_to_one(q, k, v, *, attn_mask=None, key_padding_mask=None, is_causal=False, scale=None):
    """A scale kept in a [0, 1] fixed-point register."""
    if scale is not None:
        scale = min(scale, 1.0)
    return _correct(q, k, v, attn_mask, key_padding_mask, is_causal, scale)


def heads_past_one_without_gqa(q, k, v, *, attn_mask=None, key_padding_mask=None, is_causal=False, scale=None):
    """Without GQA (H == Hkv >= 4), heads past 1 read head 1's keys (the GQA path is right)."""
    if q.shape[1] == k.shape[1] and k.shape[1] >= 4:
        k = torch.cat([k[:, :2], k[:, 1:2].expand_as(k[:, 2:])], 1)
    return _correct(q, k, v, attn_mask, key_padding_mask, is_causal, scale)


def square_2d_mask_transposed(q, k, v, *, attn_mask=None, key_padding_mask=None, is_causal=False, scale=None):
    """A 2-D square attn_mask indexed [key, query] (right for every is_causal call)."""
    if attn_mask is not None and attn_mask.dim() == 2 and attn_mask.shape[0] == attn_mask.shape[1]:
        attn_mask = attn_mask.t()
    return _correct(q, k, v, attn_mask, key_padding_mask, is_causal, scale)


def contiguous_path_drops_odd_key(q, k, v, *, attn_mask=None, key_padding_mask=None, is_causal=False, scale=None):
    """The all-contiguous fast path drops the last key when Sk is odd (the strided path is right)."""
    if q.is_contiguous() and k.is_contiguous() and v.is_contiguous() and k.shape[-2] % 2 == 1 and k.shape[-2] > 1:
        keep = k.shape[-2] - 1
        if attn_mask is not None and attn_mask.shape[-1] > 1:
            attn_mask = attn_mask[..., :keep]
        if key_padding_mask is not None:
            key_padding_mask = key_padding_mask[:, :keep]
        k, v = k[..., :keep, :], v[..., :keep, :]
    return _correct(q, k, v, attn_mask, key_padding_mask, is_causal, scale)


def uniform_padding_ignored(q, k, v, *, attn_mask=None, key_padding_mask=None, is_causal=False, scale=None):
    """A key padding mask the same for every item is taken as no padding (a shortcut)."""
    if key_padding_mask is not None and bool((key_padding_mask == key_padding_mask[:1]).all()):
        key_padding_mask = None
    return _correct(q, k, v, attn_mask, key_padding_mask, is_causal, scale)
