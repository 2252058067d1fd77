"""`gpuparity.attention`: masked scaled-dot-product attention with SDPA's mask semantics,
validated inputs and a backend chosen by verified dispatch (DESIGN.md contracts)."""
from __future__ import annotations

from typing import Any, Dict

import torch

from . import library, select
from .calls import attention_extras, attention_problem
from ..validation import describe

__all__ = ["attention", "explain_attention", "attention_problem"]


def attention(q, k, v, *, attn_mask=None, key_padding_mask=None, is_causal=False, scale=None,
              window=None, softcap=None, backend: str = "auto"):
    """Scaled dot-product attention, q: (B, H, Sq, D); k, v: (B, Hkv, Sk, D), H % Hkv == 0.

    attn_mask: as in F.scaled_dot_product_attention (bool: True = attend; float: added to the
    scores; broadcastable to (B, H, Sq, Sk)). key_padding_mask: as in nn.MultiheadAttention
    (bool (B, Sk), True = padding). is_causal: top-left aligned. window=(left, right): query i
    attends key j only when i - left <= j <= i + right (FlashAttention's window_size; -1 leaves
    that side unbounded; top-left aligned like is_causal when Sq != Sk). softcap=c > 0: the scaled
    scores s become c * tanh(s / c) (Gemma-2) before masks are applied. A query row with no key left
    returns zeros and zero gradients. backend: "auto" (the fastest backend verified on this
    machine) or a name from `gpuparity.dispatch.backends("attention")`, which is forced and
    raises with its reasons when it cannot serve the call.
    """
    if not isinstance(backend, str):
        raise TypeError(f"backend: expected a backend name (str) or 'auto', got {describe(backend)}")
    problem = attention_problem(q, k, v, attn_mask=attn_mask, key_padding_mask=key_padding_mask,
                                is_causal=is_causal, scale=scale, window=window, softcap=softcap)
    if torch.compiler.is_compiling():  # traced: one torch.library op that chooses its backend when it runs
        return library.attention(q, k, v, attn_mask, key_padding_mask, is_causal, scale, backend,
                                 problem.feature("window"), problem.feature("softcap"))
    chosen = select.resolve(problem, backend)
    return chosen.fn(q, k, v, attn_mask=attn_mask, key_padding_mask=key_padding_mask, is_causal=is_causal,
                     scale=scale, **attention_extras(problem))


def explain_attention(q, k, v, *, attn_mask=None, key_padding_mask=None, is_causal=False, scale=None,
                      window=None, softcap=None) -> Dict[str, Any]:
    """Why each backend would or would not serve this call under backend="auto"
    (see dispatch.explain): {"chosen", "chosen_backend", "candidates": [...]}."""
    problem = attention_problem(q, k, v, attn_mask=attn_mask, key_padding_mask=key_padding_mask,
                                is_causal=is_causal, scale=scale, window=window, softcap=softcap)
    return select.explain(problem)
