"""One module per backend family. Importing a module registers its backends with
`gpuparity.dispatch`; `load_all` is the one list of them."""
from __future__ import annotations

import importlib

# Each entry is imported once; a module whose optional dependency is missing registers
# backends whose availability() says so, so it must import without that dependency.
MODULES = (
    "gpuparity.backends.sdpa",
    "gpuparity.backends.torch_ops",
    "gpuparity.backends.triton_attention",
    "gpuparity.backends.triton_decode",
    "gpuparity.backends.varlen_composition",
    "gpuparity.backends.triton_norms",
    "gpuparity.backends.triton_rotary",
    "gpuparity.backends.ce_composition",
    "gpuparity.backends.triton_cross_entropy",
    "gpuparity.backends.triton_swiglu",
    "gpuparity.backends.flex",
    "gpuparity.backends.compiled",
)

_LOADED = False


def load_all() -> None:
    global _LOADED
    if _LOADED:
        return
    _LOADED = True
    for name in MODULES:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:  # a real import error inside an existing module: surface it
                raise
