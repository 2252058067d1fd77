"""The backend registry: what a call needs (`Problem`), what a backend declares it can serve
(`Backend`, with its reasons in words when it cannot), the table every backend module
registers itself in, and the key a stored verdict speaks for (`VerdictKey`). A base piece: backends/, the op contracts, dispatch and checks/ take it
from here, and it imports nothing of gpuparity's."""
from __future__ import annotations

import dataclasses
import sys
import threading
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Tuple

import torch

_REGISTRY: Dict[str, Dict[str, "Backend"]] = {}
_LOCK = threading.Lock()
# Called after every registration: dispatch forgets the resolutions it remembered.
_LISTENERS: List[Callable[[], None]] = []
# (op, backend name) -> the module that registered it: backends.load orders each op's backends
# by the modules of its line in the op manifest, whichever module was imported first
_SOURCES: Dict[Tuple[str, str], str] = {}


# Features a backend serves only when it says so (Backend.opt_in): "dropout" (attention dropout p > 0),
# "alibi" (attention with ALiBi slopes in the kernels: the battery's ALiBi cases, gpuparity.flash_attn).
OPT_IN = ("dropout", "alibi")


@dataclasses.dataclass(frozen=True)
class Problem:
    """What a call needs, as far as choosing a backend goes."""
    op: str
    device: torch.device
    dtype: torch.dtype
    kind: str = "default"                 # the probe key beyond dtype: e.g. mask kind
    features: Tuple[Tuple[str, Any], ...] = ()

    def feature(self, name: str, default=None):
        return dict(self.features).get(name, default)


@dataclasses.dataclass
class Backend:
    name: str
    op: str
    fn: Callable                                  # the op's public signature, minus `backend`
    description: str = ""
    device_types: Tuple[str, ...] = ("cuda", "cpu")
    dtypes: Tuple[torch.dtype, ...] = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
    availability: Optional[Callable[[], Optional[str]]] = None    # reason it is absent here, or None
    supports: Optional[Callable[[Problem], List[str]]] = None     # reasons it cannot serve a call
    fallback: bool = False                        # trusted plain composition: last resort, not probed
    probed: bool = True                           # False for backends auto must never pick
    # The lowest battery level that runs this backend: "full" for backends that compile per
    # shape (minutes over a whole battery); below it they are SKIP with that reason.
    battery_level: str = "quick"
    # Compiles kernels on first use of each specialization (Triton): the battery starts these
    # checks first, so their compiles overlap the rest instead of forming a tail.
    jit: bool = False
    # Optional split into a forward that also returns what its backward needs, and that
    # backward, for the torch.library ops (gpuparity.ops.library): with them a compiled graph
    # runs this backend's own fused backward instead of recomputing the forward under autograd.
    #   forward_saving(*op args) -> (out, saved: tuple of tensors)
    #   backward_from(grad_out, saved, *op args) -> tuple of input gradients (None where none)
    forward_saving: Optional[Callable] = None
    backward_from: Optional[Callable] = None
    # Problem features in OPT_IN that this backend implements; a call with one it does not
    # name is refused (a backend that never heard of dropout must not ignore it silently).
    opt_in: Tuple[str, ...] = ()

    def unavailable_reason(self) -> Optional[str]:
        if self.availability is None:
            return None
        try:
            return self.availability()
        except Exception as exc:  # noqa: BLE001 - a broken import is a reason, not a crash
            return f"{self.name}: availability check raised {type(exc).__name__}: {exc}"

    def reasons(self, problem: Problem) -> List[str]:
        reasons: List[str] = []
        absent = self.unavailable_reason()
        if absent:
            return [absent]
        if problem.device.type not in self.device_types:
            reasons.append(f"{self.name}: no {problem.device.type} support (serves {', '.join(self.device_types)})")
        if problem.dtype not in self.dtypes:
            names = ", ".join(str(d).replace("torch.", "") for d in self.dtypes)
            reasons.append(f"{self.name}: no {str(problem.dtype).replace('torch.', '')} kernel (has {names})")
        for feature in OPT_IN:
            if problem.feature(feature) and feature not in self.opt_in:
                reasons.append(f"{self.name}: does not implement {feature} ({feature}={problem.feature(feature)})")
        if not reasons and self.supports is not None:
            reasons.extend(self.supports(problem))
        return reasons


class VerdictKey(NamedTuple):
    """What one stored verdict speaks for: an op's backend at a dtype and a call kind. The
    verdict store (checks/verdicts.py, which adds `of`: the dtype as the store names it) keeps it
    as the string `encode()` writes, "op|backend|dtype|kind"; every reader (the store, the
    known-issue remedies of known/avoid.py) parses it back with `decode`. Here, in the base, so
    that those readers need not import each other."""
    op: str
    backend: str
    dtype: str
    kind: str

    SEPARATOR = "|"

    def encode(self) -> str:
        return self.SEPARATOR.join(self)

    @classmethod
    def decode(cls, key: str) -> "VerdictKey":
        parts = key.split(cls.SEPARATOR) if isinstance(key, str) else []
        if len(parts) != 4 or not all(parts):
            raise ValueError(f"verdict key: got {key!r}, need 'op|backend|dtype|kind' (four non-empty parts)")
        return cls(*parts)


class BackendUnavailable(RuntimeError):
    """A named backend cannot serve this call; the message lists why."""


def register(backend: Backend, source: Optional[str] = None) -> Backend:
    """Add `backend` to its op's table (last, or in its place if the name is there). `source`: the
    module registering it (default: the caller's)."""
    if source is None:
        source = sys._getframe(1).f_globals.get("__name__", "")
    with _LOCK:
        _REGISTRY.setdefault(backend.op, {})[backend.name] = backend
        _SOURCES[(backend.op, backend.name)] = source
    for listener in list(_LISTENERS):
        listener()
    return backend


def unregister(op: str, name: str) -> None:
    """Remove a backend (tests and planted backends); a no-op if it is not there."""
    with _LOCK:
        _REGISTRY.get(op, {}).pop(name, None)
    for listener in list(_LISTENERS):
        listener()


def order_by_source(op: str, modules: Tuple[str, ...]) -> None:
    """Reorder `op`'s backends: those registered by `modules` in that order (one module's in the
    order it registered them), then any other as registered."""
    with _LOCK:
        table = _REGISTRY.get(op, {})
        rank = {module: i for i, module in enumerate(modules)}
        names = sorted(table, key=lambda name, order=list(table): (
            rank.get(_SOURCES.get((op, name), ""), len(modules)), order.index(name)))
        if names == list(table):
            return
        _REGISTRY[op] = {name: table[name] for name in names}
    for listener in list(_LISTENERS):
        listener()


def registered(op: str) -> Dict[str, Backend]:
    """The backends registered so far for `op` (no module is imported here)."""
    return dict(_REGISTRY.get(op, {}))


def on_change(listener: Callable[[], None]) -> None:
    _LISTENERS.append(listener)
