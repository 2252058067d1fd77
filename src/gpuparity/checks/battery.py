"""The battery: every case of every op on every backend, each in a crash-isolated worker
process with a timeout; results stream to disk as they arrive.

`run_battery(...)` is the one entry point (doctor, check, fleet and the probes use it). What
runs is decided in plan.py, how it runs (workers, timeouts, cut-offs) in pool.py; this module
joins the two and turns results into probe-cache verdicts."""
from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Union

import torch

from .attribute import attribute, set_aside_for
from .execute import dtype_from_name
from .plan import (SECONDS_PER_CHECK, WORKER_START_S, Task, check_backend_names, estimate_seconds,
                   is_jit as _is_jit, normalize_device, plan, timing_tasks, validate_device)
from .pool import (CRASH_LIMIT, DEFAULT_TIMEOUT_S, Budget, WorkerPool, as_budget, default_workers,
                   queue_order as _queue_order, run_tasks)
from .results import CheckResult, ResultStream, Status, clip
from ..contracts import get_spec
from .verdicts import VerdictKey, verdict_dtype

# plan, run_tasks, Task and normalize_device are imported from here by checks/selection.py
__all__ = ["BatteryRun", "Budget", "CRASH_LIMIT", "DEFAULT_TIMEOUT_S", "SECONDS_PER_CHECK", "Task",
           "WORKER_START_S", "WorkerPool", "as_budget", "check_backend_names", "default_workers",
           "estimate_seconds", "normalize_device", "plan", "run_battery", "run_tasks", "timing_tasks",
           "validate_device", "verdict_status", "verdicts_from_results"]


@dataclasses.dataclass
class BatteryRun:
    results: List[CheckResult]
    level: str
    device: str
    seed: int
    duration_s: float
    stream_path: Optional[str] = None
    shrunk: List[Any] = dataclasses.field(default_factory=list)   # shrink.Shrunk of failures (api.check)

    @property
    def ok(self) -> bool:
        """Nothing failed, errored, crashed or hung, and nothing was left NOT_RUN."""
        return not any(r.status.bad or r.status == Status.NOT_RUN for r in self.results)


def run_battery(ops: Optional[Sequence[str]] = None, level: str = "default", device="cpu",
                dtypes: Optional[Sequence[str]] = None, backends: Optional[Sequence[str]] = None,
                impl: Optional[str] = None, seed: int = 0, stream_path: Optional[str] = None,
                progress: Optional[Callable[[int, int, CheckResult], None]] = None,
                timeout: Optional[float] = None, isolate: bool = True,
                case_filter: Optional[Callable] = None, env: Optional[Dict[str, str]] = None,
                warm_timings: bool = False, budget: Union[None, float, Budget] = None,
                crash_limit: Optional[int] = CRASH_LIMIT, explore: Optional[float] = None,
                case_lists: Optional[Dict[str, Sequence[Any]]] = None,
                impl_lacks: Optional[Sequence[str]] = None) -> BatteryRun:
    """Run the battery; returns every result (SKIPs included) in the order they finished.
    warm_timings: also run each compiling backend's timing case once, alongside the checks,
    so that the timings that follow (doctor) find their kernels compiled. case_lists: exactly
    these cases for the ops named (plan's `cases`); impl_lacks: the optional keywords `impl`
    does not take (plan's, known from api.check's preflight). budget: seconds for
    the whole run (or a Budget started earlier); crash_limit: crashes or hangs in a row after
    which an implementation's remaining checks are NOT_RUN (pool.run_tasks). explore: seconds
    more spent drawing family members where errors came closest to the bound (explore.py)."""
    if explore is not None and (not isinstance(explore, (int, float)) or isinstance(explore, bool) or explore <= 0):
        raise ValueError(f"explore: expected a positive number of seconds, got {explore!r}")
    device = normalize_device(device)
    validate_device(device)
    budget = as_budget(budget)
    started = time.monotonic()
    tasks, decided = plan(ops, level, device, dtypes, backends, impl, seed, case_filter, case_lists,
                          impl_lacks=impl_lacks)
    # what progress counts: the checks that run. The skips decided up front are reported at
    # done=0 (results, not progress); warm-ups report nothing
    total = len(tasks)
    if warm_timings:
        keys = [(t.op, t.backend, t.dtype) for t in tasks if not t.impl]
        tasks = tasks + timing_tasks(keys, str(device), mode="warm", first_id=len(tasks) + len(decided), only=_is_jit)
    done = 0
    results: List[CheckResult] = []
    # an --impl's ERRORs that may be torch's known fault, and its attention FAILs on a GPU that may be
    # torch's fused SDPA kernel's: held back, rerun after the battery (attribute.py)
    held: List[tuple] = []
    with ResultStream(stream_path) as stream:
        def emit(result: CheckResult, ran: bool) -> None:
            nonlocal done
            done += ran
            stream.write(result)
            results.append(result)
            if progress:
                progress(done, total, result)

        def record(result: CheckResult, ran: bool = True) -> None:
            _label_known(result, device.type)
            set_aside = set_aside_for(result, device.type) if impl else ([], [])
            if set_aside[1]:
                held.append((result, set_aside, ran))
            else:
                emit(result, ran)
        for result in decided:
            record(result, ran=False)
        finished = False
        try:
            run_tasks(tasks, isolate=isolate, timeout=timeout, env=env, on_result=record, budget=budget,
                      crash_limit=crash_limit)
            if explore and not (budget and budget.spent):
                from .explore import explore as explore_more
                seconds = min(explore, budget.remaining()) if budget else explore
                explore_more(seconds, ops, device, dtypes, backends, impl, seed,
                             previous=list(results) + [r for r, _, _ in held],   # held ones weigh too
                             on_result=record, isolate=isolate, timeout=timeout, env=env,
                             level="full" if level == "full" else "default", impl_lacks=impl_lacks)
            finished = True
        finally:   # interrupted: the held ERRORs are reported as they came (nothing measured is lost)
            if held and finished:
                attribute([(r, names) for r, names, _ in held], impl, isolate=isolate, timeout=timeout, env=env,
                          budget=budget)
            for result, _, ran in held:
                emit(result, ran)
    return BatteryRun(results, level, str(device), seed, time.monotonic() - started, stream_path)


def verdicts_from_results(results: Iterable[CheckResult]) -> Dict[str, Dict[str, Any]]:
    """Probe-cache verdicts ("op|backend|dtype|kind") from battery results: a backend passes a
    kind when every case of that kind passed (SKIPs aside) and at least one ran. A kind with
    checks left NOT_RUN and none failed gets no verdict: the evidence is incomplete."""
    groups: Dict[str, List[CheckResult]] = {}
    for result in results:
        if result.backend.startswith("impl:"):
            continue
        spec = get_spec(result.op)
        # the checks ran with this process's fp32 switches (child_env carries them to workers)
        dtype = verdict_dtype(result.op, dtype_from_name(result.dtype), torch.device(result.device))
        key = VerdictKey(result.op, result.backend, dtype, spec.kind(result.params)).encode()
        groups.setdefault(key, []).append(result)
    verdicts = {}
    for key, members in groups.items():
        ran = [r for r in members if r.status not in (Status.SKIP, Status.NOT_RUN)]
        bad = [r for r in ran if r.status.bad]
        if not ran or (not bad and any(r.status == Status.NOT_RUN for r in members)):
            continue
        verdicts[key] = {
            "passed": not bad,
            "checks": len(ran),
            "failed": len(bad),
            "reason": (f"passed {len(ran)} check{'s' * (len(ran) != 1)}" if not bad else
                       f"failed {len(bad)}/{len(ran)} check{'s' * (len(ran) != 1)}, e.g. {bad[0].case}: {bad[0].status.value} {clip(bad[0].reason, 200)}"),
            "checked_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
        }
    return verdicts


def verdict_status(verdict: Dict[str, Any]) -> str:
    """"passed", "failed" (checks ran and some did not pass, or the timing run failed) or
    "unsupported" (no check ran: the backend cannot serve that kind here, and the verdict's
    reason is the SKIP's). The probe records an unsupported backend as passed=False with only
    the SKIP reason, so a verdict is a failure only with evidence that checks ran."""
    if verdict.get("passed"):
        return "passed"
    if verdict.get("unsupported"):
        return "unsupported"
    reason = str(verdict.get("reason", ""))
    if verdict.get("checks") or reason.startswith(("failed ", "timing run failed")):
        return "failed"
    return "unsupported"


def _label_known(result: CheckResult, device_type: str) -> None:
    """A FAIL of a backend that a known issue's avoid entry rules out for this op, dtype and
    device (known/avoid.py named_for) says so first in its reason, not as a new failure
    (TORCH-CPU-FP16-CE-MEAN: torch's CPU fp16 cross_entropy at --level full); an ERROR whose words
    are a known issue's `error_markers` names that issue (named_by_error: torch SDPA's "misaligned
    address" met by an --impl that calls it)."""
    from ..known.avoid import named_by_error, named_for

    def issues(named) -> str:
        return "; ".join(f"known issue {issue} ({title})" for issue, title in named)
    if result.status == Status.ERROR:
        named = named_by_error(result.reason, device_type)
        if named:
            result.reason = (f"this error matches {issues(named)} (`gpuparity known-issues` gives the remedy): "
                             + result.reason)
    elif result.status == Status.FAIL and not result.backend.startswith("impl:"):
        named = named_for(result.op, result.backend, result.dtype, device_type)
        if named:
            result.reason = (f"{result.backend} in {result.dtype} on {device_type} is ruled out for {result.op} by "
                             f"{issues(named)}: " + result.reason)
