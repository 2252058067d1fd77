"""Where the monitor and `explain` meet a running model: torch.nn.functional's attention, norm,
softmax and loss functions replaced by wrappers while one is active, gpuparity's own ops seen
through the backend the dispatcher hands them (`ops.select.resolve`), and a model's own RMSNorm
modules at their boundaries. Installed once for however many listeners are active, restored
when the last one leaves; a call made inside a watched call (gpuparity's sdpa backends call
F.scaled_dot_product_attention) is not seen twice, nor are the checks a first auto call runs
while `ops.select.resolve` verifies its backend; traced code (torch.compile) passes straight
through.

A listener has `on_call(kind, original, args, kwargs, backend) -> result`; it decides whether
to look at the call and must return what `original(*args, **kwargs)` returns.
"""
from __future__ import annotations

import dataclasses
import functools
import logging
import threading
from typing import Any, Callable, Dict, List, Optional

import torch
import torch.nn.functional as F

from . import ops

LOG = logging.getLogger("gpuparity")

_LOCK = threading.RLock()
_LOCAL = threading.local()


class _PatchState:
    """What is patched while a listener is active (undo state, emptied by the last uninstall)."""

    def __init__(self):
        self.listeners: List[Any] = []          # innermost last; only the innermost one sees calls
        self.originals: Dict[str, Callable] = {}
        self.resolve: Dict[str, Callable] = {}  # "select" -> the original ops.select.resolve
        self.proxies: Dict[int, Any] = {}       # id(Backend) -> (Backend, its watching copy)


_STATE = _PatchState()
_LISTENERS = _STATE.listeners
_ORIGINALS = _STATE.originals
_RESOLVE = _STATE.resolve
_PROXIES = _STATE.proxies


def current():
    return _LISTENERS[-1] if _LISTENERS else None


def inside_watched_call() -> bool:
    return getattr(_LOCAL, "depth", 0) > 0


class _Depth:
    """Marks the thread as inside a watched call for the duration (calls made inside it pass)."""
    __slots__ = ()

    def __enter__(self):
        _LOCAL.depth = getattr(_LOCAL, "depth", 0) + 1

    def __exit__(self, *exc):
        _LOCAL.depth -= 1


DEPTH = _Depth()


def _dispatch(kind, original, args, kwargs, backend):
    listener = current()
    if listener is None or getattr(_LOCAL, "depth", 0):
        return original(*args, **kwargs)
    with DEPTH:
        return listener.on_call(kind, original, args, kwargs, backend)


def _functional_wrapper(name: str, original: Callable, kind: ops.OpKind) -> Callable:
    @functools.wraps(original)
    def watched(*args, **kwargs):
        if torch.compiler.is_compiling():  # traced code: the compiled graph holds the original op
            return original(*args, **kwargs)
        return _dispatch(kind, original, args, kwargs, None)
    watched.__gpuparity_watched__ = original
    return watched


def _backend_proxy(chosen):
    """A copy of a dispatched Backend whose fn reports its calls (kept per backend object, so a
    training loop's calls cost a dictionary lookup)."""
    entry = _PROXIES.get(id(chosen))
    if entry is not None and entry[0] is chosen:
        return entry[1]
    kind = ops.GPUPARITY.get(chosen.op)
    if kind is None:
        return chosen
    original = chosen.fn

    @functools.wraps(original)
    def watched(*args, **kwargs):
        return _dispatch(kind, original, args, kwargs, chosen.name)
    proxy = dataclasses.replace(chosen, fn=watched)
    _PROXIES[id(chosen)] = (chosen, proxy)
    return proxy


def _watched_resolve(original: Callable) -> Callable:
    def resolve(problem, backend="auto"):
        # a first auto call may verify its backend here, in this process (checks/selection.py):
        # those checks' F.* calls are gpuparity's own, not the run's, so they are not seen
        with DEPTH:
            chosen = original(problem, backend)
        if not _LISTENERS:
            return chosen
        return _backend_proxy(chosen)
    resolve.__gpuparity_watched__ = original
    return resolve


def install(listener) -> None:
    """Make `listener` the one that sees calls (patching on the first)."""
    from ..ops import select
    with _LOCK:
        if not _LISTENERS:
            for name, kind in ops.FUNCTIONAL.items():
                original = getattr(F, name, None)
                if original is None:
                    continue
                _ORIGINALS[name] = original
                setattr(F, name, _functional_wrapper(name, original, kind))
            _RESOLVE["select"] = select.resolve
            select.resolve = _watched_resolve(select.resolve)
        _LISTENERS.append(listener)


def uninstall(listener) -> None:
    """Remove `listener`; the last one out restores every patched function (one another library
    replaced meanwhile is left to it, with a warning)."""
    from ..ops import select
    with _LOCK:
        if listener in _LISTENERS:
            _LISTENERS.remove(listener)
        if _LISTENERS:
            return
        for name, original in _ORIGINALS.items():
            now = getattr(F, name, None)
            if getattr(now, "__gpuparity_watched__", None) is original:
                setattr(F, name, original)
            else:
                LOG.warning("gpuparity monitor: torch.nn.functional.%s was replaced by someone else while the "
                            "monitor ran; left as it is now", name)
        _ORIGINALS.clear()
        if "select" in _RESOLVE:
            original = _RESOLVE.pop("select")
            if getattr(select.resolve, "__gpuparity_watched__", None) is original:
                select.resolve = original
        _PROXIES.clear()


# --------------------------------------------------------------------------- module boundaries
def rms_norm_modules(model: torch.nn.Module):
    """(path, module) for the model's own RMSNorm modules of the x * rsqrt(mean(x^2) + eps) * weight
    form (transformers' Llama, Qwen2, Mistral ... RMSNorm: `variance_epsilon`, a `weight`);
    gpuparity's own subclasses are seen through gpuparity.rms_norm instead."""
    found = []
    for path, module in model.named_modules():
        cls = type(module)
        if (cls.__name__.endswith("RMSNorm") and not cls.__module__.startswith("gpuparity")
                and "gemma" not in cls.__name__.lower() and hasattr(module, "variance_epsilon")
                and isinstance(getattr(module, "weight", None), torch.Tensor)):
            found.append((path, module))
    return found


def watch_rms_norm_modules(model: torch.nn.Module) -> List[Any]:
    """Route each RMSNorm module's forward through the listener (a forward of the module's own
    class, so its result is the module's own); returns the handles to remove."""
    handles = []
    for _path, module in rms_norm_modules(model):
        kind = ops.RMS_NORM_MODULE

        def forward(x, *rest, _module=module, **kwargs):
            if rest or kwargs or torch.compiler.is_compiling() or not isinstance(x, torch.Tensor):
                return _module.__class__.forward(_module, x, *rest, **kwargs)
            return _dispatch(kind, _NormCall(_module), (x,), {}, type(_module).__name__)
        module.forward = forward
        handles.append(module)
    return handles


class _NormCall:
    """Calls an RMSNorm module's own forward with the bound arguments the listener passes."""

    def __init__(self, module):
        self.module = module

    def __call__(self, x, *rest, **kwargs):
        return type(self.module).forward(self.module, x)

    def bind_extra(self, x) -> Dict[str, Any]:
        m = self.module
        return {"normalized_shape": tuple(m.weight.shape), "weight": m.weight, "eps": m.variance_epsilon}


def unwatch_modules(handles: List[Any]) -> None:
    for module in handles:
        module.__dict__.pop("forward", None)


def compiled_note(model: Optional[torch.nn.Module]) -> Optional[str]:
    """A sentence when the model (or a part) runs under torch.compile: what the monitor cannot see."""
    if model is None:
        return None
    parts = []
    if hasattr(model, "_orig_mod"):
        parts.append("the model")
    for path, module in model.named_modules():
        if getattr(module, "_compiled_call_impl", None) is not None:
            parts.append(path or "the model")
    if not parts:
        return None
    return (f"{', '.join(sorted(set(parts))[:5])} run(s) under torch.compile: calls inside compiled regions are "
            f"not seen (the monitor samples only calls made eagerly, outside the compiled graphs)")
