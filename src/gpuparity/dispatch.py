"""Backend registry, support reasons in words, and verified auto-selection with a probe cache.

Every backend declares what it supports and answers `reasons(problem) -> list[str]` (empty
when it can serve). `backend="auto"` only ever uses a backend whose correctness probe passed
on this machine, torch build, dtype and feature kind (e.g. the attention mask kind); among
those the fastest measured wins, and the op's `fallback` backend (a plain composition, never
probed) is the last resort. Probe verdicts are cached on disk keyed by the platform
fingerprint. `gpuparity doctor` fills the cache.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

LOG = logging.getLogger("gpuparity")


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
        if not reasons and self.supports is not None:
            reasons.extend(self.supports(problem))
        return reasons


_REGISTRY: Dict[str, Dict[str, Backend]] = {}
_LOCK = threading.Lock()
# Resolutions already made, so a training loop does not re-derive every backend's reasons and
# verdicts on every call (a loop over all registered backends, each with its probe lookup). A resolution follows from
# the problem, the registry, the probe verdicts in memory, two environment variables and, for
# fp32, torch's TF32 switches: the key holds the variables and switches, and anything that
# changes the registry or the verdicts (register, a probe, clear_cache) clears the memo. The
# probe cache's place is read when a verdict is first needed: a process that moves it
# (GPUPARITY_CACHE_DIR) or changes the numerics variables of its fingerprint
# (platform.NUMERICS_ENV, which the vendor libraries read once anyway) calls clear_cache().
# Bounded (problems carry sequence lengths: a decode loop makes a new one per step).
_RESOLVED: Dict[tuple, "Backend"] = {}
_RESOLVED_MAX = 4096
_STATE_ENV = ("GPUPARITY_TRUST_UNPROBED", "TRITON_INTERPRET")
_GENERATION = [0]   # bumped on every change: a resolution made across one is not kept


def _state_changed() -> None:
    _GENERATION[0] += 1
    _RESOLVED.clear()


def register(backend: Backend) -> Backend:
    with _LOCK:
        _REGISTRY.setdefault(backend.op, {})[backend.name] = backend
        _state_changed()
    return backend


def _load_builtin_backends() -> None:
    # Importing the modules registers their backends; the list is the one place they are named.
    from .backends import load_all
    load_all()


def backends(op: str) -> List[Backend]:
    _load_builtin_backends()
    return list(_REGISTRY.get(op, {}).values())


def get(op: str, name: str) -> Backend:
    _load_builtin_backends()
    table = _REGISTRY.get(op, {})
    if name not in table:
        raise ValueError(f"backend: expected one of {sorted(table) + ['auto']} for {op}, got {name!r}")
    return table[name]


class BackendUnavailable(RuntimeError):
    """A named backend cannot serve this call; the message lists why."""


def _resolution_key(problem: Problem, backend: str) -> tuple:
    environ = os.environ
    key = (problem, backend, tuple([environ.get(name) for name in _STATE_ENV]))
    if problem.dtype == torch.float32:
        from .numerics import cudnn_tf32, matmul_tf32
        key += (matmul_tf32(), cudnn_tf32())
    return key


def resolve(problem: Problem, backend: str = "auto") -> Backend:
    """The backend that serves `problem`: the named one (or an error with its reasons), or the
    verified choice for "auto". Remembered per problem (see _RESOLVED); errors are not."""
    key = _resolution_key(problem, backend)
    chosen = _RESOLVED.get(key)
    if chosen is not None:
        return chosen
    generation = _GENERATION[0]
    if backend != "auto":
        chosen = get(problem.op, backend)
        reasons = chosen.reasons(problem)
        if reasons:
            raise BackendUnavailable(f"backend={backend!r} cannot serve this {problem.op} call: " + "; ".join(reasons))
    else:
        chosen = explain(problem)["chosen_backend"]
    if generation == _GENERATION[0]:   # nothing changed meanwhile (another thread, a first probe)
        if len(_RESOLVED) >= _RESOLVED_MAX:
            _RESOLVED.clear()
        _RESOLVED[key] = chosen
    return chosen


def explain(problem: Problem) -> Dict[str, Any]:
    """Why each backend was or was not chosen for `problem` under "auto".

    Returns {"chosen": name, "chosen_backend": Backend, "candidates": [{name, status, reason, time_ms}]}.
    """
    rows = []
    verified: List[Tuple[float, Backend]] = []
    fallback: Optional[Backend] = None
    for candidate in backends(problem.op):
        reasons = candidate.reasons(problem)
        if reasons:
            rows.append({"name": candidate.name, "status": "unsupported", "reason": "; ".join(reasons)})
            continue
        if candidate.fallback:
            fallback = fallback or candidate
            rows.append({"name": candidate.name, "status": "fallback", "reason": "trusted composition, last resort"})
            continue
        if not candidate.probed:
            rows.append({"name": candidate.name, "status": "never-auto", "reason": "only used when named"})
            continue
        verdict = probe_verdict(problem, candidate)
        if verdict.get("passed"):
            time_ms = float(verdict.get("time_ms") or float("inf"))
            verified.append((time_ms, candidate))
            rows.append({"name": candidate.name, "status": "verified", "reason": verdict.get("reason", ""),
                         "time_ms": time_ms})
        else:
            rows.append({"name": candidate.name, "status": "failed-probe", "reason": verdict.get("reason", "")})
    if verified:
        verified.sort(key=lambda item: item[0])
        chosen = verified[0][1]
    elif fallback is not None:
        chosen = fallback
    else:
        raise BackendUnavailable(f"no backend can serve this {problem.op} call: " +
                                 "; ".join(f"{r['name']}: {r['reason']}" for r in rows))
    return {"chosen": chosen.name, "chosen_backend": chosen, "candidates": rows}


# --------------------------------------------------------------------------- probe cache
def cache_dir() -> str:
    base = os.environ.get("GPUPARITY_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "gpuparity")
    return base


def _cache_path(device: torch.device) -> str:
    from . import platform
    index = device.index if device.type == "cuda" and device.index is not None else (0 if device.type == "cuda" else None)
    key = platform.fingerprint_key(platform.current(), index)
    return os.path.join(cache_dir(), f"probes-{device.type}-{key}.json")


_MEMORY_CACHE: Dict[str, Dict[str, Any]] = {}


def verdict_dtype(op: str, dtype: torch.dtype, device: torch.device) -> str:
    """The dtype part of a verdict key: "float32+tf32" when this op's fp32 runs on TF32 units
    here under torch's current switches (a verdict made with TF32 off does not speak for TF32
    on, nor the other way), else the dtype's name."""
    name = str(dtype).replace("torch.", "")
    if dtype == torch.float32:
        from .checks.specs import get_spec
        if get_spec(op).precision(dtype, torch.device(device)) == "tf32":
            name += "+tf32"
    return name


def probe_key(problem: Problem, backend: Backend) -> str:
    return f"{problem.op}|{backend.name}|{verdict_dtype(problem.op, problem.dtype, problem.device)}|{problem.kind}"


def _load_cache(path: str) -> Dict[str, Any]:
    if path in _MEMORY_CACHE:
        return _MEMORY_CACHE[path]
    data: Dict[str, Any] = {}
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle).get("verdicts", {})
    except (OSError, ValueError):
        data = {}
    _MEMORY_CACHE[path] = data
    _state_changed()
    return data


def store_verdicts(device: torch.device, verdicts: Dict[str, Dict[str, Any]]) -> str:
    """Merge probe verdicts into the on-disk cache for `device`; returns the cache path."""
    path = _cache_path(device)
    data = _load_cache(path)
    data.update(verdicts)
    _state_changed()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    from . import platform
    with open(tmp, "w", encoding="utf-8") as handle:
        json.dump({"schema_version": 1, "fingerprint": platform.fingerprint_key(platform.current()),
                   "verdicts": data}, handle, indent=1, sort_keys=True)
    os.replace(tmp, path)
    return path


def clear_cache() -> None:
    _MEMORY_CACHE.clear()
    _state_changed()


def probe_verdict(problem: Problem, backend: Backend) -> Dict[str, Any]:
    """The cached verdict for (problem kind, backend), probing now if there is none."""
    if os.environ.get("GPUPARITY_TRUST_UNPROBED") == "1":
        return {"passed": True, "reason": "probe skipped (GPUPARITY_TRUST_UNPROBED=1)", "time_ms": None}
    path = _cache_path(problem.device)
    cache = _load_cache(path)
    key = probe_key(problem, backend)
    if key not in cache:
        from .checks.probe import probe_op
        dtype = str(problem.dtype).replace("torch.", "")
        # A first call can take a minute on a GPU (Triton compiles, crash-isolated checks):
        # say so through logging (shown on stderr by default), since the library never prints.
        LOG.warning("gpuparity: first %s call with %s, %s on %s here: checking its backends against float64 "
                    "before backend='auto' uses them (once; cached in %s; `gpuparity doctor` fills the cache "
                    "ahead of time)", problem.op, dtype, problem.kind, problem.device, path)
        started = time.monotonic()
        verdicts = probe_op(problem.op, problem.dtype, problem.kind, problem.device)
        store_verdicts(problem.device, verdicts)
        LOG.info("gpuparity: probed %s (%s, %s) in %.1f s", problem.op, dtype, problem.kind,
                 time.monotonic() - started)
        cache = _load_cache(path)
    return cache.get(key, {"passed": False, "reason": "no probe verdict recorded"})
