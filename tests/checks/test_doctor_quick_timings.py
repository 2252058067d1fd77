"""`gpuparity doctor --quick` ranks with the timings an earlier doctor measured on this platform
(its verdict cache) and times only what they lack: on the H100 the timing phase alone took 26 s of
a 72 s --quick (issue 45's target: 45 s)."""
from __future__ import annotations

import torch

from gpuparity import doctor
from gpuparity.checks.results import CheckResult, Status
from gpuparity.checks.verdicts import store_verdicts


def passed(op, backend, dtype="float32"):
    return CheckResult(op, backend, "case", dtype, "cpu", Status.PASS)


def test_cached_timings_reads_what_an_earlier_doctor_stored_here(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUPARITY_CACHE_DIR", str(tmp_path))
    assert doctor.cached_timings("cpu") == {}
    store_verdicts(torch.device("cpu"), {
        "rms_norm|torch|float32|dense": {"status": "PASS", "time_ms": 0.5},
        "rms_norm|composition|float32|dense": {"status": "PASS", "time_ms": 0.9, "time_ms_large": 3.0},
        "rms_norm|triton|float32|dense": {"status": "PASS"},                     # never timed
    }, strict=True)
    assert doctor.cached_timings("cpu") == {("rms_norm", "torch", "float32"): 0.5,
                                            ("rms_norm", "composition", "float32"): 0.9,
                                            ("rms_norm", "composition", "float32", "large"): 3.0}


def test_known_timings_are_kept_and_only_the_rest_is_timed(monkeypatch):
    timed = []

    def run_tasks(tasks, **_kwargs):
        for task in tasks:
            timed.append((task.op, task.backend, task.dtype))
            yield CheckResult(task.op, task.backend, task.case, task.dtype, "cpu", Status.PASS,
                              params={"time_ms": 7.0})
    monkeypatch.setattr(doctor, "run_tasks", run_tasks)
    results = [passed(op, backend) for op in ("rms_norm", "layer_norm") for backend in ("torch", "compile")]
    plain = doctor._timings(results, "cpu", None)
    assert set(plain) == {(r.op, r.backend, r.dtype) for r in results} == set(timed)   # all timed, once each
    timed.clear()
    known = {key: 1.5 for key in plain}
    again = doctor._timings(results, "cpu", None, known=known)
    assert timed == [] and again == known
    # a timing of a backend that did not pass here is not kept
    failed = [passed("rms_norm", "torch"), CheckResult("rms_norm", "compile", "c", "float32", "cpu", Status.FAIL)]
    assert doctor._timings(failed, "cpu", None, known=known) == {("rms_norm", "torch", "float32"): 1.5}
