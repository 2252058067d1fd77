"""The battery's worker pool: runs planned tasks in crash-isolated worker processes (or
in-process), each under a per-check timeout, and stops early where running more would only
cost time: an implementation that keeps crashing or hanging, or a run whose budget is spent."""
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
from typing import Any, Callable, Dict, Iterable, List, Optional, Union

import torch

from ..contracts import get_spec
from ..isolate import Stopped, child_env, describe_exit, forget, kill_tree, spawn, stopping, tail
from .plan import Task, is_jit
from .results import CheckResult, Comparison, Status
from .worker import MARKER, READY

DEFAULT_TIMEOUT_S = {"cpu": 60.0, "cuda": 180.0}  # the first Triton call compiles its kernels
# A kernel that hangs costs the whole per-check timeout on every check, and one that segfaults
# restarts the worker for every check: after this many crashes or hangs in a row of the same
# implementation (or op and backend), the rest of its checks are NOT_RUN.
CRASH_LIMIT = 3


@dataclasses.dataclass
class Budget:
    """A whole run's wall-clock limit (--budget): checks that would start after it is spent,
    and a check still running when it runs out, are NOT_RUN with `reason`."""
    seconds: float
    started: float = dataclasses.field(default_factory=time.monotonic)

    def __post_init__(self):
        if not isinstance(self.seconds, (int, float)) or not self.seconds > 0:
            raise ValueError(f"budget: expected a positive number of seconds, got {self.seconds!r}")

    def remaining(self) -> float:
        return self.seconds - (time.monotonic() - self.started)

    @property
    def spent(self) -> bool:
        return self.remaining() <= 0

    @property
    def reason(self) -> str:
        return f"not run: the run's budget of {self.seconds:g} s (--budget) was spent"


def as_budget(value: Union[None, float, Budget]) -> Optional[Budget]:
    """None, a Budget, or seconds (a budget that starts now)."""
    if value is None or isinstance(value, Budget):
        return value
    return Budget(value)


class Breaker:
    """Counts crashes and hangs in a row per implementation (op and backend, or --impl); after
    `limit` of them its remaining checks are not run. Any other outcome resets the count."""

    def __init__(self, limit: int = CRASH_LIMIT):
        self.limit = limit
        self.streaks: Dict[tuple, int] = {}
        self.tripped: Dict[tuple, str] = {}

    @staticmethod
    def _key(task: Task) -> tuple:
        return (task.op, task.backend)

    def record(self, task: Task, status: Status) -> None:
        key = self._key(task)
        if status not in (Status.CRASH, Status.TIMEOUT):
            self.streaks[key] = 0
            return
        self.streaks[key] = self.streaks.get(key, 0) + 1
        if self.streaks[key] >= self.limit and key not in self.tripped:
            who = task.impl if task.impl else f"{task.backend} ({task.op})"
            self.tripped[key] = f"not run: {self.limit} consecutive crashes/hangs of {who}"

    def reason(self, task: Task) -> Optional[str]:
        return self.tripped.get(self._key(task))


class WorkerPool:
    """One worker subprocess at a time; restarted after a crash, a timeout or a sticky device
    error (checks/worker.py answer_task)."""

    def __init__(self, env: Optional[Dict[str, str]] = None, ops: Optional[Iterable[str]] = None):
        self.env = env
        # the ops whose backends the worker imports before its first task (None: every op's); a
        # task of another op imports its own when it arrives
        self.ops = None if ops is None else tuple(dict.fromkeys(ops))
        self.proc: Optional[subprocess.Popen] = None
        self.lines: "queue.Queue[Optional[str]]" = queue.Queue()
        self.stderr_file = None
        self.ready = threading.Event()   # set when the worker said READY, or ended
        self.ready_info: Dict[str, Any] = {}   # what the worker said it set up before READY (worker.py)

    def start(self) -> "WorkerPool":
        """Start the worker now (it imports torch while the caller does other work)."""
        if self.proc is None or self.proc.poll() is not None:
            self._stop()
            self._start()
        return self

    def _start(self) -> None:
        self.stderr_file = tempfile.TemporaryFile(mode="w+")
        self.lines = queue.Queue()
        self.ready = threading.Event()
        self.proc = spawn([sys.executable, "-m", "gpuparity.checks.worker", *(self.ops or ())], stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, stderr=self.stderr_file, text=True,
                          env=child_env(self.env), bufsize=1)
        self.ready_info = {}
        reader = threading.Thread(target=self._read, args=(self.proc, self.lines, self.ready, self.ready_info),
                                  daemon=True)
        reader.start()

    @staticmethod
    def _read(proc: subprocess.Popen, lines: "queue.Queue[Optional[str]]", ready: threading.Event,
              info: Optional[Dict[str, Any]] = None) -> None:
        for line in proc.stdout:
            if line.startswith(READY):
                if info is not None:
                    try:
                        info.update(json.loads(line[len(READY):].strip() or "{}"))
                    except ValueError:   # an older worker's bare READY, or noise: nothing to keep
                        pass
                ready.set()
                continue
            lines.put(line)
        ready.set()
        lines.put(None)  # EOF: the worker died or exited

    def wait_ready(self, timeout: Optional[float] = None) -> bool:
        """Start the worker if it is not running and wait until its imports are done (True), it
        ended (True: the next task restarts it), or `timeout` passed (False)."""
        self.start()
        return self.ready.wait(timeout)

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
            forget(self.proc)
        if self.stderr_file is not None:
            self.stderr_file.close()
        self.proc, self.stderr_file = None, None

    def run(self, task: Task, timeout: float) -> Dict[str, Any]:
        try:
            self.start()
        except Stopped as exc:
            return {"status": "NOT_RUN", "reason": f"not run: {exc}"}
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
                    if answer.get("sticky"):   # the worker exits (worker.answer_task): the next task starts a fresh one
                        self._retire()
                    return answer

    def _retire(self, wait_s: float = 10.0) -> None:
        """The worker said it ends (a sticky device error): let it exit, then forget it."""
        if self.proc is not None:
            try:
                self.proc.wait(timeout=wait_s)
            except subprocess.TimeoutExpired:
                pass
        self._stop()

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self._stop()


def _run_in_process(task: Task) -> Dict[str, Any]:
    from .worker import answer_task
    return answer_task(dataclasses.asdict(task), in_process=True)


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


def _queue_first(op: str) -> bool:
    try:
        return get_spec(op).queue_first
    except ValueError:   # an op without a contract (a planted task): no precedence
        return False


def queue_order(task: Task) -> tuple:
    """Longest first, so that no long check starts last: tasks of backends that compile on
    first use (Triton) lead, timing warm-ups first among them, their compiles overlapping
    everything else; then the ops whose contract says queue_first (attention: the largest
    references), then by dtype (fp32 kernels compile slowest); plan order breaks ties."""
    return (not is_jit(task), task.mode != "warm", not _queue_first(task.op), _DTYPE_ORDER.get(task.dtype, 3),
            task.id)


def _run_one(task: Task, pool: Optional[WorkerPool], timeout: Optional[float], budget: Optional[Budget],
             cut: Optional[str]) -> CheckResult:
    """One task's result; `cut`: why it is not run at all."""
    if cut is None and budget is not None and budget.spent:
        cut = budget.reason
    if cut is not None:
        return task.result(Status.NOT_RUN, cut)
    limit = timeout or DEFAULT_TIMEOUT_S[torch.device(task.device).type]
    # a check still running when the budget runs out is stopped there: not run, not a hang
    by_budget = pool is not None and budget is not None and budget.remaining() < limit
    if by_budget:
        limit = max(budget.remaining(), 0.01)
    started = time.monotonic()
    answer = pool.run(task, limit) if pool else _run_in_process(task)
    duration = time.monotonic() - started
    if by_budget and answer["status"] == Status.TIMEOUT.value:
        return task.result(Status.NOT_RUN, f"{budget.reason} (stopped after {duration:.1f} s)", duration_s=duration)
    result = _to_result(task, answer, duration)
    if "time_ms" in answer:
        result.params = {**result.params, "time_ms": answer["time_ms"]}
    return result


def run_tasks(tasks: Iterable[Task], *, isolate: bool = True, timeout: Optional[float] = None,
              env: Optional[Dict[str, str]] = None,
              on_result: Optional[Callable[[CheckResult], None]] = None,
              workers: Optional[int] = None, pool: Optional[WorkerPool] = None,
              budget: Union[None, float, Budget] = None, crash_limit: Optional[int] = CRASH_LIMIT,
              keep_pool: bool = False) -> List[CheckResult]:
    """Run tasks in crash-isolated workers (or in-process); results in task order. `pool`: an
    already started worker to use when workers == 1 (ignored otherwise), e.g. one that imported
    torch meanwhile; it is closed when the tasks are done, unless `keep_pool` (the first-call
    probe keeps its worker alive across calls: checks/selection.py). Tasks of mode "warm" run but are
    not passed to `on_result`. After `crash_limit` crashes or hangs in a row of one
    implementation (None: never) its remaining tasks are NOT_RUN, and so is every task left
    when `budget` (seconds from now, or a Budget) is spent."""
    tasks = list(tasks)
    if not tasks:
        return []
    budget = as_budget(budget)
    breaker = Breaker(crash_limit) if crash_limit else None
    if workers is None:
        workers = default_workers(torch.device(tasks[0].device).type)
    workers = max(1, min(workers, len(tasks))) if isolate else 1
    if workers > 1 and "OMP_NUM_THREADS" not in os.environ:
        # Each worker's torch would start one CPU thread per core: N workers on N cores with N
        # threads each spin against each other and against Triton's compiles (seen on a 16-core
        # H100 machine: checks several times slower). Share the cores instead.
        env = {**(env or {}), "OMP_NUM_THREADS": str(max(1, _cores() // workers))}
    pending: "queue.Queue[Task]" = queue.Queue()
    for task in sorted(tasks, key=queue_order):
        pending.put(task)
    done: Dict[int, CheckResult] = {}
    lock = threading.Lock()
    ops = [task.op for task in tasks]   # what a worker started here imports ahead

    given = pool

    def drain() -> None:
        pool = (given if given is not None and workers == 1 else WorkerPool(env, ops=ops)) if isolate else None
        try:
            while True:
                try:
                    task = pending.get_nowait()
                except queue.Empty:
                    return
                with lock:
                    cut = breaker.reason(task) if breaker else None
                result = _run_one(task, pool, timeout, budget, cut)
                with lock:
                    if stopping():
                        return  # interrupted: what it killed is not a result of the check
                    if breaker and cut is None:
                        breaker.record(task, result.status)
                    done[task.id] = result
                    if on_result and task.mode != "warm":
                        on_result(result)
        finally:
            if pool and not (keep_pool and pool is given):
                pool.close()

    if workers == 1:
        drain()
    else:
        threads = [threading.Thread(target=drain, daemon=True) for _ in range(workers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    if stopping():
        raise Stopped("interrupted: the checks left were not run")
    return [done[task.id] for task in tasks]
