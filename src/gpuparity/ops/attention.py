"""`gpuparity.attention`: masked scaled-dot-product attention with SDPA's mask semantics,
validated inputs and a backend chosen by verified dispatch (DESIGN.md contracts)."""
from __future__ import annotations

from typing import Any, Dict

import torch

from . import library, select
from .calls import attention_problem
from ..validation import describe

__all__ = ["attention", "explain_attention", "attention_problem"]


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
    if torch.compiler.is_compiling():  # traced: one torch.library op that chooses its backend when it runs
        return library.attention(q, k, v, attn_mask, key_padding_mask, is_causal, scale, backend)
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
