"""Speed priors per device family: the order in which `backend="auto"` tries an op's backends
before anything was timed on this machine.

A first auto call verifies one candidate, not every backend: it needs an order to pick that
candidate from (the selector, ops/select.py, ranks by this table; checks/ verifies). Timings measured here (`gpuparity doctor`, or the background
refinement a first call starts on a GPU) replace the prior as soon as they are stored. A prior
only ranks: a backend is still used only after its checks passed here, and a confirmed known
issue still rules it out.

The table is data. Each entry lists backend names fastest first, as measured in the record
named beside it; "composition" in a list means: stop there and use the op's trusted plain
composition (the fallback, never probed) rather than verify what follows. Backends an entry
does not name come after the named ones in registration order; the composition stays the last
resort. An op may give a separate order for training-size calls ("large": what the spec's
`is_large` says), as the doctor's two timing cases do.

Where the numbers came from:
- "cuda": benchmarks/records/h100/doctor-2026-11-26.txt ("Recommended configuration": triton
  first for attention, linear_cross_entropy and decode; torch on the small timing case and
  triton on the large one for the norms and swiglu) and benchmarks/records/h100/attention-2026-11-24.md
  (the SDPA order below triton: cuDNN, then flash, efficient, math; flex compiles per shape
  and comes last). Measured on an H100 (sm_90); used for every CUDA or ROCm GPU until a record
  of another family says otherwise (a backend a device cannot serve is never a candidate).
- "cpu": benchmarks/records/cpu/doctor-2026-11-21.txt (sdpa_math for attention, torch for the
  norms, softmax, matmul, conv2d and cross_entropy, the composition for rotary). The compiled
  and Triton (interpreted) backends are not tried first on a CPU: inductor compiles for seconds
  per shape there and the interpreter is orders slower, so the composition comes before them.
"""
from __future__ import annotations

from typing import Dict, List, Union

import torch

Order = Union[List[str], Dict[str, List[str]]]   # a list, or {"default": [...], "large": [...]}

PRIORS: Dict[str, Dict[str, Order]] = {
    "cuda": {
        "attention": ["triton", "sdpa_cudnn", "sdpa_flash", "sdpa_efficient", "sdpa_math", "flex"],
        "attention_decode": ["triton", "sdpa"],
        "attention_varlen": ["triton"],
        "layer_norm": {"default": ["torch", "triton", "compile"], "large": ["triton", "torch", "compile"]},
        "rms_norm": {"default": ["torch", "triton", "compile"], "large": ["triton", "torch", "compile"]},
        "swiglu": {"default": ["torch", "triton"], "large": ["triton", "torch"]},
        "residual_norm": ["triton"],   # 3-7x the composition on an H100: docs/kernels-norms-rope.md
        "linear_cross_entropy": ["triton"],
        "rotary": ["triton", "compile"],
        "softmax": ["torch"],
        "matmul": ["torch"],
        "conv2d": ["torch"],
        "cross_entropy": ["torch"],
    },
    "cpu": {
        "attention": ["sdpa_math", "composition"],
        "attention_decode": ["sdpa", "composition"],
        "attention_varlen": ["composition"],
        "layer_norm": ["torch", "composition"],
        "rms_norm": ["torch", "composition"],
        "swiglu": ["torch", "composition"],
        "residual_norm": ["composition"],
        "linear_cross_entropy": ["composition"],
        "rotary": ["composition"],
        "softmax": ["torch"],
        "matmul": ["torch"],
        "conv2d": ["torch"],
        "cross_entropy": ["torch"],
    },
}


def family(device: torch.device) -> str:
    """The PRIORS table that speaks for `device`."""
    return "cuda" if torch.device(device).type == "cuda" else "cpu"


def order(op: str, device: torch.device, large: bool = False) -> List[str]:
    """Backend names of `op`, fastest first by this device family's prior ([] when it has none)."""
    entry = PRIORS.get(family(device), {}).get(op, [])
    if isinstance(entry, dict):
        entry = entry.get("large" if large else "default") or entry.get("default", [])
    return list(entry)
