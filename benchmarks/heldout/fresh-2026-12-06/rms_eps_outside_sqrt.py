"""Held-out bug (2026-12-06): rms_norm divides by sqrt(mean(x^2)) + eps instead of
sqrt(mean(x^2) + eps). Indistinguishable on ordinary rows; wrong on rows whose mean square is near
eps (tiny or denormal activations, zero rows)."""
import torch


def _rms_norm(x, normalized_shape, weight, eps, bug):
    dims = tuple(range(-len(tuple(normalized_shape)), 0))
    # eps=None: what F.rms_norm's kernels use, the float32 eps for fp16/bf16 (its docs say
    # finfo(x.dtype).eps; a first version that followed the docs failed 9 bf16 checks)
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
