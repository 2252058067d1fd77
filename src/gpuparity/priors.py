"""Speed priors per device family: the order in which `backend="auto"` tries an op's backends
before anything was timed on this machine.

A first auto call verifies one candidate, not every backend: it needs an order to pick that
candidate from (the selector, ops/select.py, ranks by `order`; checks/ verifies). Timings
measured here (`gpuparity doctor`, or the background refinement a first call starts on a GPU)
replace the prior as soon as they are stored. A prior only ranks: a backend is still used only
after its checks passed here, and a confirmed known issue still rules it out.

Each op's contract declares its priors (`OpSpec.priors` in contracts/<op>.py: data), per device
family; `PRIORS` here overrides one (tests plant orders there). Each entry lists backend names
fastest first, as measured in the records below; "composition" in a list means: stop there and use the op's trusted plain
composition (the fallback, never probed) rather than verify what follows. Backends an entry
does not name come after the named ones in registration order; the composition stays the last
resort. An op may give a separate order for training-size calls ("large": what the spec's
`is_large` says), as the doctor's two timing cases do.

Where the numbers came from:
- "cuda": benchmarks/records/h100/doctor-2026-11-26.md, full text in
  `git show f975455:benchmarks/records/h100/doctor-2026-11-26.txt` ("Recommended configuration":
  triton first for attention, linear_cross_entropy and decode; torch on the small timing case and
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

# Per family, op -> an order that overrides the op's declared one (a test's, or a user's
# experiment); empty as shipped: each op's contract declares its priors (`OpSpec.priors`).
PRIORS: Dict[str, Dict[str, Order]] = {"cuda": {}, "cpu": {}}


def declared(op: str) -> Dict[str, Order]:
    """The priors `op`'s contract declares ({} for an op without a contract)."""
    from .contracts import CONTRACTS, get_spec
    return get_spec(op).priors if op in CONTRACTS else {}


def family(device: torch.device) -> str:
    """The PRIORS table that speaks for `device`."""
    return "cuda" if torch.device(device).type == "cuda" else "cpu"


def order(op: str, device: torch.device, large: bool = False) -> List[str]:
    """Backend names of `op`, fastest first by this device family's prior ([] when it has none)."""
    entry = PRIORS.get(family(device), {}).get(op)
    if entry is None:
        entry = declared(op).get(family(device), [])
    if isinstance(entry, dict):
        entry = entry.get("large" if large else "default") or entry.get("default", [])
    return list(entry)
