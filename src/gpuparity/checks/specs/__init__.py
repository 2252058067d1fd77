"""The battery's op specs: one per op, named by the op."""
from __future__ import annotations

from typing import Dict

from .attention import SPEC as ATTENTION
from .base import LEVELS, Case, OpSpec
from .basic import CONV2D_SPEC, CROSS_ENTROPY_SPEC, MATMUL_SPEC, SOFTMAX_SPEC
from .norms import LN_SPEC, RMS_SPEC
from .rotary import SPEC as ROTARY
from .decode import SPEC as DECODE
from .varlen import SPEC as VARLEN
from .linear_cross_entropy import SPEC as LINEAR_CE
from .swiglu import SPEC as SWIGLU

SPECS: Dict[str, OpSpec] = {spec.op: spec for spec in (
    ATTENTION, SOFTMAX_SPEC, LN_SPEC, RMS_SPEC, ROTARY, MATMUL_SPEC, CONV2D_SPEC, CROSS_ENTROPY_SPEC)}
SPECS.update({spec.op: spec for spec in (VARLEN, DECODE)})
SPECS[LINEAR_CE.op] = LINEAR_CE
SPECS[SWIGLU.op] = SWIGLU
OPS = tuple(SPECS)


def get_spec(op: str) -> OpSpec:
    if op not in SPECS:
        raise ValueError(f"op: expected one of {list(SPECS)}, got {op!r}")
    return SPECS[op]


__all__ = ["SPECS", "OPS", "get_spec", "Case", "OpSpec", "LEVELS"]
