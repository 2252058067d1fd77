"""The order checks start in, and the timing warm-ups that ride along with the battery."""
from __future__ import annotations

import dataclasses

from gpuparity import dispatch
from gpuparity.checks import battery
from gpuparity.checks.battery import Task, _queue_order, run_tasks, timing_tasks


def _task(i, op, backend, dtype="bfloat16", mode="check"):
    return Task(i, op, backend, "case", {}, dtype, "cpu", 0, mode=mode)


def test_compiling_backends_start_first_then_attention_then_fp32():
    tasks = [_task(0, "softmax", "torch"), _task(1, "attention", "sdpa_math"),
             _task(2, "rms_norm", "triton", "float16"), _task(3, "attention", "triton", "bfloat16"),
             _task(4, "attention", "triton", "float32"), _task(5, "attention", "sdpa_math", "float32")]
    order = [t.id for t in sorted(tasks, key=_queue_order)]
    # triton (jit) first: attention before norms, fp32 before bf16; then attention, then the rest
    assert order == [4, 3, 2, 5, 1, 0]
    assert dispatch.get("attention", "triton").jit and not dispatch.get("attention", "sdpa_math").jit
    # a user's implementation is not a registered backend: it simply keeps plan order
    assert not battery._is_jit(dataclasses.replace(tasks[0], backend="impl:x:y", impl="x:y"))


def test_timing_tasks_rank_two_or_more_candidates_and_never_fallbacks():
    keys = [("attention", "triton", "bfloat16"), ("attention", "sdpa_math", "bfloat16"),
            ("attention", "composition", "bfloat16"), ("attention", "triton", "bfloat16"),
            ("attention", "triton", "float32"), ("attention", "composition", "float32"),
            ("softmax", "torch", "float32"), ("rms_norm", "torch", "float32"), ("rms_norm", "triton", "float32")]
    tasks = timing_tasks(keys, "cpu", first_id=100)
    # attention fp32 has one candidate besides its fallback, softmax only one: nothing to rank
    assert sorted((t.op, t.backend, t.dtype) for t in tasks) == [
        ("attention", "sdpa_math", "bfloat16"), ("attention", "triton", "bfloat16"),
        ("rms_norm", "torch", "float32"), ("rms_norm", "triton", "float32")]
    assert all(t.case == "timing" and t.mode == "time" and t.id >= 100 for t in tasks)
    assert len({t.id for t in tasks}) == len(tasks)
    warm = timing_tasks(keys, "cpu", mode="warm", only=battery._is_jit)
    assert sorted((t.backend, t.mode) for t in warm) == [("triton", "warm"), ("triton", "warm")]


def test_warm_tasks_run_but_report_nothing():
    check = _task(0, "softmax", "torch", "float32")
    check = dataclasses.replace(check, case="classes", params={"shape": (4, 5), "dim": -1, "scale": 1.0})
    # (a warm-up of the torch rms_norm: any op runs the same way in-process)
    warm = timing_tasks([("rms_norm", "torch", "float32"), ("rms_norm", "composition", "float32"),
                         ("rms_norm", "triton", "float32")], "cpu", mode="warm", first_id=1,
                        only=lambda t: t.backend == "torch")
    seen = []
    results = run_tasks([check] + warm, isolate=False, on_result=seen.append)
    assert [r.case for r in seen] == ["classes"]          # the callback never sees the warm-up
    assert results[1].status.value == "PASS"               # but it ran (and would have compiled)


def test_progress_counts_checks_only_when_warm_ups_ride_along(monkeypatch):
    # rms_norm's torch backend standing in for a compiling one, so a warm-up is queued on the CPU
    monkeypatch.setattr(battery, "_is_jit", lambda task: task.backend == "torch")
    seen = []
    run = battery.run_battery(["rms_norm"], "quick", "cpu", dtypes=["float32"], backends=["torch", "triton"],
                              isolate=False, warm_timings=True, progress=lambda done, total, r: seen.append((done, total)))
    assert seen[-1][0] == seen[-1][1] == len(run.results)
    assert all(r.case != "timing" for r in run.results)


def test_doctor_closes_its_timing_worker_when_the_battery_raises(monkeypatch):
    from gpuparity import doctor
    closed = []

    class Pool(battery.WorkerPool):
        def close(self):
            closed.append(True)
            super().close()

    monkeypatch.setattr(doctor, "WorkerPool", Pool)

    def broken(*args, **kwargs):
        raise RuntimeError("battery broke")

    monkeypatch.setattr(doctor, "run_battery", broken)
    try:
        doctor.run_doctor(doctor.DoctorOptions(ops=["softmax"], probes=False, device="cpu"))
    except RuntimeError as exc:
        assert "battery broke" in str(exc)
    else:
        raise AssertionError("run_doctor should have raised")
    assert closed == [True]
