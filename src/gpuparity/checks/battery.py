"""The battery: every case of every op on every backend, each in a crash-isolated worker
process with a timeout; results stream to disk as they arrive.

`run_battery(...)` is the one entry point (doctor, check, fleet and the probes use it).
"""
from __future__ import annotations

import dataclasses
import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence

import torch

from .. import dispatch
from .execute import dtype_from_name, dtype_name, task_seed
from .isolate import child_env, describe_exit, kill_tree, tail
from .results import CheckResult, Comparison, ResultStream, Status
from .specs import LEVELS, OPS, get_spec
from .verdicts import verdict_dtype
from .worker import MARKER

DEFAULT_TIMEOUT_S = {"cpu": 60.0, "cuda": 180.0}  # the first Triton call compiles its kernels
# Rough cost of one check, for the up-front estimate of --full.
# The up-front estimate: on a 16-core H100 machine the default level's 663 checks took 40 s in
# all on a fresh machine (Triton compiling every kernel), 25 s with its cache warm; on a 2-core
# CPU its 342 checks took 11-36 s (36 s with another job on the cores).
SECONDS_PER_CHECK = {"cpu": 0.1, "cuda": 0.05}
WORKER_START_S = {"cpu": 2.0, "cuda": 6.0}


@dataclasses.dataclass
class Task:
    id: int
    op: str
    backend: str
    case: str
    params: Dict[str, Any]
    dtype: str
    device: str
    seed: int
    impl: Optional[str] = None
    mode: str = "check"
    base_seed: Optional[int] = None  # the run's --seed, from which `seed` is derived
    level: Optional[str] = None

    def result(self, status: Status, reason: str = "", **extra) -> CheckResult:
        return CheckResult(op=self.op, backend=self.backend, case=self.case, dtype=self.dtype, device=self.device,
                           status=status, seed=self.seed, reason=reason, params=self.params,
                           base_seed=self.base_seed, level=self.level, **extra)


@dataclasses.dataclass
class BatteryRun:
    results: List[CheckResult]
    level: str
    device: str
    seed: int
    duration_s: float
    stream_path: Optional[str] = None

    @property
    def ok(self) -> bool:
        return not any(r.status.bad for r in self.results)


def normalize_device(device) -> torch.device:
    try:
        device = torch.device(device) if device is not None else torch.device("cpu")
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"device: expected 'cpu', 'cuda' or 'cuda:N', got {device!r}") from exc
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", 0)
    return device


def validate_device(device: torch.device) -> None:
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"device: expected 'cpu' or 'cuda[:N]', got {str(device)!r}")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device: {device} was asked for, but torch sees no CUDA or ROCm GPU "
                             f"(torch {torch.__version__}); use --device cpu")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ValueError(f"device: {device} was asked for, but only {torch.cuda.device_count()} GPU(s) are visible")


def plan(ops: Optional[Sequence[str]] = None, level: str = "default", device="cpu",
         dtypes: Optional[Sequence[str]] = None, backends: Optional[Sequence[str]] = None,
         impl: Optional[str] = None, seed: int = 0, case_filter: Optional[Callable] = None):
    """(tasks to run, results already decided: SKIP with a reason)."""
    if level not in LEVELS:
        raise ValueError(f"level: expected one of {list(LEVELS)}, got {level!r}")
    device = normalize_device(device)
    ops = list(ops or OPS)
    if backends and not impl:
        check_backend_names(ops, backends)
    tasks: List[Task] = []
    decided: List[CheckResult] = []
    next_id = 0
    for op in ops:
        spec = get_spec(op)
        op_dtypes = spec.dtypes(device, level)
        if dtypes:
            wanted = [dtype_name(d) if isinstance(d, torch.dtype) else d for d in dtypes]
            from .execute import dtype_from_name
            op_dtypes = [dtype_from_name(d) for d in wanted]
        if impl:
            candidates = [(f"impl:{impl}", None)]
        else:
            available = dispatch.backends(op)
            if backends:
                available = [b for b in available if b.name in backends]
            candidates = [(b.name, b) for b in available]
        for case in spec.cases():
            if not case.at(level) or (case_filter and not case_filter(op, case)):
                continue
            for dtype in op_dtypes:
                if case.params.get("half_at_full") and dtype != torch.float32 and level != "full":
                    continue
                if (level == "default" and dtype == torch.float16 and torch.bfloat16 in op_dtypes
                        and case.level != "quick"):
                    # fp16 runs the kernels bf16 runs, in a second dtype: at the default level it
                    # gets the quick (hostile) cases, bf16 every case; --full runs fp16 on all.
                    continue
                seed_here = task_seed(seed, op, case.name, dtype_name(dtype))
                for name, backend in candidates:
                    task = Task(next_id, op, name, case.name, case.params, dtype_name(dtype), str(device),
                                seed_here, impl=impl, base_seed=seed, level=level)
                    next_id += 1
                    if backend is not None and LEVELS.index(backend.battery_level) > LEVELS.index(level):
                        decided.append(task.result(Status.SKIP, f"{name}: compiles per shape, so the battery "
                                                                f"checks it at --{backend.battery_level} (probed on first use)"))
                        continue
                    if backend is not None:
                        reasons = backend.reasons(spec.problem(case.params, dtype, device))
                        if reasons:
                            decided.append(task.result(Status.SKIP, "; ".join(reasons)))
                            continue
                    tasks.append(task)
    return tasks, decided


def check_backend_names(ops: Sequence[str], backends: Sequence[str]) -> None:
    """A backend name that none of `ops` has is a typo, not a filter that matches nothing."""
    have = sorted({b.name for op in ops for b in dispatch.backends(op)})
    unknown = [b for b in backends if b not in have]
    if unknown:
        raise ValueError(f"backends: got {', '.join(unknown)}, which no selected op ({', '.join(ops)}) has; "
                         f"expected names from {', '.join(have)}")


def estimate_seconds(n_tasks: int, device) -> float:
    kind = normalize_device(device).type
    return WORKER_START_S[kind] + n_tasks * SECONDS_PER_CHECK[kind]


class WorkerPool:
    """One worker subprocess at a time; restarted after a crash or a timeout."""

    def __init__(self, env: Optional[Dict[str, str]] = None):
        self.env = env
        self.proc: Optional[subprocess.Popen] = None
        self.lines: "queue.Queue[Optional[str]]" = queue.Queue()
        self.stderr_file = None

    def start(self) -> "WorkerPool":
        """Start the worker now (it imports torch while the caller does other work)."""
        if self.proc is None or self.proc.poll() is not None:
            self._stop()
            self._start()
        return self

    def _start(self) -> None:
        self.stderr_file = tempfile.TemporaryFile(mode="w+")
        self.lines = queue.Queue()
        self.proc = subprocess.Popen([sys.executable, "-m", "gpuparity.checks.worker"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.stderr_file, text=True,
                                     env=child_env(self.env), start_new_session=True, bufsize=1)
        reader = threading.Thread(target=self._read, args=(self.proc, self.lines), daemon=True)
        reader.start()

    @staticmethod
    def _read(proc: subprocess.Popen, lines: "queue.Queue[Optional[str]]") -> None:
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)  # EOF: the worker died or exited

    def _stderr_tail(self) -> str:
        if self.stderr_file is None:
            return ""
        self.stderr_file.flush()
        self.stderr_file.seek(0)
        return tail(self.stderr_file.read())

    def _stop(self) -> None:
        if self.proc is not None:
            kill_tree(self.proc)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        if self.stderr_file is not None:
            self.stderr_file.close()
        self.proc, self.stderr_file = None, None

    def run(self, task: Task, timeout: float) -> Dict[str, Any]:
        self.start()
        deadline = time.monotonic() + timeout
        try:
            self.proc.stdin.write(json.dumps(dataclasses.asdict(task)) + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            pass  # the reader will see EOF
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                stderr = self._stderr_tail()
                self._stop()
                return {"status": "TIMEOUT", "reason": f"no answer within {timeout:g} s (hang?)", "stderr_tail": stderr}
            try:
                line = self.lines.get(timeout=remaining)
            except queue.Empty:
                continue
            if line is None:
                self.proc.wait(timeout=10)
                code = self.proc.returncode
                stderr = self._stderr_tail()
                self._stop()
                return {"status": "CRASH", "reason": f"the worker {describe_exit(code)} during this check",
                        "stderr_tail": stderr}
            if line.startswith(MARKER):
                answer = json.loads(line[len(MARKER):])
                if answer.get("id") == task.id:
                    return answer

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self._stop()


def _run_in_process(task: Task) -> Dict[str, Any]:
    from .worker import handle
    try:
        return handle(dataclasses.asdict(task))
    except Exception as exc:  # noqa: BLE001
        return {"status": "ERROR", "reason": f"the check itself raised {type(exc).__name__}: {exc}"}


def _to_result(task: Task, answer: Dict[str, Any], duration: float) -> CheckResult:
    comparisons = [Comparison(**c) for c in answer.get("comparisons", [])]
    return task.result(Status(answer["status"]), answer.get("reason", ""), comparisons=comparisons,
                       duration_s=duration, stderr_tail=answer.get("stderr_tail", ""))


def default_workers(device_type: str) -> int:
    """Worker processes run side by side on a GPU machine: the first run of a Triton backend
    is dominated by CPU-bound JIT compiles (seconds per specialization). GPUPARITY_WORKERS
    overrides; the CPU uses one (its cores are the compute)."""
    configured = os.environ.get("GPUPARITY_WORKERS")
    if configured:
        return max(1, int(configured))
    if device_type != "cuda":
        return 1
    workers = min(16, _cores())
    try:  # each worker holds a GPU context (a few hundred MiB): leave room on small GPUs
        workers = min(workers, max(1, torch.cuda.get_device_properties(0).total_memory // (2 << 30)))
    except Exception:  # noqa: BLE001 - no device to ask: the core count decides
        pass
    return max(1, workers)


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))  # what SLURM's --cpus-per-task leaves us
    except (AttributeError, OSError):
        return os.cpu_count() or 2


_DTYPE_ORDER = {"float32": 0, "bfloat16": 1, "float16": 2}


def _is_jit(task: Task) -> bool:
    if task.impl:
        return False
    try:
        return dispatch.get(task.op, task.backend).jit
    except ValueError:
        return False


def _queue_order(task: Task) -> tuple:
    """Longest first, so that no long check starts last: tasks of backends that compile on
    first use (Triton) lead, timing warm-ups first among them, their compiles overlapping
    everything else; then attention (the largest references), then by dtype (fp32 kernels
    compile slowest); plan order breaks ties."""
    return (not _is_jit(task), task.mode != "warm", task.op != "attention", _DTYPE_ORDER.get(task.dtype, 3),
            task.id)


def timing_tasks(keys: Iterable[tuple], device: str, mode: str = "time", first_id: int = 0,
                 only: Optional[Callable[[Task], bool]] = None) -> List[Task]:
    """One task per (op, backend, dtype) worth timing on the op's timing case: mode "time"
    measures it; mode "warm" only runs it once (compiling what the timing will need).
    Timings only rank candidates, so fallback compositions (never ranked) are left out, and
    so is an (op, dtype) with a single candidate left (nothing to rank). `only` filters the
    tasks after that."""
    candidates: Dict[tuple, List[str]] = {}
    for op, backend, dtype in sorted(set(keys)):
        if get_spec(op).timing_params() is not None and not dispatch.get(op, backend).fallback:
            candidates.setdefault((op, dtype), []).append(backend)
    tasks = []
    for (op, dtype), backends in candidates.items():
        if len(backends) < 2:
            continue
        for backend in backends:
            task = Task(first_id + len(tasks), op, backend, "timing", get_spec(op).timing_params(), dtype, device, 0,
                        mode=mode)
            if only is None or only(task):
                tasks.append(task)
    return tasks


def run_tasks(tasks: Iterable[Task], *, isolate: bool = True, timeout: Optional[float] = None,
              env: Optional[Dict[str, str]] = None,
              on_result: Optional[Callable[[CheckResult], None]] = None,
              workers: Optional[int] = None, pool: Optional["WorkerPool"] = None) -> List[CheckResult]:
    """Run tasks in crash-isolated workers (or in-process); results in task order. `pool`: an
    already started worker to use when workers == 1 (ignored otherwise), e.g. one that imported
    torch meanwhile; it is closed when the tasks are done. Tasks of mode "warm" run but are
    not passed to `on_result`."""
    tasks = list(tasks)
    if not tasks:
        return []
    if workers is None:
        workers = default_workers(torch.device(tasks[0].device).type)
    workers = max(1, min(workers, len(tasks))) if isolate else 1
    if workers > 1 and "OMP_NUM_THREADS" not in os.environ:
        # Each worker's torch would start one CPU thread per core: N workers on N cores with N
        # threads each spin against each other and against Triton's compiles (seen on a 16-core
        # H100 machine: checks several times slower). Share the cores instead.
        env = {**(env or {}), "OMP_NUM_THREADS": str(max(1, _cores() // workers))}
    pending: "queue.Queue[Task]" = queue.Queue()
    for task in sorted(tasks, key=_queue_order):
        pending.put(task)
    done: Dict[int, CheckResult] = {}
    lock = threading.Lock()

    given = pool

    def drain() -> None:
        pool = (given if given is not None and workers == 1 else WorkerPool(env)) if isolate else None
        try:
            while True:
                try:
                    task = pending.get_nowait()
                except queue.Empty:
                    return
                limit = timeout or DEFAULT_TIMEOUT_S[torch.device(task.device).type]
                started = time.monotonic()
                answer = pool.run(task, limit) if pool else _run_in_process(task)
                result = _to_result(task, answer, time.monotonic() - started)
                if "time_ms" in answer:
                    result.params = {**result.params, "time_ms": answer["time_ms"]}
                with lock:
                    done[task.id] = result
                    if on_result and task.mode != "warm":
                        on_result(result)
        finally:
            if pool:
                pool.close()

    if workers == 1:
        drain()
    else:
        threads = [threading.Thread(target=drain, daemon=True) for _ in range(workers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    return [done[task.id] for task in tasks]


def run_battery(ops: Optional[Sequence[str]] = None, level: str = "default", device="cpu",
                dtypes: Optional[Sequence[str]] = None, backends: Optional[Sequence[str]] = None,
                impl: Optional[str] = None, seed: int = 0, stream_path: Optional[str] = None,
                progress: Optional[Callable[[int, int, CheckResult], None]] = None,
                timeout: Optional[float] = None, isolate: bool = True,
                case_filter: Optional[Callable] = None, env: Optional[Dict[str, str]] = None,
                warm_timings: bool = False) -> BatteryRun:
    """Run the battery; returns every result (SKIPs included) in the order they finished.
    warm_timings: also run each compiling backend's timing case once, alongside the checks,
    so that the timings that follow (doctor) find their kernels compiled."""
    device = normalize_device(device)
    validate_device(device)
    started = time.monotonic()
    tasks, decided = plan(ops, level, device, dtypes, backends, impl, seed, case_filter)
    total = len(tasks) + len(decided)  # what progress counts: warm-ups report nothing
    if warm_timings:
        keys = [(t.op, t.backend, t.dtype) for t in tasks if not t.impl]
        tasks = tasks + timing_tasks(keys, str(device), mode="warm", first_id=len(tasks) + len(decided), only=_is_jit)
    done = 0
    results: List[CheckResult] = []
    with ResultStream(stream_path) as stream:
        def record(result: CheckResult) -> None:
            nonlocal done
            done += 1
            stream.write(result)
            results.append(result)
            if progress:
                progress(done, total, result)
        for result in decided:
            record(result)
        run_tasks(tasks, isolate=isolate, timeout=timeout, env=env, on_result=record)
    return BatteryRun(results, level, str(device), seed, time.monotonic() - started, stream_path)


def verdicts_from_results(results: Iterable[CheckResult]) -> Dict[str, Dict[str, Any]]:
    """Probe-cache verdicts ("op|backend|dtype|kind") from battery results: a backend passes a
    kind when every case of that kind passed (SKIPs aside) and at least one ran."""
    groups: Dict[str, List[CheckResult]] = {}
    for result in results:
        if result.backend.startswith("impl:"):
            continue
        spec = get_spec(result.op)
        # the checks ran with this process's fp32 switches (child_env carries them to workers)
        dtype = verdict_dtype(result.op, dtype_from_name(result.dtype), torch.device(result.device))
        key = f"{result.op}|{result.backend}|{dtype}|{spec.kind(result.params)}"
        groups.setdefault(key, []).append(result)
    verdicts = {}
    for key, members in groups.items():
        ran = [r for r in members if r.status != Status.SKIP]
        if not ran:
            continue
        bad = [r for r in ran if r.status.bad]
        verdicts[key] = {
            "passed": not bad,
            "checks": len(ran),
            "failed": len(bad),
            "reason": (f"passed {len(ran)} checks" if not bad else
                       f"failed {len(bad)}/{len(ran)} checks, e.g. {bad[0].case}: {bad[0].status.value} {bad[0].reason[:200]}"),
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
