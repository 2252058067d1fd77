"""Held-out bug: variance in one pass, E[x^2] - E[x]^2 in fp32 (cancels at large mean / spread)."""
import torch


def _layer_norm(x, normalized_shape, weight, bias, eps, bug):
    dims = tuple(range(-len(tuple(normalized_shape)), 0))
    xf = x.float()
    mean = xf.mean(dim=dims, keepdim=True)
    if bug:
        var = (xf.pow(2).mean(dim=dims, keepdim=True) - mean.pow(2)).clamp_min(0)
    else:
        var = (xf - mean).pow(2).mean(dim=dims, keepdim=True)
    y = (xf - mean) * torch.rsqrt(var + eps)
    if weight is not None:
        y = y * weight.float()
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)


def layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5):
    return _layer_norm(x, normalized_shape, weight, bias, eps, True)


def correct(x, normalized_shape, weight=None, bias=None, eps=1e-5):
    return _layer_norm(x, normalized_shape, weight, bias, eps, False)
