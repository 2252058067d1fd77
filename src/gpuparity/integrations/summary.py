"""What gpuparity.patch(model) did: each module it replaced or left, and why. patching.py
returns it and the integrations' adapters fill it (patching.py sits above integrations/ and nn/,
which import neither each other nor it)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List


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
