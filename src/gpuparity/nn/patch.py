"""`gpuparity.patch(model)`: swap torch.nn modules for gpuparity's verified drop-ins in place,
keeping their weights. Each drop-in class declares `from_torch(module)` and names the torch
class it replaces in `REPLACES`; the table below is the one list of drop-ins. Hugging Face
transformers models also go through gpuparity.integrations.transformers."""
from __future__ import annotations

import importlib
import sys
from typing import Dict, Tuple

import torch.nn as nn

from .summary import PatchEntry, PatchSummary  # noqa: F401 - re-exported

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


def _is_transformers_model(model: nn.Module) -> bool:
    # a PreTrainedModel instance means transformers is already imported: never import it here
    transformers = sys.modules.get("transformers")
    return transformers is not None and isinstance(model, getattr(transformers, "PreTrainedModel", ()))


def patch(model: nn.Module, *, backend: str = "auto", include=None) -> PatchSummary:
    """Swap every supported module of `model` in place; returns a PatchSummary (replaced and
    left modules with reasons; iterating it gives the replaced module paths).

    include: optional iterable of classes to swap (default: all that have a drop-in); for a
    transformers model it may also name transformers' norm and attention classes.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(backend, str):
        raise TypeError(f"backend: expected a backend name (str) or 'auto', got {type(backend).__name__}")
    include = None if include is None else tuple(include)
    summary = PatchSummary()
    if _is_transformers_model(model):
        from ..integrations import transformers as hf
        hf.patch_model(model, backend=backend, include=include, summary=summary)
    table = _drop_in_table()
    if include is not None:
        table = {k: v for k, v in table.items() if k in include}
    for parent_name, parent in list(model.named_modules()):
        for child_name, child in list(parent.named_children()):
            replacement_cls = table.get(type(child))
            if replacement_cls is None:
                continue
            setattr(parent, child_name, replacement_cls.from_torch(child, backend=backend))
            path = f"{parent_name}.{child_name}" if parent_name else child_name
            summary.replaced.append(PatchEntry(path, f"{type(child).__module__}.{type(child).__name__}",
                                               f"-> {replacement_cls.__module__}.{replacement_cls.__name__}"))
    return summary
