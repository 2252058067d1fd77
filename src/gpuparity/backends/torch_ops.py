"""Torch's own implementations of the non-attention ops: each a thin wrapper of one torch call
(a repro script copies them in: checks/repro.py). Their plain compositions, the trusted
baselines of the battery and the last resort of "auto", are the op contracts' (contracts/)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..registry import Backend, register


# ---------------------------------------------------------------- norms
def torch_rms_norm(x, normalized_shape, weight=None, eps=None):
    return F.rms_norm(x, normalized_shape, weight, eps)   # torch >= 2.4 (pyproject.toml)


def torch_layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5):
    return F.layer_norm(x, normalized_shape, weight, bias, eps)


# ---------------------------------------------------------------- softmax / matmul / conv / loss
def torch_softmax(x, dim=-1):
    return torch.softmax(x, dim=dim)


def torch_matmul(a, b):
    return torch.matmul(a, b)


def torch_conv2d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    return F.conv2d(x, weight, bias, stride, padding, dilation, groups)


def torch_cross_entropy(logits, target, *, ignore_index=-100, label_smoothing=0.0, reduction="mean"):
    return F.cross_entropy(logits, target, ignore_index=ignore_index, label_smoothing=label_smoothing,
                           reduction=reduction)


def torch_swiglu(gate, up):
    return F.silu(gate) * up


register(Backend("torch", "rms_norm", torch_rms_norm, "torch F.rms_norm"))
register(Backend("torch", "layer_norm", torch_layer_norm, "torch F.layer_norm"))
register(Backend("torch", "softmax", torch_softmax, "torch.softmax"))
register(Backend("torch", "matmul", torch_matmul, "torch.matmul (cuBLAS / hipBLASLt / CPU BLAS)"))
register(Backend("torch", "conv2d", torch_conv2d, "F.conv2d (cuDNN / MIOpen / CPU)"))
register(Backend("torch", "cross_entropy", torch_cross_entropy, "F.cross_entropy"))
register(Backend("torch", "swiglu", torch_swiglu, "F.silu(gate) * up (autograd keeps the activation)"))
