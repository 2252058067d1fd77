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


# --------------------------------------------------------------------------- the other ops' relations
from gpuparity.contracts.decode import decode_composition  # noqa: E402
from gpuparity.contracts.norms import layer_norm_composition, rms_norm_composition  # noqa: E402
from gpuparity.contracts.rotary import rotary_composition  # noqa: E402
from gpuparity.contracts.varlen import composition_varlen  # noqa: E402

PREPARED = {}   # the weight cache of the *_weight_cached_by_shape bugs (a test clears it)


def rms_small_batch_drops_weight(x, normalized_shape, weight=None, eps=None):
    """Fewer than 4 rows take a small-batch path that forgets the weight."""
    if x.shape[0] < 4:
        weight = None
    return rms_norm_composition(x, normalized_shape, weight, eps)


def rms_weight_cached_by_shape(x, normalized_shape, weight=None, eps=None):
    """A 'prepared weight' cache keyed by shape and dtype: the first weight seen is used for every
    later call (a layer's weight assumed never to change)."""
    if weight is not None:
        weight = PREPARED.setdefault(("rms", tuple(weight.shape), weight.dtype), weight)
    return rms_norm_composition(x, normalized_shape, weight, eps)


def rms_contiguous_path_shifts_weight(x, normalized_shape, weight=None, eps=None):
    """The contiguous fast path (width % 8 == 0) reads the weight one feature late."""
    if x.is_contiguous() and x.shape[-1] % 8 == 0 and weight is not None:
        weight = torch.roll(weight, 1, -1)
    return rms_norm_composition(x, normalized_shape, weight, eps)


def ln_small_batch_drops_bias(x, normalized_shape, weight=None, bias=None, eps=1e-5):
    """Fewer than 4 rows take a small-batch path that forgets the bias."""
    if x.shape[0] < 4:
        bias = None
    return layer_norm_composition(x, normalized_shape, weight, bias, eps)


def ln_weight_cached_by_shape(x, normalized_shape, weight=None, bias=None, eps=1e-5):
    """A 'prepared weight' cache keyed by shape and dtype (the weight and bias of the first call)."""
    if weight is not None:
        weight = PREPARED.setdefault(("ln_w", tuple(weight.shape), weight.dtype), weight)
    if bias is not None:
        bias = PREPARED.setdefault(("ln_b", tuple(bias.shape), bias.dtype), bias)
    return layer_norm_composition(x, normalized_shape, weight, bias, eps)


def ln_contiguous_path_shifts_bias(x, normalized_shape, weight=None, bias=None, eps=1e-5):
    """The contiguous fast path (width % 8 == 0) reads the bias one feature late."""
    if x.is_contiguous() and x.shape[-1] % 8 == 0 and bias is not None:
        bias = torch.roll(bias, 1, -1)
    return layer_norm_composition(x, normalized_shape, weight, bias, eps)


def rotary_table_from_storage_start(x, cos, sin, *, interleaved=False, seqlen_offsets=0, cu_seqlens=None,
                                    max_seqlen=None):
    """cos/sin read from the start of their storage (a view's storage offset ignored)."""
    cos = torch.as_strided(cos, cos.shape, cos.stride(), 0)
    sin = torch.as_strided(sin, sin.shape, sin.stride(), 0)
    return rotary_composition(x, cos, sin, interleaved=interleaved, seqlen_offsets=seqlen_offsets,
                              cu_seqlens=cu_seqlens, max_seqlen=max_seqlen)


def rotary_contiguous_odd_heads(x, cos, sin, *, interleaved=False, seqlen_offsets=0, cu_seqlens=None,
                                max_seqlen=None):
    """The contiguous fast path with an odd number of heads leaves the last head unrotated."""
    out = rotary_composition(x, cos, sin, interleaved=interleaved, seqlen_offsets=seqlen_offsets,
                             cu_seqlens=cu_seqlens, max_seqlen=max_seqlen)
    if x.is_contiguous() and x.shape[-2] % 2 == 1 and x.shape[-2] > 1:
        out = torch.cat([out[..., :-1, :], x[..., -1:, :]], -2)
    return out


def rotary_contiguous_first_offset(x, cos, sin, *, interleaved=False, seqlen_offsets=0, cu_seqlens=None,
                                   max_seqlen=None):
    """The contiguous fast path uses item 0's offset for every item."""
    if x.is_contiguous() and isinstance(seqlen_offsets, torch.Tensor):
        seqlen_offsets = seqlen_offsets[:1].expand_as(seqlen_offsets).clone()
    return rotary_composition(x, cos, sin, interleaved=interleaved, seqlen_offsets=seqlen_offsets,
                              cu_seqlens=cu_seqlens, max_seqlen=max_seqlen)


def varlen_single_sequence_top_left(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *,
                                    causal=False, window=None, softcap=None, scale=None):
    """One sequence takes a dense path whose causal mask is top-left, not bottom-right."""
    if cu_seqlens_q.numel() == 2 and causal and q.shape[0] != k.shape[0]:
        from gpuparity.contracts.attention import composition
        band = torch.ones(q.shape[0], k.shape[0], dtype=torch.bool, device=q.device).tril()
        out = composition(q.transpose(0, 1).unsqueeze(0), k.transpose(0, 1).unsqueeze(0),
                          v.transpose(0, 1).unsqueeze(0), attn_mask=band, scale=scale, softcap=softcap)
        return out.squeeze(0).transpose(0, 1)
    return composition_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=causal,
                              window=window, softcap=softcap, scale=scale)


def varlen_contiguous_scale_over_d(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *,
                                   causal=False, window=None, softcap=None, scale=None):
    """The all-contiguous fast path with D % 32 == 0 scales by 1/D instead of 1/sqrt(D)."""
    if scale is None and q.is_contiguous() and k.is_contiguous() and v.is_contiguous() and q.shape[-1] % 32 == 0:
        scale = 1.0 / q.shape[-1]
    return composition_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=causal,
                              window=window, softcap=softcap, scale=scale)


def decode_contiguous_cache_drops_softcap(q, k_cache, v_cache, cache_seqlens, *, scale=None, softcap=None,
                                          block_table=None):
    """A contiguous (not paged) cache takes a path that forgets the softcap."""
    if block_table is None:
        softcap = None
    return decode_composition(q, k_cache, v_cache, cache_seqlens, scale=scale, softcap=softcap,
                              block_table=block_table)


def decode_batch_of_one_full_cache(q, k_cache, v_cache, cache_seqlens, *, scale=None, softcap=None,
                                   block_table=None):
    """A batch of one reads the whole cache, its length ignored."""
    if q.shape[0] == 1 and block_table is None:
        cache_seqlens = torch.full_like(cache_seqlens, k_cache.shape[2])
    return decode_composition(q, k_cache, v_cache, cache_seqlens, scale=scale, softcap=softcap,
                              block_table=block_table)


def decode_contiguous_gqa_modulo(q, k_cache, v_cache, cache_seqlens, *, scale=None, softcap=None, block_table=None):
    """The contiguous-cache fast path maps query head h to KV head h % Hkv (not h // group)."""
    if k_cache.is_contiguous() and v_cache.is_contiguous() and q.shape[1] != k_cache.shape[1] and block_table is None:
        group = q.shape[1] // k_cache.shape[1]
        k_cache, v_cache = k_cache.repeat(1, group, 1, 1), v_cache.repeat(1, group, 1, 1)
    return decode_composition(q, k_cache, v_cache, cache_seqlens, scale=scale, softcap=softcap,
                              block_table=block_table)


# --------------------------------------------------------------------------- cross_entropy
from gpuparity.contracts.basic import cross_entropy_composition  # noqa: E402


def _ce(logits, target, ignore_index=-100, label_smoothing=0.0, reduction="mean"):
    return cross_entropy_composition(logits, target, ignore_index=ignore_index, label_smoothing=label_smoothing,
                                     reduction=reduction)


def ce_small_batch_drops_smoothing(logits, target, *, ignore_index=-100, label_smoothing=0.0, reduction="mean"):
    """Fewer than 8 rows take a small-batch path that forgets label smoothing."""
    return _ce(logits, target, ignore_index, label_smoothing if logits.shape[0] >= 8 else 0.0, reduction)


def ce_ignored_rows_taken_as_suffix(logits, target, *, ignore_index=-100, label_smoothing=0.0, reduction="mean"):
    """The ignored rows taken as a padded suffix: only the first (rows not ignored) rows count."""
    valid = int((target != ignore_index).sum())
    rows = _ce(logits, target, ignore_index, label_smoothing, "none")
    rows = rows * (torch.arange(rows.shape[0], device=rows.device) < valid)
    if reduction == "none":
        return rows
    total = rows.float().sum()
    return (total if reduction == "sum" else total / max(valid, 1)).to(logits.dtype)


def ce_logits_clamped_at_60(logits, target, *, ignore_index=-100, label_smoothing=0.0, reduction="mean"):
    """Logits clamped to [-60, 60] against exp's overflow (right while no logit is past 60)."""
    return _ce(logits.clamp(-60, 60), target, ignore_index, label_smoothing, reduction)


def ce_mean_over_every_row(logits, target, *, ignore_index=-100, label_smoothing=0.0, reduction="mean"):
    """'mean' divides by every row, ignored ones included (right while none is ignored)."""
    if reduction != "mean":
        return _ce(logits, target, ignore_index, label_smoothing, reduction)
    return (_ce(logits, target, ignore_index, label_smoothing, "sum").float() / logits.shape[0]).to(logits.dtype)


def ce_none_drops_smoothing(logits, target, *, ignore_index=-100, label_smoothing=0.0, reduction="mean"):
    """reduction='none' forgets label smoothing ('mean' and 'sum' take another path, right)."""
    return _ce(logits, target, ignore_index, 0.0 if reduction == "none" else label_smoothing, reduction)


def ce_contiguous_path_drops_last_class(logits, target, *, ignore_index=-100, label_smoothing=0.0, reduction="mean"):
    """The contiguous fast path (classes % 4 == 0) leaves the last class out of the logsumexp."""
    if logits.is_contiguous() and logits.shape[-1] % 4 == 0:
        logits = torch.cat([logits[:, :-1], torch.full_like(logits[:, -1:], -1e4)], -1)
    return _ce(logits, target, ignore_index, label_smoothing, reduction)
