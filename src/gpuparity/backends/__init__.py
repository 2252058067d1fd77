"""One module per backend family. Importing a module registers its backends with
`gpuparity.dispatch`; `load_all` imports them, once. Which modules, and in which order, comes
from the op manifest (src/gpuparity/manifest.py: each op's line names the modules that register its
backends, in its order, the contract among them in the slot where its `COMPOSITIONS` are
registered here), so the registration order (what `dispatch.backends(op)` lists) depends neither
on which contract an earlier call imported first nor on a hand-ordered list."""
from __future__ import annotations

import importlib
import threading

from .. import manifest
from ..registry import order_by_source, register

# Each entry is imported once, in one order that keeps every op's line of the manifest; a module
# whose optional dependency is missing registers backends whose availability() says so, so it
# must import without that dependency.
MODULES = manifest.registration_order()
# op -> the modules that register its backends, in its order (its line of the manifest)
_LINES = {line.name: manifest.backend_modules(line) for line in manifest.OPS}

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
            register(backend, source=name)
    # each op's backends in its line's order, also where a module was imported before load_all
    # (its backends registered then, ahead of the modules before it)
    for op, modules in _LINES.items():
        order_by_source(op, modules)
