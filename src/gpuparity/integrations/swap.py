"""What the transformers integration modules share when they swap a module's class: the
subclass that overrides only `forward`, and the module's class name as a PatchSummary records it."""
from __future__ import annotations

from typing import Any, Callable, Dict

import torch.nn as nn


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
