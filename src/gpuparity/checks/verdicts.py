"""The probe-verdict store behind verified auto-selection: per device and platform fingerprint,
one JSON file of verdicts keyed "op|backend|dtype|kind". `checks.probe.probe_verdict` reads
it and probes on a miss; `gpuparity doctor` fills it ahead of time. Every change here tells
dispatch to forget the resolutions it remembered (dispatch._Memo's rule)."""
from __future__ import annotations

import json
import os
import threading
from typing import Any, Dict

import torch

from .. import dispatch, platform
from ..backends.registry import Backend, Problem
from ..cachedir import cache_dir

__all__ = ["cache_dir", "cache_path", "clear_cache", "load", "probe_key", "store_verdicts", "verdict_dtype"]

# path -> verdicts read from (or written to) that file in this process
_LOADED: Dict[str, Dict[str, Any]] = {}
_LOCK = threading.Lock()


def cache_path(device: torch.device) -> str:
    index = device.index if device.type == "cuda" and device.index is not None else (0 if device.type == "cuda" else None)
    key = platform.fingerprint_key(platform.current(), index)
    return os.path.join(cache_dir(), f"probes-{device.type}-{key}.json")


def verdict_dtype(op: str, dtype: torch.dtype, device: torch.device) -> str:
    """The dtype part of a verdict key: "float32+tf32" when this op's fp32 runs on TF32 units
    here under torch's current switches (a verdict made with TF32 off does not speak for TF32
    on, nor the other way), else the dtype's name."""
    name = str(dtype).replace("torch.", "")
    if dtype == torch.float32:
        from .specs import get_spec
        if get_spec(op).precision(dtype, torch.device(device)) == "tf32":
            name += "+tf32"
    return name


def probe_key(problem: Problem, backend: Backend) -> str:
    return f"{problem.op}|{backend.name}|{verdict_dtype(problem.op, problem.dtype, problem.device)}|{problem.kind}"


def load(path: str) -> Dict[str, Any]:
    with _LOCK:
        if path in _LOADED:
            return _LOADED[path]
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle).get("verdicts", {})
        if not isinstance(data, dict):
            data = {}
    except (OSError, ValueError, AttributeError):
        data = {}   # no cache yet, or a damaged one: probe again
    with _LOCK:
        data = _LOADED.setdefault(path, data)
    dispatch.forget()
    return data


def store_verdicts(device: torch.device, verdicts: Dict[str, Dict[str, Any]]) -> str:
    """Merge probe verdicts into the on-disk store for `device`; returns its path."""
    path = cache_path(device)
    data = load(path)
    with _LOCK:
        data.update(verdicts)
        snapshot = dict(data)
    dispatch.forget()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
    with open(tmp, "w", encoding="utf-8") as handle:
        json.dump({"schema_version": 1, "fingerprint": platform.fingerprint_key(platform.current()),
                   "verdicts": snapshot}, handle, indent=1, sort_keys=True)
    os.replace(tmp, path)
    return path


def clear_cache() -> None:
    """Forget the verdicts read in this process (the files stay; `gpuparity cache clear` removes them)."""
    with _LOCK:
        _LOADED.clear()
    dispatch.forget()
