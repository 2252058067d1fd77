"""`gpuparity.attention`: masked scaled-dot-product attention with SDPA's mask semantics,
validated inputs and a backend chosen by verified dispatch (docs/design.md, contracts)."""
from __future__ import annotations

from typing import Any, Dict

import torch

from .. import dispatch
from ..backends.triton_attention.launch import SEED_LIMIT  # seeds below 2**30: the kernels add B * H in int32
from . import dropout, library, select
from ..contracts.attention import attention_call, attention_problem
from .dropout import attention_dropout_mask
from ..validation import describe

__all__ = ["attention", "attention_dropout_mask", "attention_lse", "explain_attention", "attention_problem"]

_LSE_ROWS = 1 << 22  # scores per chunk of attention_lse's pass (16 MiB of fp32)


def attention(q, k, v, *, attn_mask=None, key_padding_mask=None, is_causal=False, scale=None,
              window=None, softcap=None, dropout_p: float = 0.0, generator=None, backend: str = "auto",
              return_lse: bool = False):
    """Scaled dot-product attention, q: (B, H, Sq, D); k, v: (B, Hkv, Sk, D), H % Hkv == 0.

    attn_mask: as in F.scaled_dot_product_attention (bool: True = attend; float: added to the
    scores; broadcastable to (B, H, Sq, Sk)). key_padding_mask: as in nn.MultiheadAttention
    (bool (B, Sk), True = padding). is_causal: top-left aligned. window=(left, right): query i
    attends key j only when i - left <= j <= i + right (FlashAttention's window_size; -1 leaves
    that side unbounded; top-left aligned like is_causal when Sq != Sk). softcap=c > 0: the scaled
    scores s become c * tanh(s / c) (Gemma-2) before masks are applied. A query row with no key left
    returns zeros and zero gradients. dropout_p in [0, 1): dropout on the attention probabilities
    (kept ones scaled by 1 / (1 - p)), with a seed drawn from `generator` (else torch's default
    generator for q's device, without a device sync), so torch.manual_seed(s) repeats a call; the
    backward replays the same mask. Only backends that implement dropout serve it ("triton", whose
    mask `attention_dropout_mask` regenerates, and the "composition" fallback); pass 0.0 in eval.
    backend: "auto" (the fastest backend verified on this machine) or a name from
    `gpuparity.dispatch.backends("attention")`, which is forced and raises with its reasons when it
    cannot serve the call. return_lse=True: returns (out, lse), lse the fp32 (B, H, Sq) log-sum-exp
    of each row's scaled, softcapped, masked scores (attention_lse: a separate pass, not the
    kernel's own; -inf for a row with no key; no gradient).
    """
    if not isinstance(backend, str):
        raise TypeError(f"backend: expected a backend name (str) or 'auto', got {describe(backend)}")
    if not isinstance(return_lse, bool):
        raise TypeError(f"return_lse: expected a bool, got {describe(return_lse)}")
    if return_lse:
        out = attention(q, k, v, attn_mask=attn_mask, key_padding_mask=key_padding_mask, is_causal=is_causal,
                        scale=scale, window=window, softcap=softcap, dropout_p=dropout_p, generator=generator,
                        backend=backend)
        return out, attention_lse(q, k, attn_mask=attn_mask, key_padding_mask=key_padding_mask,
                                  is_causal=is_causal, scale=scale, window=window, softcap=softcap)
    if torch.compiler.is_compiling():  # traced: one torch.library op that chooses its backend when it runs
        problem = attention_problem(q, k, v, attn_mask=attn_mask, key_padding_mask=key_padding_mask,
                                    is_causal=is_causal, scale=scale, window=window, softcap=softcap,
                                    dropout_p=dropout_p)
        p = problem.feature("dropout")
        # the seed is a tensor drawn in the graph, so each run of the compiled graph gets a new one
        seed = None if p is None else torch.randint(0, SEED_LIMIT, (), dtype=torch.int64,
                                                     generator=generator)
        return library.attention(q, k, v, attn_mask, key_padding_mask, is_causal, scale, backend,
                                 problem.feature("window"), problem.feature("softcap"), p or 0.0, seed)
    # eager: validated once per call signature (contracts.attention.attention_call), then dispatch's memo
    problem, extras = attention_call(q, k, v, attn_mask, key_padding_mask, is_causal, scale, window, softcap,
                                     dropout_p)
    if "dropout_p" not in extras:
        chosen = select.resolve(problem, backend)
        return chosen.fn(q, k, v, attn_mask=attn_mask, key_padding_mask=key_padding_mask, is_causal=is_causal,
                         scale=scale, **extras)
    chosen = dropout.resolve(problem, backend)
    return chosen.fn(q, k, v, attn_mask=attn_mask, key_padding_mask=key_padding_mask, is_causal=is_causal,
                     scale=scale, seed=dropout.draw_seed(q.device, generator), **extras)


def attention_lse(q, k, *, attn_mask=None, key_padding_mask=None, is_causal=False, scale=None, window=None,
                  softcap=None) -> torch.Tensor:
    """fp32 (B, H, Sq): logsumexp over the keys a query may attend to of its scores
    s = scale * q.k (softcapped, plus a float attn_mask), with gpuparity.attention's mask semantics
    (top-left is_causal and window); -inf for a row with no key. A separate fp32 pass over Q K^T in
    chunks of query rows, without gradient: the kernels keep their own lse private."""
    attention_problem(q, k, k, attn_mask=attn_mask, key_padding_mask=key_padding_mask, is_causal=is_causal,
                      scale=scale, window=window, softcap=softcap)
    from ..contracts.masks import allowed_mask
    from ..contracts.attention import check_window
    from ..contracts.base import check_softcap
    batch, heads, q_len, head_dim = q.shape
    k_len = k.shape[2]
    window, softcap = check_window(window, q_len, k_len), check_softcap(softcap)
    scale = head_dim ** -0.5 if scale is None else float(scale)
    with torch.no_grad():
        keys = k.float().repeat_interleave(heads // k.shape[1], dim=1) if heads != k.shape[1] else k.float()
        allowed = allowed_mask(q_len, k_len, q.device, attn_mask=attn_mask, key_padding_mask=key_padding_mask,
                               is_causal=is_causal, window=window)
        additive = None
        if attn_mask is not None and attn_mask.dtype != torch.bool:
            additive = attn_mask.float().reshape((1,) * (4 - attn_mask.dim()) + tuple(attn_mask.shape))
        lse = torch.empty(batch, heads, q_len, dtype=torch.float32, device=q.device)
        step = max(1, _LSE_ROWS // max(1, batch * heads * k_len))
        for start in range(0, q_len, step):
            rows = slice(start, min(q_len, start + step))
            scores = torch.matmul(q[:, :, rows].float(), keys.transpose(-2, -1)) * scale
            if softcap is not None:
                scores = softcap * torch.tanh(scores / softcap)
            if additive is not None:
                scores = scores + (additive if additive.shape[2] == 1 else additive[:, :, rows])
            if allowed is not None:
                scores = scores.masked_fill(~(allowed if allowed.shape[2] == 1 else allowed[:, :, rows]),
                                            float("-inf"))
            lse[:, :, rows] = torch.logsumexp(scores, dim=-1)
    return lse


def explain_attention(q, k, v, *, attn_mask=None, key_padding_mask=None, is_causal=False, scale=None,
                      window=None, softcap=None, dropout_p: float = 0.0) -> Dict[str, Any]:
    """Why each backend would or would not serve this call under backend="auto"
    (see dispatch.explain): {"chosen", "chosen_backend", "candidates": [...]}."""
    problem = attention_problem(q, k, v, attn_mask=attn_mask, key_padding_mask=key_padding_mask,
                                is_causal=is_causal, scale=scale, window=window, softcap=softcap,
                                dropout_p=dropout_p)
    if problem.feature("dropout") is not None:
        return dispatch.explain(problem, verdict=dropout.verdict)
    return select.explain(problem)
