"""gpuparity: the same answers, fast, on CUDA, ROCm and CPU; and where and why they differ.

Ops: attention, rms_norm, layer_norm, apply_rotary (verified backend dispatch).
Checks: check(op, impl=...), the battery behind `gpuparity doctor`.
Devices: get_device() verifies a GPU in a separate process and falls back to the CPU.
Modules: gpuparity.nn drop-ins and patch(model).
Importing gpuparity or an op starts no process: the checking worker starts at the first auto call
that needs a verdict, at patch(model), or at prepare() (ahead of the first calls, on a GPU).
Runs: monitor(model, every=N) shadow-checks sampled calls of a real run; explain(model, inputs)
says which backend and kernel each attention / norm / rotary call ran.
"""
from __future__ import annotations

import importlib

from . import manifest

__version__ = "0.1.0"

# Public name -> module that defines it; imported on first use so `import gpuparity` stays
# light (and so a missing optional piece does not break the rest). The ops' public functions come
# from their lines in the op manifest (src/gpuparity/manifest.py, which imports nothing).
_LAZY = {
    **manifest.exports(),
    "check": "gpuparity.api",
    "get_device": "gpuparity.device",
    "patch": "gpuparity.patching",
    "prepare": "gpuparity.ops.select",
    "safe_compile": "gpuparity.compile",
    "monitor": "gpuparity.shadow",
    "explain": "gpuparity.explain_run",
}

__all__ = ["__version__", *_LAZY, "nn", "trace", "profile"]


def __getattr__(name):
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        # kept as a module global: Python calls __getattr__ only for names it does not find, so
        # later `gpuparity.attention(...)` calls skip the import machinery (2.4 us per call on
        # a slow CPU: per layer, per step, for a model calling gpuparity.rms_norm)
        globals()[name] = value
        return value
    if name in ("nn", "trace", "profile", "known", "platform", "dispatch"):
        return importlib.import_module(f"gpuparity.{name}")
    if name == "reference":   # the float64 references, gathered from the op contracts
        return importlib.import_module("gpuparity.contracts.reference")
    raise AttributeError(f"module 'gpuparity' has no attribute {name!r}")
