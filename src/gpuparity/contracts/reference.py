"""`gpuparity.reference`: the float64 reference of every op, gathered from the op contracts
(each defined in contracts/<op>.py), for users and tests who compare against them.

Written as plain differentiable torch compositions; callers upcast inputs to float64 on the
CPU. They define the semantics every backend is held to (docs/design.md, contracts), including
the corner cases: a fully masked attention row returns zeros with zero gradients.
"""
from __future__ import annotations

from .masks import window_allowed
from ..numerics import default_rms_eps
from .attention import attention, attention_allowed, attention_dropout, empty_query_rows
from .basic import conv2d, cross_entropy, matmul, softmax
from .decode import decode_reference
from .linear_cross_entropy import reference_linear_cross_entropy
from .norms import layer_norm, rms_norm
from .rotary import apply_rotary, rotary_positions
from .swiglu import reference_swiglu
from .residual_norm import reference_residual_norm
from .varlen import attention_varlen_reference

__all__ = ["attention", "attention_allowed", "attention_dropout", "empty_query_rows", "window_allowed",
           "softmax", "matmul", "conv2d", "cross_entropy", "rms_norm", "layer_norm", "default_rms_eps",
           "apply_rotary", "rotary_positions", "decode_reference", "attention_varlen_reference",
           "reference_linear_cross_entropy", "reference_swiglu", "reference_residual_norm"]
