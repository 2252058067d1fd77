"""Input validation shared by every public function: errors that name the argument, what it
got (shape, dtype, device) and what it needs."""
from __future__ import annotations

from typing import Iterable, Optional, Sequence

import torch

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def describe(value) -> str:
    """A short description of a value for error messages."""
    if isinstance(value, torch.Tensor):
        return f"Tensor(shape={tuple(value.shape)}, dtype={str(value.dtype).replace('torch.', '')}, device={value.device})"
    return f"{type(value).__name__} {value!r}"


def expect_tensor(name: str, value, *, ndim: Optional[Iterable[int]] = None,
                  dtypes: Optional[Sequence[torch.dtype]] = None) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {describe(value)}")
    if ndim is not None:
        allowed = tuple(ndim)
        if value.dim() not in allowed:
            want = " or ".join(str(n) for n in allowed)
            raise ValueError(f"{name}: expected a {want}-D tensor, got {describe(value)}")
    if dtypes is not None and value.dtype not in dtypes:
        names = ", ".join(str(d).replace("torch.", "") for d in dtypes)
        raise TypeError(f"{name}: expected dtype in ({names}), got {describe(value)}")
    return value


def expect_same_device(reference_name: str, reference: torch.Tensor, **others) -> None:
    for name, other in others.items():
        if other is not None and other.device != reference.device:
            raise ValueError(
                f"{name}: expected a tensor on {reference.device} (the device of {reference_name}), "
                f"got {describe(other)}")


def expect_same_dtype(reference_name: str, reference: torch.Tensor, **others) -> None:
    for name, other in others.items():
        if other is not None and other.dtype != reference.dtype:
            raise TypeError(
                f"{name}: expected dtype {str(reference.dtype).replace('torch.', '')} "
                f"(the dtype of {reference_name}), got {describe(other)}")


def expect_broadcastable(name: str, value: torch.Tensor, target: Sequence[int], meaning: str) -> None:
    """Masks may broadcast only in the torch sense: same rank, each dim 1 or equal."""
    target = tuple(target)
    shape = tuple(value.shape)
    ok = len(shape) <= len(target) and all(
        s == 1 or s == t for s, t in zip(shape[::-1], target[::-1]))
    if not ok:
        raise ValueError(f"{name}: expected a tensor broadcastable to {target} ({meaning}), "
                         f"got {describe(value)}")
