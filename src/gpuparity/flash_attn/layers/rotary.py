"""FlashAttention's `flash_attn.layers.rotary` on gpuparity's verified rotary op: the functions
(out of place, and in place on packed qkv / kv as FlashAttention's modules call them) and the
`RotaryEmbedding` module with its cos/sin cache and XPos scaling. Each function is one
autograd.Function whose forward and backward are calls of `ops.triton.rotary.apply_rotary` (the
backward rotates by the conjugate angle), so gradients flow into qkv even when it is a leaf that
is rotated in place, as in FlashAttention."""
from __future__ import annotations

from typing import Optional, Tuple, Union

import torch
from torch import Tensor

from .._compose import FlashAttnArgumentError
from ..ops.triton.rotary import apply_rotary
from ...validation import describe

__all__ = ["apply_rotary_emb", "apply_rotary_emb_func", "apply_rotary_emb_qkv_", "apply_rotary_emb_kv_",
           "apply_rotary_emb_torch", "rotate_half", "RotaryEmbedding"]


def rotate_half(x: Tensor, interleaved: bool = False) -> Tensor:
    """(-x2, x1) of the halves (x1, x2) of the last dim; interleaved: of the pairs (x[2i], x[2i+1])."""
    if not interleaved:
        first, second = x.chunk(2, dim=-1)
        return torch.cat((-second, first), dim=-1)
    even, odd = x[..., ::2], x[..., 1::2]
    return torch.stack((-odd, even), dim=-1).flatten(-2)


def apply_rotary_emb_torch(x: Tensor, cos: Tensor, sin: Tensor, interleaved: bool = False) -> Tensor:
    """FlashAttention's plain-torch rotary (its tests' reference): x (batch, seqlen, nheads, headdim),
    cos/sin (seqlen, rotary_dim / 2) or (batch, seqlen, rotary_dim / 2)."""
    rotary_dim = cos.shape[-1] * 2
    if rotary_dim > x.shape[-1]:
        raise FlashAttnArgumentError(f"cos: rotary_dim = 2 * cos.shape[-1] = {rotary_dim} exceeds the head dim of "
                                     f"x {describe(x)}")
    repeat = (lambda t: t.repeat_interleave(2, dim=-1)) if interleaved else (lambda t: torch.cat((t, t), dim=-1))
    cos, sin = repeat(cos).unsqueeze(-2), repeat(sin).unsqueeze(-2)
    rotated = x[..., :rotary_dim] * cos + rotate_half(x[..., :rotary_dim], interleaved) * sin
    return torch.cat((rotated, x[..., rotary_dim:]), dim=-1)


def _save_offsets(ctx, seqlen_offsets, *tensors) -> None:
    # an int offset is kept on ctx (save_for_backward takes tensors only)
    if isinstance(seqlen_offsets, Tensor):
        ctx.save_for_backward(*tensors, seqlen_offsets)
        ctx.int_offsets = None
    else:
        ctx.save_for_backward(*tensors)
        ctx.int_offsets = seqlen_offsets


def _saved(ctx):
    """(saved tensors without the offsets, seqlen_offsets)."""
    saved = ctx.saved_tensors
    if ctx.int_offsets is None:
        return saved[:-1], saved[-1]
    return saved, ctx.int_offsets


class ApplyRotaryEmb(torch.autograd.Function):

    @staticmethod
    def forward(ctx, x, cos, sin, interleaved=False, inplace=False, seqlen_offsets=0, cu_seqlens=None,
                max_seqlen=None):
        out = apply_rotary(x, cos, sin, seqlen_offsets=seqlen_offsets, cu_seqlens=cu_seqlens, max_seqlen=max_seqlen,
                           interleaved=interleaved, inplace=inplace)
        _save_offsets(ctx, seqlen_offsets, cos, sin, cu_seqlens)
        ctx.interleaved, ctx.max_seqlen = interleaved, max_seqlen
        return x if inplace else out

    @staticmethod
    def backward(ctx, grad_out):
        (cos, sin, cu_seqlens), seqlen_offsets = _saved(ctx)
        # the transpose of a rotation is the rotation by the opposite angle (out of place: the
        # incoming gradient may be shared with other consumers)
        grad_x = apply_rotary(grad_out, cos, sin, seqlen_offsets=seqlen_offsets, cu_seqlens=cu_seqlens,
                              max_seqlen=ctx.max_seqlen, interleaved=ctx.interleaved, conjugate=True)
        return grad_x, None, None, None, None, None, None, None


def apply_rotary_emb(x: Tensor, cos: Tensor, sin: Tensor, interleaved: bool = False, inplace: bool = False,
                     seqlen_offsets: Union[int, Tensor] = 0, cu_seqlens: Optional[Tensor] = None,
                     max_seqlen: Optional[int] = None) -> Tensor:
    """Rotary embedding on the first rotary_dim = 2 * cos.shape[1] features of each head.

    Arguments:
        x: (batch_size, seqlen, nheads, headdim), or (total_seqlen, nheads, headdim) with cu_seqlens.
        cos, sin: (seqlen_rotary, rotary_dim / 2), no gradient taken.
        interleaved: rotate pairs (2i, 2i + 1) (GPT-J) instead of the two halves (GPT-NeoX).
        inplace: rotate x in place (its gradient still flows).
        seqlen_offsets: int or (batch_size,): sequence b starts at position seqlen_offsets[b] (KV cache).
        cu_seqlens: (batch + 1,) or None; max_seqlen: int.
    Return:
        out: x's shape.
    """
    return ApplyRotaryEmb.apply(x, cos, sin, interleaved, inplace, seqlen_offsets, cu_seqlens, max_seqlen)


# FlashAttention's older name
apply_rotary_emb_func = apply_rotary_emb


def _qk_views(qkv: Tensor, num_heads_q: Optional[int]) -> Tuple[Tensor, Tensor, Optional[Tensor]]:
    """(q, k, q and k as one (batch, seqlen, nheads_q + nheads_k, headdim) view or None) of packed qkv,
    views into qkv."""
    if qkv.dim() == 5:
        if qkv.shape[2] != 3:
            raise FlashAttnArgumentError(f"qkv: expected (batch_size, seqlen, 3, nheads, headdim), got {describe(qkv)}")
        q, k = qkv[:, :, 0], qkv[:, :, 1]
        both = qkv[:, :, :2]
        try:
            joined = both.view(qkv.shape[0], qkv.shape[1], -1, qkv.shape[-1])
        except RuntimeError:   # strides that do not merge (3, nheads): two calls
            joined = None
        return q, k, joined
    if qkv.dim() != 4:
        raise FlashAttnArgumentError(f"qkv: expected (batch_size, seqlen, 3, nheads, headdim) or (batch_size, seqlen, "
                                     f"num_heads_q + 2 * num_heads_k, headdim), got {describe(qkv)}")
    if isinstance(num_heads_q, bool) or not isinstance(num_heads_q, int):
        raise FlashAttnArgumentError(f"num_heads_q: needed with a 4-D qkv (batch_size, seqlen, num_heads_q + 2 * "
                                     f"num_heads_k, headdim), got {describe(num_heads_q)}")
    num_heads_k = (qkv.shape[2] - num_heads_q) // 2
    if num_heads_q < 1 or num_heads_k < 1 or qkv.shape[2] != num_heads_q + 2 * num_heads_k:
        raise FlashAttnArgumentError(f"num_heads_q: expected qkv.shape[2] = num_heads_q + 2 * num_heads_k with both >= 1, "
                                     f"got num_heads_q={num_heads_q} for qkv {describe(qkv)}")
    end = num_heads_q + num_heads_k
    return qkv[:, :, :num_heads_q], qkv[:, :, num_heads_q:end], qkv[:, :, :end]


def _rotate_qkv_in_place(qkv, cos, sin, cos_k, sin_k, interleaved, seqlen_offsets, num_heads_q, conjugate) -> None:
    # views of a detached alias: autograd refuses views made under no_grad of a base that requires
    # grad once another view of it was written (the Function's own backward accounts for the write)
    q, k, joined = _qk_views(qkv.detach(), num_heads_q)
    rotate = dict(seqlen_offsets=seqlen_offsets, interleaved=interleaved, inplace=True, conjugate=conjugate)
    if cos_k is None and sin_k is None and joined is not None:
        apply_rotary(joined, cos, sin, **rotate)   # q and k in one call
        return
    apply_rotary(q, cos, sin, **rotate)
    apply_rotary(k, cos if cos_k is None else cos_k, sin if sin_k is None else sin_k, **rotate)


class ApplyRotaryEmbQKV_(torch.autograd.Function):

    @staticmethod
    def forward(ctx, qkv, cos, sin, cos_k=None, sin_k=None, interleaved=False, seqlen_offsets=0, num_heads_q=None):
        _rotate_qkv_in_place(qkv, cos, sin, cos_k, sin_k, interleaved, seqlen_offsets, num_heads_q, False)
        _save_offsets(ctx, seqlen_offsets, cos, sin, cos_k, sin_k)
        ctx.interleaved, ctx.num_heads_q = interleaved, num_heads_q
        return qkv

    @staticmethod
    def backward(ctx, grad_qkv):
        (cos, sin, cos_k, sin_k), seqlen_offsets = _saved(ctx)
        grad_qkv = grad_qkv.clone()   # v's gradient passes; q's and k's rotate back in this copy
        _rotate_qkv_in_place(grad_qkv, cos, sin, cos_k, sin_k, ctx.interleaved, seqlen_offsets, ctx.num_heads_q, True)
        return grad_qkv, None, None, None, None, None, None, None


def apply_rotary_emb_qkv_(qkv: Tensor, cos: Tensor, sin: Tensor, cos_k: Optional[Tensor] = None,
                          sin_k: Optional[Tensor] = None, interleaved: bool = False,
                          seqlen_offsets: Union[int, Tensor] = 0, num_heads_q: Optional[int] = None) -> Tensor:
    """Rotary embedding *in place* on q and k of packed qkv.

    Arguments:
        qkv: (batch_size, seqlen, 3, nheads, headdim), or (batch_size, seqlen, num_heads_q + 2 * num_heads_k,
            headdim) (MQA / GQA) with num_heads_q.
        cos, sin: (seqlen, rotary_dim / 2); cos_k, sin_k: the same for k (XPos), else cos, sin.
        interleaved, seqlen_offsets: as apply_rotary_emb.
    Return:
        qkv, rotated in place.
    """
    return ApplyRotaryEmbQKV_.apply(qkv, cos, sin, cos_k, sin_k, interleaved, seqlen_offsets, num_heads_q)


def _key_view(kv: Tensor) -> Tensor:
    if kv.dim() != 5 or kv.shape[2] != 2:
        raise FlashAttnArgumentError(f"kv: expected (batch_size, seqlen, 2, nheads, headdim), got {describe(kv)}")
    return kv[:, :, 0]


class ApplyRotaryEmbKV_(torch.autograd.Function):

    @staticmethod
    def forward(ctx, kv, cos, sin, interleaved=False, seqlen_offsets=0):
        apply_rotary(_key_view(kv.detach()), cos, sin, seqlen_offsets=seqlen_offsets, interleaved=interleaved,
                     inplace=True)
        _save_offsets(ctx, seqlen_offsets, cos, sin)
        ctx.interleaved = interleaved
        return kv

    @staticmethod
    def backward(ctx, grad_kv):
        (cos, sin), seqlen_offsets = _saved(ctx)
        grad_kv = grad_kv.clone()
        apply_rotary(grad_kv[:, :, 0], cos, sin, seqlen_offsets=seqlen_offsets, interleaved=ctx.interleaved,
                     inplace=True, conjugate=True)
        return grad_kv, None, None, None, None


def apply_rotary_emb_kv_(kv: Tensor, cos: Tensor, sin: Tensor, interleaved: bool = False,
                         seqlen_offsets: Union[int, Tensor] = 0) -> Tensor:
    """Rotary embedding *in place* on k of packed kv (batch_size, seqlen, 2, nheads, headdim);
    cos, sin (seqlen, rotary_dim / 2); interleaved, seqlen_offsets as apply_rotary_emb. Returns kv."""
    return ApplyRotaryEmbKV_.apply(kv, cos, sin, interleaved, seqlen_offsets)


class RotaryEmbedding(torch.nn.Module):
    """Rotary position embeddings (RoFormer, Su et al.) applied in place to packed qkv or to q and kv,
    with a cos/sin cache grown on demand. scale_base set: XPos (Sun et al.), q's cos/sin times
    scale ** ((position - seqlen // 2) / scale_base) and k's divided by it, scale per frequency
    (2i + 0.4 * dim) / (1.4 * dim)."""

    def __init__(self, dim: int, base=10000.0, interleaved=False, scale_base=None, device=None):
        super().__init__()
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 2 or dim % 2:
            raise FlashAttnArgumentError(f"dim: expected an even int >= 2 (the rotary dim), got {describe(dim)}")
        self.dim = dim
        self.base = float(base)
        self.register_buffer("inv_freq", self._compute_inv_freq(device), persistent=False)
        self.interleaved = interleaved
        self.scale_base = scale_base
        scale = None
        if scale_base is not None:
            scale = (torch.arange(0, dim, 2, device=device, dtype=torch.float32) + 0.4 * dim) / (1.4 * dim)
        self.register_buffer("scale", scale, persistent=False)
        self._seq_len_cached = 0
        self._cos_cached = self._sin_cached = self._cos_k_cached = self._sin_k_cached = None

    def _compute_inv_freq(self, device=None) -> Tensor:
        return 1.0 / (self.base ** (torch.arange(0, self.dim, 2, device=device, dtype=torch.float32) / self.dim))

    def _update_cos_sin_cache(self, seqlen: int, device=None, dtype=None) -> None:
        cached = self._cos_cached
        if not (seqlen > self._seq_len_cached or cached is None or cached.device != device or cached.dtype != dtype
                or (self.training and not torch.compiler.is_compiling() and cached.is_inference())):
            return
        self._seq_len_cached = seqlen
        # angles in fp32 whatever the model's dtype: position * inv_freq loses digits in bf16
        inv_freq = self.inv_freq if self.inv_freq.dtype == torch.float32 else self._compute_inv_freq(device)
        angles = torch.outer(torch.arange(seqlen, device=device, dtype=torch.float32), inv_freq.to(device))
        cos, sin = torch.cos(angles), torch.sin(angles)
        if self.scale is None:
            self._cos_cached, self._sin_cached = cos.to(dtype), sin.to(dtype)
            return
        power = (torch.arange(seqlen, dtype=self.scale.dtype, device=self.scale.device) - seqlen // 2) / self.scale_base
        scale = (self.scale.to(power.device) ** power.unsqueeze(1)).to(device)
        self._cos_cached, self._sin_cached = (cos * scale).to(dtype), (sin * scale).to(dtype)
        self._cos_k_cached, self._sin_k_cached = (cos / scale).to(dtype), (sin / scale).to(dtype)

    def forward(self, qkv: Tensor, kv: Optional[Tensor] = None, seqlen_offset: Union[int, Tensor] = 0,
                max_seqlen: Optional[int] = None, num_heads_q: Optional[int] = None
                ) -> Union[Tensor, Tuple[Tensor, Tensor]]:
        """qkv: (batch, seqlen, 3, nheads, headdim) or (batch, seqlen, num_heads_q + 2 * num_heads_k, headdim)
        when kv is None, else q (batch, seqlen, nheads, headdim) and kv (batch, seqlen, 2, nheads, headdim).
        seqlen_offset: int or (batch,); with a tensor pass max_seqlen (the cache is built up to it).
        Rotates in place; returns qkv, or (q, kv)."""
        seqlen = qkv.shape[1]
        if max_seqlen is not None:
            self._update_cos_sin_cache(max_seqlen, device=qkv.device, dtype=qkv.dtype)
        elif isinstance(seqlen_offset, int):
            self._update_cos_sin_cache(seqlen + seqlen_offset, device=qkv.device, dtype=qkv.dtype)
        elif self._cos_cached is None:
            raise FlashAttnArgumentError("max_seqlen: needed with a tensor seqlen_offset before the cos/sin cache "
                                         "exists (the cache is built up to max_seqlen)")
        xpos = self.scale is not None
        if kv is None:
            return apply_rotary_emb_qkv_(qkv, self._cos_cached, self._sin_cached,
                                         self._cos_k_cached if xpos else None, self._sin_k_cached if xpos else None,
                                         interleaved=self.interleaved, seqlen_offsets=seqlen_offset,
                                         num_heads_q=num_heads_q)
        q = apply_rotary_emb(qkv, self._cos_cached, self._sin_cached, interleaved=self.interleaved, inplace=True,
                             seqlen_offsets=seqlen_offset)
        kv = apply_rotary_emb_kv_(kv, self._cos_k_cached if xpos else self._cos_cached,
                                  self._sin_k_cached if xpos else self._sin_cached, interleaved=self.interleaved,
                                  seqlen_offsets=seqlen_offset)
        return q, kv
