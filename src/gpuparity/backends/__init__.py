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
_LOAD_LOCK = threading.Lock()   # another thread's first call waits here until every module registered
_LOADER = [None]                # the thread importing MODULES, while it does


class RegistrationError(RuntimeError):
    """A backend or contract module asked for the registry while it was being filled."""


def load_all() -> None:
    """Import MODULES, once, registering their backends in that order. Whoever returns from here
    sees the whole registry: a caller on another thread waits for it; a module of MODULES that
    asks for the registry while it is imported (a half-filled one) gets RegistrationError."""
    global _LOADED
    if _LOADED:
        return
    if _LOADER[0] == threading.get_ident():
        raise RegistrationError("backends.load_all: a module of backends.MODULES asked for the backend registry "
                                "while it was imported, and would see it half filled; list or resolve backends "
                                "when called, not at import")
    with _LOAD_LOCK:
        if _LOADED:
            return
        _LOADER[0] = threading.get_ident()
        try:
            _load_modules()
            _LOADED = True
        finally:
            _LOADER[0] = None


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
