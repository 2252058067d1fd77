"""`gpuparity.rms_norm` and `gpuparity.layer_norm`: exactly F.rms_norm / F.layer_norm, with
every input checked and the backend chosen by the verified dispatcher."""
from __future__ import annotations

from typing import Optional

import torch

from . import library_norms, select
from ..contracts.norms import ShapeLike, check_norm_inputs, norm_problem, normalized_tuple

__all__ = ["rms_norm", "layer_norm", "check_norm_inputs", "normalized_tuple"]


def rms_norm(x: torch.Tensor, normalized_shape: ShapeLike, weight: Optional[torch.Tensor] = None,
             eps: Optional[float] = None, *, backend: str = "auto") -> torch.Tensor:
    """F.rms_norm: x / sqrt(mean(x^2) + eps) * weight over the last dims; eps=None means
    torch.finfo(x.dtype).eps. Statistics in fp32 on every backend that has a kernel."""
    shape = check_norm_inputs(x, normalized_shape, weight, None, eps, eps_may_be_none=True)
    if torch.compiler.is_compiling():  # traced: one torch.library op that chooses its backend when it runs
        return library_norms.traced_norm("rms_norm", x, shape, weight, None, eps, backend)
    chosen = select.resolve(norm_problem("rms_norm", x, shape, weight, None), backend)
    return chosen.fn(x, shape, weight, eps)


def layer_norm(x: torch.Tensor, normalized_shape: ShapeLike, weight: Optional[torch.Tensor] = None,
               bias: Optional[torch.Tensor] = None, eps: float = 1e-5, *, backend: str = "auto") -> torch.Tensor:
    """F.layer_norm: (x - mean) / sqrt(var + eps) * weight + bias (biased variance)."""
    shape = check_norm_inputs(x, normalized_shape, weight, bias, eps, eps_may_be_none=False)
    if torch.compiler.is_compiling():
        return library_norms.traced_norm("layer_norm", x, shape, weight, bias, eps, backend)
    chosen = select.resolve(norm_problem("layer_norm", x, shape, weight, bias), backend)
    return chosen.fn(x, shape, weight, bias, eps)
