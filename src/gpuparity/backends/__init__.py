"""One module per backend family. Importing a module registers its backends with
`gpuparity.dispatch`; `load_all` is the one list of them. The op contracts' plain compositions
(`COMPOSITIONS` in contracts/<op>.py) are registered here too, each in its slot of MODULES, so
the registration order (what `dispatch.backends(op)` lists) does not depend on which contract an
earlier call imported first."""
from __future__ import annotations

import importlib
import threading

from ..registry import register

# Each entry is imported once; a module whose optional dependency is missing registers
# backends whose availability() says so, so it must import without that dependency.
MODULES = (
    "gpuparity.backends.sdpa",
    "gpuparity.contracts.attention",
    "gpuparity.backends.torch_ops",
    "gpuparity.contracts.norms",
    "gpuparity.contracts.rotary",
    "gpuparity.contracts.basic",
    "gpuparity.contracts.swiglu",
    "gpuparity.backends.triton_attention",
    "gpuparity.backends.triton_decode",
    "gpuparity.contracts.decode",
    "gpuparity.contracts.varlen",
    "gpuparity.backends.triton_norms",
    "gpuparity.backends.triton_rotary",
    "gpuparity.backends.ce_composition",
    "gpuparity.backends.triton_cross_entropy",
    "gpuparity.backends.triton_swiglu",
    "gpuparity.contracts.residual_norm",
    "gpuparity.backends.triton_residual_norm",
    "gpuparity.backends.flex",
    "gpuparity.backends.compiled",
)

_LOADED = False
_LOADING = False
_LOAD_LOCK = threading.RLock()   # re-entrant: a backend module's import may call load_all


def load_all() -> None:
    global _LOADED
    if _LOADED:
        return
    global _LOADING
    with _LOAD_LOCK:   # a background resolution and the caller's first call may both arrive here
        if _LOADED or _LOADING:   # _LOADING: this thread's own imports called back
            return
        _LOADING = True
        try:
            _load_modules()
            _LOADED = True
        finally:
            _LOADING = False


def _load_modules() -> None:
    for name in MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:  # a real import error inside an existing module: surface it
                raise
            continue
        for backend in getattr(module, "COMPOSITIONS", ()):   # a contract's composition
            register(backend)
