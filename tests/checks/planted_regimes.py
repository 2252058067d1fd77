"""Attention implementations wrong in one regime only (the class of pytorch#196678: right on
every ordinary case, wrong at a tile remainder, on massive-activation rows, past a length...),
loaded by the battery as 'tests/checks/planted_regimes.py:NAME'. The default level's families
must catch each, and pass attention_correct (planted_impls.py)."""
from __future__ import annotations

import torch

from gpuparity.contracts.attention import composition


def _correct(q, k, v, attn_mask=None, key_padding_mask=None, is_causal=False, scale=None):
    return composition(q, k, v, attn_mask=attn_mask, key_padding_mask=key_padding_mask, is_causal=is_causal,
                       scale=scale)


def _drop_keys_from(start, q, k, v, attn_mask, key_padding_mask, is_causal, scale):
    """As a kernel that never visits the keys from `start` on (a partial last tile skipped)."""
    if attn_mask is not None and attn_mask.shape[-1] > 1:
        attn_mask = attn_mask[..., :start]
    if key_padding_mask is not None:
        key_padding_mask = key_padding_mask[:, :start]
    return _correct(q, k[..., :start, :], v[..., :start, :], attn_mask, key_padding_mask, is_causal, scale)


def attention_tile_remainder_64(q, k, v, *, attn_mask=None, key_padding_mask=None, is_causal=False, scale=None):
    """Sk % 128 == 64: the last half tile of keys is skipped."""
    sk = k.shape[-2]
    if sk % 128 == 64:
        return _drop_keys_from(sk - 64, q, k, v, attn_mask, key_padding_mask, is_causal, scale)
    return _correct(q, k, v, attn_mask, key_padding_mask, is_causal, scale)


def attention_query_tile_plus_one(q, k, v, *, attn_mask=None, key_padding_mask=None, is_causal=False, scale=None):
    """Sq % 64 == 1: the last query row (alone in its tile) is left at zero."""
    out = _correct(q, k, v, attn_mask, key_padding_mask, is_causal, scale)
    if q.shape[-2] % 64 == 1 and q.shape[-2] > 1:
        keep = torch.ones(q.shape[-2], 1, dtype=out.dtype, device=out.device)
        keep[-1] = 0
        out = out * keep
    return out


class _NanGradRows(torch.autograd.Function):
    """Identity forward; the backward writes NaN into the gradient of the rows marked."""

    @staticmethod
    def forward(ctx, q, rows):
        ctx.save_for_backward(rows)
        return q.view_as(q)

    @staticmethod
    def backward(ctx, grad):
        (rows,) = ctx.saved_tensors
        return grad.masked_fill(rows, float("nan")), None


def attention_massive_rows_nan_grad(q, k, v, *, attn_mask=None, key_padding_mask=None, is_causal=False,
                                    scale=None):
    """pytorch#196678's shape: with an attn_mask, rows whose logsumexp is below -88.7 get NaN in grad_q."""
    if attn_mask is not None:
        with torch.no_grad():
            group = q.shape[1] // k.shape[1]
            keys = k.repeat_interleave(group, dim=1).float()
            s = (q.float() @ keys.transpose(-2, -1)) * (q.shape[-1] ** -0.5 if scale is None else scale)
            if attn_mask.dtype == torch.bool:
                s = s.masked_fill(~attn_mask, float("-inf"))
            else:
                s = s + attn_mask.float()
            lse = torch.logsumexp(s, dim=-1, keepdim=True)
            rows = (lse < -88.7) & torch.isfinite(lse)   # (a row with no key at all is another matter)
        q = _NanGradRows.apply(q, rows.expand(q.shape))
    return _correct(q, k, v, attn_mask, key_padding_mask, is_causal, scale)


def attention_long_drop_past_4096(q, k, v, *, attn_mask=None, key_padding_mask=None, is_causal=False, scale=None):
    """Keys past 4096 are never read (a 12-bit tile counter)."""
    if k.shape[-2] > 4096:
        return _drop_keys_from(4096, q, k, v, attn_mask, key_padding_mask, is_causal, scale)
    return _correct(q, k, v, attn_mask, key_padding_mask, is_causal, scale)


def attention_long_queries_past_8192(q, k, v, *, attn_mask=None, key_padding_mask=None, is_causal=False,
                                     scale=None):
    """Query rows past 8192 get the output of row 8191 (a grid dimension capped)."""
    out = _correct(q, k, v, attn_mask, key_padding_mask, is_causal, scale)
    if q.shape[-2] > 8192:
        out = torch.cat([out[..., :8192, :], out[..., 8191:8192, :].expand_as(out[..., 8192:, :])], dim=-2)
    return out


def attention_all_true_mask_as_causal(q, k, v, *, attn_mask=None, key_padding_mask=None, is_causal=False,
                                      scale=None):
    """An all-True bool attn_mask is taken for the causal fast path."""
    if attn_mask is not None and attn_mask.dtype == torch.bool and bool(attn_mask.all()):
        return _correct(q, k, v, None, key_padding_mask, True, scale)
    return _correct(q, k, v, attn_mask, key_padding_mask, is_causal, scale)


def attention_batch_items_past_two(q, k, v, *, attn_mask=None, key_padding_mask=None, is_causal=False,
                                   scale=None):
    """Batch items 2 and up read the keys and values of item 1 (a batch stride off by one item)."""
    if q.shape[0] > 2 and k.shape[0] > 2:
        k = torch.cat([k[:2], k[1:2].expand(k.shape[0] - 2, *k.shape[1:])])
        v = torch.cat([v[:2], v[1:2].expand(v.shape[0] - 2, *v.shape[1:])])
    return _correct(q, k, v, attn_mask, key_padding_mask, is_causal, scale)


def attention_d128_sq_ne_sk(q, k, v, *, attn_mask=None, key_padding_mask=None, is_causal=False, scale=None):
    """Head dim 128 with Sq != Sk: the kernel for that pair scales by 1/D, not 1/sqrt(D)."""
    if q.shape[-1] == 128 and q.shape[-2] != k.shape[-2] and scale is None:
        scale = 1.0 / 128
    return _correct(q, k, v, attn_mask, key_padding_mask, is_causal, scale)


def attention_noncontiguous_v(q, k, v, *, attn_mask=None, key_padding_mask=None, is_causal=False, scale=None):
    """A non-contiguous V is read as if contiguous (aotriton's ROCm/pytorch#3230 class)."""
    if not v.is_contiguous():
        v = v.as_strided(v.shape, torch.empty(v.shape).stride(), v.storage_offset())
    return _correct(q, k, v, attn_mask, key_padding_mask, is_causal, scale)


def attention_finfo_min_mask_overflow(q, k, v, *, attn_mask=None, key_padding_mask=None, is_causal=False,
                                      scale=None):
    """A float mask holding finfo.min, added twice (scores + mask + mask) overflows to -inf and
    the row's max becomes -inf: NaN rows."""
    if attn_mask is not None and attn_mask.is_floating_point() and bool(
            (attn_mask == torch.finfo(attn_mask.dtype).min).any()):
        out = _correct(q, k, v, attn_mask, key_padding_mask, is_causal, scale)
        return out + float("nan") * (out[..., :1] != 0)
    return _correct(q, k, v, attn_mask, key_padding_mask, is_causal, scale)


REGIME_BUGS = {
    # name: the family whose default members must catch it
    "attention_tile_remainder_64": "tile",
    "attention_query_tile_plus_one": "tile",
    "attention_massive_rows_nan_grad": "values",
    "attention_long_drop_past_4096": "long",
    "attention_long_queries_past_8192": "long",
    "attention_all_true_mask_as_causal": "masks",
    "attention_batch_items_past_two": "batch",
    "attention_d128_sq_ne_sk": "head_dim",
    "attention_noncontiguous_v": "layouts",
    "attention_finfo_min_mask_overflow": "masks",
}


def attention_gqa_strided_v(q, k, v, *, attn_mask=None, key_padding_mask=None, is_causal=False, scale=None):
    """Two ordinary conditions at once: with GQA (H != Hkv), a non-contiguous V is read as if it
    were contiguous (the GQA path's pointer arithmetic ignores V's strides). Right with GQA alone
    and with a strided V alone: only the covering array's pairs meet both."""
    if q.shape[1] != k.shape[1] and not v.is_contiguous():
        v = v.as_strided(v.shape, torch.empty(v.shape).stride(), v.storage_offset())
    return _correct(q, k, v, attn_mask, key_padding_mask, is_causal, scale)


def attention_window_open_side_as_zero(q, k, v, *, attn_mask=None, key_padding_mask=None, is_causal=False,
                                       scale=None, window=None, softcap=None):
    """A window's open side (-1, unbounded) read as 0: only the diagonal on that side is seen."""
    if window is not None:
        window = tuple(0 if side == -1 else side for side in window)
    return composition(q, k, v, attn_mask=attn_mask, key_padding_mask=key_padding_mask, is_causal=is_causal,
                       scale=scale, window=window, softcap=softcap)
