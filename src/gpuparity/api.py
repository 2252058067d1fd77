"""Library entry points that are not ops: check a user implementation against the battery."""
from __future__ import annotations

from typing import Callable, Optional, Sequence

from .checks.battery import (DEFAULT_TIMEOUT_S, BatteryRun, as_budget, normalize_device, plan, run_battery,
                             validate_device)
from .checks.specs import LEVELS, get_spec


def check(op: str, impl: Optional[str] = None, *, backends: Optional[Sequence[str]] = None,
          dtypes: Optional[Sequence[str]] = None, level: str = "default", device=None, seed: int = 0,
          progress: Optional[Callable] = None, timeout: Optional[float] = None,
          stream_path: Optional[str] = None, cases: Optional[Sequence[str]] = None,
          budget: Optional[float] = None) -> BatteryRun:
    """Run `op`'s whole battery (forward and backward, against float64, crash-isolated) on the
    registered backends, or on `impl` ("package.module:function" or "file.py:function") with the
    op's public signature; `cases` names the cases to run (default: every case of `level`).
    `budget`: seconds for the whole run; checks left when it is spent are NOT_RUN. An
    implementation that crashes or hangs 3 times in a row has the rest of its checks NOT_RUN.
    `run.ok` is False when anything failed, errored, crashed or hung, or was not run."""
    spec = get_spec(op)  # a clear error for an unknown op
    if impl is not None and not isinstance(impl, str):
        raise TypeError(f"impl: expected 'package.module:function' or 'file.py:function' (a string, so the "
                        f"check can run in a separate process), got {type(impl).__name__}")
    budget = as_budget(budget)  # a bad budget is a usage error before anything runs
    case_filter = _case_filter(op, cases, level) if cases else None
    if device is None:
        import torch
        device = "cuda:0" if torch.cuda.is_available() else "cpu"
    if impl is not None:
        device = normalize_device(device)
        validate_device(device)  # before the slower import check
        problem = _impl_load_error_isolated(impl, op, timeout or DEFAULT_TIMEOUT_S[device.type])
        if problem:
            raise ValueError(f"{problem}; needs a function with {op}'s signature {spec.signature}")
    if case_filter is not None:
        tasks, decided = plan([op], level, device, dtypes, backends, impl, seed, case_filter)
        if not tasks and not decided:
            raise ValueError(f"case: {', '.join(cases)} of {op} selects no check at level {level}"
                             + (f" in {', '.join(dtypes)}" if dtypes else "")
                             + "; some cases run in 16-bit dtypes only at --level full")
    return run_battery([op], level, device, dtypes, backends, impl, seed, stream_path, progress, timeout,
                       case_filter=case_filter, budget=budget)


def _case_filter(op: str, cases: Sequence[str], level: str) -> Callable:
    """The battery's case_filter for named cases; an unknown name, or one the level leaves out,
    is a usage error rather than a run with nothing in it."""
    if level not in LEVELS:
        raise ValueError(f"level: expected one of {list(LEVELS)}, got {level!r}")
    by_name = {case.name: case for case in get_spec(op).cases()}
    unknown = [name for name in cases if name not in by_name]
    if unknown:
        raise ValueError(f"case: got {', '.join(unknown)}, which {op} does not have; expected names from "
                         f"{', '.join(by_name)}")
    for name in cases:
        if not by_name[name].at(level):
            raise ValueError(f"case: {name} of {op} runs from level {by_name[name].level} up, "
                             f"got level {level}; use --level {by_name[name].level}")
    wanted = set(cases)
    return lambda _op, case: case.name in wanted


def impl_load_error(impl: str, op: Optional[str] = None) -> Optional[str]:
    """Why `impl` cannot be loaded (import, attribute, not callable) or, given `op`, cannot take
    the calls the battery makes for it (its parameters), or None; called in a child process by
    _impl_load_error_isolated."""
    from .checks.execute import ImplError, load_impl
    from .checks.signature import signature_mismatch
    try:
        fn = load_impl(impl)
    except ImplError as exc:
        return str(exc)
    return signature_mismatch(fn, op, f"--impl {impl!r}") if op else None


def _impl_load_error_isolated(impl: str, op: str, timeout: float) -> Optional[str]:
    """Load `impl` once in a separate process before the battery: a module that does not import,
    a missing function or one with the wrong parameters is bad input (one message, exit 2), not
    an ERROR in every check. A crash or hang on import is left to the battery, which reports it
    per check with stderr."""
    from .checks.isolate import call_isolated
    outcome = call_isolated("gpuparity.api:impl_load_error", {"impl": impl, "op": op}, timeout=timeout)
    return outcome.value if outcome.ok else None
