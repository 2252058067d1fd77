"""The verdict store behind verified auto-selection: per device and platform fingerprint,
one JSON file of verdicts keyed "op|backend|dtype|kind". `checks.selection.verdict_for` reads
it and verifies on a miss; `gpuparity doctor` fills it ahead of time. Every change here tells
dispatch to forget the resolutions it remembered (dispatch._Memo's rule)."""
from __future__ import annotations

import json
import os
import threading
from typing import Any, Dict, Optional

import torch

from .. import dispatch, platform
from .. import registry
from ..registry import Backend, Problem
from ..cachedir import cache_dir, unwritable, warn_once
from .. import caches

__all__ = ["CacheCorrupt", "VerdictKey", "cache_dir", "cache_path", "clear_cache", "load", "read_file", "store_verdicts",
           "verdict_dtype", "verdict_key"]

# path -> verdicts read from (or written to) that file in this process
_LOADED: Dict[str, Dict[str, Any]] = caches.register("checks.verdicts.loaded", {})
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
        from ..contracts import get_spec
        if get_spec(op).precision(dtype, torch.device(device)) == "tf32":
            name += "+tf32"
    return name


class VerdictKey(registry.VerdictKey):
    """The store's key (registry.VerdictKey: "op|backend|dtype|kind", `encode`, `decode`), and
    the key of a call's verdict as the store names its dtype (`of`)."""
    __slots__ = ()

    @classmethod
    def of(cls, problem: Problem, backend: str) -> "VerdictKey":
        """The key of `backend`'s verdict for calls like `problem` (its op, dtype and kind)."""
        return cls(problem.op, backend, verdict_dtype(problem.op, problem.dtype, problem.device), problem.kind)


def verdict_key(problem: Problem, backend: Backend) -> str:
    """The store's key (a string) of `backend`'s verdict for calls like `problem`."""
    return VerdictKey.of(problem, backend.name).encode()


class CacheCorrupt(ValueError):
    """A probe cache file that is not valid JSON or not shaped as this module writes it."""


def read_file(path: str) -> Dict[str, Any]:
    """The verdicts of one cache file; raises CacheCorrupt naming the file and how to clear it
    (OSError when it cannot be read at all)."""
    with open(path, encoding="utf-8") as handle:
        text = handle.read()
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise CacheCorrupt(_damaged(path, str(exc))) from None
    if not isinstance(data, dict) or not isinstance(data.get("verdicts", {}), dict):
        raise CacheCorrupt(_damaged(path, "expected an object with a 'verdicts' object"))
    verdicts = data.get("verdicts", {})
    for key, verdict in verdicts.items():
        try:
            VerdictKey.decode(key)
        except ValueError:
            raise CacheCorrupt(_damaged(path, f"entry {key!r} is not 'op|backend|dtype|kind' with an object")) from None
        if not isinstance(verdict, dict):
            raise CacheCorrupt(_damaged(path, f"entry {key!r} is not 'op|backend|dtype|kind' with an object"))
    return verdicts


def _damaged(path: str, why: str) -> str:
    return (f"the probe cache {path} is damaged ({why}); remove it with `gpuparity cache clear` "
            f"(the next backend='auto' call probes again)")


def load(path: str) -> Dict[str, Any]:
    with _LOCK:
        if path in _LOADED:
            return _LOADED[path]
    try:
        data = read_file(path)
    except CacheCorrupt as exc:
        # probe again and overwrite it, but say so: a file that keeps breaking is worth knowing about
        warn_once(f"corrupt:{path}", "gpuparity: %s; probing again, and the probes replace it", exc)
        data = {}
    except OSError:
        data = {}   # no cache yet (or unreadable): probe again
    with _LOCK:
        data = _LOADED.setdefault(path, data)
    dispatch.forget()
    return data


def store_verdicts(device: torch.device, verdicts: Dict[str, Dict[str, Any]], *,
                   strict: bool = False) -> Optional[str]:
    """Merge probe verdicts into the store for `device`; returns its path. The merged verdicts
    stay in this process either way; when the file cannot be written (read-only home, a
    container, a GPUPARITY_CACHE_DIR that cannot be created) that is logged once and None is
    returned, or, with `strict`, the OSError is raised (the doctor reports it)."""
    path = cache_path(device)
    data = load(path)
    with _LOCK:
        data.update(verdicts)
        snapshot = dict(data)
    dispatch.forget()
    tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(tmp, "w", encoding="utf-8") as handle:
            json.dump({"schema_version": 1, "fingerprint": platform.fingerprint_key(platform.current()),
                       "verdicts": snapshot}, handle, indent=1, sort_keys=True)
        os.replace(tmp, path)
    except OSError as exc:
        try:
            os.remove(tmp)
        except OSError:
            pass
        if strict:
            raise
        unwritable(path, exc)
        return None
    return path


def clear_cache() -> None:
    """Forget the verdicts read in this process (the files stay; `gpuparity cache clear` removes them)."""
    with _LOCK:
        _LOADED.clear()
    dispatch.forget()
