"""Hugging Face gated MLPs (Llama, Mistral, Qwen2, Qwen3) whose act_fn(gate_proj(x)) * up_proj(x)
runs through gpuparity.swiglu when act_fn is silu (called by patch_model): the same projections
and state_dict; the activation silu(gate) is no longer stored for the backward."""
from __future__ import annotations

from typing import Callable, Dict

import torch.nn as nn

from ..nn.summary import PatchEntry, PatchSummary
from ..ops.swiglu import swiglu

# MLP classes whose forward is down_proj(act_fn(gate_proj(x)) * up_proj(x)), checked against
# their own forward by the tests; served when act_fn is silu (Gemma's gelu is left, with why).
MLPS = ("LlamaMLP", "MistralMLP", "Qwen2MLP", "Qwen3MLP", "GemmaMLP", "Gemma2MLP")
SILU_NAMES = ("SiLU", "SiLUActivation")


def _forward(self, x):
    return self.down_proj(swiglu(self.gate_proj(x), self.up_proj(x), backend=self.gpuparity_backend))


_SWAPPED: Dict[type, type] = {}


def _swapped_class(cls: type) -> type:
    """A subclass of transformers' MLP whose forward calls gpuparity.swiglu (isinstance,
    attributes and state_dict stay the original's)."""
    if cls not in _SWAPPED:
        name = f"Gpuparity{cls.__name__}"
        new = type(name, (cls,), {"forward": _forward, "gpuparity_original": cls, "__module__": __name__,
                                  "__qualname__": name})
        globals()[name] = new  # pickle finds it by name
        _SWAPPED[cls] = new
    return _SWAPPED[cls]


def _qualname(module: nn.Module) -> str:
    return f"{type(module).__module__}.{type(module).__name__}"


def patch_mlps(model: nn.Module, *, backend: str, summary: PatchSummary, wanted: Callable[[nn.Module], bool]) -> None:
    for path, module in model.named_modules():
        cls = type(module)
        if cls.__name__ not in MLPS or not cls.__module__.startswith("transformers.") or not wanted(module):
            continue
        act = getattr(module, "act_fn", None)
        if type(act).__name__ not in SILU_NAMES:
            summary.left.append(PatchEntry(path, _qualname(module), (
                f"MLP activation {type(act).__name__}: gpuparity.swiglu is silu(gate) * up only")))
            continue
        original = _qualname(module)
        module.__class__ = _swapped_class(cls)
        module.gpuparity_backend = backend
        summary.replaced.append(PatchEntry(path, original, "MLP act_fn(gate) * up -> gpuparity.swiglu"))
