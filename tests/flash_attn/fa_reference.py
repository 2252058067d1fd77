"""A float64 referee written in FlashAttention's own terms ((B, S, H, D), bottom-right alignment,
ALiBi as -slope * |i + Sk - Sq - j|), independent of how gpuparity.flash_attn composes its masks,
and the tolerance-policy check of an output and its gradients against it."""
from __future__ import annotations

import torch

from gpuparity.tolerance import judge


def reference(q, k, v, *, causal=False, window=(-1, -1), softcap=0.0, alibi=None, scale=None, q_lens=None,
              k_lens=None, key_start=None, keep=None, dropout_p=0.0, dtype=torch.float64):
    """(out (B, Sq, H, D), lse (B, H, Sq), empty (B, Sq)) computed in `dtype` (float64: the referee).
    q_lens/k_lens (B,): item b's valid queries/keys (padding after); key_start (B,): keys before it
    are padding; keep (B, H, Sq, Sk) bool: the dropout mask."""
    q, k, v = (t.to(dtype) for t in (q, k, v))
    batch, q_len, heads, head_dim = q.shape
    k_len = k.shape[1]
    group = heads // k.shape[2]
    k, v = k.repeat_interleave(group, dim=2), v.repeat_interleave(group, dim=2)
    scale = head_dim ** -0.5 if scale is None else scale
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * scale
    if softcap > 0:
        scores = softcap * torch.tanh(scores / softcap)
    device = q.device   # the index arithmetic next to the scores (a GPU run keeps them there)
    ql = torch.full((batch,), q_len, device=device) if q_lens is None else q_lens.to(device).long()
    kl = torch.full((batch,), k_len, device=device) if k_lens is None else k_lens.to(device).long()
    i = torch.arange(q_len, device=device).view(1, -1, 1)
    j = torch.arange(k_len, device=device).view(1, 1, -1)
    diagonal = i + (kl - ql).view(-1, 1, 1)            # the key position of query i
    ok = (j < kl.view(-1, 1, 1)) & (i < ql.view(-1, 1, 1))
    if key_start is not None:
        ok &= j >= key_start.to(device).long().view(-1, 1, 1)
    left, right = window
    right = 0 if causal else right
    if left >= 0:
        ok &= j >= diagonal - left
    if right >= 0:
        ok &= j <= diagonal + right
    if alibi is not None:
        slopes = alibi.to(device, dtype).reshape(-1, heads, 1, 1)
        scores = scores - slopes * (diagonal - j).abs().unsqueeze(1).to(dtype)
    scores = scores.masked_fill(~ok.unsqueeze(1), float("-inf"))
    empty = ~ok.any(-1)
    lse = torch.logsumexp(scores, dim=-1)
    probs = torch.softmax(scores.masked_fill(empty.view(batch, 1, q_len, 1), 0.0), dim=-1)
    probs = probs.masked_fill(empty.view(batch, 1, q_len, 1), 0.0)
    if keep is not None:
        probs = torch.where(keep.to(device), probs / (1 - dropout_p), torch.zeros((), dtype=probs.dtype, device=device))
    out = torch.einsum("bhqk,bkhd->bqhd", probs.to(dtype), v)
    return out, lse, empty


def check(got, ref, baseline, dtype, names=("out", "dq", "dk", "dv"), must_be_zero=None):
    """Each of got against ref (float64) under the tolerance policy; asserts."""
    for i, (name, mine, want, base) in enumerate(zip(names, got, ref, baseline)):
        zero = must_be_zero if i == 0 else None
        result = judge(name, mine, want, base, dtype, must_be_zero=zero)
        assert result.passed, result.reason


def grads(fn, leaves, grad):
    """[out, *grads of leaves] of out = fn(*leaves)."""
    leaves = [t.detach().clone().requires_grad_() for t in leaves]
    out = fn(*leaves)
    out = out[0] if isinstance(out, tuple) else out
    out.backward(grad.to(out.dtype))
    return [out.detach()] + [t.grad.detach() for t in leaves]
