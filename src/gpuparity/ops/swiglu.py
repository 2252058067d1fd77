"""`gpuparity.swiglu(gate, up)` = silu(gate) * up, the gated MLP activation of Llama, Mistral and
Qwen, with the backend chosen by the verified dispatcher; and `gpuparity::swiglu` (+ its backward
op) as a torch.library custom op, the path the public function takes while torch.compile or
torch.export traces it."""
from __future__ import annotations

from typing import Tuple

import torch
from torch import Tensor

from . import library, select
from ..contracts.swiglu import SWIGLU, SWIGLU_BACKWARD, swiglu_problem
from .library import _recomputed_grads

__all__ = ["swiglu"]


def swiglu(gate: Tensor, up: Tensor, *, backend: str = "auto") -> Tensor:
    """silu(gate) * up = gate * sigmoid(gate) * up, elementwise; gate and up of one shape, dtype
    and device (e.g. the two halves of a fused gate/up projection, read in place). The Triton
    backend computes in fp32 and rounds once, and its backward recomputes silu(gate) from the
    saved gate and up, so training keeps two (tokens, intermediate) tensors per layer where
    `F.silu(gate) * up` keeps three. backend: "auto" or a name from
    `gpuparity.dispatch.backends("swiglu")`."""
    problem = swiglu_problem(gate, up)
    if torch.compiler.is_compiling():
        # traced: the backend chosen now (library.traced_backend); a composition inline, the
        # Triton kernels as an op (the triton_op twin where inductor can call them)
        chosen = library.traced_backend(problem, backend)
        if chosen.forward_saving is None:
            return chosen.fn(gate, up)
        return library._op("swiglu", library._kernels_traceable(gate, up))(gate, up, chosen.name)
    return select.resolve(problem, backend).fn(gate, up)


def _swiglu_body(a) -> Tensor:
    chosen = select.resolve(swiglu_problem(a.gate, a.up), a.backend)
    if chosen.forward_saving is not None:
        return chosen.forward_saving(a.gate, a.up)[0]
    return chosen.fn(a.gate, a.up).contiguous()


def _swiglu_fake(a) -> Tensor:
    return torch.empty(a.gate.shape, dtype=a.gate.dtype, device=a.gate.device)


def _swiglu_backward_body(a) -> Tuple[Tensor, Tensor]:
    chosen = select.resolve(swiglu_problem(a.gate, a.up), a.backend)
    if chosen.backward_from is not None:
        dgate, dup = chosen.backward_from(a.grad, (), a.gate, a.up)
    else:
        dgate, dup = _recomputed_grads(chosen.fn, [a.gate, a.up], [True, True], a.grad)
    return dgate.contiguous(), dup.contiguous()


def _swiglu_backward_fake(a) -> Tuple[Tensor, Tensor]:
    return (torch.empty(a.gate.shape, dtype=a.gate.dtype, device=a.gate.device),
            torch.empty(a.up.shape, dtype=a.up.dtype, device=a.up.device))


swiglu_backward_op, swiglu_backward_kernels_op = library.define(SWIGLU_BACKWARD, _swiglu_backward_body,
                                                                _swiglu_backward_fake)


def _setup(ctx, a, output, kernels):
    ctx.kernels = kernels
    ctx.save_for_backward(a.gate, a.up)
    ctx.backend = a.backend


def _backward(ctx, grad):
    gate, up = ctx.saved_tensors
    dgate, dup = library._op("swiglu_backward", ctx.kernels)(grad, gate, up, ctx.backend)
    needs = ctx.needs_input_grad
    return {"gate": dgate if needs[0] else None, "up": dup if needs[1] else None}


swiglu_op, swiglu_kernels_op = library.define(SWIGLU, _swiglu_body, _swiglu_fake, _backward, _setup)
