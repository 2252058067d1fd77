"""FlashAttention's deterministic=True on gpuparity (flash_attn_interface._backend): the backend a
call runs on, by name, is one whose backward gives the same bits on every run of the call.

ORDER lists them per op in the order preferred per device type: gpuparity's Triton kernels (no
atomics: dq and dk/dv in separate programs, GQA summed in a fixed order) and plain torch math
(sdpa_math, the composition: first on a CPU, where it needs no verification). SDPA's flash,
efficient and cuDNN kernels accumulate dq with atomics (torch warns about them under
use_deterministic_algorithms) and flex's backward is not documented deterministic; a backend
registered elsewhere is not known to be: deterministic=True moves auto off all of them.
"""
from __future__ import annotations

import os
from typing import Dict, Tuple

import torch

from .. import caches
from ..ops import dropout as _dropout
from ..registry import Problem
from ._compose import FlashAttnArgumentError

ORDER: Dict[str, Dict[str, Tuple[str, ...]]] = {
    "attention": {"cuda": ("triton", "sdpa_math", "composition"), "cpu": ("composition", "sdpa_math", "triton")},
    "attention_varlen": {"cuda": ("triton", "composition"), "cpu": ("composition", "triton")},
}
# (problem, TRITON_INTERPRET) -> the backend _first_verified chose: bounded, problems carry lengths
_CHOSEN: Dict[tuple, str] = caches.register("flash_attn.deterministic_chosen", {})
_CHOSEN_MAX = 1024


def order(op: str, device: torch.device) -> Tuple[str, ...]:
    return ORDER[op].get(device.type, ORDER[op]["cuda"])


def _first_verified(problem: Problem) -> str:
    """The first backend of ORDER that serves `problem` and passes its verification here (as auto
    verifies: a stored verdict, else a check now; the composition is trusted)."""
    from .. import dispatch
    from ..ops import select
    key = (problem, os.environ.get("TRITON_INTERPRET"))
    if key in _CHOSEN:
        return _CHOSEN[key]
    verdict = _dropout.verdict if problem.feature("dropout") is not None else select.verdict
    names = order(problem.op, problem.device)
    for name in names:
        backend = dispatch.get(problem.op, name)
        if backend.reasons(problem):
            continue
        if backend.fallback or verdict(problem, backend).get("passed"):
            if len(_CHOSEN) >= _CHOSEN_MAX:
                _CHOSEN.clear()
            _CHOSEN[key] = name
            return name
    raise FlashAttnArgumentError(f"deterministic: True, but none of the deterministic {problem.op} backends "
                                 f"{list(names)} serves this call here")


def _of(problem: Problem) -> str:
    """auto's verified choice for `problem` (waiting for its verdict: an eager first call may be
    served by a baseline while the check runs, and a later call by the verified backend, which
    would change the bits between calls) where it is deterministic, else _first_verified."""
    from ..ops import select
    waiting = _dropout.resolve if problem.feature("dropout") is not None else select.resolve_waiting
    chosen = waiting(problem, "auto").name
    return chosen if chosen in order(problem.op, problem.device) else _first_verified(problem)


def _traced(op, device, dtype, kind, features) -> str:
    """_of's answer while torch.compile traces: dynamo keeps it as a constant of the graph."""
    from torch.utils._python_dispatch import _disable_current_modes
    with _disable_current_modes():
        return _of(Problem(op, device, dtype, kind, features))


_traced._dynamo_marked_constant = True   # torch._dynamo.assume_constant_result


def backend_for(op: str, name: str, problem: Problem) -> str:
    """The backend, by name, a deterministic=True call of `op` runs on where backends() names
    `name`: that name if it is deterministic (else FlashAttnArgumentError), for "auto" _of's."""
    names = order(op, problem.device)
    if name != "auto":
        if name not in names:
            raise FlashAttnArgumentError(f"deterministic: True needs an {op} backend whose backward is deterministic "
                                         f"({', '.join(names)}), but backends({op}={name!r}) names one that is not")
        return name
    if torch.compiler.is_compiling():
        from ..ops import library
        if library._symbolic(problem.features):   # dynamic shapes: no choice per size while tracing
            return "composition"
        return _traced(op, problem.device, problem.dtype, problem.kind, problem.features)
    return _of(problem)
