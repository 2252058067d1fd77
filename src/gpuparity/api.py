"""Library entry points that are not ops: check a user implementation against the battery."""
from __future__ import annotations

from typing import Callable, Optional, Sequence

from .checks.battery import BatteryRun, run_battery
from .checks.specs import get_spec


def check(op: str, impl: Optional[str] = None, *, backends: Optional[Sequence[str]] = None,
          dtypes: Optional[Sequence[str]] = None, level: str = "default", device=None, seed: int = 0,
          progress: Optional[Callable] = None, timeout: Optional[float] = None,
          stream_path: Optional[str] = None) -> BatteryRun:
    """Run `op`'s whole battery (forward and backward, against float64, crash-isolated) on the
    registered backends, or on `impl` ("package.module:function" or "file.py:function") with the
    op's public signature. `run.ok` is False when anything failed, errored, crashed or hung."""
    get_spec(op)  # a clear error for an unknown op
    if impl is not None and not isinstance(impl, str):
        raise TypeError(f"impl: expected 'package.module:function' or 'file.py:function' (a string, so the "
                        f"check can run in a separate process), got {type(impl).__name__}")
    if device is None:
        import torch
        device = "cuda:0" if torch.cuda.is_available() else "cpu"
    return run_battery([op], level, device, dtypes, backends, impl, seed, stream_path, progress, timeout)
