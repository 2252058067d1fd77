"""The battery's worker process: reads tasks as JSON lines on stdin, answers each on one
marked line of stdout. The parent (pool.py) restarts it after a crash or a hang."""
from __future__ import annotations

import json
import sys
import time
import traceback
from typing import Any, Callable, Dict, Optional

MARKER = "GPUPARITY-TASK "
READY = "GPUPARITY-READY"   # one line once the imports are done (then a JSON of what was set up): tasks now


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
    import os
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
        try:
            answer = handle(task)
        except Exception as exc:  # noqa: BLE001 - anything else is an ERROR of this task
            answer = {"id": task.get("id"), "status": "ERROR",
                      "reason": f"the check itself raised {type(exc).__name__}: {exc}",
                      "traceback": traceback.format_exc(limit=6), "comparisons": []}
        sys.stdout.write(MARKER + json.dumps(answer) + "\n")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
