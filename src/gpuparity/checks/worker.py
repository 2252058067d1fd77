"""The battery's worker process: reads tasks as JSON lines on stdin, answers each on one
marked line of stdout. The parent (pool.py) restarts it after a crash or a hang."""
from __future__ import annotations

import json
import sys
import time
import traceback
from typing import Any, Dict

MARKER = "GPUPARITY-TASK "
READY = "GPUPARITY-READY"   # one line once the imports are done: the worker takes tasks now


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


def main() -> int:
    # Import torch and the backend modules (Triton's among them) of the ops named on the command
    # line (every op's when none is) before the first task arrives: a worker started ahead of its
    # tasks (the doctor's timing worker) is ready then. A task of another op imports its own.
    import os

    from ..backends import load
    from ..isolate import TF32_ENV, apply_fp32_switches, die_with_parent
    die_with_parent()   # a worker does not outlive the run that started it
    apply_fp32_switches(os.environ.get(TF32_ENV))  # fp32 as the parent computes it
    load(sys.argv[1:] or None)
    _preimport_autograd_helpers()
    sys.stdout.write(READY + "\n")
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
