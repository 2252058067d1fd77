"""Hugging Face gated MLPs (Llama, Mistral, Qwen2, Qwen3) whose act_fn(gate_proj(x)) * up_proj(x)
runs through gpuparity.swiglu when act_fn is silu (called by patch_model): the same projections
and state_dict; the activation silu(gate) is no longer stored for the backward."""
from __future__ import annotations

from typing import Callable, Dict

import torch.nn as nn

from .summary import PatchEntry, PatchSummary
from ..ops.swiglu import swiglu
from .swap import mark, qualname, serves, swapped_subclass

# MLP classes whose forward is down_proj(act_fn(gate_proj(x)) * up_proj(x)), checked against
# their own forward by the tests; served when act_fn is silu (Gemma's gelu is left, with why).
MLPS = ("LlamaMLP", "MistralMLP", "Qwen2MLP", "Qwen3MLP", "GemmaMLP", "Gemma2MLP")
SILU_NAMES = ("SiLU", "SiLUActivation")


def _forward(self, x):
    if not serves(self):
        return self.gpuparity_original.forward(self, x)
    return self.down_proj(swiglu(self.gate_proj(x), self.up_proj(x), backend=self.gpuparity_backend))


_SWAPPED: Dict[type, type] = {}


def patch_mlps(model: nn.Module, *, backend: str, summary: PatchSummary, wanted: Callable[[nn.Module], bool],
               plan=None) -> None:
    left = None if plan is None else plan.left("swiglu")
    for path, module in model.named_modules():
        cls = type(module)
        if cls.__name__ not in MLPS or not cls.__module__.startswith("transformers.") or not wanted(module):
            continue
        act = getattr(module, "act_fn", None)
        if type(act).__name__ not in SILU_NAMES:
            summary.left.append(PatchEntry(path, qualname(module), (
                f"MLP activation {type(act).__name__}: gpuparity.swiglu is silu(gate) * up only")))
            continue
        original = qualname(module)
        if left is not None:
            summary.left.append(PatchEntry(path, original, f"MLP: {left}"))
            continue
        module.__class__ = swapped_subclass(cls, _forward, globals(), _SWAPPED)
        module.gpuparity_backend = backend
        summary.replaced.append(PatchEntry(path, original, "MLP act_fn(gate) * up -> gpuparity.swiglu"
                                           + mark(module, plan, "swiglu")))
