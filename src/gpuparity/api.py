"""Library entry points that are not ops: check a user implementation against the battery."""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from .checks.battery import (DEFAULT_TIMEOUT_S, BatteryRun, as_budget, normalize_device, plan, run_battery,
                             validate_device)
from .contracts import LEVELS, get_spec


def check(op: str, impl: Optional[str] = None, *, backends: Optional[Sequence[str]] = None,
          dtypes: Optional[Sequence[str]] = None, level: str = "default", device=None, seed: int = 0,
          progress: Optional[Callable] = None, timeout: Optional[float] = None,
          stream_path: Optional[str] = None, cases: Optional[Sequence[str]] = None,
          budget: Optional[float] = None, explore: Optional[float] = None, shrink: bool = True,
          repro_dir: Optional[str] = None, shrink_seconds: float = 60.0) -> BatteryRun:
    """Run `op`'s whole battery (forward and backward, against float64, crash-isolated) on the
    registered backends, or on `impl` ("package.module:function" or "file.py:function") with the
    op's public signature; `cases` names the cases to run (default: every case of `level`).
    `budget`: seconds for the whole run; checks left when it is spent are NOT_RUN. An
    implementation that crashes or hangs 3 times in a row has the rest of its checks NOT_RUN.
    `run.ok` is False when anything failed, errored, crashed or hung, or was not run.
    `explore`: seconds more spent on the op's regime families where errors came closest to the
    bound. `shrink`: each implementation's first failure is shrunk to the smallest case that
    still fails (`run.shrunk`) and, given `repro_dir`, handed over as a standalone repro script
    there (checks/shrink.py, checks/repro.py); `shrink_seconds` bounds each search."""
    get_spec(op)  # a clear error for an unknown op
    if impl is not None and not isinstance(impl, str):
        raise TypeError(f"impl: expected 'package.module:function' or 'file.py:function' (a string, so the "
                        f"check can run in a separate process), got {type(impl).__name__}")
    budget = as_budget(budget)  # a bad budget is a usage error before anything runs
    named = _named_cases(op, cases, level) if cases else None
    if device is None:
        import torch
        device = "cuda:0" if torch.cuda.is_available() else "cpu"
    if impl is not None:
        device = normalize_device(device)
        validate_device(device)  # before the slower import check
        problem, lacks = _impl_preflight_isolated(impl, op, timeout or DEFAULT_TIMEOUT_S[device.type])
        if problem:
            raise ValueError(problem)
    else:
        lacks = None
    if named is not None:
        tasks, decided = plan([op], level, device, dtypes, backends, impl, seed, cases={op: named},
                              impl_lacks=lacks)
        if not tasks and not decided:
            raise ValueError(f"case: {', '.join(cases)} of {op} selects no check at level {level}"
                             + (f" in {', '.join(dtypes)}" if dtypes else "")
                             + "; some cases run in 16-bit dtypes only at --level full")
    run = run_battery([op], level, device, dtypes, backends, impl, seed, stream_path, progress, timeout,
                      budget=budget, explore=explore, case_lists={op: named} if named is not None else None,
                      impl_lacks=lacks)
    if shrink and not run.ok:
        from .checks.shrink import shrink_failures
        run.shrunk = shrink_failures(run.results, impl=impl, timeout=timeout, seconds=shrink_seconds,
                                     repro_dir=repro_dir)
    return run


def _named_cases(op: str, cases: Sequence[str], level: str) -> list:
    """The cases named (listed cases, family members such as "tile.sq192_sk192_bool_d64", explore
    draws such as "tile.draw3", relation checks such as "relation.batch_items.cover.20"); an unknown name, or one the level leaves out, is a usage error
    rather than a run with nothing in it."""
    from .checks.relations import lookup
    if level not in LEVELS:
        raise ValueError(f"level: expected one of {list(LEVELS)}, got {level!r}")
    spec = get_spec(op)
    found = {name: lookup(spec, name) for name in cases}
    unknown = [name for name, case in found.items() if case is None]
    if unknown:
        raise ValueError(f"case: got {', '.join(unknown)}, which {op} does not have; expected names from "
                         f"{', '.join(case.name for case in spec.cases())} or a family member "
                         f"(<family>.<label>, families: {', '.join(f.name for f in spec.families())})")
    for name, case in found.items():
        if not case.at(level):
            raise ValueError(f"case: {name} of {op} runs from level {case.level} up, "
                             f"got level {level}; use --level {case.level}")
    return list(found.values())


def impl_preflight(impl: str, op: Optional[str] = None) -> Dict[str, Any]:
    """{"error": why `impl` cannot be loaded or, given `op`, cannot take the battery's calls (None:
    it can), "lacks": the op's optional keywords it does not take (checks/signature.lacking_keywords;
    None without an answer)}; called in a child process by _impl_preflight_isolated."""
    from .checks.execute import ImplError, load_impl
    from .checks.signature import lacking_keywords, signature_mismatch
    try:
        fn = load_impl(impl)
    except ImplError as exc:
        error = f"{exc}; needs a function with {op}'s signature {get_spec(op).signature}" if op else str(exc)
        return {"error": error, "lacks": None}
    if not op:
        return {"error": None, "lacks": None}
    return {"error": signature_mismatch(fn, op, f"--impl {impl!r}"), "lacks": lacking_keywords(fn, op)}


def _impl_preflight_isolated(impl: str, op: str, timeout: float) -> Tuple[Optional[str], Optional[List[str]]]:
    """Load `impl` once in a separate process before the battery: a module that does not import,
    a missing function or one with the wrong parameters is bad input (one message, exit 2), not
    an ERROR in every check. A crash or hang on import is left to the battery, which reports it
    per check with stderr. (error, the optional keywords it lacks: their cases SKIP in the plan,
    before any input is built; None where unknown)."""
    from .isolate import call_isolated
    outcome = call_isolated("gpuparity.api:impl_preflight", {"impl": impl, "op": op}, timeout=timeout)
    if not outcome.ok or not isinstance(outcome.value, dict):
        return None, None
    return outcome.value.get("error"), outcome.value.get("lacks")
