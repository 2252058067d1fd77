"""One contract per op: everything that defines the op independent of any backend.

A contract module (contracts/<op>.py) holds its op's argument checks and the `Problem` a call
becomes for the dispatcher, its float64 reference, its trusted plain composition (registered as
the op's "composition" backend), and the battery's cases and regime families (its `OpSpec`).
Backends (backends/) implement the op; the check engine (checks/) runs any contract by name
from this registry and knows no op itself; ops/ is the public layer over both.

Adding an op: its contract module, its line in src/gpuparity/manifest.py, its backends and its tests.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Dict, Tuple

from .. import manifest

if TYPE_CHECKING:
    from .base import LEVELS, Case, OpSpec


def __getattr__(name: str):
    # LEVELS, Case and OpSpec come from base.py (it imports torch) when first asked for: the op
    # names need no torch, so `gpuparity check --help` lists them at once
    if name in ("LEVELS", "Case", "OpSpec"):
        return getattr(importlib.import_module(".base", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

# op -> (contract module, the OpSpec's name in it), in the battery's order: the manifest's
# (src/gpuparity/manifest.py, one line per op). A contract is imported the first time its op is asked
# for, so a call of one op loads one contract.
CONTRACTS: Dict[str, Tuple[str, str]] = manifest.contracts()
OPS = tuple(CONTRACTS)
# the contract modules, each once (contracts/reference.py gathers their REFERENCES)
MODULES = tuple(dict.fromkeys(module for module, _ in CONTRACTS.values()))


def get_spec(op: str) -> OpSpec:
    """The battery's spec of `op` (its contract's OpSpec)."""
    if op not in CONTRACTS:
        raise ValueError(f"op: expected one of {list(CONTRACTS)}, got {op!r}")
    module, name = CONTRACTS[op]
    return getattr(importlib.import_module(module), name)


__all__ = ["CONTRACTS", "OPS", "MODULES", "get_spec", "Case", "OpSpec", "LEVELS"]
