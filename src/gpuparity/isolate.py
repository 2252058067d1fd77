# long file: the two ways to run a call in a process of its own (a fresh interpreter; a child forked from a zygote that imported torch once) share the answer protocol, the Outcome and the children's lifetime (stop_children, die_with_parent), which must stay one place
"""Run a function in a fresh Python process, so that a segfault, abort, illegal memory access,
HSA error or hang becomes a result (CRASH / TIMEOUT with the last lines of stderr) instead of
the end of the caller.

`call_isolated("pkg.module:function", kwargs, timeout)`: kwargs and the return value travel
as JSON. The child prints its answer on one marked line of stdout, so anything else the
function or its libraries print does not get in the way. `ForkServer(preload=[...]).call(...)`
gives the same Outcomes from children forked off one process that imported torch once (a
trivial call: milliseconds instead of seconds).
"""
from __future__ import annotations

import atexit
import dataclasses
import importlib
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import traceback
from typing import Any, Dict, Optional, Set

from . import targets

MARKER = "GPUPARITY-RESULT "
STDERR_TAIL_LINES = 20


@dataclasses.dataclass
class Outcome:
    status: str                 # "ok" | "error" | "crash" | "timeout"
    value: Any = None
    error: str = ""
    stderr_tail: str = ""
    returncode: Optional[int] = None
    duration_s: float = 0.0
    # How the call ran: "spawn" (a fresh interpreter), "fork" (a child of a ForkServer), or
    # "spawn (fork server ...: why)" when a ForkServer could not take the call.
    runner: str = "spawn"

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def tail(text: str, lines: int = STDERR_TAIL_LINES) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def describe_exit(returncode: Optional[int]) -> str:
    if returncode is None:
        return "no exit status"
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"killed by {name}"
    return f"exited with status {returncode}"


TF32_ENV = "GPUPARITY_FP32_SWITCHES"


def fp32_switches() -> str:
    """This process's fp32 numerics switches (may matmuls and cuDNN use TF32) as one string: what
    a child process must apply to compute as this one does."""
    from .numerics import cudnn_tf32, matmul_tf32
    return f"matmul_tf32={int(matmul_tf32())},cudnn_tf32={int(cudnn_tf32())}"


def apply_fp32_switches(text: Optional[str]) -> None:
    """Set what fp32_switches() described (in a child process); unknown parts are ignored."""
    if not text:
        return
    import torch
    values = dict(part.split("=", 1) for part in text.split(",") if "=" in part)
    if "matmul_tf32" in values:
        torch.backends.cuda.matmul.allow_tf32 = values["matmul_tf32"] == "1"
    if "cudnn_tf32" in values:
        torch.backends.cudnn.allow_tf32 = values["cudnn_tf32"] == "1"


def child_env(extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    env = dict(os.environ)
    # Checks run in child processes must see fp32 as the caller does: a script that turned TF32
    # on gets its fp32 backends verified with TF32 on.
    env.setdefault(TF32_ENV, fp32_switches())
    env.setdefault("PYTHONUNBUFFERED", "1")
    # A crash should be quick and quiet, not a core dump.
    env.setdefault("PYTHONFAULTHANDLER", "1")
    env[PARENT_ENV] = str(os.getpid())   # die_with_parent() in the child watches this process
    if extra:
        env.update(extra)
    return env


# ------------------------------------------------------------------ children end with the parent
# Every child process (battery workers, isolated calls) is registered here while it lives. When
# the run is interrupted (SIGTERM from SLURM's time limit, SIGINT) the command line calls
# stop_children(): they are killed at once and no new one starts. A parent killed without a
# chance to clean up (SIGKILL) is noticed by the children themselves (die_with_parent).

_CHILDREN: Set[subprocess.Popen] = set()
# reentrant: stop_children() runs in a signal handler, which may interrupt this thread inside spawn()
_CHILDREN_LOCK = threading.RLock()
_STOPPING = threading.Event()
PARENT_ENV = "GPUPARITY_PARENT_PID"


class Stopped(RuntimeError):
    """A child process was asked for after stop_children(): the run is being interrupted."""


def spawn(argv, **popen_args) -> subprocess.Popen:
    """Popen a child in a session of its own (a crash or a hang is killed with its whole group),
    registered so that stop_children() can end it."""
    with _CHILDREN_LOCK:
        if _STOPPING.is_set():
            raise Stopped("interrupted: no new child process")
        proc = subprocess.Popen(argv, start_new_session=True, **popen_args)
        proc.gpuparity_owner = os.getpid()   # see kill_tree
        _CHILDREN.add(proc)
    return proc


def forget(proc: subprocess.Popen) -> None:
    with _CHILDREN_LOCK:
        _CHILDREN.discard(proc)


def stopping() -> bool:
    """Whether stop_children() was called: results that arrive now are the interruption's, not the checks'."""
    return _STOPPING.is_set()


def stop_children() -> None:
    """Kill every live child process group now, and start no new one in this process."""
    with _CHILDREN_LOCK:
        _STOPPING.set()
        children = list(_CHILDREN)
    for proc in children:
        kill_tree(proc)


def allow_children() -> None:
    """After an interruption was handled (the command returned): children may start again (a
    process that runs several commands, e.g. tests calling cli.main)."""
    _STOPPING.clear()


def _kill_children_at_exit() -> None:
    with _CHILDREN_LOCK:
        children = list(_CHILDREN)
    for proc in children:
        if proc.poll() is None:
            kill_tree(proc)


atexit.register(_kill_children_at_exit)


def die_with_parent() -> None:
    """In a child: end when the parent that started it ends, however it ends. Linux's
    PR_SET_PDEATHSIG has the kernel send SIGKILL; a watchdog thread that sees the parent change
    (reparented: the parent is gone) covers other systems and a parent that died before this ran."""
    expected = os.environ.get(PARENT_ENV)
    parent = int(expected) if expected and expected.isdigit() else os.getppid()
    if sys.platform.startswith("linux"):
        try:
            import ctypes
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, signal.SIGKILL, 0, 0, 0)   # PR_SET_PDEATHSIG = 1
        except (OSError, AttributeError):
            pass

    def end() -> None:
        try:
            if os.getpgrp() == os.getpid():   # started by spawn(): the group is this child and what it started
                os.killpg(os.getpgrp(), signal.SIGKILL)
        finally:
            os._exit(1)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        end()
    if os.getppid() != parent:
        end()
    threading.Thread(target=watch, daemon=True, name="gpuparity-die-with-parent").start()


def call_isolated(target: str, kwargs: Optional[Dict[str, Any]] = None, timeout: float = 60.0,
                  env: Optional[Dict[str, str]] = None) -> Outcome:
    start = time.monotonic()
    try:
        proc = spawn([sys.executable, "-m", "gpuparity.isolate", target],
                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                     text=True, env=child_env(env))
    except Stopped as exc:
        return Outcome("error", error=str(exc))
    try:
        stdout, stderr = proc.communicate(json.dumps(kwargs or {}), timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_tree(proc)
        stdout, stderr = proc.communicate()
        forget(proc)
        return _timeout_outcome(timeout, stderr, time.monotonic() - start)
    forget(proc)
    return _outcome(stdout.splitlines(), stderr, proc.returncode, time.monotonic() - start)


def _timeout_outcome(timeout: float, stderr: str, duration: float, runner: str = "spawn") -> Outcome:
    return Outcome("timeout", error=f"no answer within {timeout:g} s (hang?)", stderr_tail=tail(stderr),
                   duration_s=duration, runner=runner)


def _outcome(stdout_lines, stderr: str, returncode: Optional[int], duration: float,
             runner: str = "spawn") -> Outcome:
    """The Outcome of a child that ended: its answer is the last MARKER line of its stdout."""
    answer = None
    for line in stdout_lines:
        if line.startswith(MARKER):
            answer = json.loads(line[len(MARKER):])
    if answer is None:
        return Outcome("crash", error=f"the process {describe_exit(returncode)} before answering",
                       stderr_tail=tail(stderr), returncode=returncode, duration_s=duration, runner=runner)
    if answer.get("error"):
        return Outcome("error", error=answer["error"], stderr_tail=tail(stderr), returncode=returncode,
                       duration_s=duration, runner=runner)
    return Outcome("ok", value=answer.get("value"), stderr_tail=tail(stderr), returncode=returncode,
                   duration_s=duration, runner=runner)


def kill_tree(proc: subprocess.Popen) -> None:
    """Kill proc's process group, if this process started it: a fork of the starting process
    (e.g. a user's os.fork() child that exits through atexit) inherits the Popen objects and must
    not kill its parent's workers (the parent's next check would read that as a crash)."""
    if getattr(proc, "gpuparity_owner", os.getpid()) != os.getpid():
        return
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError, OSError):
        try:
            proc.kill()
        except OSError:
            pass
    # a ForkServer's zygote: its children live in sessions of their own (see ForkServer)
    for group in list(getattr(proc, "gpuparity_groups", ())):
        try:
            os.killpg(group, signal.SIGKILL)
        except (ProcessLookupError, PermissionError, OSError):
            pass


def _answer_line(target: str, kwargs: Dict[str, Any]) -> str:
    """Run the target; the MARKER line that carries its value or its error."""
    try:
        value = targets.load(target)(**kwargs)
        line = json.dumps({"value": value})
    except Exception as exc:  # noqa: BLE001 - the parent wants the error as data
        line = json.dumps({"error": f"{type(exc).__name__}: {exc}",
                           "traceback": traceback.format_exc(limit=8)})
    return "\n" + MARKER + line + "\n"


def _child_main(target: str) -> int:
    die_with_parent()
    kwargs = json.loads(sys.stdin.read() or "{}")
    sys.stdout.write(_answer_line(target, kwargs))
    sys.stdout.flush()
    return 0


# ------------------------------------------------------------------ fork server
# Most of a short isolated call is starting Python and importing torch (about 4 s on an H100 host).
# A ForkServer pays that once: its "zygote" process imports torch and the caller's preload modules
# without touching CUDA/HIP, then forks one child per call. Each child is as isolated as a spawned
# one (its own session, its own CUDA context, torch's import-time flags, its crash or hang its own)
# and answers the same way (the MARKER line). What a fork cannot give a child is a fresh reading of
# what the zygote read at start: environment variables read while importing torch (e.g.
# TORCH_ALLOW_TF32_CUBLAS_OVERRIDE), so a call whose environment differs there from the zygote's
# runs spawned instead (START_ENV_PREFIXES), as does every call where fork cannot be used.

ZYGOTE_FLAG = "--zygote"
ZYGOTE_STARTUP_S = 300.0      # importing torch on a loaded machine
ZYGOTE_GRACE_S = 30.0         # beyond a call's own timeout, before the zygote counts as stuck
STDERR_KEEP_BYTES = 64 * 1024
# Variables that torch, CUDA/HIP, Triton or the interpreter may read at import: a call that
# changes one of them cannot be forked from a zygote that imported with the old value.
START_ENV_PREFIXES = ("TORCH", "PYTORCH", "CUDA", "CUBLAS", "CUDNN", "NVIDIA", "HIP", "HSA", "ROCM", "ROCBLAS",
                      "HIPBLASLT", "MIOPEN", "NCCL", "RCCL", "TRITON", "OMP_", "MKL_", "KMP_", "GOMP", "OPENBLAS",
                      "LD_", "PYTHON")
_LIBCUDA = re.compile(r"/libcuda\.so")


def fork_available() -> bool:
    """Whether this system can fork (POSIX) a child that keeps the parent's imports."""
    return os.name == "posix" and hasattr(os, "fork") and hasattr(os, "setsid")


def gpu_runtime_started() -> str:
    """In the zygote: why forking now would hand children a CUDA runtime they cannot use ("" when
    it is safe). A forked child cannot use CUDA once its parent called the driver's cuInit (torch's
    lazy init does; so does cudaGetDeviceCount, e.g. torch.cuda.is_available() without NVML). The
    driver library merely being loaded is harmless: torch 2.11's CUDA build loads libcuda.so at
    import (the H100 test machine), so the driver itself is asked, without initialising it
    (`_driver_initialised`)."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return "torch.cuda is initialised in the fork server"
    state = _driver_initialised(_loaded_libcuda())
    if state is None:
        return "the CUDA driver library (libcuda.so) is loaded in the fork server and could not be asked whether it is initialised"
    if state:
        return "the CUDA driver is initialised (cuInit) in the fork server"
    return ""


def _loaded_libcuda() -> Optional[str]:
    """The path of the CUDA driver library this process has mapped, else None."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as handle:
            for line in handle:
                if _LIBCUDA.search(line):
                    return line.split(None, 5)[-1].strip()
    except OSError:
        pass
    return None


CUDA_ERROR_NOT_INITIALIZED = 3


def _driver_initialised(path: Optional[str]) -> Optional[bool]:
    """Whether the loaded CUDA driver library at `path` has been initialised: False when none is
    loaded or cuDeviceGetCount answers CUDA_ERROR_NOT_INITIALIZED (a call that initialises
    nothing), True when it answers anything else, None when it cannot be asked. RTLD_NOLOAD: the
    library already mapped is opened, never a new one."""
    if path is None:
        return False
    try:
        import ctypes
        lib = ctypes.CDLL(path, mode=getattr(os, "RTLD_NOLOAD", 0) | getattr(os, "RTLD_LAZY", 1))
        count = ctypes.c_int(0)
        return int(lib.cuDeviceGetCount(ctypes.byref(count))) != CUDA_ERROR_NOT_INITIALIZED
    except (OSError, AttributeError):
        return None


def _write_all(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data):]


def _read_text(path: str, keep: int) -> str:
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - keep))
            return handle.read().decode("utf-8", "replace")
    except OSError:
        return ""


def _marker_lines(path: str) -> list:
    try:
        with open(path, "rb") as handle:
            return [line.decode("utf-8", "replace").rstrip("\n") for line in handle
                    if line.startswith(MARKER.encode())]
    except OSError:
        return []


def _zygote_main(preload) -> int:
    """The fork server's loop (`python -m gpuparity.isolate --zygote MODULE...`): one JSON request a
    line on stdin, one JSON message a line on stdout (started / done / refused). Single-threaded."""
    import selectors
    import tempfile
    requests_fd, answers_fd = os.dup(0), os.dup(1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.dup2(2, 1)            # a stray print of a preload module must not break the answers
    parent = int(os.environ.get(PARENT_ENV, "0") or 0) or os.getppid()

    def send(message: Dict[str, Any]) -> None:
        _write_all(answers_fd, (json.dumps(message) + "\n").encode())

    # torch.cuda.is_available() through NVML, should a preload module ask: no CUDA driver in here
    os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"
    try:
        import torch  # noqa: F401 - the point of the zygote
        for name in preload:
            importlib.import_module(name)
    except BaseException as exc:  # noqa: BLE001 - told to the client, which falls back
        send({"ready": False, "error": f"preloading failed: {type(exc).__name__}: {exc}"})
        return 1
    workdir = tempfile.mkdtemp(prefix="gpuparity-fork-")
    send({"ready": True, "pid": os.getpid(), "workdir": workdir,
          "native_threads": len(os.listdir("/proc/self/task")) if os.path.isdir("/proc/self/task") else None})
    running: Dict[int, Dict[str, Any]] = {}     # pid -> the request, its files, its deadline
    selector = selectors.DefaultSelector()
    selector.register(requests_fd, selectors.EVENT_READ)
    buffer, open_input = b"", True

    def finish(pid: int, status: int, timed_out: bool) -> None:
        job = running.pop(pid)
        send({"id": job["id"], "done": True, "pid": pid, "timed_out": timed_out,
              "returncode": None if timed_out else os.waitstatus_to_exitcode(status),
              "answer": _marker_lines(job["out"]), "stderr": _read_text(job["err"], STDERR_KEEP_BYTES),
              "duration_s": time.monotonic() - job["start"]})
        for path in (job["out"], job["err"]):
            try:
                os.unlink(path)
            except OSError:
                pass

    def end_all() -> int:
        for pid in list(running):
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                pass
        shutil.rmtree(workdir, ignore_errors=True)
        return 0

    while open_input or running:
        if os.getppid() != parent:
            return end_all()
        wait = 0.01 if running else 0.5
        for _ in selector.select(timeout=wait):
            chunk = os.read(requests_fd, 1 << 16)
            if not chunk:
                open_input = False
                selector.unregister(requests_fd)
                return end_all()        # the client closed: nobody waits for these children
            buffer += chunk
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            request = json.loads(line)
            refusal = gpu_runtime_started()
            if not refusal and threading.active_count() != 1:
                refusal = f"the fork server runs {threading.active_count()} Python threads, not 1"
            if refusal:
                send({"id": request["id"], "refused": refusal})
                continue
            base = os.path.join(workdir, str(request["id"]))
            job = {"id": request["id"], "out": base + ".out", "err": base + ".err", "start": time.monotonic(),
                   "deadline": time.monotonic() + float(request["timeout"])}
            for stream in (sys.stdout, sys.stderr):
                stream.flush()
            pid = os.fork()
            if pid == 0:
                _forked_child(request, job, (requests_fd, answers_fd), os.getppid())   # never returns
            running[pid] = job
            send({"id": request["id"], "started": True, "pid": pid})
        now = time.monotonic()
        for pid, job in list(running.items()):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                finish(pid, status, False)
            elif now > job["deadline"]:
                try:
                    os.killpg(pid, signal.SIGKILL)   # the child, and what it started
                except OSError:
                    os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                finish(pid, 0, True)
    return end_all()


def _forked_child(request: Dict[str, Any], job: Dict[str, Any], close_fds, zygote: int) -> None:
    """In a child of the zygote: a session of its own, stdout/stderr to the job's files, the
    caller's environment, then the target; the zygote's loop is never returned to."""
    code = 1
    try:
        os.setsid()
        for fd in close_fds:
            os.close(fd)
        for fd, path in ((1, job["out"]), (2, job["err"])):
            handle = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.dup2(handle, fd)
            os.close(handle)
        os.environ.clear()
        os.environ.update(request["env"])
        os.environ[PARENT_ENV] = str(zygote)       # die with the zygote
        try:
            os.chdir(request["cwd"])
        except OSError:
            pass
        die_with_parent()
        sys.stdout.write(_answer_line(request["target"], request["kwargs"]))
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
        if exc.code is not None and not isinstance(exc.code, int):
            sys.stderr.write(f"{exc.code}\n")
    except BaseException:  # noqa: BLE001 - as an uncaught exception ends a spawned child
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)   # not the zygote's loop, nor anyone's atexit handlers


class _Pending:
    def __init__(self) -> None:
        self.event = threading.Event()
        self.message: Optional[Dict[str, Any]] = None


class ForkServer:
    """Isolated calls forked from one process that imported torch and `preload` once.

    `with ForkServer(preload=["pkg.mod"]) as server: server.call("pkg.mod:fn", kwargs, timeout)`
    gives the Outcome call_isolated would give (ok / error / crash / timeout, the stderr tail),
    with Outcome.runner "fork". Thread-safe: calls from several threads run side by side. Where a
    call cannot be forked (no fork on this system, the zygote failed to start, died, refused because
    CUDA is initialised in it, or the call changes an import-time variable) it runs through
    call_isolated and Outcome.runner says why. The zygote is a child of spawn(): stop_children()
    ends it and its children (each in a session of its own, listed on the zygote's Popen)."""

    def __init__(self, preload=(), *, startup_timeout: float = ZYGOTE_STARTUP_S) -> None:
        if isinstance(preload, str):
            raise TypeError(f"preload: expected a list of module names, got the string {preload!r}")
        self.preload = list(preload)
        self.startup_timeout = float(startup_timeout)
        self._proc: Optional[subprocess.Popen] = None
        self._lock = threading.Lock()
        self._pending: Dict[int, _Pending] = {}
        self._ids = itertools.count(1)
        self._ready = threading.Event()
        self._broken = ""                      # why calls go to call_isolated; "" while usable
        self._start_env: Dict[str, str] = {}
        self._stderr_path = ""
        self.info: Dict[str, Any] = {}         # the zygote's ready message

    @property
    def broken(self) -> str:
        return self._broken

    def start(self) -> "ForkServer":
        """Start the zygote (returns at once; the first call waits until it is ready)."""
        if self._proc is not None or self._broken:
            return self
        if not fork_available():
            self._broken = "os.fork is not available on this system"
            return self
        import tempfile
        handle, self._stderr_path = tempfile.mkstemp(prefix="gpuparity-zygote-", suffix=".err")
        self._start_env = child_env()
        try:
            with os.fdopen(handle, "wb") as stderr:
                self._proc = spawn([sys.executable, "-m", "gpuparity.isolate", ZYGOTE_FLAG, *self.preload],
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr,
                                   env=self._start_env)
        except (Stopped, OSError) as exc:
            self._broken = f"could not start: {exc}"
            return self
        self._proc.gpuparity_groups = set()
        threading.Thread(target=self._read, daemon=True, name="gpuparity-fork-server").start()
        return self

    def __enter__(self) -> "ForkServer":
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.close()

    def close(self) -> None:
        """End the zygote (its running children with it) and remove its files."""
        proc = self._proc
        if proc is None:
            return
        with self._lock:
            self._broken = self._broken or "closed"
        try:
            proc.stdin.close()        # the zygote kills its children and exits
        except OSError:
            pass
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            kill_tree(proc)
            proc.wait()
        kill_tree(proc)               # children whose groups are still listed
        forget(proc)
        try:
            os.unlink(self._stderr_path)
        except OSError:
            pass
        if self.info.get("workdir"):
            shutil.rmtree(self.info["workdir"], ignore_errors=True)

    # ---------------------------------------------------------------- the reader thread
    def _read(self) -> None:
        proc = self._proc
        for raw in proc.stdout:
            try:
                message = json.loads(raw)
            except ValueError:
                continue
            if "ready" in message:
                if message["ready"]:
                    self.info = message
                else:
                    self._fail(message.get("error", "the zygote did not start"))
                self._ready.set()
                continue
            if message.get("started"):
                proc.gpuparity_groups.add(message["pid"])
                continue
            if message.get("done"):
                proc.gpuparity_groups.discard(message["pid"])
            with self._lock:
                pending = self._pending.pop(message.get("id"), None)
            if pending is not None:
                pending.message = message
                pending.event.set()
        proc.wait()
        said = tail(_read_text(self._stderr_path, 4096), 3) if self._stderr_path else ""
        self._fail(f"the zygote {describe_exit(proc.returncode)}" + (f": {said}" if said else ""))
        self._ready.set()

    def _fail(self, why: str) -> None:
        with self._lock:
            self._broken = self._broken or why
            waiting, self._pending = list(self._pending.values()), {}
        for pending in waiting:
            pending.event.set()

    # ---------------------------------------------------------------- calls
    def call(self, target: str, kwargs: Optional[Dict[str, Any]] = None, timeout: float = 60.0,
             env: Optional[Dict[str, str]] = None) -> Outcome:
        """call_isolated(target, kwargs, timeout, env), forked from the zygote where it can be."""
        if stopping():
            return Outcome("error", error="interrupted: no new child process")
        if self._proc is None and not self._broken:
            self.start()
        if not self._broken and not self._ready.wait(self.startup_timeout):
            self._fail(f"the zygote was not ready within {self.startup_timeout:g} s")
            kill_tree(self._proc)
        full_env = child_env(env)
        changed = sorted(name for name in set(full_env) | set(self._start_env)
                         if name != PARENT_ENV and full_env.get(name) != self._start_env.get(name)
                         and name.upper().startswith(START_ENV_PREFIXES))
        if self._broken or changed:
            why = self._broken or f"the call changes {', '.join(changed)}, read at import"
            return self._spawned(target, kwargs, timeout, env, f"fork server unavailable: {why}")
        pending = _Pending()
        request = {"target": target, "kwargs": kwargs or {}, "timeout": float(timeout), "env": full_env,
                   "cwd": os.getcwd()}
        with self._lock:
            if self._broken:
                return self._spawned(target, kwargs, timeout, env, f"fork server unavailable: {self._broken}")
            request["id"] = next(self._ids)
            self._pending[request["id"]] = pending
            try:
                self._proc.stdin.write((json.dumps(request) + "\n").encode())
                self._proc.stdin.flush()
            except (OSError, ValueError) as exc:
                self._pending.pop(request["id"], None)
                self._broken = self._broken or f"the zygote stopped reading ({exc})"
        if not pending.event.is_set() and not self._broken and \
                not pending.event.wait(float(timeout) + ZYGOTE_GRACE_S):
            self._fail(f"the zygote gave no word within {float(timeout) + ZYGOTE_GRACE_S:g} s of a "
                       f"{float(timeout):g} s call")
            kill_tree(self._proc)
        message = pending.message
        if message is None or "refused" in message:
            if message is not None:
                self._fail(message["refused"])
            if stopping():
                return Outcome("error", error="interrupted: no new child process")
            return self._spawned(target, kwargs, timeout, env, f"fork server unavailable: {self._broken}")
        if message["timed_out"]:
            return _timeout_outcome(timeout, message["stderr"], message["duration_s"], runner="fork")
        return _outcome(message["answer"], message["stderr"], message["returncode"], message["duration_s"],
                        runner="fork")

    @staticmethod
    def _spawned(target, kwargs, timeout, env, why: str) -> Outcome:
        outcome = call_isolated(target, kwargs, timeout, env)
        outcome.runner = f"spawn ({why})"
        return outcome


if __name__ == "__main__":
    if sys.argv[1:2] == [ZYGOTE_FLAG]:
        sys.exit(_zygote_main(sys.argv[2:]))
    sys.exit(_child_main(sys.argv[1]))
