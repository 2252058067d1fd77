"""`gpuparity.patch(model)`: swap torch.nn modules for gpuparity's verified drop-ins in place,
keeping their weights. Each drop-in class declares `from_torch(module)` and names the torch
class it replaces in `REPLACES`; the table below is the one list of drop-ins."""
from __future__ import annotations

import importlib
from typing import Dict, List, Tuple

import torch.nn as nn

# (module path, class name) of every drop-in.
DROP_INS: Tuple[Tuple[str, str], ...] = (
    ("gpuparity.nn.attention", "MultiheadAttention"),
    ("gpuparity.nn.norms", "RMSNorm"),
    ("gpuparity.nn.norms", "LayerNorm"),
)


def _drop_in_table() -> Dict[type, type]:
    table: Dict[type, type] = {}
    for module_name, class_name in DROP_INS:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name == module_name:
                continue
            raise
        cls = getattr(module, class_name, None)
        replaces = getattr(cls, "REPLACES", None)
        if cls is not None and replaces is not None:
            table[replaces] = cls
    return table


def patch(model: nn.Module, *, backend: str = "auto", include=None) -> List[str]:
    """Swap every supported module of `model` in place; returns the swapped module names.

    include: optional iterable of torch classes to swap (default: all that have a drop-in).
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
    table = _drop_in_table()
    if include is not None:
        table = {k: v for k, v in table.items() if k in tuple(include)}
    swapped: List[str] = []
    for parent_name, parent in list(model.named_modules()):
        for child_name, child in list(parent.named_children()):
            replacement_cls = table.get(type(child))
            if replacement_cls is None:
                continue
            setattr(parent, child_name, replacement_cls.from_torch(child, backend=backend))
            swapped.append(f"{parent_name}.{child_name}" if parent_name else child_name)
    return swapped
