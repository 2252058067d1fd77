"""`gpuparity::linear_cross_entropy` as a torch.library custom op, for torch.compile(fullgraph=True)
and torch.export (the public function takes this path only while tracing). The op returns the
loss and, for mean/sum, the gradients its backend computed in the same chunked pass (empty
tensors where not wanted); its autograd formula scales them by grad_output. With reduction
"none" the backward op `::linear_cross_entropy_backward` recomputes in chunks."""
from __future__ import annotations

from typing import List, Optional, Tuple

import torch
from torch import Tensor

from ..registry import Backend
from . import select
from ..contracts.linear_cross_entropy import linear_cross_entropy_problem
from .library import _recomputed_grads

__all__ = ["linear_cross_entropy"]


def _serve(hidden, weight, target, bias, ignore_index, reduction, softcap, backend) -> Backend:
    problem = linear_cross_entropy_problem(hidden, weight, target, bias, ignore_index, reduction, softcap)
    return select.resolve(problem, backend)


def _empty(like: Tensor) -> Tensor:
    return like.new_empty(0, dtype=torch.float32)


def _loss_dtype(hidden: Tensor) -> torch.dtype:
    return torch.float64 if hidden.dtype == torch.float64 else torch.float32


@torch.library.custom_op("gpuparity::linear_cross_entropy", mutates_args=())
def linear_cross_entropy_op(hidden: Tensor, weight: Tensor, target: Tensor, bias: Optional[Tensor], ignore_index: int,
                            reduction: str, softcap: Optional[float], backend: str,
                            wanted: List[bool]) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """(loss, grad_hidden, grad_weight, grad_bias) of the loss for mean/sum (unscaled by
    grad_output); a gradient not wanted, or any with reduction "none", is an empty tensor."""
    chosen = _serve(hidden, weight, target, bias, ignore_index, reduction, softcap, backend)
    wanted = [bool(w) for w in wanted] if reduction != "none" else [False, False, False]
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


@linear_cross_entropy_op.register_fake
def _fake(hidden, weight, target, bias, ignore_index, reduction, softcap, backend, wanted):
    shape = tuple(target.shape) if reduction == "none" else ()
    params = (hidden, weight, bias)
    grads = [torch.empty(p.shape, dtype=p.dtype, device=hidden.device) if (w and p is not None and reduction != "none")
             else _empty(hidden) for p, w in zip(params, wanted)]
    return (hidden.new_empty(shape, dtype=_loss_dtype(hidden)), *grads)


@torch.library.custom_op("gpuparity::linear_cross_entropy_backward", mutates_args=())
def linear_cross_entropy_backward_op(grad: Tensor, hidden: Tensor, weight: Tensor, target: Tensor,
                                     bias: Optional[Tensor], ignore_index: int, softcap: Optional[float],
                                     backend: str, wanted: List[bool]) -> Tuple[Tensor, Tensor, Tensor]:
    """reduction "none": (grad_hidden, grad_weight, grad_bias) for the per-token grad_output."""
    chosen = _serve(hidden, weight, target, bias, ignore_index, "none", softcap, backend)
    wanted = [bool(w) for w in wanted]
    if chosen.backward_from is not None:
        grads = chosen.backward_from(grad, (None, None, None), hidden, weight, target, bias, ignore_index, "none",
                                     softcap, wanted)
    else:
        grads = _recomputed_grads(lambda h, w, b: chosen.fn(h, w, target, b, ignore_index, "none", softcap),
                                  [hidden, weight, bias], wanted, grad)
    return tuple(g.contiguous() if (g is not None and w) else _empty(hidden) for g, w in zip(grads, wanted))


@linear_cross_entropy_backward_op.register_fake
def _backward_fake(grad, hidden, weight, target, bias, ignore_index, softcap, backend, wanted):
    return tuple(torch.empty(p.shape, dtype=p.dtype, device=hidden.device) if (w and p is not None)
                 else _empty(hidden) for p, w in zip((hidden, weight, bias), wanted))


def _setup(ctx, inputs, output):
    hidden, weight, target, bias, ignore_index, reduction, softcap, backend, wanted = inputs
    ctx.spec = (ignore_index, reduction, softcap, backend, [bool(w) for w in wanted])
    if reduction == "none":
        ctx.save_for_backward(hidden, weight, target, bias)
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
    return gh, gw, None, gb, None, None, None, None, None


linear_cross_entropy_op.register_autograd(_backward, setup_context=_setup)


def linear_cross_entropy(hidden: Tensor, weight: Tensor, target: Tensor, bias: Optional[Tensor], ignore_index: int,
                         reduction: str, softcap: Optional[float], backend: str) -> Tensor:
    grad_on = torch.is_grad_enabled()
    wanted = [grad_on and hidden.requires_grad, grad_on and weight.requires_grad,
              grad_on and bias is not None and bias.requires_grad]
    return torch.ops.gpuparity.linear_cross_entropy(hidden, weight, target, bias, ignore_index, reduction, softcap,
                                                    backend, wanted)[0]
