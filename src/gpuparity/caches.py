"""Every process-level (in-memory) cache of gpuparity, by name, and one call that clears them all.

A module keeps a memo as `_MEMO = caches.register("ops.dropout.memo", {})` (a dict, list or set
is cleared in place), memoizes a function with `@caches.lru_cache("backends.flex.compiled")`
(functools.lru_cache, registered), or registers a clearing callable. `clear_all()` empties
them (tests use it between cases that change the platform or the registry); `gpuparity cache
clear` empties the on-disk caches (`cachedir.py`). tests/test_architecture.py fails when a
module-level memo is not registered here.
"""
from __future__ import annotations

import functools
import threading
from typing import Callable, Dict, List, TypeVar

T = TypeVar("T")

_LOCK = threading.Lock()
_CLEARERS: Dict[str, Callable[[], None]] = {}


def _clearer(cache) -> Callable[[], None]:
    if hasattr(cache, "cache_clear"):          # functools.lru_cache / functools.cache
        return cache.cache_clear
    if hasattr(cache, "clear"):                # dict, list, set, WeakKeyDictionary, ...
        return cache.clear
    if callable(cache):
        return cache
    raise TypeError(f"cache: expected a dict, list, set, an lru_cache function or a clearing callable, "
                    f"got {type(cache).__name__}")


def register(name: str, cache: T) -> T:
    """Record `cache` under `name` (a dotted name saying whose memo it is) and return it unchanged.
    Registering the same name again replaces the entry (a module reloaded in a test)."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"name: expected a non-empty string, got {name!r}")
    clear = _clearer(cache)
    with _LOCK:
        _CLEARERS[name] = clear
    return cache


def names() -> List[str]:
    """The registered caches' names, sorted."""
    with _LOCK:
        return sorted(_CLEARERS)


def clear_all() -> List[str]:
    """Empty every registered cache; returns the names cleared."""
    with _LOCK:
        clearers = dict(_CLEARERS)
    for clear in clearers.values():
        clear()
    return sorted(clearers)


def lru_cache(name: str, maxsize=None):
    """`functools.lru_cache(maxsize)`, registered under `name`."""
    def wrap(function):
        return register(name, functools.lru_cache(maxsize=maxsize)(function))
    return wrap
