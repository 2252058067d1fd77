"""`gpuparity.reference`: the float64 reference of every op, gathered from the op contracts
(each defined in contracts/<op>.py and named in its `REFERENCES`), for users and tests who
compare against them.

Written as plain differentiable torch compositions; callers upcast inputs to float64 on the
CPU. They define the semantics every backend is held to (docs/design.md, contracts), including
the corner cases: a fully masked attention row returns zeros with zero gradients.
"""
from __future__ import annotations

import importlib

from . import MODULES

__all__ = []
for _module in MODULES:
    _contract = importlib.import_module(_module)
    for _name in _contract.REFERENCES:
        globals()[_name] = getattr(_contract, _name)
        __all__.append(_name)
del _module, _contract, _name
