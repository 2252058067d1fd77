"""`gpuparity.rms_norm` and `gpuparity.layer_norm`: exactly F.rms_norm / F.layer_norm, with
every input checked and the backend chosen by the verified dispatcher."""
from __future__ import annotations

import numbers
from typing import Optional, Sequence, Tuple, Union

import torch

from .. import dispatch
from . import select
from ..validation import FLOAT_DTYPES, describe, expect_same_device, expect_tensor

ShapeLike = Union[int, Sequence[int], torch.Size]


def normalized_tuple(name: str, normalized_shape: ShapeLike) -> Tuple[int, ...]:
    if isinstance(normalized_shape, bool):
        raise TypeError(f"{name}: expected an int or a sequence of ints, got {describe(normalized_shape)}")
    if isinstance(normalized_shape, numbers.Integral):
        shape = (int(normalized_shape),)
    else:
        try:
            shape = tuple(normalized_shape)
        except TypeError:
            raise TypeError(f"{name}: expected an int or a sequence of ints, got {describe(normalized_shape)}") from None
        if not all(isinstance(s, numbers.Integral) and not isinstance(s, bool) for s in shape):
            raise TypeError(f"{name}: expected an int or a sequence of ints, got {normalized_shape!r}")
        shape = tuple(int(s) for s in shape)
    if not shape:
        raise ValueError(f"{name}: expected at least one normalized dimension, got {normalized_shape!r}")
    if any(s < 0 for s in shape):
        raise ValueError(f"{name}: expected sizes >= 0, got {shape}")
    return shape


def check_norm_inputs(x, normalized_shape: ShapeLike, weight=None, bias=None, eps=None,
                      *, eps_may_be_none: bool) -> Tuple[int, ...]:
    """Validate the arguments of F.rms_norm / F.layer_norm; returns normalized_shape as a tuple."""
    expect_tensor("x", x, dtypes=FLOAT_DTYPES)
    shape = normalized_tuple("normalized_shape", normalized_shape)
    if x.dim() < len(shape) or tuple(x.shape[x.dim() - len(shape):]) != shape:
        raise ValueError(f"normalized_shape: expected the last {len(shape)} dimension(s) of x, "
                         f"got {shape} for x {describe(x)}")
    for name, param in (("weight", weight), ("bias", bias)):
        if param is None:
            continue
        expect_tensor(name, param, dtypes=FLOAT_DTYPES)
        if tuple(param.shape) != shape:
            raise ValueError(f"{name}: expected shape {shape} (normalized_shape), got {describe(param)}")
    expect_same_device("x", x, weight=weight, bias=bias)
    if eps is None:
        if not eps_may_be_none:
            raise TypeError("eps: expected a float >= 0, got None")
    elif isinstance(eps, bool) or not isinstance(eps, numbers.Real) or not eps >= 0:
        raise ValueError(f"eps: expected a float >= 0{' or None' if eps_may_be_none else ''}, got {describe(eps)}")
    return shape


def _hidden(shape: Tuple[int, ...]) -> int:
    n = 1
    for size in shape:
        n *= size
    return n


def rms_norm(x: torch.Tensor, normalized_shape: ShapeLike, weight: Optional[torch.Tensor] = None,
             eps: Optional[float] = None, *, backend: str = "auto") -> torch.Tensor:
    """F.rms_norm: x / sqrt(mean(x^2) + eps) * weight over the last dims; eps=None means
    torch.finfo(x.dtype).eps. Statistics in fp32 on every backend that has a kernel."""
    shape = check_norm_inputs(x, normalized_shape, weight, None, eps, eps_may_be_none=True)
    problem = dispatch.Problem("rms_norm", x.device, x.dtype, "default",
                               (("hidden", _hidden(shape)), ("weight", weight is not None)))
    chosen = select.resolve(problem, backend)
    return chosen.fn(x, shape, weight, eps)


def layer_norm(x: torch.Tensor, normalized_shape: ShapeLike, weight: Optional[torch.Tensor] = None,
               bias: Optional[torch.Tensor] = None, eps: float = 1e-5, *, backend: str = "auto") -> torch.Tensor:
    """F.layer_norm: (x - mean) / sqrt(var + eps) * weight + bias (biased variance)."""
    shape = check_norm_inputs(x, normalized_shape, weight, bias, eps, eps_may_be_none=False)
    problem = dispatch.Problem("layer_norm", x.device, x.dtype, "default",
                               (("hidden", _hidden(shape)), ("weight", weight is not None),
                                ("bias", bias is not None)))
    chosen = select.resolve(problem, backend)
    return chosen.fn(x, shape, weight, bias, eps)
