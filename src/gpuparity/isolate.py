"""Run a function in a fresh Python process, so that a segfault, abort, illegal memory access,
HSA error or hang becomes a result (CRASH / TIMEOUT with the last lines of stderr) instead of
the end of the caller.

`call_isolated("pkg.module:function", kwargs, timeout)`: kwargs and the return value travel
as JSON. The child prints its answer on one marked line of stdout, so anything else the
function or its libraries print does not get in the way.
"""
from __future__ import annotations

import atexit
import dataclasses
import json
import os
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
        return Outcome("timeout", error=f"no answer within {timeout:g} s (hang?)", stderr_tail=tail(stderr),
                       duration_s=time.monotonic() - start)
    forget(proc)
    duration = time.monotonic() - start
    answer = None
    for line in stdout.splitlines():
        if line.startswith(MARKER):
            answer = json.loads(line[len(MARKER):])
    if answer is None:
        return Outcome("crash", error=f"the process {describe_exit(proc.returncode)} before answering",
                       stderr_tail=tail(stderr), returncode=proc.returncode, duration_s=duration)
    if answer.get("error"):
        return Outcome("error", error=answer["error"], stderr_tail=tail(stderr), returncode=proc.returncode,
                       duration_s=duration)
    return Outcome("ok", value=answer.get("value"), stderr_tail=tail(stderr), returncode=proc.returncode,
                   duration_s=duration)


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


def _child_main(target: str) -> int:
    die_with_parent()
    kwargs = json.loads(sys.stdin.read() or "{}")
    try:
        value = targets.load(target)(**kwargs)
        line = json.dumps({"value": value})
    except Exception as exc:  # noqa: BLE001 - the parent wants the error as data
        line = json.dumps({"error": f"{type(exc).__name__}: {exc}",
                           "traceback": traceback.format_exc(limit=8)})
    sys.stdout.write("\n" + MARKER + line + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(_child_main(sys.argv[1]))
