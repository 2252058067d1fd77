"""Held-out bug: x / (sqrt(mean(x^2)) + eps) instead of x * rsqrt(mean(x^2) + eps)."""
import torch


def _rms_norm(x, normalized_shape, weight, eps, bug):
    dims = tuple(range(-len(tuple(normalized_shape)), 0))
    # eps=None: F.rms_norm's kernels' (fp32 eps for bf16)
    eps = torch.finfo(torch.float64 if x.dtype == torch.float64 else torch.float32).eps if eps is None else eps
    xf = x.float()
    ms = xf.pow(2).mean(dim=dims, keepdim=True)
    y = xf / (ms.sqrt() + eps) if bug else xf * torch.rsqrt(ms + eps)
    if weight is not None:
        y = y * weight.float()
    return y.to(x.dtype)


def rms_norm(x, normalized_shape, weight=None, eps=None):
    return _rms_norm(x, normalized_shape, weight, eps, True)


def correct(x, normalized_shape, weight=None, eps=None):
    return _rms_norm(x, normalized_shape, weight, eps, False)
