"""torch's fp32 numerics switches, read the same way everywhere: may fp32 matmuls (cuBLAS, and
gpuparity's attention kernels, which follow them) and cuDNN convolutions use TF32 units?

torch has two APIs for this: the legacy `allow_tf32` flags with `set_float32_matmul_precision`,
and, from torch 2.9, `fp32_precision` per backend. After a script sets the new one, reading the
legacy one raises ("mix of the legacy and new APIs"); these readers use whichever is in force
and never raise."""
from __future__ import annotations

from typing import Optional

import torch


def _inherited(value: Optional[str]) -> Optional[str]:
    """A backend's fp32_precision, with "none" resolved to the global torch.backends one."""
    if value in (None, "none"):
        value = getattr(torch.backends, "fp32_precision", None)
    return value


def matmul_tf32() -> bool:
    """fp32 matmuls may run on TF32 units."""
    try:
        return bool(torch.backends.cuda.matmul.allow_tf32) or torch.get_float32_matmul_precision() != "highest"
    except RuntimeError:  # the new API is in force
        return _inherited(getattr(torch.backends.cuda.matmul, "fp32_precision", None)) == "tf32"


def cudnn_tf32() -> bool:
    """fp32 cuDNN convolutions may run on TF32 units."""
    try:
        return bool(torch.backends.cudnn.allow_tf32)
    except RuntimeError:
        conv = getattr(getattr(torch.backends.cudnn, "conv", None), "fp32_precision", None)
        if conv in (None, "none"):
            conv = getattr(torch.backends.cudnn, "fp32_precision", None)
        return _inherited(conv) == "tf32"


def default_rms_eps(dtype: torch.dtype) -> float:
    """What F.rms_norm uses for eps=None. Its docs say finfo(x.dtype).eps, but its kernels use
    the eps of the op-math dtype (float32 for fp16/bf16 inputs); we follow the kernels, since
    that is what users compare against."""
    return torch.finfo(torch.float64 if dtype == torch.float64 else torch.float32).eps


def rotate(x, cos, sin, interleaved: bool):
    """x (..., rotary_dim); cos/sin (..., rotary_dim/2) broadcast to x's leading dims."""
    if interleaved:
        x0, x1 = x[..., 0::2], x[..., 1::2]
        out0 = x0 * cos - x1 * sin
        out1 = x0 * sin + x1 * cos
        return torch.stack((out0, out1), dim=-1).flatten(-2)
    half = x.shape[-1] // 2
    x0, x1 = x[..., :half], x[..., half:]
    return torch.cat((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1)
