"""`gpuparity::apply_rotary` and `gpuparity::apply_rotary_pair` (an attention's q and k in one
launch): the torch.library ops that gpuparity.apply_rotary and apply_rotary_pair become under
torch.compile / torch.export, with their triton_op twins (a fake implementation each, a registered
autograd formula: the backward is itself the rotation by -theta; the backend chosen as
ops/library.py describes for the dense ops). Their argument checks and the Problem a call becomes
are the op's contract's (contracts/rotary.py)."""
from __future__ import annotations

from typing import Tuple

import torch
from torch import Tensor

from ..contracts.rotary import APPLY_ROTARY, APPLY_ROTARY_PAIR, check_rotary_inputs, rotary_problem
from . import select
from .library import _kernels_traceable, _like, _op, define, deferred, traced_backend

__all__ = ["apply_rotary", "rotary_op", "rotary_pair_op"]


def _rotary_body(a) -> Tensor:
    x, cos, sin = a.x, a.cos, a.sin
    seqlen_offsets = a.offset if a.offsets is None else a.offsets
    # the checks that read device values (cu_seqlens order, offsets within the table) were
    # skipped while tracing; they run here on the real tensors
    max_seqlen = check_rotary_inputs(x, cos, sin, interleaved=a.interleaved, seqlen_offsets=seqlen_offsets,
                                     cu_seqlens=a.cu_seqlens, max_seqlen=a.max_seqlen, inplace=False)
    chosen = select.resolve(rotary_problem(x, cos, a.interleaved, seqlen_offsets, a.cu_seqlens), a.backend)
    out = chosen.fn(x, cos, sin, interleaved=a.interleaved, seqlen_offsets=seqlen_offsets, cu_seqlens=a.cu_seqlens,
                    max_seqlen=max_seqlen)
    return _like(out, x)


def _rotary_fake(a) -> Tensor:
    return torch.empty_like(a.x)


def _rotary_setup(ctx, a, output, kernels):
    ctx.kernels = kernels
    ctx.save_for_backward(a.cos, a.sin, a.offsets, a.cu_seqlens)
    ctx.spec = (a.interleaved, a.offset, a.max_seqlen, a.backend)


def _rotary_backward(ctx, grad):
    cos, sin, offsets, cu_seqlens = ctx.saved_tensors
    interleaved, offset, max_seqlen, backend = ctx.spec
    # a rotation's transpose is the rotation by -theta; the pass-through features pass through
    dx = _op("apply_rotary", ctx.kernels)(grad, cos, -sin, interleaved, offset, offsets, cu_seqlens, max_seqlen,
                                          backend)
    return {"x": dx}


rotary_op, rotary_kernels_op = define(APPLY_ROTARY, _rotary_body, _rotary_fake, _rotary_backward, _rotary_setup)


def apply_rotary(x, cos, sin, interleaved, seqlen_offsets, cu_seqlens, max_seqlen, backend) -> Tensor:
    """A traced gpuparity.apply_rotary: a composition inline, the Triton kernel as an op. With
    cu_seqlens or an offsets tensor, always the opaque op: its body checks their values (order,
    positions within the table) when it runs, which a traced composition could not."""
    chosen = traced_backend(rotary_problem(x, cos, interleaved, seqlen_offsets, cu_seqlens), backend)
    if isinstance(seqlen_offsets, Tensor):
        offset, offsets = 0, seqlen_offsets
    else:
        offset, offsets = int(seqlen_offsets), None
    plain = offsets is None and cu_seqlens is None
    if chosen.name != "triton" and plain and not deferred(chosen):
        return chosen.fn(x, cos, sin, interleaved=interleaved, seqlen_offsets=offset, max_seqlen=max_seqlen)
    kernels = plain and _kernels_traceable(x, cos, sin)
    return _op("apply_rotary", kernels)(x, cos, sin, bool(interleaved), offset, offsets, cu_seqlens, max_seqlen,
                                        chosen.name)


def _rotary_pair_body(a) -> Tuple[Tensor, Tensor]:
    chosen = select.resolve(rotary_problem(a.q, a.cos, a.interleaved, 0, None), a.backend)
    pair = getattr(chosen.fn, "pair", None)
    if pair is None:    # the backend named when the graph was traced has no pair launch
        sin = -a.sin if a.conjugate else a.sin
        q_out, k_out = (chosen.fn(x, a.cos, sin, interleaved=a.interleaved) for x in (a.q, a.k))
    else:
        q_out, k_out = pair(a.q, a.k, a.cos, a.sin, interleaved=a.interleaved, conjugate=a.conjugate)
    return _like(q_out, a.q), _like(k_out, a.k)


def _rotary_pair_fake(a) -> Tuple[Tensor, Tensor]:
    return torch.empty_like(a.q), torch.empty_like(a.k)


def _rotary_pair_setup(ctx, a, output, kernels):
    ctx.kernels = kernels
    ctx.save_for_backward(a.cos, a.sin)
    ctx.spec = (a.interleaved, a.conjugate, a.backend)


def _rotary_pair_backward(ctx, grad_q, grad_k):
    cos, sin = ctx.saved_tensors
    interleaved, conjugate, backend = ctx.spec
    # the transpose of a rotation by theta is the rotation by -theta (the kernel negates sin)
    dq, dk = _op("apply_rotary_pair", ctx.kernels)(grad_q, grad_k, cos, sin, interleaved, not conjugate, backend)
    return {"q": dq, "k": dk}


rotary_pair_op, rotary_pair_kernels_op = define(APPLY_ROTARY_PAIR, _rotary_pair_body, _rotary_pair_fake,
                                                _rotary_pair_backward, _rotary_pair_setup)
