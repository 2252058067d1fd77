"""`gpuparity::attention_varlen`: the torch.library op that gpuparity.attention_varlen becomes
under torch.compile / torch.export (a fake implementation, a registered autograd formula through
`::attention_varlen_backward`, the backend chosen in the body when it runs, as ops/library.py's
dense ops). Its argument checks, which the public function shares, are the op's contract's
(contracts/varlen.py)."""
# The Triton backend's forward saves its log-sum-exp and its backward is the fused dq / dk-dv
# kernels (_FUSED); other backends (the composition) recompute their forward under autograd in
# the backward op, as ops/library.py does for the dense ops.
from __future__ import annotations

from typing import Tuple

import torch
from torch import Tensor

from ..registry import Problem
from ..backends.triton_attention.varlen import triton_attention_varlen, varlen_backward_from, varlen_forward_saving
from ..contracts.varlen import ATTENTION_VARLEN, ATTENTION_VARLEN_BACKWARD, attention_varlen_problem
from .library import _like, _recomputed_grads, _serve, _served, define

__all__ = ["attention_varlen_op", "attention_varlen_problem"]


# ----------------------------------------------------------------------------- the torch.library ops
# backend function -> (forward_saving, backward_from) where the registry entry does not carry them
_FUSED = {triton_attention_varlen: (varlen_forward_saving, varlen_backward_from)}


def _split(chosen):
    if chosen.forward_saving is not None:
        return chosen.forward_saving, chosen.backward_from
    return _FUSED.get(chosen.fn, (None, None))


def _problem(q, k, v, cu_q, cu_k, max_q, max_k, causal, window, softcap, scale, check_values=True) -> Problem:
    return attention_varlen_problem(q, k, v, cu_q, cu_k, max_q, max_k, causal=causal,
                                    window=None if window is None else tuple(window), softcap=softcap, scale=scale,
                                    check_values=check_values)


def _lse_like(q: Tensor) -> Tensor:
    return q.new_zeros((q.shape[1], q.shape[0]), dtype=torch.float32)


def _attention_varlen_body(a) -> Tuple[Tensor, Tensor]:
    """(out, lse): lse (H, total_q) float32 is what the Triton backward reads (zeros otherwise)."""
    # the checks of cu_seqlens' values were skipped while tracing; they run here, on real tensors
    problem = _problem(a.q, a.k, a.v, a.cu_seqlens_q, a.cu_seqlens_k, a.max_seqlen_q, a.max_seqlen_k, a.causal,
                       a.window, a.softcap, a.scale)
    chosen = _serve(problem, a.backend)
    forward_saving, _ = _split(chosen)
    args = (a.q, a.k, a.v, a.cu_seqlens_q, a.cu_seqlens_k, a.max_seqlen_q, a.max_seqlen_k)
    flags = dict(causal=a.causal, window=problem.feature("window"), softcap=problem.feature("softcap"),
                 scale=a.scale)
    if forward_saving is not None:
        out, (lse,) = forward_saving(*args, **flags)
    else:
        out, lse = chosen.fn(*args, **flags), _lse_like(a.q)
    return _like(out, a.q), lse


def _attention_varlen_fake(a) -> Tuple[Tensor, Tensor]:
    return torch.empty_like(a.q), a.q.new_empty((a.q.shape[1], a.q.shape[0]), dtype=torch.float32)


def _attention_varlen_backward_body(a) -> Tuple[Tensor, Tensor, Tensor]:
    """(dq, dk, dv) with the backend the forward served this call with."""
    q, k, v = a.q, a.k, a.v
    problem = _problem(q, k, v, a.cu_seqlens_q, a.cu_seqlens_k, a.max_seqlen_q, a.max_seqlen_k, a.causal, a.window,
                       a.softcap, a.scale, check_values=False)
    chosen = _served(problem, a.backend)
    _, backward_from = _split(chosen)
    args = (a.cu_seqlens_q, a.cu_seqlens_k, a.max_seqlen_q, a.max_seqlen_k)
    flags = dict(causal=a.causal, window=problem.feature("window"), softcap=problem.feature("softcap"),
                 scale=a.scale)
    if backward_from is not None:
        dq, dk, dv = backward_from(a.grad, (a.out, a.lse), q, k, v, *args, **flags)
    else:
        dq, dk, dv = _recomputed_grads(lambda q_, k_, v_: chosen.fn(q_, k_, v_, *args, **flags), [q, k, v],
                                       [True, True, True], a.grad)
    return _like(dq, q), _like(dk, k), _like(dv, v)


def _attention_varlen_backward_fake(a) -> Tuple[Tensor, Tensor, Tensor]:
    return torch.empty_like(a.q), torch.empty_like(a.k), torch.empty_like(a.v)


# no triton_op twin for the backward op either
attention_varlen_backward_op, _ = define(ATTENTION_VARLEN_BACKWARD, _attention_varlen_backward_body,
                                         _attention_varlen_backward_fake, twin=False)


def _setup(ctx, a, output, kernels):
    ctx.save_for_backward(a.q, a.k, a.v, output[0], output[1], a.cu_seqlens_q, a.cu_seqlens_k)
    ctx.spec = (a.max_seqlen_q, a.max_seqlen_k, a.causal, a.window, a.softcap, a.scale, a.backend)


def _backward(ctx, grad, _grad_lse):
    q, k, v, out, lse, cu_q, cu_k = ctx.saved_tensors
    max_q, max_k, causal, window, softcap, scale, backend = ctx.spec
    dq, dk, dv = torch.ops.gpuparity.attention_varlen_backward(grad.contiguous(), q, k, v, out, lse, cu_q, cu_k,
                                                               max_q, max_k, causal, window, softcap, scale, backend)
    return {"q": dq, "k": dk, "v": dv}


# no triton_op twin: the opaque op serves every traced call
attention_varlen_op, _ = define(ATTENTION_VARLEN, _attention_varlen_body, _attention_varlen_fake, _backward, _setup,
                                twin=False)
