"""Correctness probes for verified auto-selection. `probe_verdict` returns the stored verdict
for a backend, probing on a miss: the op's quick battery cases (plus the default-level cases
of the kind asked for) on every probed backend, then a timing of each backend that passed. On a GPU the probe runs in a worker process, so a backend that crashes
the GPU cannot take the caller down with it."""
from __future__ import annotations

import logging
import os
import time
from typing import Any, Dict, List, Optional, Sequence

import torch

from .. import dispatch
from ..backends.registry import Backend, Problem
from . import verdicts as verdicts_store
from .battery import Task, normalize_device, plan, run_tasks, verdicts_from_results
from .plan import timing_cases, timing_field
from .execute import dtype_name
from .results import Status
from .specs import get_spec

LOG = logging.getLogger("gpuparity")
TRUST_UNPROBED = "GPUPARITY_TRUST_UNPROBED"


def _isolate(device: torch.device) -> bool:
    mode = os.environ.get("GPUPARITY_PROBE", "auto")
    if mode == "subprocess":
        return True
    if mode == "inprocess":
        return False
    return device.type == "cuda"


def probed_backends(op: str) -> List[str]:
    """The backends of `op` that auto chooses from and therefore probes."""
    return [b.name for b in dispatch.backends(op) if b.probed and not b.fallback]


def probe_op(op: str, dtype: torch.dtype, kind: str, device,
             backends: Optional[Sequence[str]] = None) -> Dict[str, Dict[str, Any]]:
    """Verdicts keyed as verdicts.probe_key for every probed backend of `op` at `dtype` (or
    those of `backends` among them)."""
    device = normalize_device(device)
    spec = get_spec(op)
    probed = [name for name in probed_backends(op) if backends is None or name in backends]
    if not probed:
        return {}

    def wanted(_op, case):
        return case.level == "quick" or (case.level == "default" and spec.kind(case.params) == kind)

    # level "full" so that every backend is probed, including those the battery defers to --full
    tasks, decided = plan([op], "full", device, [dtype_name(dtype)], probed, None, 0, wanted)
    results = decided + run_tasks(tasks, isolate=_isolate(device))
    verdicts = verdicts_from_results(results)
    dname = dtype_name(dtype)
    vname = verdicts_store.verdict_dtype(op, dtype, device)
    for backend in probed:
        key = f"{op}|{backend}|{vname}|{kind}"
        if key not in verdicts:  # no case of exactly this kind: all of the backend's probe cases decide
            ran = [r for r in results if r.backend == backend and r.status != Status.SKIP]
            bad = [r for r in ran if r.status.bad]
            if ran:
                verdicts[key] = {"passed": not bad, "reason": (
                    f"passed {len(ran)} probe check{'s' * (len(ran) != 1)}" if not bad
                    else f"failed {len(bad)}/{len(ran)} probe check{'s' * (len(ran) != 1)}")}
            else:
                skipped = [r for r in results if r.backend == backend]
                verdicts[key] = {"passed": False, "reason": skipped[0].reason if skipped else "not probed"}
    # a confirmed known issue's remedy wins over a passing battery verdict
    from ..known import avoid
    avoid.apply(verdicts, avoid.confirmed_here(op, dtype, device, probed), device.type)
    timing = spec.timing_params()
    if timing is not None:
        passed = sorted({k.split("|")[1] for k, v in verdicts.items() if v.get("passed")})
        time_tasks = [Task(len(passed) * j + i, op, name, case, params, dname, str(device), 0, mode="time")
                      for j, (case, params) in enumerate(timing_cases(op, str(device)))
                      for i, name in enumerate(passed)]
        for result in run_tasks(time_tasks, isolate=_isolate(device), workers=1):
            time_ms = result.params.get("time_ms") if result.status == Status.PASS else None
            for key, verdict in verdicts.items():
                if key.split("|")[1] == result.backend:
                    verdict[timing_field(result.case)] = time_ms
                    if time_ms is None:
                        verdict.update(passed=False, reason=f"timing run failed: {result.status.value} {result.reason[:200]}")
    return verdicts


def probe_verdict(problem: Problem, backend: Backend) -> Dict[str, Any]:
    """The stored verdict for (problem kind, backend), probing now if there is none."""
    if os.environ.get(TRUST_UNPROBED) == "1":
        return {"passed": True, "reason": f"probe skipped ({TRUST_UNPROBED}=1)", "time_ms": None}
    path = verdicts_store.cache_path(problem.device)
    key = verdicts_store.probe_key(problem, backend)
    stored = verdicts_store.load(path)
    if key not in stored:
        # only the backends with no verdict for this call's kind yet: after `gpuparity doctor`
        # (which leaves the --full backends unchecked) a first call does not re-check the rest
        missing = [name for name in probed_backends(problem.op)
                   if verdicts_store.probe_key(problem, dispatch.get(problem.op, name)) not in stored]
        dtype = str(problem.dtype).replace("torch.", "")
        # A first call can take a minute on a GPU (Triton compiles, crash-isolated checks):
        # say so through logging (shown on stderr by default), since the library never prints.
        LOG.warning("gpuparity: first %s call with %s, %s on %s here: checking its backends against float64 "
                    "before backend='auto' uses them (once; cached in %s; `gpuparity doctor` fills the cache "
                    "ahead of time)", problem.op, dtype, problem.kind, problem.device, path)
        started = time.monotonic()
        verdicts_store.store_verdicts(problem.device, probe_op(problem.op, problem.dtype, problem.kind, problem.device,
                                                               missing or None))
        LOG.info("gpuparity: probed %s (%s, %s) in %.1f s", problem.op, dtype, problem.kind,
                 time.monotonic() - started)
        stored = verdicts_store.load(path)
    found = stored.get(key, {"passed": False, "reason": "no probe verdict recorded"})
    if found.get("time_ms_large") is not None and get_spec(problem.op).is_large(problem):
        # a large call is ranked by the large timing case (specs/base.py large_timing_params)
        return {**found, "time_ms": found["time_ms_large"]}
    return found
