"""What the transformers integration modules share when they swap a module's class: the
subclass that overrides only `forward`, and the module's class name as a PatchSummary records it."""
from __future__ import annotations

from typing import Any, Callable, Dict

import torch
import torch.nn as nn

# (eagerly, under torch.compile): where a swapped module's gpuparity forward serves (patching.Plan)
EVERYWHERE = (True, True)


def serves(module: nn.Module) -> bool:
    """Whether gpuparity serves this call of a swapped module: patch(mode="auto") swaps a module
    whose gpuparity forward wins in one mode only, and the other mode runs transformers' own.
    Under torch.compile this is read while tracing (a constant of the graph)."""
    eagerly, compiled = getattr(module, "gpuparity_serves", EVERYWHERE)
    # not serves[is_compiling()]: dynamo of torch 2.11 refuses a bool index into a tuple
    # ("indices must be integers or slices, not bool"), a graph break at every swapped module
    return compiled if torch.compiler.is_compiling() else eagerly


def mark(module: nn.Module, plan, kind: str) -> str:
    """Record where `module` is served (plan.serves(kind)); returns the summary's addition."""
    if plan is None:
        return ""
    module.gpuparity_serves = plan.serves(kind)
    return plan.note(kind)


def qualname(module: nn.Module) -> str:
    cls = type(module)
    return f"{cls.__module__}.{cls.__name__}"


def swapped_subclass(cls: type, forward: Callable, home: Dict[str, Any], cache: Dict[type, type],
                     **attributes) -> type:
    """Gpuparity<cls>: a subclass of `cls` whose forward is `forward` (isinstance, attributes
    and state_dict stay the original's; `gpuparity_original` names it), made once per class
    (`cache`) and bound in `home`, a module's globals, so pickle finds it by name."""
    if cls not in cache:
        name = f"Gpuparity{cls.__name__}"
        new = type(name, (cls,), {"forward": forward, "gpuparity_original": cls, "__module__": home["__name__"],
                                  "__qualname__": name, **attributes})
        home[name] = new
        cache[cls] = new
    return cache[cls]
