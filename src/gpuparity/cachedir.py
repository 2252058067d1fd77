"""Where gpuparity keeps its on-disk caches (probe verdicts, compile probes): one place."""
from __future__ import annotations

import os


def cache_dir() -> str:
    """$GPUPARITY_CACHE_DIR, else $XDG_CACHE_HOME/gpuparity, else ~/.cache/gpuparity."""
    return os.environ.get("GPUPARITY_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "gpuparity")
