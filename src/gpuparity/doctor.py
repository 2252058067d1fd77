"""`gpuparity doctor`: the platform report, the known issues that apply (confirmed by probes),
the battery on every backend, and a recommended configuration; one JSON-able report. The
battery's verdicts also fill the probe cache that `backend="auto"` reads."""
from __future__ import annotations

import dataclasses
import datetime
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

from . import __version__, dispatch, platform
from .checks.battery import (BatteryRun, Budget, WorkerPool, as_budget, estimate_seconds, normalize_device, plan,
                             run_battery, run_tasks, timing_tasks, validate_device, verdicts_from_results)
from .checks.plan import timing_field
from .checks.verdicts import VerdictKey, store_verdicts
from .known import avoid as known_avoid
from .checks.results import CheckResult, Status, tally

SCHEMA_VERSION = 1
# A known issue fails the doctor when its probe failed here ("confirmed") and it is a bug or a
# configuration problem. Confirmed by-design behaviour (TF32 defaults, the cuBLAS workspace
# rule of deterministic mode) and precision limitations of a kernel that auto-selection
# already avoids (TORCH-CPU-BF16-LN-GRAD) are reported with their remedies, not failures.
FAILING_KNOWN_STATUSES = ("confirmed",)
NON_FAILING_KNOWN_KINDS = ("behaviour", "limitation")


@dataclasses.dataclass
class DoctorOptions:
    level: str = "default"
    device: Optional[str] = None           # None: the first GPU if there is one, else cpu
    ops: Optional[Sequence[str]] = None
    dtypes: Optional[Sequence[str]] = None
    backends: Optional[Sequence[str]] = None
    seed: int = 0
    probes: bool = True                    # run known-issue probes
    stream_path: Optional[str] = None      # results as JSON lines, as they arrive
    fill_cache: bool = True
    timeout: Optional[float] = None
    budget: Optional[float] = None         # seconds for the whole run; what is left then is NOT_RUN
    explore: Optional[float] = None        # seconds more drawing regime-family cases (checks/explore.py)
    shrink: bool = True                    # each failing backend's first failure shrunk, with a repro script
    repro_dir: Optional[str] = None        # where the repro scripts go (None: none written)
    shrink_seconds: float = 30.0           # per shrunk failure


def default_device() -> str:
    import torch
    return "cuda:0" if torch.cuda.is_available() else "cpu"


def estimate(options: DoctorOptions) -> Dict[str, Any]:
    """How long the battery will take, before it starts (the CLI says it up front). Bad options
    (a device that is not there, an unknown op, dtype or backend) raise here, before any estimate."""
    device = normalize_device(options.device or default_device())
    validate_device(device)
    as_budget(options.budget)  # a bad budget is a usage error before the run
    tasks, decided = plan(options.ops, options.level, device, options.dtypes, options.backends, None, options.seed)
    return {"checks": len(tasks), "skipped": len(decided), "seconds": estimate_seconds(len(tasks), device)}


def _known_issues(report: Dict[str, Any], device: str, probes: bool, sink: Dict[str, Any],
                  reuse: bool = False) -> None:
    try:
        from . import known
    except ImportError as exc:
        sink["error"] = f"the known-issue base is not available: {exc}"
        return
    try:
        results = known.evaluate(report, probes=probes, device=device, reuse_outcomes=reuse)
        sink["results"] = [r.to_dict() if hasattr(r, "to_dict") else dataclasses.asdict(r) for r in results]
    except Exception as exc:  # noqa: BLE001 - the report is still written without them
        sink["error"] = f"evaluating known issues failed: {type(exc).__name__}: {exc}"


def _timings(results: List[CheckResult], device: str, timeout: Optional[float],
             pool: Optional[WorkerPool] = None, budget: Optional[Budget] = None,
             known: Optional[Dict[tuple, float]] = None) -> Dict[tuple, float]:
    """Time every (op, backend, dtype) whose checks all passed, on the op's timing case, where
    there is more than one such backend to rank. `known`: timings already measured on this
    platform (`cached_timings`, for --quick); those are kept, not measured again."""
    passed: Dict[tuple, bool] = {}
    for r in results:
        if r.status == Status.SKIP or r.backend.startswith("impl:"):
            continue
        key = (r.op, r.backend, r.dtype)
        passed[key] = passed.get(key, True) and r.status == Status.PASS
    known = known or {}

    def unmeasured(task) -> bool:
        suffix = ("large",) if timing_field(task.case) == "time_ms_large" else ()
        return (task.op, task.backend, task.dtype) + suffix not in known

    tasks = timing_tasks([key for key, ok in passed.items() if ok], device, only=unmeasured)
    times = {key: value for key, value in known.items() if passed.get(key[:3])}
    for result in run_tasks(tasks, timeout=timeout, workers=1, pool=pool, budget=budget):  # alone on the GPU
        if result.status == Status.PASS:
            # (op, backend, dtype): the timing case; (op, backend, dtype, "large"): the large one
            suffix = ("large",) if timing_field(result.case) == "time_ms_large" else ()
            times[(result.op, result.backend, result.dtype) + suffix] = result.params.get("time_ms")
    return times


def cached_timings(device: str) -> Dict[tuple, float]:
    """The timings an earlier doctor stored in this platform's verdict cache: (op, backend, dtype)
    -> ms of the timing case, (op, backend, dtype, "large") -> ms of the large one. The cache is per
    device and platform fingerprint (checks/verdicts.py cache_path), so these were measured on this
    GPU under the same torch, driver and libraries. Timings only rank backends that passed."""
    import torch
    from .checks.verdicts import cache_path, read_file
    try:
        stored = read_file(cache_path(torch.device(device)))
    except (OSError, ValueError):
        return {}
    times: Dict[tuple, float] = {}
    for key, verdict in stored.items():
        op, backend, dtype, _kind = VerdictKey.decode(key)
        base = (op, backend, dtype.split("+")[0])
        for field, suffix in (("time_ms", ()), ("time_ms_large", ("large",))):
            value = verdict.get(field)
            if isinstance(value, (int, float)) and value > 0:
                times.setdefault(base + suffix, float(value))
    return times


def _auto_may_pick(op: str, backend: str) -> bool:
    """Whether backend="auto" may choose this backend (a baseline registered with probed=False,
    e.g. linear_cross_entropy's materialising "torch", is checked but never chosen)."""
    try:
        return dispatch.get(op, backend).probed
    except (KeyError, ValueError):
        return True


def _registration_index(op: str, backend: str) -> int:
    names = [b.name for b in dispatch.backends(op)]
    return names.index(backend) if backend in names else len(names)


def recommendations(results: List[CheckResult], times: Dict[tuple, float], avoids: Sequence = (),
                    device_type: str = "cpu") -> List[Dict[str, Any]]:
    """Per op and dtype: the fastest backend that passed everything, and the ones to avoid
    (failed checks, or ruled out by a known issue confirmed here: its remedy wins)."""
    by_op: Dict[tuple, Dict[str, List[CheckResult]]] = {}
    for r in results:
        if r.backend.startswith("impl:"):
            continue
        by_op.setdefault((r.op, r.dtype), {}).setdefault(r.backend, []).append(r)
    out = []
    for (op, dtype), backends in sorted(by_op.items()):
        good, avoid, unfinished = [], [], []
        for name, members in backends.items():
            ran = [m for m in members if m.status not in (Status.SKIP, Status.NOT_RUN)]
            bad = [m for m in ran if m.status.bad]
            not_run = [m for m in members if m.status == Status.NOT_RUN]
            if not ran and not not_run:
                continue
            # an avoid with a regime (known/avoid.py) rules out only some calls: a note, below
            ruled_out = next((a for a in avoids if a.matches(op, name, dtype, device_type) and a.when is None), None)
            if ruled_out is not None:
                avoid.append({"backend": name, "failed": len(bad), "of": len(ran), "statuses": ["known-issue"],
                              "example": ruled_out.reason[:200], "known_issue": ruled_out.issue})
            elif not bad and not_run:  # passed what ran, but not every check ran: not verified
                unfinished.append({"backend": name, "not_run": len(not_run), "of": len(ran) + len(not_run)})
            elif bad:
                kinds = sorted({m.status.value for m in bad})
                avoid.append({"backend": name, "failed": len(bad), "of": len(ran), "statuses": kinds,
                              "example": f"{bad[0].case}: {bad[0].reason[:160]}"})
            elif _auto_may_pick(op, name):
                good.append({"backend": name, "checks": len(ran), "time_ms": times.get((op, name, dtype)),
                             "time_ms_large": times.get((op, name, dtype, "large"))})
        # as dispatch ranks them: by time, then (untimed, e.g. an op with no timing case) in the
        # order the backends registered
        good.sort(key=lambda g: (g["time_ms"] is None, g["time_ms"] or 0.0, _registration_index(op, g["backend"])))
        use = good[0]["backend"] if good else None
        text = f"{op} ({dtype}): " + (f"use {use}" if use else "no backend passed every check")
        if good and good[0]["time_ms"] is not None:
            text += f" ({good[0]['time_ms']:.3g} ms on the timing case)"
        large = sorted((g for g in good if g["time_ms_large"] is not None), key=lambda g: g["time_ms_large"])
        if large:   # what backend="auto" takes for training-size calls (contracts/base.py is_large)
            text += f", {large[0]['backend']} for training-size calls ({large[0]['time_ms_large']:.3g} ms on the large case)"
        if avoid:
            text += "; avoid " + ", ".join(
                f"{a['backend']}: known issue {a['known_issue']} confirmed here" if a.get("known_issue")
                else f"{a['backend']}: failed {a['failed']}/{a['of']} check{'s' * (a['of'] != 1)}" for a in avoid)
        ran_any = [name for name, members in backends.items()
                   if any(m.status not in (Status.SKIP, Status.NOT_RUN) for m in members)]
        regimes = known_avoid.regime_notes(avoids, op, ran_any, dtype, device_type)
        if regimes:
            text += "; " + "; ".join(r["text"] for r in regimes)
        if unfinished:
            text += "; not verified: " + ", ".join(f"{u['backend']}: {u['not_run']}/{u['of']} check{'s' * (u['of'] != 1)} not run"
                                                   for u in unfinished)
        out.append({"op": op, "dtype": dtype, "use": use, "verified": good, "avoid": avoid, "unfinished": unfinished,
                    "avoid_calls": regimes, "text": text})
    return out


def _avoids(known_results: List[Dict[str, Any]]) -> list:
    try:
        return known_avoid.from_results(known_results)
    except Exception:  # noqa: BLE001 - the base failed to load: reported under known_issues_error already
        return []


def partial_report(options: DoctorOptions, results: List[CheckResult], *, error: str, exit_code: int,
                   interrupted: Optional[str] = None, duration_s: float = 0.0) -> Dict[str, Any]:
    """The report of a run that stopped early (SIGTERM, SIGINT, an unexpected error), from the
    results measured so far (the stream), in run_doctor's shape so that every writer takes it:
    marked partial, with `interrupted` naming the signal; no known issues or recommendations
    (the evidence is incomplete)."""
    report = platform.collect()
    return {
        "schema_version": SCHEMA_VERSION,
        "kind": "doctor",
        "partial": True,
        "interrupted": interrupted,
        "error": error,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "gpuparity_version": __version__,
        "platform": report,
        "machine": platform.summary_line(report),
        "options": {"level": options.level, "device": options.device or default_device(), "seed": options.seed,
                    "timeout": options.timeout, "budget": options.budget,
                    "ops": list(options.ops) if options.ops else None,
                    "dtypes": list(options.dtypes) if options.dtypes else None},
        "known_issues": [],
        "known_issues_error": "not evaluated: the run stopped early",
        "battery": {"results": [r.to_dict() for r in results], "tally": tally(results), "duration_s": duration_s},
        "recommendations": [],
        "probe_cache": None,
        "timings_reused": 0,
        "probes_reused": 0,
        "duration_s": duration_s,
        "phases_s": {},
        "exit_code": exit_code,
    }


def _shrink(results: List[CheckResult], options: DoctorOptions, budget) -> List[Dict[str, Any]]:
    """Each failing backend's first FAIL or ERROR shrunk to a minimal case, with a standalone repro
    script in options.repro_dir (checks/shrink.py), as `gpuparity check` does; within the budget."""
    if not options.shrink or not any(r.status in (Status.FAIL, Status.ERROR) for r in results):
        return []
    if budget is not None and budget.remaining() < options.shrink_seconds:
        return []
    from .checks.shrink import shrink_failures
    found = shrink_failures(results, timeout=options.timeout, seconds=options.shrink_seconds,
                            repro_dir=options.repro_dir)
    return [item.to_dict() for item in found]


def run_doctor(options: DoctorOptions, *, progress: Optional[Callable[[int, int, CheckResult], None]] = None,
               on_phase: Optional[Callable[[str], None]] = None) -> Dict[str, Any]:
    """Everything `gpuparity doctor` reports, as one dict (schema_version 1). options.budget
    bounds the battery, the known-issue probes and the timings together."""
    started = time.monotonic()
    budget = as_budget(options.budget)
    device = str(normalize_device(options.device or default_device()))
    validate_device(normalize_device(device))
    phases: Dict[str, float] = {}  # wall seconds of each phase, in the report
    clock = [time.monotonic()]

    def phase(name: str, finished: Optional[str] = None) -> None:
        now = time.monotonic()
        if finished:
            phases[finished] = round(now - clock[0], 2)
        clock[0] = now
        if on_phase:
            on_phase(name)

    phase("platform")
    report = platform.collect()
    known_sink: Dict[str, Any] = {}
    # --quick lets the probe outcomes an earlier doctor kept on this very platform stand (known/outcomes.py)
    known_thread = threading.Thread(target=_known_issues, args=(report, device, options.probes, known_sink,
                                                                options.level == "quick"), daemon=True)
    known_thread.start()  # probes run in their own processes, alongside the battery
    on_gpu = normalize_device(device).type == "cuda"
    # the timing worker imports torch while the battery runs
    timing_pool = WorkerPool(ops=options.ops).start() if options.fill_cache else None
    try:
        phase("battery", finished="platform")
        # timing warm-ups compile kernels alongside the checks; on the CPU there is nothing to compile
        run: BatteryRun = run_battery(options.ops, options.level, device, options.dtypes, options.backends,
                                      None, options.seed, options.stream_path, progress, options.timeout,
                                      warm_timings=options.fill_cache and on_gpu, budget=budget,
                                      explore=options.explore)
        phase("known issues", finished="battery")
        # the probes use the GPU too: the timings below run alone
        known_thread.join(timeout=max(budget.remaining(), 0.0) if budget else None)
        if known_thread.is_alive():
            known_sink = {"error": f"the known-issue probes did not finish within the budget of {budget.seconds:g} s "
                                   f"(--budget)"}
        phase("timing", finished="known issues (after the battery)")
        # --quick ranks with the timings an earlier doctor measured here and times only what they lack
        reused = cached_timings(device) if options.fill_cache and options.level == "quick" else {}
        times = (_timings(run.results, device, options.timeout, timing_pool, budget, known=reused)
                 if options.fill_cache and not (budget and budget.spent) else {})
        timings_reused = sum(1 for key in reused if key in times)
    finally:
        if timing_pool is not None:
            timing_pool.close()
    phase("done", finished="timing")
    cache_path = None
    known_results = known_sink.get("results", [])
    avoids = _avoids(known_results)
    device_type = normalize_device(device).type
    if options.fill_cache:
        verdicts = verdicts_from_results(run.results)
        known_avoid.apply(verdicts, avoids, device_type)
        for key, verdict in verdicts.items():
            op, backend, dtype, _kind = VerdictKey.decode(key)
            verdict["time_ms"] = times.get((op, backend, dtype.split("+")[0]))  # "float32+tf32": timed as float32
            large = times.get((op, backend, dtype.split("+")[0], "large"))
            if large is not None:
                verdict["time_ms_large"] = large
        try:
            import torch
            cache_path = store_verdicts(torch.device(device), verdicts, strict=True)
        except OSError as exc:
            cache_path = f"not written: {exc}"
    shrunk = _shrink(run.results, options, budget)
    battery_bad = [r for r in run.results if r.status.bad or r.status == Status.NOT_RUN]
    known_bad = [k for k in known_results if k.get("status") in FAILING_KNOWN_STATUSES
                 and k.get("kind") not in NON_FAILING_KNOWN_KINDS]
    exit_code = 1 if battery_bad or known_bad else 0
    return {
        "schema_version": SCHEMA_VERSION,
        "kind": "doctor",
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "gpuparity_version": __version__,
        "platform": report,
        "machine": platform.summary_line(report),
        "options": {"level": options.level, "device": device, "seed": options.seed, "timeout": options.timeout,
                    "budget": options.budget,
                    "ops": list(options.ops) if options.ops else None,
                    "dtypes": list(options.dtypes) if options.dtypes else None},
        "known_issues": known_results,
        "known_issues_error": known_sink.get("error"),
        "battery": {"results": [r.to_dict() for r in run.results], "tally": tally(run.results),
                    "duration_s": run.duration_s},
        "recommendations": recommendations(run.results, times, avoids, device_type),
        "shrunk": shrunk,
        "probe_cache": cache_path,
        "timings_reused": timings_reused,
        "probes_reused": sum(1 for k in known_results if (k.get("probe_outcome") or {}).get("reused")),
        "duration_s": time.monotonic() - started,
        "phases_s": phases,
        "exit_code": exit_code,
    }
