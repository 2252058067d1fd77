"""Probe outcomes kept per platform, so that `doctor --quick` need not probe again what a doctor
probed on this very platform a short while ago.

A kept outcome is the probe's own verdict (it ran here), not a version rule's guess. It is reused
only while everything that decided it is unchanged:

- the platform fingerprint (GPU, driver, torch, vendor libraries, Triton, gpuparity's version and
  the numerics environment variables: `platform.fingerprint_key`) names the file;
- each outcome carries a key of the entry as written and of the probes' source, so an edited
  entry or probe runs again;
- it is younger than `MAX_AGE_S`, and its verdict was decisive (confirmed or ruled out): an
  inconclusive probe always runs again.

The default doctor always probes and refreshes the file; only `--quick` reuses it.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import time
from typing import Any, Dict, Optional

from .. import caches
from ..cachedir import write_json

MAX_AGE_S = 7 * 24 * 3600
REUSABLE_VERDICTS = ("confirmed", "ruled out")
_SOURCE_KEYS: Dict[str, str] = caches.register("known.outcomes.source_keys", {})


def _module_source_key(module: str) -> str:
    if module not in _SOURCE_KEYS:
        spec = importlib.util.find_spec(module)
        try:
            with open(spec.origin, "rb") as handle:   # type: ignore[union-attr]
                data = handle.read()
        except (OSError, AttributeError, TypeError):
            data = b""
        _SOURCE_KEYS[module] = hashlib.sha256(data).hexdigest()[:16]
    return _SOURCE_KEYS[module]


def code_key(issue: Dict[str, Any], probe_module: str) -> str:
    """What decided a probe's outcome besides the platform: the entry as written and the probes' source."""
    text = json.dumps(issue, sort_keys=True, default=str) + _module_source_key(probe_module)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def load(path: str) -> Dict[str, Dict[str, Any]]:
    """Entry id -> {"code", "at", "outcome"}; {} when none were kept or the file is unreadable."""
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {key: value for key, value in data.items()
            if isinstance(value, dict) and isinstance(value.get("outcome"), dict)
            and isinstance(value.get("at"), (int, float)) and isinstance(value.get("code"), str)}


def save(path: str, outcomes: Dict[str, Dict[str, Any]]) -> None:
    """Merge `outcomes` (entry id -> {"code", "at", "outcome"}) into the file at `path`. A cache
    that cannot be written only costs the next --quick its probes."""
    write_json(path, {**load(path), **outcomes})


def entry(outcome: Dict[str, Any], code: str, now: Optional[float] = None) -> Dict[str, Any]:
    """What is kept for one probe run."""
    return {"code": code, "at": time.time() if now is None else now, "outcome": outcome}


def reusable(kept: Optional[Dict[str, Any]], code: str, now: Optional[float] = None) -> Optional[Dict[str, Any]]:
    """The kept outcome, marked as reused, when it may stand for a new run of the probe; else None."""
    if not kept or kept.get("code") != code:
        return None
    now = time.time() if now is None else now
    age = now - float(kept["at"])
    outcome = kept["outcome"]
    if not 0 <= age <= MAX_AGE_S or outcome.get("verdict") not in REUSABLE_VERDICTS:
        return None
    return {**outcome, "reused": True, "probed_at": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(kept["at"])),
            "age_s": round(age, 1)}
