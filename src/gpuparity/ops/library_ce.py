"""gpuparity.linear_cross_entropy while torch.compile or torch.export traces it (the public
function takes this path only then).

One pass, when the traced call's backend is the Triton one, the reduction mean or sum, the shapes
static and the whole logits (tokens x vocab, in the input dtype) at most ONE_PASS_BYTES: the LM
head's GEMM, the backward's two GEMMs and the reduction are plain torch ops in the graph (inductor
calls the same matmuls it would for F.linear + F.cross_entropy), and between them one row kernel
reads the logits once (L2 serves its second sweep) and writes the loss and the gradient
(`gpuparity::cross_entropy_rows`, a triton_op inductor calls from its generated code). Inductor's
own loss reads the logits in its forward and again in its backward, in fp32; the gradient here
exists after the forward instead of the logits, the same bytes. The backward scales by
grad_output on the small sides (hidden (N, H) before the weight's GEMM, the hidden gradient
after its GEMM), never on a (N, V) or (V, H) tensor.

Otherwise the custom op `gpuparity::linear_cross_entropy`: the loss and, for mean/sum, the
gradients its backend computed in the same chunked pass (empty tensors where not wanted); its
autograd formula scales them by grad_output. With reduction "none" the backward op
`::linear_cross_entropy_backward` recomputes in chunks."""
from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor

from . import library, select
from ..backends import ce_composition, triton_cross_entropy
from ..contracts.linear_cross_entropy import (LINEAR_CROSS_ENTROPY, LINEAR_CROSS_ENTROPY_BACKWARD,
                                              linear_cross_entropy_problem)
from .library import _recomputed_grads

# The most bytes of whole logits (tokens x vocab, input dtype) the traced one pass makes; above,
# the chunked op (whose chunks hold at most ce_composition.CHUNK_BYTES of fp32 logits).
ONE_PASS_BYTES = 1 << 30

__all__ = ["traced"]


def _empty(like: Tensor) -> Tensor:
    return like.new_empty(0, dtype=torch.float32)


def _loss_dtype(hidden: Tensor) -> torch.dtype:
    return torch.float64 if hidden.dtype == torch.float64 else torch.float32


def _linear_cross_entropy_body(a) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """(loss, grad_hidden, grad_weight, grad_bias) of the loss for mean/sum (unscaled by
    grad_output); a gradient not wanted, or any with reduction "none", is an empty tensor."""
    hidden, weight, target, bias = a.hidden, a.weight, a.target, a.bias
    ignore_index, reduction, softcap = a.ignore_index, a.reduction, a.softcap
    chosen = select.resolve(linear_cross_entropy_problem(hidden, weight, target, bias, ignore_index, reduction,
                                                         softcap), a.backend)
    wanted = [bool(w) for w in a.wanted] if reduction != "none" else [False, False, False]
    if chosen.forward_saving is not None:
        loss, grads = chosen.forward_saving(hidden, weight, target, bias, ignore_index, reduction, softcap, wanted)
    else:
        def forward(hidden_, weight_, bias_):
            return chosen.fn(hidden_, weight_, target, bias_, ignore_index, reduction, softcap)
        with torch.no_grad():
            loss = forward(hidden, weight, bias)
        grads = (_recomputed_grads(forward, [hidden, weight, bias], wanted, torch.ones_like(loss))
                 if any(wanted) else (None, None, None))
    grads = [g.contiguous() if (g is not None and w) else _empty(hidden) for g, w in zip(grads, wanted)]
    return (loss.clone() if loss._base is not None else loss), *grads


def _fake(a) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    hidden = a.hidden
    shape = tuple(a.target.shape) if a.reduction == "none" else ()
    grads = [torch.empty(p.shape, dtype=p.dtype, device=hidden.device)
             if (w and p is not None and a.reduction != "none") else _empty(hidden)
             for p, w in zip((hidden, a.weight, a.bias), a.wanted)]
    return (hidden.new_empty(shape, dtype=_loss_dtype(hidden)), *grads)


def _backward_body(a) -> Tuple[Tensor, Tensor, Tensor]:
    """reduction "none": (grad_hidden, grad_weight, grad_bias) for the per-token grad_output."""
    hidden, weight, target, bias = a.hidden, a.weight, a.target, a.bias
    chosen = select.resolve(linear_cross_entropy_problem(hidden, weight, target, bias, a.ignore_index, "none",
                                                         a.softcap), a.backend)
    wanted = [bool(w) for w in a.wanted]
    if chosen.backward_from is not None:
        grads = chosen.backward_from(a.grad, (None, None, None), hidden, weight, target, bias, a.ignore_index, "none",
                                     a.softcap, wanted)
    else:
        grads = _recomputed_grads(lambda h, w, b: chosen.fn(h, w, target, b, a.ignore_index, "none", a.softcap),
                                  [hidden, weight, bias], wanted, a.grad)
    return tuple(g.contiguous() if (g is not None and w) else _empty(hidden) for g, w in zip(grads, wanted))


def _backward_fake(a) -> Tuple[Tensor, Tensor, Tensor]:
    return tuple(torch.empty(p.shape, dtype=p.dtype, device=a.hidden.device) if (w and p is not None)
                 else _empty(a.hidden) for p, w in zip((a.hidden, a.weight, a.bias), a.wanted))


# opaque op only, as the forward
linear_cross_entropy_backward_op, _ = library.define(LINEAR_CROSS_ENTROPY_BACKWARD, _backward_body, _backward_fake,
                                                     twin=False)


def _setup(ctx, a, output, kernels):
    ctx.spec = (a.ignore_index, a.reduction, a.softcap, a.backend, [bool(w) for w in a.wanted])
    if a.reduction == "none":
        ctx.save_for_backward(a.hidden, a.weight, a.target, a.bias)
    else:
        ctx.save_for_backward(*output[1:])


def _backward(ctx, grad, *_unused):
    ignore_index, reduction, softcap, backend, wanted = ctx.spec
    if reduction == "none":
        hidden, weight, target, bias = ctx.saved_tensors
        grads = torch.ops.gpuparity.linear_cross_entropy_backward(grad, hidden, weight, target, bias, ignore_index,
                                                                  softcap, backend, wanted)
    else:
        grads = [g * grad.to(g.dtype) for g in ctx.saved_tensors]
    gh, gw, gb = (g if w else None for g, w in zip(grads, wanted))
    return {"hidden": gh, "weight": gw, "bias": gb}


linear_cross_entropy_op, _ = library.define(LINEAR_CROSS_ENTROPY, _linear_cross_entropy_body, _fake, _backward,
                                            _setup, twin=False)


# ----------------------------------------------------------------------------- traced one pass
def _rows(logits: Tensor, target: Tensor, scale: Tensor, ignore_index: int,
          softcap: Optional[float]) -> Tuple[Tensor, Tensor]:
    """(per-row losses (N,) fp32, d(sum_r scale * loss_r)/d logits in the logits' dtype) from the
    Triton row kernel: one read of each row for its logsumexp, one more (mostly from L2) for the
    gradient, written into a new buffer (an op's outputs alias none of its inputs)."""
    losses = logits.new_empty(logits.shape[0], dtype=torch.float32)
    lse = torch.empty_like(losses)
    grad = torch.empty_like(logits, memory_format=torch.contiguous_format)
    triton_cross_entropy.triton_rows(logits, target, losses, lse, scale, ignore_index, softcap, True, grad_out=grad)
    return losses, grad


@torch.library.custom_op("gpuparity::cross_entropy_rows", mutates_args=())
def cross_entropy_rows_op(logits: Tensor, target: Tensor, scale: Tensor, ignore_index: int,
                          softcap: Optional[float]) -> Tuple[Tensor, Tensor]:
    """_rows as an opaque op (the interpreter's kernels, dynamic shapes)."""
    return _rows(logits, target, scale, ignore_index, softcap)


@cross_entropy_rows_op.register_fake
def _rows_fake(logits, target, scale, ignore_index, softcap):
    return (logits.new_empty(logits.shape[0], dtype=torch.float32),
            torch.empty_like(logits, memory_format=torch.contiguous_format))


library._twin("cross_entropy_rows", _rows)   # gpuparity::cross_entropy_rows_kernels (torch >= 2.6)


class _OnePass(torch.autograd.Function):
    """The traced one pass (see the top): the gradient of the logits from the forward, the GEMMs
    in the backward, scaled by grad_output on their small operands."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, target, ignore_index, reduction, softcap):
        hidden2, target1 = hidden.reshape(-1, hidden.shape[-1]), target.reshape(-1)
        logits = torch.nn.functional.linear(hidden2, weight, bias)
        scale = (ce_composition.mean_scale(target1, ignore_index, torch.float32) if reduction == "mean"
                 else torch.ones((), dtype=torch.float32, device=hidden.device))
        kernels = library._kernels_traceable(logits)
        losses, grad = library._op("cross_entropy_rows", kernels)(logits, target1, scale, ignore_index, softcap)
        ctx.save_for_backward(grad, hidden2, weight)
        ctx.shape, ctx.bias_dtype = hidden.shape, None if bias is None else bias.dtype
        total = losses.sum()
        return total * scale if reduction == "mean" else total

    @staticmethod
    def backward(ctx, g):
        grad, hidden2, weight = ctx.saved_tensors
        g = g.reshape(())
        needs = ctx.needs_input_grad
        gh = (torch.mm(grad, weight) * g).to(hidden2.dtype).reshape(ctx.shape) if needs[0] else None
        gw = torch.mm(grad.t(), hidden2 * g.to(hidden2.dtype)) if needs[1] else None
        gb = (grad.sum(0, dtype=torch.float32) * g).to(ctx.bias_dtype) if needs[2] else None
        return gh, gw, gb, None, None, None, None


def _one_pass(problem, hidden: Tensor, weight: Tensor, target: Tensor, bias: Optional[Tensor], reduction: str,
              backend: str) -> bool:
    """Whether this traced call takes the one pass (see the top); the backend is chosen now."""
    if reduction == "none" or not library._static(hidden, weight, target, bias):
        return False
    tokens = hidden.numel() // max(1, hidden.shape[-1])
    if tokens * weight.shape[0] * hidden.element_size() > ONE_PASS_BYTES:
        return False
    return library.traced_backend(problem, backend).name == "triton"


def traced(problem, hidden: Tensor, weight: Tensor, target: Tensor, bias: Optional[Tensor], ignore_index: int,
           reduction: str, softcap: Optional[float], backend: str) -> Tensor:
    """gpuparity.linear_cross_entropy while torch.compile or torch.export traces it (`problem`:
    the call's, from the public function)."""
    if _one_pass(problem, hidden, weight, target, bias, reduction, backend):
        return _OnePass.apply(hidden, weight, bias, target, ignore_index, reduction, softcap)
    grad_on = torch.is_grad_enabled()
    wanted = [grad_on and hidden.requires_grad, grad_on and weight.requires_grad,
              grad_on and bias is not None and bias.requires_grad]
    return torch.ops.gpuparity.linear_cross_entropy(hidden, weight, target, bias, ignore_index, reduction, softcap,
                                                    backend, wanted)[0]
