"""Find where two machines diverge: record a model's per-module activations and gradients
(`record`), compare two recordings (`compare`), and replay one on this machine (`replay`)."""
from __future__ import annotations

from .compare import TraceComparison, compare
from .record import record
from .replay import ReplayResult, replay
from .store import Trace, TraceCorrupt, TraceMismatch, load

__all__ = ["record", "compare", "replay", "load", "Trace", "TraceCorrupt", "TraceMismatch", "TraceComparison", "ReplayResult"]
