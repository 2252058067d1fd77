"""doctor shrinks a failing backend's first failure and hands over its repro, as check does:
the shrinker is the one tests/checks/test_shrink.py checks; here, that doctor calls it with the
repro folder, keeps what it returns in its JSON and prints it under the failure."""
from __future__ import annotations

import io

from rich.console import Console

from gpuparity import doctor
from gpuparity.checks import shrink as shrink_module
from gpuparity.checks.battery import BatteryRun
from gpuparity.checks.results import CheckResult, Status
from gpuparity.report.terminal import render_doctor


class _Shrunk:
    def to_dict(self):
        return {"op": "softmax", "backend": "torch", "case": "basic", "dtype": "float32", "seed": 7,
                "params": {"n": 1}, "steps": ["sizes: n 64 -> 1"], "attempts": 3, "minimal": True,
                "status": "FAIL", "reason": "planted", "repro": "/tmp/repro-softmax.py", "repro_error": None}


def _run_with_one_failure(monkeypatch, options):
    failing = CheckResult("softmax", "torch", "basic", "float32", "cpu", Status.FAIL, seed=7, reason="planted",
                          params={"n": 64})
    passing = CheckResult("softmax", "composition", "basic", "float32", "cpu", Status.PASS, seed=7)
    monkeypatch.setattr(doctor, "run_battery", lambda *a, **k: BatteryRun([failing, passing], "quick", "cpu", 0, 0.1))
    asked = []
    monkeypatch.setattr(shrink_module, "shrink_failures",
                        lambda results, **kwargs: asked.append((results, kwargs)) or [_Shrunk()])
    return doctor.run_doctor(options), asked


def test_doctor_shrinks_a_failure_and_shows_its_repro(monkeypatch, tmp_path):
    options = doctor.DoctorOptions(ops=["softmax"], probes=False, device="cpu", level="quick", fill_cache=False,
                                   repro_dir=str(tmp_path))
    report, asked = _run_with_one_failure(monkeypatch, options)
    [(results, kwargs)] = asked
    assert [r.status for r in results if r.status.bad] == [Status.FAIL]
    assert kwargs["repro_dir"] == str(tmp_path)
    assert report["shrunk"][0]["repro"] == "/tmp/repro-softmax.py" and report["exit_code"] == 1
    out = io.StringIO()
    render_doctor(Console(file=out, width=200), report)
    assert "/tmp/repro-softmax.py" in out.getvalue() and "shrunk in 3 runs" in out.getvalue()


def test_doctor_no_shrink_skips_it(monkeypatch):
    options = doctor.DoctorOptions(ops=["softmax"], probes=False, device="cpu", level="quick", fill_cache=False,
                                   shrink=False)
    report, asked = _run_with_one_failure(monkeypatch, options)
    assert asked == [] and report["shrunk"] == []
