"""A sticky device error (CUDA's "misaligned address", "an illegal memory access", ...: the
process's GPU context is unusable after it) is the ERROR of the check that raised it, and of no
other: the worker reports it and exits, the pool starts a fresh one for the checks after it, and
the shrinker's candidates after a sticky one run in a fresh process, so that a candidate "fails
the same way" only when it does. Simulated on the CPU (tests/checks/planted_sticky.py: a fault
on a storage offset, then every call in that process raises the same error)."""
from __future__ import annotations

import os

import pytest
import torch

from gpuparity.checks import families
from gpuparity.checks.plan import Task
from gpuparity.checks.pool import WorkerPool, run_tasks
from gpuparity.checks.results import Status
from gpuparity.checks.shrink import _same_failure, shrink
from gpuparity.checks.worker import STICKY_NOTE, sticky_device_error
from gpuparity.contracts import get_spec

PLANTED = os.path.join(os.path.dirname(__file__), "planted_sticky.py")
ON_OFFSET, ON_WIDE = f"{PLANTED}:softmax_faults_on_offset", f"{PLANTED}:softmax_faults_on_wide"


def _task(number, case, impl, mode="check"):
    spec = get_spec("softmax")
    params = spec.timing_params() if mode == "time" else dict(families.lookup(spec, case).params)
    return Task(number, "softmax", f"impl:{impl}", case, params, "float32", "cpu", 1000 + number, impl=impl,
                mode=mode)


@pytest.fixture(scope="module")
def sticky_run():
    # the doctor's way: a timing task first, in a worker started ahead and handed over (doctor._timings);
    # then checks, two of which fault: each fault ends its worker
    tasks = [_task(0, "timing", ON_WIDE, mode="time"), _task(1, "rows_17", ON_OFFSET),
             _task(2, "layouts.x_offset", ON_OFFSET), _task(3, "odd_781", ON_OFFSET),
             _task(4, "large_logits_x4", ON_OFFSET)]
    pool = WorkerPool(ops=["softmax"]).start()
    return run_tasks(tasks, workers=1, pool=pool, crash_limit=None)


def test_only_the_faulting_checks_fail_and_the_worker_is_replaced(sticky_run):
    statuses = {r.case: r.status for r in sticky_run}
    # before: every check after the first fault was an ERROR too (the worker's context was poisoned)
    assert statuses == {"timing": Status.ERROR, "rows_17": Status.PASS, "layouts.x_offset": Status.ERROR,
                        "odd_781": Status.PASS, "large_logits_x4": Status.PASS}, statuses
    for result in sticky_run:
        if result.status == Status.ERROR:
            assert "misaligned address" in result.reason and STICKY_NOTE in result.reason, result.reason
            assert "the worker was replaced" in result.reason


def test_the_shrinker_keeps_the_fault_and_writes_its_repro(sticky_run, tmp_path):
    [original] = [r for r in sticky_run if r.case == "layouts.x_offset"]
    shrunk = shrink(original, impl=ON_OFFSET, seconds=60, repro_dir=str(tmp_path))
    # before: every candidate ran in the poisoned worker and "failed the same way": the offset
    # view was shrunk away (views {'x': 'offset'} -> None), leaving a case that does not fault
    assert shrunk.params.get("views") == {"x": "offset"}, shrunk.steps
    assert tuple(shrunk.params["shape"]) == (1, 1), shrunk.steps
    assert shrunk.result.status == Status.ERROR and STICKY_NOTE in shrunk.result.reason
    assert shrunk.minimal and shrunk.repro, shrunk.repro_error
    saved = torch.load(shrunk.repro[:-3] + ".pt", weights_only=False)
    assert saved["impl_args"][0]["offset"] == 3     # the view the implementation faulted on


def test_which_errors_are_sticky():
    assert sticky_device_error("AcceleratorError", "CUDA error: misaligned address\nCUDA kernel errors might ...")
    assert sticky_device_error("torch.AcceleratorError", "CUDA error: an illegal memory access was encountered")
    assert sticky_device_error("RuntimeError", "HIP error: unspecified launch failure")
    assert sticky_device_error("RuntimeError", "Triton Error [CUDA]: device-side assert triggered")
    assert not sticky_device_error("AcceleratorError", "CUDA error: out of memory")
    assert not sticky_device_error("RuntimeError", "HIP error: invalid device function")
    assert not sticky_device_error("ValueError", "CUDA error: misaligned address")     # not torch's error type
    assert not sticky_device_error("RuntimeError", "misaligned address in my parser")  # no device error


def test_a_sticky_error_shrinks_only_to_a_sticky_error():
    from gpuparity.checks.results import CheckResult

    def error(reason):
        return CheckResult("softmax", "impl:x", "c", "float32", "cpu", Status.ERROR, reason=reason)
    sticky = error(f"raised AcceleratorError: CUDA error: misaligned address at k.py:3 [{STICKY_NOTE}; ...]")
    assert _same_failure(sticky, sticky)
    assert not _same_failure(sticky, error("raised AcceleratorError: CUDA error: out of memory at k.py:3"))


def test_the_repro_saves_the_inputs_as_they_went_in(tmp_path):
    # on a GPU nothing can be copied off the device after a sticky error: the repro's inputs are
    # saved before the call (checks/repro.py CallRecorder snapshot), so also before it wrote into them
    from gpuparity import targets
    from gpuparity.checks import execute

    impl = f"{PLANTED}:softmax_writes_then_faults"
    params = dict(families.lookup(get_spec("softmax"), "layouts.x_offset").params)
    stem = str(tmp_path / "repro")
    status, _, reason = execute.run_case("softmax", targets.load(impl), params, torch.float32, torch.device("cpu"), 7,
                                         repro={"stem": stem, "case": "layouts.x_offset", "impl": impl})
    assert status == Status.ERROR and "misaligned address" in reason
    [x] = torch.load(stem + ".pt", weights_only=False)["impl_args"][:1]
    went_in = x["base"].as_strided(x["size"], x["stride"], x["offset"])
    assert x["offset"] == 3 and not (went_in == 7).any()   # before: saved after the call, all 7
