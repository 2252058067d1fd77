"""The battery's worker process: reads tasks as JSON lines on stdin, answers each on one
marked line of stdout. The parent (pool.py) restarts it after a crash or a hang, and after a
sticky device error, after which the worker exits (`answer_task`)."""
from __future__ import annotations

import json
import os
import re
import sys
import time
import traceback
from typing import Any, Callable, Dict, Optional

MARKER = "GPUPARITY-TASK "
READY = "GPUPARITY-READY"   # one line once the imports are done (then a JSON of what was set up): tasks now

# A GPU error after which the process's GPU context is unusable: CUDA's "sticky" errors (a kernel
# that faulted: every later call in the process raises the same error, whatever it does) and
# HIP's likewise. torch raises them as torch.AcceleratorError (a RuntimeError; older torch: a
# RuntimeError), Triton's launcher as a RuntimeError "Triton Error [CUDA]: ...". Not sticky:
# out of memory, invalid configuration or device function (the launch is refused, nothing ran).
STICKY_PHRASES = ("misaligned address", "an illegal memory access", "illegal address", "illegal instruction",
                  "unspecified launch failure", "device-side assert", "hardware stack error",
                  "invalid program counter", "uncorrectable ecc error", "launch timed out")
DEVICE_WORDS = ("cuda", "hip", "triton error")
STICKY_TYPES = ("AcceleratorError", "RuntimeError")
# what a sticky error's reason says (the shrinker reads it: src/gpuparity/checks/shrink.py)
STICKY_NOTE = "sticky device error: this process's GPU context is unusable after it"
STICKY_EXIT = 3   # the worker's exit status after reporting a sticky device error
_RAISED = re.compile(r"raised ([\w.]+): (.*)", re.S)


def sticky_device_error(kind: str, message: str) -> bool:
    """Whether an exception of type name `kind` (torch.AcceleratorError, RuntimeError) with
    `message` is a sticky device error (STICKY_PHRASES, on a CUDA/HIP/Triton error)."""
    text = message.lower()
    return (kind.rpartition(".")[2] in STICKY_TYPES and any(word in text for word in DEVICE_WORDS)
            and any(phrase in text for phrase in STICKY_PHRASES))


def _sticky_reason(reason: str) -> bool:
    """An ERROR's reason ("... raised <Type>: <message> ...", src/gpuparity/checks/execute.py)
    names a sticky device error."""
    raised = _RAISED.search(reason or "")
    return bool(raised) and sticky_device_error(*raised.groups())


def _context_broken(device) -> bool:
    """After an ERROR on a GPU: a small launch and a synchronisation raise (the context is
    unusable, whatever the error's message said)."""
    import torch
    try:
        torch.zeros(1, device=device).add_(1)
        torch.cuda.synchronize(device)
    except Exception:  # noqa: BLE001 - any error here: the context is gone
        return True
    return False


def answer_task(task: Dict[str, Any], in_process: bool = False) -> Dict[str, Any]:
    """One task's answer (`handle`; anything it raises is an ERROR of the task). On a GPU the
    check's work is waited for at its end, so that an error it launched asynchronously is its
    own, not the next check's. A sticky device error (`sticky_device_error`, or a context that
    no longer runs a kernel) gets answer["sticky"] and STICKY_NOTE in its reason: the worker
    exits after reporting it (`main`) and the pool starts a fresh one (src/gpuparity/checks/pool.py)."""
    try:
        answer = handle(task)
    except Exception as exc:  # noqa: BLE001 - anything else is an ERROR of this task
        answer = {"id": task.get("id"), "status": "ERROR",
                  "reason": f"the check itself raised {type(exc).__name__}: {exc}",
                  "traceback": traceback.format_exc(limit=6), "comparisons": []}
    device = str(task.get("device", "cpu"))
    if not device.startswith("cuda"):
        if answer.get("status") == "ERROR" and _sticky_reason(answer.get("reason", "")):
            _mark_sticky(answer, in_process)
        return answer
    import torch
    try:
        torch.cuda.synchronize(device)
    except Exception as exc:  # noqa: BLE001 - an error this check's kernels launched: its own
        if answer.get("status") != "ERROR":
            answer.update(status="ERROR", comparisons=[],
                          reason=f"the check's GPU work raised {type(exc).__name__}: {exc} (at the synchronisation "
                                 "after it)")
    if answer.get("status") == "ERROR" and (_sticky_reason(answer.get("reason", "")) or _context_broken(device)):
        _mark_sticky(answer, in_process)
    return answer


def _mark_sticky(answer: Dict[str, Any], in_process: bool) -> None:
    after = ("in-process (not isolated): later checks in this process may fail the same way" if in_process else
             "the worker was replaced: the checks after it run in a fresh process")
    answer.update(sticky=True, reason=f"{answer.get('reason', '')} [{STICKY_NOTE}; {after}]")


def handle(task: Dict[str, Any]) -> Dict[str, Any]:
    import torch

    from ..dispatch import get as get_backend
    from .execute import ImplError, dtype_from_name, resolve_fn, run_case, time_case
    from .plan import LARGE_TIMING_CASE

    started = time.monotonic()
    answer: Dict[str, Any] = {"id": task["id"]}
    device = torch.device(task["device"])
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dtype = dtype_from_name(task["dtype"])
    try:
        fn = resolve_fn(task["op"], task["backend"], task.get("impl"))
    except ImplError as exc:
        answer.update(status="ERROR", reason=str(exc), comparisons=[])
        return answer
    if task.get("set_aside"):   # a rerun that tells a known torch fault from the implementation's own
        from ..known.sidestep import without_sdpa
        fn = without_sdpa(fn, task["set_aside"])
    if task.get("mode") in ("time", "warm"):
        repeats = 0 if task["mode"] == "warm" else 10
        answer.update(status="PASS", time_ms=time_case(task["op"], fn, task["params"], dtype, device, repeats,
                                                       device_time=task.get("case") == LARGE_TIMING_CASE))
        return answer
    baseline = get_backend(task["op"], "composition").fn
    if task["params"].get("relation"):   # an equivalence relation: two calls of fn, no float64 referee
        from .relations import run_case as run_relation
        run_case = run_relation
    status, comparisons, reason = run_case(task["op"], fn, task["params"], dtype, device, task["seed"],
                                           baseline_fn=baseline, repro=task.get("repro"))
    answer.update(status=status.value, reason=reason, comparisons=[c.to_dict() for c in comparisons],
                  duration_s=time.monotonic() - started)
    return answer


def _preimport_autograd_helpers() -> None:
    """What the first backward of a check would import: torch's autograd reaches
    torch.fx.experimental.symbolic_shapes, and with it sympy, on its first call. On the lent H100
    machine that import took 3.8 s of the first check's 5.0 s (profiled; sympy there has no
    bytecode cached, so every process compiles it): imported here, it is part of the worker's
    start, which overlaps the caller's own setup, not of the first call's wait."""
    try:
        import torch.fx.experimental.symbolic_shapes  # noqa: F401
    except Exception:  # noqa: BLE001 - an older torch: the first backward imports what it needs
        pass


# GPUPARITY_WORKER_WARM: "1" (or a device such as "cuda:1"): before it says READY, the worker
# also sets up the GPU its checks will use (`warm_device`), while a thread imports what the
# first check imports (`_preimport_autograd_helpers`, the check modules), so that a first check
# pays for neither. A worker so started holds its CUDA context (some hundred MiB) from its start,
# not from its first check. Unset, a worker does not warm up, except the first-call and background
# workers on a machine with a GPU, which checks/selection.py starts with "1" (set "0" to keep them cold).
WARM = "GPUPARITY_WORKER_WARM"


def warm_target(value: Optional[str]) -> Optional[str]:
    """The device `GPUPARITY_WORKER_WARM=value` asks to set up: None (off: unset, "", "0"),
    "cuda" for "1" (the current GPU), else the device named; ValueError for anything else."""
    if value is None or value.strip() in ("", "0"):
        return None
    value = value.strip()
    if value == "1":
        return "cuda"
    if not (value == "cuda" or value.startswith("cuda:")):
        raise ValueError(f"{WARM}: expected 0, 1 or a CUDA device such as 'cuda:0', got {value!r}")
    return value


def warm_device(name: str) -> Dict[str, float]:
    """Set up `name` (a CUDA device) as a first check would: the CUDA context and the caching
    allocator, a small Triton launch (Triton's driver, its launcher, the cache lookups), cuBLAS
    (float64 and bfloat16 matmuls: the reference and the kernels' dtype) and autograd's device
    thread (a backward). Seconds per part; a part that fails is skipped (the check then pays it)."""
    import torch
    spent: Dict[str, float] = {}
    device = torch.device(name)
    if device.type != "cuda" or not torch.cuda.is_available():
        return spent

    def part(what: str, fn: Callable[[], Any]) -> None:
        started = time.monotonic()
        try:
            fn()
            torch.cuda.synchronize(device)
        except Exception:  # noqa: BLE001 - a warm-up that fails leaves the work to the first check
            pass
        spent[what] = time.monotonic() - started

    def context():
        if device.index is not None:
            torch.cuda.set_device(device)
        torch.zeros(1, device=device)

    def triton_kernel():   # a small launch of one of the kernels (SwiGLU's: one short kernel)
        from ..dispatch import get as get_backend
        x = torch.ones(4, 64, device=device, dtype=torch.bfloat16)
        get_backend("swiglu", "triton").fn(x, x)

    def matmuls():
        for dtype in (torch.float64, torch.bfloat16, torch.float32):
            a = torch.ones(16, 16, device=device, dtype=dtype)
            a @ a

    def backward():
        x = torch.ones(16, device=device, requires_grad=True)
        (x * 2).sum().backward()

    for what, fn in (("context", context), ("triton", triton_kernel), ("cublas", matmuls), ("autograd", backward)):
        part(what, fn)
    return spent


_FIRST_CHECK_MODULES = ("torch.fx.experimental.symbolic_shapes", "gpuparity.checks.execute", "gpuparity.checks.plan",
                        "gpuparity.checks.relations")


def _preimport_for_checks() -> None:
    _preimport_autograd_helpers()
    from . import execute, plan, relations  # noqa: F401 - what a first check imports


def main() -> int:
    # Import torch and the backend modules (Triton's among them) of the ops named on the command
    # line (every op's when none is) before the first task arrives: a worker started ahead of its
    # tasks (the doctor's timing worker) is ready then. A task of another op imports its own.
    started = time.monotonic()
    import threading

    from ..backends import load
    from ..isolate import TF32_ENV, apply_fp32_switches, die_with_parent
    die_with_parent()   # a worker does not outlive the run that started it
    apply_fp32_switches(os.environ.get(TF32_ENV))  # fp32 as the parent computes it
    warm = warm_target(os.environ.get(WARM))
    load(sys.argv[1:] or None)
    spent: Dict[str, float] = {}
    if warm is None:
        _preimport_autograd_helpers()
    else:
        # the first check's imports (GIL-bound: sympy compiles its sources where it has no
        # bytecode) beside the device's set-up (mostly in the driver, without the GIL)
        importing = threading.Thread(target=_preimport_for_checks, name="gpuparity-worker-imports", daemon=True)
        importing.start()
        spent = warm_device(warm)
        importing.join()
    # what was set up before this line: the parent keeps it (pool.WorkerPool.ready_info)
    info = {"seconds": round(time.monotonic() - started, 3), "warm": warm, "spent": spent,
            "imported": sorted(m for m in _FIRST_CHECK_MODULES if m in sys.modules)}
    sys.stdout.write(READY + " " + json.dumps(info) + "\n")
    sys.stdout.flush()
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        task = json.loads(line)
        answer = answer_task(task)
        sys.stdout.write(MARKER + json.dumps(answer) + "\n")
        sys.stdout.flush()
        if answer.get("sticky"):
            # every later task here would fail the same way: end without the interpreter's
            # teardown (freeing memory on a broken context can hang), the pool starts a fresh worker
            sys.stderr.flush()
            os._exit(STICKY_EXIT)
    return 0


if __name__ == "__main__":
    sys.exit(main())
