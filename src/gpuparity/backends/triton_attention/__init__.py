"""gpuparity's fused masked attention in Triton, registered as backend "triton"; imports without
triton (kernels.py, the one module that imports it, is loaded on first launch)."""
from __future__ import annotations

import importlib
from typing import Dict, List, Optional, Tuple

import torch

from ...registry import Backend, Problem, register
from .. import triton_common
from ..triton_common import clear_plans
from .aot import aot_specs
from .launch import (LOG2E, MASK_ADDITIVE, MASK_BOOL, MASK_NONE, MaskArgs, TritonAttention, attention_backward,
                     attention_forward, dot_precision, dropout_mask, dropout_seed, kernel_table,
                     prepare_masks, strict_fp32_dot, triton_attention)
from .varlen import TritonAttentionVarlen, triton_attention_varlen, varlen_backward, varlen_forward
from .tiles import (ALIBI_CONFIGS, BUCKETS, CONFIGS, FAMILY_TARGETS, MAX_HEAD_DIM, SCAN_BLOCK, SHORT_CONFIGS,
                    SHORT_KEYS, TileConfig, _bucket, family, load_overrides, padded_head_dim, tile_config, triton_next_pow2)

__all__ = [
    "ALIBI_CONFIGS", "BUCKETS", "CONFIGS", "FAMILY_TARGETS", "LOG2E", "MASK_ADDITIVE", "MASK_BOOL", "MASK_NONE", "MAX_HEAD_DIM",
    "SCAN_BLOCK", "SHORT_CONFIGS", "SHORT_KEYS", "MaskArgs", "TileConfig", "TritonAttention", "_bucket",
    "aot_specs", "attention_backward", "attention_forward", "clear_plans", "dot_precision",
    "dropout_mask", "dropout_seed", "family", "kernel_table", "load_overrides", "padded_head_dim", "prepare_masks", "strict_fp32_dot",
    "tile_config", "triton_attention", "triton_attention_varlen", "triton_common", "triton_next_pow2",
    "TritonAttentionVarlen", "varlen_backward", "varlen_forward",
]

_IMPORT_ERROR: List[str] = []   # filled on the first availability question: "" when triton imports
_UNAVAILABLE: Dict[Tuple[str, bool], Optional[str]] = {}


def _import_error() -> str:
    """Why `import triton` fails here ("" when it works), asked once: the package itself never
    imports triton, so a machine without it still gets the backend, reporting why it cannot run."""
    if not _IMPORT_ERROR:
        try:
            importlib.import_module("triton")
            _IMPORT_ERROR.append("")
        except Exception as exc:  # noqa: BLE001 - the backend then reports triton as unavailable
            _IMPORT_ERROR.append(f"{type(exc).__name__}: {exc}")
    return _IMPORT_ERROR[0]


def _unavailable_reason(device_type: str) -> Optional[str]:
    """triton_unavailable_reason, cached: dispatch asks on every call."""
    key = (device_type, triton_common.interpreting())
    if key not in _UNAVAILABLE:
        _UNAVAILABLE[key] = triton_common.triton_unavailable_reason(device_type)
    return _UNAVAILABLE[key]


def _supports(problem: Problem) -> List[str]:
    reasons = []
    absent = _unavailable_reason(problem.device.type)
    if absent:
        return [f"triton: {absent}" if not absent.startswith("triton") else absent]
    head_dim = problem.feature("head_dim", 64)
    if head_dim > MAX_HEAD_DIM:
        reasons.append(f"triton: head_dim {head_dim} > {MAX_HEAD_DIM}")
    if problem.feature("mask_requires_grad"):
        reasons.append("triton: no gradient for a float attn_mask (it requires grad)")
    return reasons  # window and softcap: served in the kernels


def _availability() -> Optional[str]:
    error = _import_error()
    return f"triton: not importable ({error})" if error else None


# The forward/backward split the torch.library ops call (gpuparity.ops.library): a compiled graph
# saves (out, lse) and runs the fused backward, as TritonAttention does eagerly.
def _forward_saving(q, k, v, attn_mask, key_padding_mask, is_causal, scale, window=None, softcap=None,
                    dropout_p=0.0, seed=None):
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    out, lse = attention_forward(q, k, v, prepare_masks(q, k, attn_mask, key_padding_mask, None), bool(is_causal),
                                 scale, float(dropout_p), int(seed or 0), window=window, softcap=softcap)
    return out, (lse,)


def _backward_from(dout, saved, q, k, v, attn_mask, key_padding_mask, is_causal, scale, window=None, softcap=None,
                   dropout_p=0.0, seed=None):
    out, lse = saved
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    masks = prepare_masks(q, k, attn_mask, key_padding_mask, None)   # the kernels scan the padding themselves
    return attention_backward(dout, q, k, v, out, lse, masks, bool(is_causal), scale, float(dropout_p), int(seed or 0),
                              window=window, softcap=softcap)


# triton_attention takes the dispatcher's keywords (window, softcap, dropout_p, seed) itself:
# registered as is, one Python frame fewer per call
register(Backend("triton", "attention", triton_attention,
                 "gpuparity's fused Triton kernel (forward and backward, masks read in tiles)",
                 device_types=("cuda", "cpu"), dtypes=(torch.float16, torch.bfloat16, torch.float32),
                 availability=_availability, supports=_supports, jit=True,
                 forward_saving=_forward_saving, backward_from=_backward_from, opt_in=("dropout", "alibi")))


def _varlen_supports(problem: Problem) -> List[str]:
    absent = _unavailable_reason(problem.device.type)
    if absent:
        return [f"triton: {absent}" if not absent.startswith("triton") else absent]
    head_dim = problem.feature("head_dim", 64)
    return [f"triton: head_dim {head_dim} > {MAX_HEAD_DIM}"] if head_dim > MAX_HEAD_DIM else []


# backend="auto" uses it once the battery verified it here (contracts/varlen.py, ops.select)
register(Backend("triton", "attention_varlen", triton_attention_varlen,
                 "gpuparity's fused Triton kernels over packed sequences (no padding computed)",
                 device_types=("cuda", "cpu"), dtypes=(torch.float16, torch.bfloat16, torch.float32),
                 availability=_availability, supports=_varlen_supports, jit=True, opt_in=("alibi",)))
