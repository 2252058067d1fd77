"""`gpuparity.attention`: masked scaled-dot-product attention with SDPA's mask semantics,
validated inputs and a backend chosen by verified dispatch (DESIGN.md contracts)."""
from __future__ import annotations

import numbers
from typing import Any, Dict

import torch

from .. import dispatch
from . import select
from ..backends.masks import mask_kind
from ..validation import (FLOAT_DTYPES, describe, expect_broadcastable, expect_same_device,
                          expect_same_dtype, expect_tensor)

__all__ = ["attention", "explain_attention", "attention_problem"]


def attention_problem(q, k, v, *, attn_mask=None, key_padding_mask=None, is_causal=False, scale=None
                      ) -> dispatch.Problem:
    """Validate the inputs of `attention` and describe the call for the dispatcher.

    Raises TypeError/ValueError naming the argument, what it got and what it needs.
    """
    expect_tensor("q", q, ndim=(4,), dtypes=FLOAT_DTYPES)
    expect_tensor("k", k, ndim=(4,), dtypes=FLOAT_DTYPES)
    expect_tensor("v", v, ndim=(4,), dtypes=FLOAT_DTYPES)
    expect_same_dtype("q", q, k=k, v=v)
    expect_same_device("q", q, k=k, v=v)
    batch, heads, q_len, head_dim = q.shape
    if k.shape[0] != batch or k.shape[3] != head_dim:
        raise ValueError(f"k: expected shape (B={batch}, Hkv, Sk, D={head_dim}) to match q (B, H, Sq, D), "
                         f"got {describe(k)}")
    kv_heads, k_len = k.shape[1], k.shape[2]
    if tuple(v.shape) != tuple(k.shape):
        raise ValueError(f"v: expected the shape of k {tuple(k.shape)}, got {describe(v)}")
    if kv_heads == 0 or heads % kv_heads:
        raise ValueError(f"k: expected a number of heads Hkv that divides q's H={heads} (GQA/MQA), "
                         f"got Hkv={kv_heads} in {describe(k)}")
    if not isinstance(is_causal, bool):
        raise TypeError(f"is_causal: expected a bool, got {describe(is_causal)}")
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, numbers.Real)):
        raise TypeError(f"scale: expected None or a real number, got {describe(scale)}")

    mask_requires_grad = False
    if attn_mask is not None:
        if not isinstance(attn_mask, torch.Tensor):
            raise TypeError(f"attn_mask: expected None or a torch.Tensor, got {describe(attn_mask)}")
        if attn_mask.dtype != torch.bool and not attn_mask.is_floating_point():
            raise TypeError(f"attn_mask: expected dtype bool (True = attend) or a float dtype (added to the "
                            f"scores), got {describe(attn_mask)}")
        if attn_mask.dim() > 4:
            raise ValueError(f"attn_mask: expected at most 4 dims, broadcastable to (B, H, Sq, Sk) = "
                             f"{(batch, heads, q_len, k_len)}, got {describe(attn_mask)}")
        expect_broadcastable("attn_mask", attn_mask, (batch, heads, q_len, k_len),
                             "(B, H, Sq, Sk) as in scaled_dot_product_attention")
        expect_same_device("q", q, attn_mask=attn_mask)
        mask_requires_grad = attn_mask.is_floating_point() and attn_mask.requires_grad
    if key_padding_mask is not None:
        if not isinstance(key_padding_mask, torch.Tensor):
            raise TypeError(f"key_padding_mask: expected None or a torch.Tensor, got {describe(key_padding_mask)}")
        if key_padding_mask.dtype != torch.bool:
            raise TypeError(f"key_padding_mask: expected dtype bool (True = padding, ignored), got "
                            f"{describe(key_padding_mask)}; pass a float mask as attn_mask[:, None, None, :]")
        if tuple(key_padding_mask.shape) != (batch, k_len):
            raise ValueError(f"key_padding_mask: expected shape (B, Sk) = {(batch, k_len)}, got "
                             f"{describe(key_padding_mask)}")
        expect_same_device("q", q, key_padding_mask=key_padding_mask)

    features = (
        ("head_dim", int(head_dim)),
        ("has_mask", attn_mask is not None or key_padding_mask is not None),
        ("gqa", kv_heads != heads),
        ("mask_requires_grad", bool(mask_requires_grad)),
        ("is_causal", bool(is_causal)),
        ("q_len", int(q_len)),
        ("k_len", int(k_len)),
    )
    return dispatch.Problem(op="attention", device=q.device, dtype=q.dtype,
                            kind=mask_kind(attn_mask, key_padding_mask, is_causal), features=features)


def attention(q, k, v, *, attn_mask=None, key_padding_mask=None, is_causal=False, scale=None,
              backend: str = "auto"):
    """Scaled dot-product attention, q: (B, H, Sq, D); k, v: (B, Hkv, Sk, D), H % Hkv == 0.

    attn_mask: as in F.scaled_dot_product_attention (bool: True = attend; float: added to the
    scores; broadcastable to (B, H, Sq, Sk)). key_padding_mask: as in nn.MultiheadAttention
    (bool (B, Sk), True = padding). is_causal: top-left aligned. A query row with no key left
    returns zeros and zero gradients. backend: "auto" (the fastest backend verified on this
    machine) or a name from `gpuparity.dispatch.backends("attention")`, which is forced and
    raises with its reasons when it cannot serve the call.
    """
    if not isinstance(backend, str):
        raise TypeError(f"backend: expected a backend name (str) or 'auto', got {describe(backend)}")
    problem = attention_problem(q, k, v, attn_mask=attn_mask, key_padding_mask=key_padding_mask,
                                is_causal=is_causal, scale=scale)
    chosen = select.resolve(problem, backend)
    return chosen.fn(q, k, v, attn_mask=attn_mask, key_padding_mask=key_padding_mask, is_causal=is_causal,
                     scale=scale)


def explain_attention(q, k, v, *, attn_mask=None, key_padding_mask=None, is_causal=False, scale=None
                      ) -> Dict[str, Any]:
    """Why each backend would or would not serve this call under backend="auto"
    (see dispatch.explain): {"chosen", "chosen_backend", "candidates": [...]}."""
    problem = attention_problem(q, k, v, attn_mask=attn_mask, key_padding_mask=key_padding_mask,
                                is_causal=is_causal, scale=scale)
    return select.explain(problem)
