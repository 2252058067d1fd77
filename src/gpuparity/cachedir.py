"""Where gpuparity keeps its on-disk caches (probe verdicts, compile probes): one place."""
from __future__ import annotations

import json
import logging
import os
import threading
from . import caches

LOG = logging.getLogger("gpuparity")
_WARNED = caches.register("cachedir.warned", set())
_LOCK = threading.Lock()


def cache_dir() -> str:
    """$GPUPARITY_CACHE_DIR, else $XDG_CACHE_HOME/gpuparity, else ~/.cache/gpuparity."""
    return os.environ.get("GPUPARITY_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "gpuparity")


def warn_once(key: str, message: str, *args) -> None:
    """Log `message` as a warning the first time `key` comes up in this process: a cache that
    cannot be written or read is said once, not on every call."""
    with _LOCK:
        if key in _WARNED:
            return
        _WARNED.add(key)
    LOG.warning(message, *args)


def unwritable(path: str, exc: OSError) -> None:
    """Say once that the caches cannot be written (read-only home, a container, a
    GPUPARITY_CACHE_DIR that cannot be created): the library goes on without them."""
    warn_once("unwritable", "gpuparity: cannot write the cache %s (%s); going on without an on-disk cache: "
              "verdicts are kept in this process only and probed again in the next one. Set "
              "GPUPARITY_CACHE_DIR to a writable directory to keep them", path,
              exc.strerror or type(exc).__name__)


def write_json(path: str, data) -> bool:
    """Write `data` as JSON to `path` through a temporary file and a rename, so a reader never sees
    half a file; False (and no file left behind) when it cannot be written: a cache is optional."""
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with open(tmp, "w", encoding="utf-8") as handle:
            json.dump(data, handle, indent=1, sort_keys=True, default=str)
        os.replace(tmp, path)
        return True
    except OSError:
        try:
            os.remove(tmp)
        except OSError:
            pass
        return False
