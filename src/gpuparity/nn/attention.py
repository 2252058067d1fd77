"""MultiheadAttention drop-in: a subclass of torch.nn.MultiheadAttention (same parameters,
same state_dict, isinstance still holds) whose attention goes through gpuparity's verified
dispatcher, in training and in inference alike.

need_weights=True, add_bias_kv and add_zero_attn fall back to torch's own implementation
(the weights must be materialised anyway); everything else runs through
`gpuparity.attention`, attention dropout included (gpuparity.attention(dropout_p=...): the
triton kernel applies it inside the kernel; backend="auto" takes it only once its same-mask
self-check passed, else the plain composition's dropout).
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..ops import attention as attention_ops


def _keep_off_torch_fast_path(module, args):
    """A no-op forward pre-hook. nn.TransformerEncoderLayer's inference fast path reads
    self_attn's weights and calls a fused torch kernel, bypassing self_attn.forward; it
    stands down when a submodule has hooks. This hook keeps patched encoders on gpuparity's
    attention in eval / no_grad too."""
    return None


def _attention(q, k, v, **kwargs):
    """The one call site of gpuparity.attention (a seam tests use to count calls)."""
    return attention_ops.attention(q, k, v, **kwargs)


class MultiheadAttention(nn.MultiheadAttention):
    """torch.nn.MultiheadAttention with gpuparity's attention; `backend` as in gpuparity.attention."""

    REPLACES = nn.MultiheadAttention

    def __init__(self, embed_dim, num_heads, dropout=0.0, bias=True, add_bias_kv=False, add_zero_attn=False,
                 kdim=None, vdim=None, batch_first=False, device=None, dtype=None, *, backend: str = "auto"):
        super().__init__(embed_dim, num_heads, dropout=dropout, bias=bias, add_bias_kv=add_bias_kv,
                         add_zero_attn=add_zero_attn, kdim=kdim, vdim=vdim, batch_first=batch_first,
                         device=device, dtype=dtype)
        self.backend = backend
        self.register_forward_pre_hook(_keep_off_torch_fast_path)

    @classmethod
    def from_torch(cls, module: nn.MultiheadAttention, backend: str = "auto") -> "MultiheadAttention":
        """A drop-in sharing `module`'s Parameters (an optimizer built on them stays valid)."""
        if not isinstance(module, nn.MultiheadAttention):
            raise TypeError(f"module: expected a torch.nn.MultiheadAttention, got {type(module).__name__}")
        new = cls(module.embed_dim, module.num_heads, dropout=module.dropout,
                  bias=module.in_proj_bias is not None, add_bias_kv=module.bias_k is not None,
                  add_zero_attn=module.add_zero_attn, kdim=module.kdim, vdim=module.vdim,
                  batch_first=module.batch_first, device="meta", backend=backend)
        for name in ("in_proj_weight", "q_proj_weight", "k_proj_weight", "v_proj_weight", "in_proj_bias",
                     "bias_k", "bias_v"):
            setattr(new, name, getattr(module, name))
        new.out_proj = module.out_proj
        new.train(module.training)
        return new

    def extra_repr(self) -> str:
        return f"backend={self.backend!r}"

    # ----------------------------------------------------------------------- forward
    def forward(self, query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
                average_attn_weights=True, is_causal=False) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        if need_weights or self.bias_k is not None or self.add_zero_attn:
            # torch's implementation: the weights are materialised anyway (documented fallback)
            return super().forward(query, key, value, key_padding_mask=key_padding_mask, need_weights=need_weights,
                                   attn_mask=attn_mask, average_attn_weights=average_attn_weights,
                                   is_causal=is_causal)
        if query.is_nested:
            return self._forward_nested(query, key, value, attn_mask, is_causal), None
        if is_causal and attn_mask is None:
            raise RuntimeError("Need attn_mask if specifying the is_causal hint. You may use the Transformer "
                               "module method `generate_square_subsequent_mask` to create this mask.")
        batched = query.dim() == 3
        if not batched:  # (L, E): one sequence
            query, key, value = (t.unsqueeze(0) for t in (query, key, value))
            if key_padding_mask is not None:
                key_padding_mask = key_padding_mask.unsqueeze(0)
        elif not self.batch_first:  # (L, N, E) -> (N, L, E), views only
            query, key, value = (t.transpose(0, 1) for t in (query, key, value))
        out = self._attend(query, key, value, key_padding_mask, attn_mask, is_causal)
        if not batched:
            return out.squeeze(0), None
        return (out if self.batch_first else out.transpose(0, 1)), None

    def _project(self, query, key, value):
        """(N, L, E) inputs -> q, k, v as (N, H, L, Dh) strided views of the projections."""
        heads, head_dim = self.num_heads, self.head_dim
        batch = query.shape[0]
        bias_q = bias_k = bias_v = None
        if self.in_proj_bias is not None:
            bias_q, bias_k, bias_v = self.in_proj_bias.chunk(3)
        if self._qkv_same_embed_dim and query is key and key is value:
            # self-attention: one projection, heads read in place through strides
            qkv = F.linear(query, self.in_proj_weight, self.in_proj_bias)
            qkv = qkv.view(batch, query.shape[1], 3, heads, head_dim)
            return tuple(qkv[:, :, i].transpose(1, 2) for i in range(3))
        if self._qkv_same_embed_dim:
            w_q, w_k, w_v = self.in_proj_weight.chunk(3)
        else:
            w_q, w_k, w_v = self.q_proj_weight, self.k_proj_weight, self.v_proj_weight
        q = F.linear(query, w_q, bias_q)
        k = F.linear(key, w_k, bias_k)
        v = F.linear(value, w_v, bias_v)
        return tuple(t.view(batch, t.shape[1], heads, head_dim).transpose(1, 2) for t in (q, k, v))

    def _masks(self, batch, q_len, k_len, key_padding_mask, attn_mask, dtype):
        """nn.MultiheadAttention masks -> gpuparity.attention's (SDPA meaning: bool True = attend)."""
        if attn_mask is not None:
            if attn_mask.dim() == 3:  # (N * H, L, S)
                attn_mask = attn_mask.view(batch, self.num_heads, q_len, k_len)
            # MHA's bool mask marks what may NOT be attended; SDPA's what may
            attn_mask = ~attn_mask if attn_mask.dtype == torch.bool else attn_mask.to(dtype)
        if key_padding_mask is not None and key_padding_mask.dtype != torch.bool:
            # a float key padding mask is additive: fold it into a float attn_mask
            additive = key_padding_mask.to(dtype).view(batch, 1, 1, k_len)
            if attn_mask is None:
                attn_mask = additive
            elif attn_mask.dtype == torch.bool:
                attn_mask = torch.zeros((), dtype=dtype, device=additive.device).masked_fill(
                    ~attn_mask, float("-inf")) + additive
            else:
                attn_mask = attn_mask + additive
            key_padding_mask = None
        return key_padding_mask, attn_mask

    def _attend(self, query, key, value, key_padding_mask, attn_mask, is_causal):
        batch, q_len = query.shape[0], query.shape[1]
        k_len = key.shape[1]
        q, k, v = self._project(query, key, value)
        key_padding_mask, attn_mask = self._masks(batch, q_len, k_len, key_padding_mask, attn_mask, q.dtype)
        if is_causal:
            # the is_causal hint: attn_mask is the causal mask (torch drops it likewise)
            attn_mask = None
        dropout_p = self.dropout if self.training else 0.0
        out = _attention(q, k, v, backend=self.backend, attn_mask=attn_mask, key_padding_mask=key_padding_mask,
                         is_causal=bool(is_causal), dropout_p=float(dropout_p))
        out = out.transpose(1, 2).reshape(batch, q_len, self.embed_dim)
        return self.out_proj(out)

    def _forward_nested(self, query, key, value, attn_mask, is_causal):
        """nn.TransformerEncoder turns padded batches into nested tensors in inference; run
        them padded with a key padding mask and return a nested tensor again."""
        if not (query is key and key is value):
            raise ValueError("query: nested tensors are supported for self-attention only "
                             f"(query is key is value), got {type(query).__name__} inputs")
        lengths = [t.shape[0] for t in query.unbind()]
        padded = query.to_padded_tensor(0.0)
        batch, longest = padded.shape[0], padded.shape[1]
        kept = torch.arange(longest, device=padded.device).view(1, longest) < torch.tensor(
            lengths, device=padded.device).view(batch, 1)
        # nested inputs come from batch-first encoders: (N, L, E) padded
        out = self._attend(padded, padded, padded, ~kept, attn_mask, is_causal)
        return torch._nested_tensor_from_mask(out, kept, mask_check=False)
