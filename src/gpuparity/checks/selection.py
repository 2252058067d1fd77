# long file: the first-call path of backend="auto" (verifying the candidate, the kept workers, prepare ahead of first calls, the background refinement) shares one lock, one set of workers and one exit; apart, each would reach into the others' state
"""Verification behind `backend="auto"`: the checks of the candidate a first call is about to
use, and the timings the selector ranks by. It verifies and never chooses: the selector
(ops/select.py) ranks the candidates and picks, and reaches this module only through
`VERIFICATION` (ops/select.Verification: stored verdict, verdict checked on a miss, `prepare`,
the worker's start), which it loads at its first need.

A first `backend="auto"` call (dispatch walks the candidates in the selector's order and asks
`verdict_for` about each until one passes) verifies only the candidate it would choose: that
backend on a few small cases of the call's kind (`first_call_cases`), plus the known-issue
probes that bear on it, against float64. On a GPU the checks run in a worker process kept
alive across calls (a backend that crashes the GPU cannot take the caller down with it; the
worker's start is paid once), started at the first call that needs a verdict or ahead of it by
`prepare` (`gpuparity.prepare()`, `gpuparity.patch`), never at an import. The timings come from
`gpuparity doctor`, or the background refinement a first call starts on a GPU (`check_op` over
every backend, timed).

`prepare` lets a caller that knows which calls are coming (`gpuparity.patch`: the model's ops,
dtype and device) have their candidates verified in the kept worker in the background, ahead of
the first forward; a first call whose verification is already under way waits for that one
instead of checking again, and a first call always goes before what the background has queued."""
from __future__ import annotations

import atexit
import itertools
import logging
import os
import queue
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

from .. import caches, dispatch
from ..registry import Backend, Problem
from . import verdicts as verdicts_store
from .battery import Budget, Task, WorkerPool, normalize_device, plan, run_tasks, verdicts_from_results
from ..isolate import TF32_ENV, child_env
from .plan import timing_cases, timing_field
from .execute import dtype_name
from .worker import WARM
from .results import Status, clip
from ..contracts import get_spec

LOG = logging.getLogger("gpuparity")
TRUST_UNPROBED = "GPUPARITY_TRUST_UNPROBED"


def _isolate(device: torch.device) -> bool:
    mode = os.environ.get("GPUPARITY_PROBE", "auto")
    if mode == "subprocess":
        return True
    if mode == "inprocess":
        return False
    return device.type == "cuda"


def auto_candidates(op: str) -> List[str]:
    """The backends of `op` that auto chooses from, and therefore verifies."""
    return [b.name for b in dispatch.backends(op) if b.probed and not b.fallback]


# ----------------------------------------------------------------------------- workers kept alive
REFINE = "GPUPARITY_PROBE_REFINE"   # "background" or "off"; default: background where checks run in workers


class _Workers(dict):
    """purpose -> (what it read at its start: _START_ENV, worker); clearing it ends the workers."""

    def clear(self) -> None:
        for _, pool in list(self.values()):
            pool._stop()   # kill, not close: a background check may be running and need not finish
        super().clear()


_POOLS: Dict[str, Tuple[str, WorkerPool]] = caches.register("checks.selection.workers", _Workers())
_POOLS_LOCK = threading.Lock()
_FOREGROUND = threading.Lock()   # one first-call verification at a time uses the foreground worker
_TURN = threading.Condition()    # callers of a first call waiting for that worker go before `prepare`'s queue
_CALLERS_WAITING = [0]
PREPARE_THREAD = "gpuparity-prepare"
_STOP = threading.Event()        # set at exit: the background stops between checks


# what a worker reads once, at its start: it is started again when the caller changed one since
_START_ENV = (TF32_ENV, "CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")


def _pool(purpose: str) -> WorkerPool:
    """The worker kept for `purpose` ("verify": first calls, "refine": the background), started
    again when this process changed its fp32 switches (the worker checks fp32 as the caller
    computes it, read at its start) or the devices it makes visible (a worker started at import,
    before a script set CUDA_VISIBLE_DEVICES, would check another GPU)."""
    env = child_env()
    started_with = "|".join(env.get(name, "") for name in _START_ENV)
    with _POOLS_LOCK:
        if _STOP.is_set():   # a background thread's check after the exit ended the workers: start none
            raise RuntimeError("gpuparity: the process is exiting; no checking worker is started")
        kept = _POOLS.get(purpose)
        if kept is not None and kept[0] != started_with:
            kept[1].close()
            kept = None
        if kept is None:
            kept = _POOLS[purpose] = (started_with, WorkerPool(_warm_env()))
        return kept[1]


def _warm_env() -> Optional[Dict[str, str]]:
    """The first-call and background workers set the GPU up before they say READY
    (GPUPARITY_WORKER_WARM=1, checks/worker.py) on a machine with a GPU, unless the caller set the
    switch: the first compiled steps wait for these workers' first verdicts (H100: the first 3
    compiled steps of the patched Llama 1.14x the unpatched model's with it and the opaque compiled
    kernels, 1.34x with neither; benchmarks/records/h100/first-steps-2026-12-06.md)."""
    if os.environ.get(WARM) is not None:
        return None
    try:
        return {WARM: "1"} if torch.cuda.is_available() else None
    except Exception:  # noqa: BLE001 - no device to ask: no warm-up
        return None


def prestart() -> None:
    """Start the first-call worker now where checks run in workers (a visible GPU, or
    GPUPARITY_PROBE=subprocess), so that its imports (torch, Triton, the backends: seconds)
    overlap the caller's own setup instead of the first call. It takes no GPU memory until a
    check arrives. `gpuparity.prepare()` calls this (ops/select.py prepare; `gpuparity.patch`
    through it), and `prepare` below once it queued work; never an import."""
    mode = os.environ.get("GPUPARITY_PROBE", "auto")
    if mode == "inprocess" or os.environ.get(TRUST_UNPROBED) == "1":
        return
    try:
        wanted = mode == "subprocess" or torch.cuda.is_available()
        if wanted:
            _pool("verify").start()
    except Exception as exc:  # noqa: BLE001 - the first call starts it then
        LOG.debug("gpuparity: the first-call worker did not start ahead: %s: %s", type(exc).__name__, exc)


def close_workers() -> None:
    """End the kept workers (the next first call starts one again)."""
    with _POOLS_LOCK:
        _POOLS.clear()


# Background threads of this module (the refinement, `prepare`'s), joined at exit. They are
# daemon threads: one still inside torch when the interpreter finalizes is stopped where it
# stands, and a stop inside C++ (pybind11 re-taking the GIL) aborts the whole process with
# "terminate called without an active exception" (exit -6). So the exit stops them first.
_THREADS: List[threading.Thread] = []
EXIT_JOIN_S = 5.0   # what the exit waits, in all, for them to end (each ends between its checks)


def _start_thread(target: Callable[..., None], name: str, *args: Any) -> threading.Thread:
    thread = threading.Thread(target=target, args=args, name=name, daemon=True)
    _THREADS[:] = [t for t in _THREADS if t.is_alive()] + [thread]
    thread.start()
    return thread


@atexit.register
def shutdown() -> None:
    """Stop the background refinement and `prepare`, end the kept workers (which ends the checks
    under way there), and wait up to EXIT_JOIN_S for the threads to end (registered at exit)."""
    _STOP.set()
    _REFINE_QUEUE.put(None)   # wakes a refinement waiting for work
    close_workers()
    deadline = time.monotonic() + EXIT_JOIN_S
    for thread in list(_THREADS):
        if thread is not threading.current_thread():
            thread.join(max(0.0, deadline - time.monotonic()))


class _UntilExit(Budget):
    """The background's budget: spent when the process exits (checks left are NOT_RUN)."""

    def remaining(self) -> float:
        return -1.0 if _STOP.is_set() else float("inf")


# ----------------------------------------------------------------------------- verdicts from results
def _complete(verdicts: Dict[str, Dict[str, Any]], results, op: str, vname: str, kind: str,
              backends: Sequence[str]) -> None:
    """A verdict for every backend at this call's kind, in place: where no case of exactly this
    kind ran, all of the backend's probe checks decide (or the reason none ran)."""
    for backend in backends:
        key = verdicts_store.VerdictKey(op, backend, vname, kind).encode()
        if key in verdicts:
            continue
        ran = [r for r in results if r.backend == backend and r.status != Status.SKIP]
        bad = [r for r in ran if r.status.bad]
        if ran:
            verdicts[key] = {"passed": not bad, "reason": (
                f"passed {len(ran)} probe check{'s' * (len(ran) != 1)}" if not bad
                else f"failed {len(bad)}/{len(ran)} probe check{'s' * (len(ran) != 1)}")}
        else:
            skipped = [r for r in results if r.backend == backend]
            verdicts[key] = {"passed": False, "reason": skipped[0].reason if skipped else "not probed"}


def _veto_known(verdicts: Dict[str, Dict[str, Any]], op: str, dtype: torch.dtype, device: torch.device,
                backends: Sequence[str]) -> None:
    # a confirmed known issue's remedy wins over a passing battery verdict; only the issues that
    # name one of `backends` are probed (known/avoid.py: the known-issue probes)
    from ..known import avoid
    avoid.apply(verdicts, avoid.confirmed_here(op, dtype, device, backends), device.type)


# ----------------------------------------------------------------------------- every backend, timed
def check_op(op: str, dtype: torch.dtype, kind: str, device,
             backends: Optional[Sequence[str]] = None, *, workers: Optional[int] = None,
             pool: Optional[WorkerPool] = None, budget: Optional[Budget] = None) -> Dict[str, Dict[str, Any]]:
    """Verdicts keyed as verdicts.verdict_key for every auto candidate of `op` at `dtype` (or
    those of `backends` among them): the op's quick cases and the default-level cases of `kind`,
    then a timing of each backend that passed. The background refinement runs this with one
    kept worker (`pool`, `workers=1`) and a budget that ends at exit."""
    device = normalize_device(device)
    spec = get_spec(op)
    candidates = [name for name in auto_candidates(op) if backends is None or name in backends]
    if not candidates:
        return {}

    def wanted(_op, case):
        return case.level == "quick" or (case.level == "default" and spec.kind(case.params) == kind)

    isolate = _isolate(device)
    run = dict(isolate=isolate, pool=pool, keep_pool=pool is not None, budget=budget)
    # level "full" so that every candidate is checked, including those the battery defers to --full
    tasks, decided = plan([op], "full", device, [dtype_name(dtype)], candidates, None, 0, wanted)
    results = decided + run_tasks(tasks, workers=workers, **run)
    verdicts = verdicts_from_results(results)
    dname = dtype_name(dtype)
    _complete(verdicts, results, op, verdicts_store.verdict_dtype(op, dtype, device), kind, candidates)
    _veto_known(verdicts, op, dtype, device, candidates)
    timing = spec.timing_params()
    if timing is not None:
        passed = sorted({verdicts_store.VerdictKey.decode(k).backend for k, v in verdicts.items() if v.get("passed")})
        time_tasks = [Task(len(passed) * j + i, op, name, case, params, dname, str(device), 0, mode="time")
                      for j, (case, params) in enumerate(timing_cases(op, str(device)))
                      for i, name in enumerate(passed)]
        for result in run_tasks(time_tasks, workers=1, **run):
            time_ms = result.params.get("time_ms") if result.status == Status.PASS else None
            for key, verdict in verdicts.items():
                if verdicts_store.VerdictKey.decode(key).backend == result.backend:
                    verdict[timing_field(result.case)] = time_ms
                    if time_ms is None:
                        verdict.update(passed=False, reason=f"timing run failed: {result.status.value} {clip(result.reason, 200)}")
    return verdicts


# ----------------------------------------------------------------------------- one candidate
FIRST_CALL_CASES = 3   # at least this many cases of the call's kind, where the op has them


def first_call_cases(op: str, kind: str) -> List[str]:
    """The cases a first call verifies its candidate on: the op's quick (hostile, small) cases of
    exactly this kind, topped up to FIRST_CALL_CASES with its default cases of the kind. For a
    kind no case has (a combination of features, e.g. key_padding+window+alibi), the op's quick
    cases and, for each feature of the kind, the first quick or default case that has it: every
    feature the call uses is exercised before the candidate serves it (the quick cases alone hold
    no ALiBi, so an ALiBi call was approved untested)."""
    spec = get_spec(op)
    cases = [c for c in spec.cases() if c.level in ("quick", "default")]
    kinds = {c.name: spec.kind(c.params) for c in cases}
    quick = [c.name for c in cases if c.level == "quick" and kinds[c.name] == kind]
    more = [c.name for c in cases if c.level == "default" and kinds[c.name] == kind]
    chosen = quick + more[:max(0, FIRST_CALL_CASES - len(quick))]
    if chosen:
        return chosen
    chosen = [c.name for c in cases if c.level == "quick"]
    by_level = sorted(cases, key=lambda c: c.level != "quick")   # quick ones first, then default
    for feature in kind.split("+"):
        if any(feature in kinds[name].split("+") for name in chosen):
            continue
        found = next((c.name for c in by_level if feature in kinds[c.name].split("+")), None)
        if found is not None:
            chosen.append(found)
    return chosen


def verify(op: str, dtype: torch.dtype, kind: str, device, backend: str) -> Dict[str, Dict[str, Any]]:
    """Verdicts for `backend` alone at this call's kind (and at any other kind its cases
    covered): `first_call_cases` against float64, and the known issues that name it. No timing."""
    device = normalize_device(device)
    names = set(first_call_cases(op, kind))
    # the named cases exactly (plan's `cases`): the same tasks as filtering the full level's cases
    # by name, without building the op's families first (attention's covering array of triples:
    # about 12 s of this process's time on the H100 host, 50 s on a loaded 2-core CPU)
    cases = [case for case in get_spec(op).cases() if case.name in names]
    tasks, decided = plan([op], "full", device, [dtype_name(dtype)], [backend], None, 0, cases={op: cases})
    own = getattr(_OWN_WORKER, "purpose", None)
    if _isolate(device) and own is not None:   # a `prepare` thread with a worker of its own: no turn to wait for
        results = decided + run_tasks(tasks, isolate=True, workers=1, pool=_pool(own), keep_pool=True)
    elif _isolate(device):
        with _worker_turn():
            results = decided + run_tasks(tasks, isolate=True, workers=1, pool=_pool("verify"), keep_pool=True)
    else:
        results = decided + run_tasks(tasks, isolate=False)
    verdicts = verdicts_from_results(results)
    _complete(verdicts, results, op, verdicts_store.verdict_dtype(op, dtype, device), kind, [backend])
    _veto_known(verdicts, op, dtype, device, [backend])
    return verdicts


class _worker_turn:
    """Hold the kept worker for one verification. A caller's first call goes first: the
    background `prepare` thread takes the worker only while no caller waits for it (at most
    the one verification it already started is waited for)."""

    def __enter__(self) -> None:
        background = threading.current_thread().name == PREPARE_THREAD
        with _TURN:
            if background:
                _TURN.wait_for(lambda: _CALLERS_WAITING[0] == 0)
            else:
                _CALLERS_WAITING[0] += 1
        try:
            _FOREGROUND.acquire()
        finally:
            if not background:
                with _TURN:
                    _CALLERS_WAITING[0] -= 1
                    _TURN.notify_all()

    def __exit__(self, *_exc) -> None:
        _FOREGROUND.release()


# ----------------------------------------------------------------------------- refinement
# The background waits this long after the last first-call verification before it starts: the
# first steps of a model meet several ops' first calls in a row, and the background's checks and
# Triton compiles would compete with them for the host and the GPU.
REFINE_QUIET_S = 10.0
_LAST_VERIFY = [0.0]   # monotonic time the last first-call verification ended
_REFINE_QUEUE: "queue.Queue[tuple]" = queue.Queue()
_REFINE_ASKED = caches.register("checks.selection.refine_asked", set())   # (op, dtype, kind, device) already queued
_REFINE_THREAD: Optional[threading.Thread] = None


def _refine_enabled(device: torch.device) -> bool:
    mode = os.environ.get(REFINE)
    if mode in ("background", "off"):
        return mode == "background"
    return _isolate(device)   # in-process on a CPU it would compete with the caller for its cores


def _refine_later(problem: Problem) -> None:
    """Time (and verify) every backend of this call's op and kind in a background worker; the
    verdicts are stored as they arrive, and the next call ranks by them (dispatch forgets its
    choices on every store)."""
    global _REFINE_THREAD
    job = (problem.op, problem.dtype, problem.kind, problem.device)
    with _POOLS_LOCK:
        if job in _REFINE_ASKED or _STOP.is_set():
            return
        _REFINE_ASKED.add(job)
        if _REFINE_THREAD is None:
            _REFINE_THREAD = _start_thread(_refine_loop, "gpuparity-refine")
    _REFINE_QUEUE.put(job)


def _refine_loop() -> None:
    while not _STOP.is_set():
        job = _REFINE_QUEUE.get()
        if job is None:   # the exit's wake-up
            return
        op, dtype, kind, device = job
        while not _STOP.is_set() and time.monotonic() - _LAST_VERIFY[0] < REFINE_QUIET_S:
            _STOP.wait(min(1.0, REFINE_QUIET_S))
        try:
            found = check_op(op, dtype, kind, device, workers=1, pool=_pool("refine"), budget=_UntilExit(1.0))
            if not _STOP.is_set() and found:
                # a check cut short by the exit is NOT_RUN and gives no verdict; timings left
                # unmeasured then are None, so nothing half-done is stored as measured
                verdicts_store.store_verdicts(device, found)
        except Exception as exc:  # noqa: BLE001 - a refinement that fails leaves the priors in charge
            LOG.debug("gpuparity: background timing of %s (%s) stopped: %s: %s", op, kind, type(exc).__name__, exc)


# ----------------------------------------------------------------------------- ahead of the first calls
# verdict key -> an event set once its verification ended (stored or not); emptying it
# (caches.clear_all) only lets a later caller check again: each verifier holds its own event
_IN_FLIGHT: Dict[str, threading.Event] = caches.register("checks.selection.in_flight", {})
_PREPARE_QUEUE: "queue.Queue[tuple]" = queue.Queue()
_PREPARE_ASKED = caches.register("checks.selection.prepare_asked", set())   # (problem, store) already queued
_PREPARE_RUNNING = [0]             # prepare threads alive (each ends when the queue is empty)
_PREPARE_SHARED = [0]              # 1 while the prepare thread on the shared first-call worker is alive
READY_POLL_S = 0.2                 # how often an own worker's thread, waiting for its start, looks at the queue
_PREPARE_SERIAL = itertools.count()   # names each own worker apart from those still running
_OWN_WORKER = threading.local()    # .purpose: the kept worker of this prepare thread's own, if it has one
# Workers of their own for `prepare` (GPUPARITY_PREPARE_WORKERS=N: N threads, each with its own
# worker, checking N of the queued calls at once, each worker ended when the queue is empty).
# Default on a GPU: one worker per 4 host cores, at most 4 (a fresh H100 spent 44 s of a patched
# Llama's first forward on five ops checked one after another, most of it Triton compiles, which
# are CPU-bound, one core each: benchmarks/records/h100/first-steps-2026-11-27.md); each own
# worker starts its own torch and holds its own CUDA context (some hundred MiB) until the queue
# is empty. On a CPU 0: one thread that shares the first-call worker, taking turns with the caller
# (own workers would compete with the caller for its cores).
PREPARE_WORKERS = "GPUPARITY_PREPARE_WORKERS"
MAX_DEFAULT_PREPARE_WORKERS = 4
# verdict keys `prepare` verified whose first call has not come yet: a guessed call (a kind the
# model may never use) must not start the background timing of every backend; its first call does
_PREPARED = caches.register("checks.selection.prepared", set())


def _verify_once(problem: Problem, backend: Backend, key: str, path: str) -> Dict[str, Any]:
    """The store after `backend` was verified for this call's kind: by this thread, or by the one
    already verifying it (the `prepare` thread ahead of a first call), whose verdict is waited
    for rather than checked twice."""
    while True:
        with _POOLS_LOCK:
            running = _IN_FLIGHT.get(key)
            if running is None:
                mine = _IN_FLIGHT[key] = threading.Event()
        if running is None:
            break
        running.wait()
        stored = verdicts_store.load(path)
        if key in stored:
            return stored
        # that verification stored nothing (it raised): check here
    try:
        found = verify(problem.op, problem.dtype, problem.kind, problem.device, backend.name)
        _LAST_VERIFY[0] = time.monotonic()
        if _in_prepare():
            if _STOP.is_set():   # the exit killed the worker under it: a crash of ours, not a verdict
                return verdicts_store.load(path)
            _PREPARED.add(key)   # its first call starts the background timing, not the guess
        verdicts_store.store_verdicts(problem.device, found)
    finally:
        with _POOLS_LOCK:
            if _IN_FLIGHT.get(key) is mine:
                del _IN_FLIGHT[key]
        mine.set()
    return verdicts_store.load(path)


def _in_prepare() -> bool:
    return threading.current_thread().name == PREPARE_THREAD


def prepare(problems: Sequence[Problem], resolve: Callable[[Problem], Any]) -> int:
    """Queue, for a background thread, the first-call verifications of `problems` (calls the
    caller expects soon: gpuparity.patch's model's ops at its dtype and device), so that the kept
    worker checks them while the caller sets up, and the first forward finds the verdicts stored
    or waits only for the rest. `resolve(problem)` is the caller's own backend="auto"
    resolution (ops/select.py), run as a first call runs it: candidates in rank order, the
    first that passes its checks wins, a confirmed known issue vetoes; so nothing but what a
    first call would verify is verified, and the contract is the first call's. Only where
    checks run in the kept worker (a GPU, or GPUPARITY_PROBE=subprocess): in-process checks
    would compete with the caller for its cores. Returns how many problems were queued; a
    problem queued before is not queued again."""
    if os.environ.get(TRUST_UNPROBED) == "1":
        return 0
    wanted = [p for p in problems if _isolate(normalize_device(p.device))]
    own = _prepare_workers(wanted)
    # each wanted op's backends registered here, in the caller's thread (a module that fails to import
    # fails the caller's patch, not a background thread; backends.load lets no one see a table half filled)
    for op in dict.fromkeys(p.op for p in wanted):
        dispatch.backends(op)
    queued = 0
    with _POOLS_LOCK:
        if _STOP.is_set():
            return 0
        for problem in wanted:
            asked = (problem, verdicts_store.cache_path(problem.device))
            if asked in _PREPARE_ASKED:
                continue
            _PREPARE_ASKED.add(asked)
            _PREPARE_QUEUE.put((problem, resolve))
            queued += 1
        if queued:
            # one thread on the shared first-call worker (started at import or at the first
            # patch(), so often ready by now), and `own` threads that each start a worker of their
            # own and take from the queue once it is ready: a check never waits for a start that
            # an idle, ready worker could have spared it
            if not _PREPARE_SHARED[0]:
                _PREPARE_SHARED[0] = 1
                _PREPARE_RUNNING[0] += 1
                _start_thread(_prepare_loop, PREPARE_THREAD, None)
            for _ in range(_PREPARE_RUNNING[0] - _PREPARE_SHARED[0], own):
                _PREPARE_RUNNING[0] += 1
                _start_thread(_prepare_loop, PREPARE_THREAD, f"prepare-{next(_PREPARE_SERIAL)}")
    if queued:
        prestart()
    return queued


def _prepare_workers(problems: Sequence[Problem] = ()) -> int:
    configured = os.environ.get(PREPARE_WORKERS, "").strip()
    if not configured:
        if not any(normalize_device(p.device).type == "cuda" for p in problems):
            return 0
        return max(0, min(MAX_DEFAULT_PREPARE_WORKERS, (os.cpu_count() or 1) // 4))
    if not configured.isdigit():
        raise ValueError(f"{PREPARE_WORKERS}: expected a number of workers (0: share the first-call worker), "
                         f"got {configured!r}")
    return int(configured)


def wait_prepared(timeout: Optional[float] = None) -> bool:
    """Block until what `prepare` queued was resolved (True), or `timeout` seconds passed (False)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    with _PREPARE_QUEUE.all_tasks_done:
        while _PREPARE_QUEUE.unfinished_tasks:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return False
            _PREPARE_QUEUE.all_tasks_done.wait(left)
    return True


def prepare_idle(timeout: Optional[float] = None) -> bool:
    """Block until no `prepare` thread is alive (True) or `timeout` passed (False): what a test
    waits for before the next one queues its own calls."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while _PREPARE_RUNNING[0]:
        if deadline is not None and time.monotonic() >= deadline:
            return False
        time.sleep(0.02)
    return True


def _prepare_loop(purpose: Optional[str]) -> None:
    _OWN_WORKER.purpose = purpose
    try:
        if purpose is not None:   # an own worker: take work only once it can start on it at once
            try:
                pool = None if _STOP.is_set() or _PREPARE_QUEUE.empty() else _pool(purpose)
                while pool is not None and not pool.wait_ready(READY_POLL_S):
                    if _STOP.is_set() or _PREPARE_QUEUE.empty():
                        break
            except Exception as exc:  # noqa: BLE001 - the check itself reports a worker that cannot start
                LOG.debug("gpuparity: a prepare worker did not start: %s: %s", type(exc).__name__, exc)
        while True:
            with _POOLS_LOCK:   # prepare() queues under this lock: a call queued now finds this thread alive
                try:
                    problem, resolve = _PREPARE_QUEUE.get_nowait()
                except queue.Empty:
                    _PREPARE_RUNNING[0] -= 1
                    if purpose is None:
                        _PREPARE_SHARED[0] = 0
                    return
            try:
                if not _STOP.is_set():
                    resolve(problem)
                    # the guessed problem's choice is not kept: the first call of each kind resolves
                    # its own (and so starts that kind's background timing: verdict_for)
                    dispatch.forget()
            except Exception as exc:  # noqa: BLE001 - the first call itself verifies then, and says why it fails
                LOG.debug("gpuparity: verifying %s (%s) ahead of its first call stopped: %s: %s",
                          problem.op, problem.kind, type(exc).__name__, exc)
            finally:
                _PREPARE_QUEUE.task_done()
    finally:
        if purpose is not None:   # its own worker ends with it (its CUDA context with it)
            with _POOLS_LOCK:
                kept = _POOLS.pop(purpose, None)
            if kept is not None:
                kept[1].close()


# ----------------------------------------------------------------------------- the verdict source
def verdict_for(problem: Problem, backend: Backend) -> Dict[str, Any]:
    """The stored verdict for (problem kind, backend), verifying this backend now if there is none
    (or waiting for the verification already under way: `prepare`)."""
    if os.environ.get(TRUST_UNPROBED) == "1":
        return {"passed": True, "reason": f"probe skipped ({TRUST_UNPROBED}=1)", "time_ms": None}
    path = verdicts_store.cache_path(problem.device)
    key = verdicts_store.verdict_key(problem, backend)
    stored = verdicts_store.load(path)
    first = key not in stored
    if first:
        stored = _verify_once(problem, backend, key, path)
    if not _in_prepare():
        if key in _PREPARED:   # verified ahead by `prepare`: this is its first call
            _PREPARED.discard(key)
            first = True
        if first and _refine_enabled(problem.device):
            _refine_later(problem)
    return stored.get(key, {"passed": False, "reason": "no probe verdict recorded"})


# verdict keys whose verification verdict_soon runs in a background thread now; and those whose
# background verification raised (their next call verifies in the caller, which then sees why)
_SOON: set = caches.register("checks.selection.soon", set())
_SOON_RAISED: set = caches.register("checks.selection.soon_raised", set())
SOON_THREAD = "gpuparity-first-call"


def verdict_soon(problem: Problem, backend: Backend) -> Optional[Dict[str, Any]]:
    """The verdict for (problem kind, backend) if it is stored; else None, once its verification
    was started in a background thread (as `verdict_for` makes it: a caller's turn on the kept
    worker, or the wait for `prepare`'s check already under way), so the caller need not wait.
    Only where checks run in a worker (a GPU, GPUPARITY_PROBE=subprocess): where they run in this
    process, the verdict checked now (`verdict_for`), as a thread would compete with the caller
    for its cores. A stored verdict is stored by the thread; the store empties dispatch's memo."""
    if os.environ.get(TRUST_UNPROBED) == "1" or not _isolate(normalize_device(problem.device)):
        return verdict_for(problem, backend)
    key = verdicts_store.verdict_key(problem, backend)
    if key in verdicts_store.load(verdicts_store.cache_path(problem.device)) or key in _SOON_RAISED:
        return verdict_for(problem, backend)
    with _POOLS_LOCK:
        if _STOP.is_set():
            return None
        if key not in _SOON:
            _SOON.add(key)
            _start_thread(_verify_soon, SOON_THREAD, problem, backend, key)
    return None


def _verify_soon(problem: Problem, backend: Backend, key: str) -> None:
    try:
        if not _STOP.is_set():
            verdict_for(problem, backend)
    except Exception as exc:  # noqa: BLE001 - the next call verifies in the caller and says why
        _SOON_RAISED.add(key)
        LOG.debug("gpuparity: verifying %s on %s in the background stopped: %s: %s", problem.op, backend.name,
                  type(exc).__name__, exc)
    finally:
        with _POOLS_LOCK:
            _SOON.discard(key)
        dispatch.forget()   # the calls served by the baseline meanwhile resolve again


def stored_verdict(problem: Problem, backend: Backend) -> Optional[Dict[str, Any]]:
    """The verdict stored here for (problem's op, dtype, kind; backend), None if none: no check."""
    return verdicts_store.load(verdicts_store.cache_path(problem.device)).get(verdicts_store.verdict_key(problem, backend))


class _Verification:
    """What the selector (ops/select.py) asks of verification, and all it asks
    (ops/select.Verification). Each method looks this module's function up when called, so a
    test that replaces one (verdict_for, verify, prepare, prestart) is seen."""

    def stored(self, problem: Problem, backend: Backend) -> Optional[Dict[str, Any]]:
        return stored_verdict(problem, backend)

    def verdict(self, problem: Problem, backend: Backend) -> Dict[str, Any]:
        return verdict_for(problem, backend)

    def verdict_soon(self, problem: Problem, backend: Backend) -> Optional[Dict[str, Any]]:
        return verdict_soon(problem, backend)

    def prepare(self, problems: Sequence[Problem], resolve: Callable[[Problem], Any]) -> int:
        return prepare(problems, resolve)

    def start(self) -> None:
        prestart()


VERIFICATION = _Verification()
