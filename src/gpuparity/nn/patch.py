"""`gpuparity.patch(model)`: swap torch.nn modules for gpuparity's verified drop-ins in place,
keeping their weights. Each drop-in class declares `from_torch(module)` and names the torch
class it replaces in `REPLACES`; the table below is the one list of drop-ins. Hugging Face
transformers models also go through gpuparity.integrations.transformers."""
from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass, field
from typing import Dict, List, Tuple

import torch.nn as nn

# (module path, class name) of every drop-in.
DROP_INS: Tuple[Tuple[str, str], ...] = (
    ("gpuparity.nn.attention", "MultiheadAttention"),
    ("gpuparity.nn.norms", "RMSNorm"),
    ("gpuparity.nn.norms", "LayerNorm"),
)


@dataclass(frozen=True)
class PatchEntry:
    """One module patch() looked at: its path in the model, its class and what was done or why not."""
    path: str
    cls: str
    reason: str


@dataclass(eq=False)
class PatchSummary:
    """What patch() replaced and what it left, and why. Iterating, len() and == against a list
    see the replaced module paths (what patch() returned before it returned a summary)."""
    replaced: List[PatchEntry] = field(default_factory=list)
    left: List[PatchEntry] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)

    @property
    def paths(self) -> List[str]:
        return [entry.path for entry in self.replaced]

    def __iter__(self):
        return iter(self.paths)

    def __len__(self) -> int:
        return len(self.replaced)

    def __contains__(self, path) -> bool:
        return path in self.paths

    def __eq__(self, other) -> bool:
        if isinstance(other, PatchSummary):
            return (self.replaced, self.left, self.notes) == (other.replaced, other.left, other.notes)
        if isinstance(other, (list, tuple)):
            return self.paths == list(other)
        return NotImplemented

    def lines(self) -> List[str]:
        """One line per entry (for a CLI or a log; the library itself never prints)."""
        out = [f"replaced {e.path} ({e.cls}): {e.reason}" for e in self.replaced]
        out += [f"left {e.path} ({e.cls}): {e.reason}" for e in self.left]
        return out + [f"note: {n}" for n in self.notes]


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
