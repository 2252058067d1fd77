"""One module per backend family. Importing a module registers its backends with
`gpuparity.dispatch`; `load` imports the modules of the ops asked for, each once. Which modules,
and in which order, comes from the op manifest (src/gpuparity/manifest.py: each op's line names the
modules that register its backends, in its order, the contract among them in the slot where its
`COMPOSITIONS` are registered here), so the registration order (what `dispatch.backends(op)` lists)
depends neither on which contract an earlier call imported first, nor on which ops were loaded
before, nor on a hand-ordered list."""
from __future__ import annotations

import importlib
import threading
from typing import Iterable, Optional

from .. import manifest
from ..registry import order_by_source, register

# One order that keeps every op's line of the manifest; `load` imports the modules of the ops
# asked for in this order. A module whose optional dependency is missing registers backends whose
# availability() says so, so it must import without that dependency.
MODULES = manifest.registration_order()
# op -> the modules that register its backends, in its order (its line of the manifest)
_LINES = {line.name: manifest.backend_modules(line) for line in manifest.OPS}

_LOADED_OPS = set()             # the ops whose every module is imported and whose backends are in order
_IMPORTED = set()               # the modules imported here (a contract's COMPOSITIONS registered once)
_LOAD_LOCK = threading.Lock()   # another thread's first call waits here until the op's modules registered
_LOADER = [None]                # the thread importing modules, while it does


class RegistrationError(RuntimeError):
    """A backend or contract module asked for the registry while it was being filled."""


def load(ops: Optional[Iterable[str]] = None) -> None:
    """Import the modules of `ops`' lines (every op's when None), each once, in MODULES' order, and
    put each loaded op's backends in its line's order. Whoever returns from here sees those ops'
    whole tables: a caller on another thread waits; a module that asks for the registry while it
    is imported here (a half-filled one) gets RegistrationError."""
    wanted = tuple(_LINES) if ops is None else tuple(ops)
    if _LOADED_OPS.issuperset(wanted):
        return
    if _LOADER[0] == threading.get_ident():
        raise RegistrationError("backends.load: a module of the op manifest asked for the backend registry "
                                "while it was imported, and would see it half filled; list or resolve backends "
                                "when called, not at import")
    with _LOAD_LOCK:
        missing = [op for op in wanted if op not in _LOADED_OPS]
        if not missing:
            return
        _LOADER[0] = threading.get_ident()
        try:
            _load_modules(missing)
        finally:
            _LOADER[0] = None


def load_all() -> None:
    """`load` every op of the manifest (a worker that may get any op's task)."""
    load(None)


def _load_modules(ops) -> None:
    needed = {module for op in ops for module in _LINES.get(op, ())}
    for name in MODULES:
        if name not in needed or name in _IMPORTED:
            continue
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:  # a real import error inside an existing module: surface it
                raise
            _IMPORTED.add(name)
            continue
        for backend in getattr(module, "COMPOSITIONS", ()):   # a contract's composition
            register(backend, source=name)
        _IMPORTED.add(name)
    # each loaded op's backends in its line's order, also where a module was imported before
    # (its backends registered then, ahead of the modules before it); marked loaded only then, as
    # `load` answers a loaded op without the lock
    loaded = _LOADED_OPS.union(ops)
    for op in _LINES:
        if op in loaded:
            order_by_source(op, _LINES[op])
    _LOADED_OPS.update(ops)
