"""gpuparity: the same answers, fast, on CUDA, ROCm and CPU; and where and why they differ.

Ops: attention, rms_norm, layer_norm, apply_rotary (verified backend dispatch).
Checks: check(op, impl=...), the battery behind `gpuparity doctor`.
Devices: get_device() verifies a GPU in a separate process and falls back to the CPU.
Modules: gpuparity.nn drop-ins and patch(model).
Runs: monitor(model, every=N) shadow-checks sampled calls of a real run; explain(model, inputs)
says which backend and kernel each attention / norm / rotary call ran.
"""
from __future__ import annotations

import importlib
import os
import sys

__version__ = "0.1.0"

# Public name -> module that defines it; imported on first use so `import gpuparity` stays
# light (and so a missing optional piece does not break the rest).
_LAZY = {
    "attention": "gpuparity.ops.attention", "attention_dropout_mask": "gpuparity.ops.attention",
    "attention_decode": "gpuparity.ops.decode", "kv_cache_append": "gpuparity.ops.decode",
    "attention_varlen": "gpuparity.ops.varlen",
    "rms_norm": "gpuparity.ops.norms",
    "layer_norm": "gpuparity.ops.norms",
    "apply_rotary": "gpuparity.ops.rotary",
    "linear_cross_entropy": "gpuparity.ops.linear_cross_entropy",
    "swiglu": "gpuparity.ops.swiglu",
    "residual_norm": "gpuparity.ops.residual_norm",
    "check": "gpuparity.api",
    "get_device": "gpuparity.device",
    "patch": "gpuparity.patching",
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


# The first-call worker (a process that imports torch, Triton and the backends: 4-8 s on a GPU
# host) starts at import beside a torch program on a GPU machine, so that it is ready when a
# model built meanwhile is patched: its first calls then wait for their checks, not for the
# worker's start. GPUPARITY_PRESTART=0 turns this off. The device files decide "a GPU machine":
# asking torch would initialize CUDA in this process before the script's own setup
# (CUDA_VISIBLE_DEVICES set after the imports still applies; the worker is restarted then).
PRESTART = "GPUPARITY_PRESTART"
_GPU_DEVICE_FILES = {"cuda": "/dev/nvidiactl", "hip": "/dev/kfd"}


def _wants_prestart(environ, modules, exists) -> bool:
    if environ.get(PRESTART, "1").strip().lower() in ("0", "false", "off", "no") or environ.get("GPUPARITY_PARENT_PID"):
        return False   # turned off, or this is one of gpuparity's own child processes
    torch = modules.get("torch")
    version = getattr(torch, "version", None)
    if version is None:
        return False   # not beside a torch program (the command line, a plain import)
    return any(getattr(version, build, None) and exists(path) for build, path in _GPU_DEVICE_FILES.items())


def _prestart_on_import() -> None:
    try:
        if _wants_prestart(os.environ, sys.modules, os.path.exists):
            from .checks import selection
            selection.prestart(gpu_visible=True)
    except Exception as exc:  # noqa: BLE001 - an import never fails for this; the first call starts it
        import logging
        logging.getLogger("gpuparity").debug("gpuparity: no worker at import: %s: %s", type(exc).__name__, exc)


_prestart_on_import()
