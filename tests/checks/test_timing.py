"""How the battery times backends for auto's ranking: the small case step by step (host and
device), the training-size case by device time (the worker asks time_case for it)."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from gpuparity.checks import execute, worker
from gpuparity.checks.plan import LARGE_TIMING_CASE, Task, timing_cases, timing_field


@pytest.mark.parametrize("case, device_time", [("timing", False), (LARGE_TIMING_CASE, True)])
def test_worker_times_the_large_case_by_device_time(monkeypatch, case, device_time):
    seen = {}

    def fake_time_case(op, fn, params, dtype, device, repeats=10, device_time=False):
        seen.update(op=op, repeats=repeats, device_time=device_time)
        return 1.5

    monkeypatch.setattr(execute, "time_case", fake_time_case)
    task = Task(0, "swiglu", "torch", case, {"shape": (4, 8), "scale": 1.0, "layout": "contiguous"}, "float32",
                "cpu", 0, mode="time")
    answer = worker.handle(dataclasses.asdict(task))
    assert answer["status"] == "PASS" and answer["time_ms"] == 1.5
    assert seen == {"op": "swiglu", "repeats": 10, "device_time": device_time}


def test_large_case_only_on_gpus_and_its_field():
    assert [c for c, _ in timing_cases("swiglu", "cpu")] == ["timing"]
    assert [c for c, _ in timing_cases("swiglu", "cuda:0")] == ["timing", LARGE_TIMING_CASE]
    assert timing_field(LARGE_TIMING_CASE) == "time_ms_large" and timing_field("timing") == "time_ms"


def test_device_time_falls_back_to_synchronised_steps_on_the_cpu():
    fn = lambda gate, up: gate * torch.sigmoid(gate) * up  # noqa: E731
    params = {"shape": (4, 8), "scale": 1.0, "layout": "contiguous"}
    ms = execute.time_case("swiglu", fn, params, torch.float32, torch.device("cpu"), repeats=3, device_time=True)
    assert ms > 0.0


def test_a_first_call_probes_only_the_backend_asked_about(monkeypatch, tmp_path):
    """After `gpuparity doctor` (default level: backends that compile per shape are left for
    --full), a first call must not re-check every backend of the op, only the one asked about
    that has no verdict (checks/selection.py: a first call verifies its candidate alone)."""
    from gpuparity import dispatch
    from gpuparity.registry import Problem
    from gpuparity.checks import selection, verdicts

    monkeypatch.setenv("GPUPARITY_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv(selection.REFINE, "off")
    monkeypatch.delenv(selection.TRUST_UNPROBED, raising=False)
    verdicts.clear_cache()
    problem = Problem("rms_norm", torch.device("cpu"), torch.bfloat16, "default", (("large", False),))
    names = selection.auto_candidates("rms_norm")
    assert len(names) >= 2
    have, missing = names[0], names[1:]
    verdicts.store_verdicts(problem.device, {verdicts.verdict_key(problem, dispatch.get("rms_norm", have)):
                                             {"passed": True, "reason": "planted", "time_ms": 1.0}})
    asked = []

    def fake_verify(op, dtype, kind, device, backend):
        asked.append(backend)
        return {verdicts.verdict_key(problem, dispatch.get(op, backend)): {"passed": True, "reason": "probed"}}

    monkeypatch.setattr(selection, "verify", fake_verify)
    found = selection.verdict_for(problem, dispatch.get("rms_norm", missing[0]))
    assert asked == [missing[0]] and found["reason"] == "probed"
    assert selection.verdict_for(problem, dispatch.get("rms_norm", have))["reason"] == "planted"
    assert len(asked) == 1
    verdicts.clear_cache()
