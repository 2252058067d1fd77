"""A run is cut short where running on only costs time: an implementation that keeps crashing
or hanging, a spent --budget. What is left is NOT_RUN with the reason, and reports are written."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from gpuparity.checks.battery import Task, run_battery, verdicts_from_results
from gpuparity.checks.pool import Breaker, Budget
from gpuparity.checks.results import CheckResult, Status, read_stream
from gpuparity.doctor import recommendations

IMPLS = os.path.join(os.path.dirname(__file__), "planted_impls.py")


def _cli(*argv, timeout=240):
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "gpuparity", *argv], capture_output=True, text=True, timeout=timeout)
    return proc, time.monotonic() - started


def test_a_segfaulting_impl_stops_after_three_crashes_in_a_row(tmp_path):
    stream = tmp_path / "results.jsonl"
    impl = f"{IMPLS}:softmax_segfault"
    started = time.monotonic()
    run = run_battery(["softmax"], "default", "cpu", dtypes=["float32"], impl=impl, stream_path=str(stream))
    statuses = [r.status for r in run.results]
    assert statuses[:3] == [Status.CRASH] * 3, statuses
    assert statuses[3:] == [Status.NOT_RUN] * (len(statuses) - 3) and len(statuses) > 5, statuses
    assert {r.reason for r in run.results[3:]} == {f"not run: 3 consecutive crashes/hangs of {impl}"}
    assert not run.ok
    assert len(list(read_stream(str(stream)))) == len(statuses)  # every check is in the stream
    assert time.monotonic() - started < 60  # three worker starts, not one per check


def test_a_hanging_impl_stops_after_three_hangs_and_the_report_is_written(tmp_path):
    out = tmp_path / "check.json"
    proc, seconds = _cli("check", "--op", "softmax", "--impl", f"{IMPLS}:softmax_hang", "--dtype", "fp32",
                         "--timeout", "1", "--json", str(out))
    assert proc.returncode == 1, proc.stderr
    data = json.loads(out.read_text())
    statuses = [r["status"] for r in data["results"]]
    assert data["tally"]["TIMEOUT"] == 3 and data["tally"]["NOT_RUN"] == len(statuses) - 3 > 5, data["tally"]
    assert statuses[:3] == ["TIMEOUT"] * 3
    assert all(r["reason"] == f"not run: 3 consecutive crashes/hangs of {IMPLS}:softmax_hang"
               for r in data["results"][3:])
    assert "not run" in proc.stdout  # the tally line says so
    assert seconds < 60, seconds  # 3 x 1 s timeouts, not one per check


def test_a_streak_is_broken_by_any_other_outcome():
    breaker = Breaker(limit=3)
    task = Task(0, "softmax", "triton", "c", {}, "float32", "cpu", 0)
    other = Task(1, "softmax", "torch", "c", {}, "float32", "cpu", 0)
    for status in (Status.CRASH, Status.TIMEOUT, Status.FAIL, Status.CRASH, Status.CRASH):
        breaker.record(task, status)
    breaker.record(other, Status.CRASH)
    assert breaker.reason(task) is None  # the FAIL broke the streak: 2 in a row
    breaker.record(task, Status.TIMEOUT)
    assert breaker.reason(task) == "not run: 3 consecutive crashes/hangs of triton (softmax)"
    assert breaker.reason(other) is None


def test_the_budget_stops_a_hang_as_not_run_not_as_the_impls_fault(tmp_path):
    out = tmp_path / "check.json"
    proc, seconds = _cli("check", "--op", "softmax", "--impl", f"{IMPLS}:softmax_hang", "--dtype", "fp32",
                         "--level", "quick", "--timeout", "120", "--budget", "12", "--json", str(out))
    assert proc.returncode == 1, proc.stderr
    data = json.loads(out.read_text())
    assert data["tally"]["NOT_RUN"] == len(data["results"]) > 1, data["tally"]  # no TIMEOUT blamed on the impl
    reasons = [r["reason"] for r in data["results"]]
    assert all(r.startswith("not run: the run's budget of 12 s (--budget) was spent") for r in reasons), reasons
    assert "stopped after" in reasons[0]  # the check in flight was stopped at the budget
    assert seconds < 40, seconds  # not the 120 s timeout


def test_doctor_budget_leaves_the_rest_not_run_and_writes_both_reports(tmp_path):
    out, page = tmp_path / "doctor.json", tmp_path / "doctor.html"
    proc, seconds = _cli("doctor", "--ops", "softmax,layer_norm", "--no-probes", "--device", "cpu", "--budget", "1",
                         "--json", str(out), "--html", str(page))
    assert proc.returncode == 1, proc.stderr
    report = json.loads(out.read_text())
    assert report["options"]["budget"] == 1 and report["exit_code"] == 1
    results = report["battery"]["results"]
    not_run = [r for r in results if r["status"] == "NOT_RUN"]
    assert not_run and all("budget of 1 s" in r["reason"] for r in not_run)
    assert report["battery"]["tally"]["NOT_RUN"] == len(not_run)
    assert "NOT_RUN" in page.read_text()
    assert seconds < 60, seconds


def test_bad_budget_is_a_usage_error():
    proc, _ = _cli("check", "--op", "softmax", "--budget", "0")
    assert proc.returncode == 2 and "budget: expected a positive number of seconds, got 0" in proc.stderr


def test_not_run_checks_give_no_verdict_and_no_recommendation():
    def result(status, case):
        return CheckResult(op="softmax", backend="torch", case=case, dtype="float32", device="cpu", status=status,
                           params={"shape": (4, 4), "dim": -1})
    partial = [result(Status.PASS, "a"), result(Status.NOT_RUN, "b")]
    assert verdicts_from_results(partial) == {}  # incomplete evidence is not cached as passed
    assert verdicts_from_results([result(Status.PASS, "a")])
    (rec,) = recommendations(partial, {})
    assert rec["use"] is None and rec["unfinished"] == [{"backend": "torch", "not_run": 1, "of": 2}]
    assert "not verified: torch: 1/2 checks not run" in rec["text"]


def test_budget_object_counts_down():
    budget = Budget(0.05)
    assert not budget.spent and budget.remaining() > 0
    time.sleep(0.06)
    assert budget.spent and "budget of 0.05 s" in budget.reason


def test_recommendation_names_the_training_size_choice_and_skips_baselines_auto_never_picks():
    from gpuparity.checks.results import CheckResult, Status
    from gpuparity.doctor import recommendations

    def passed(op, backend):
        return CheckResult(op=op, backend=backend, dtype="bfloat16", case="basic", status=Status.PASS, device="cuda")
    results = [passed("rms_norm", "torch"), passed("rms_norm", "triton")]
    times = {("rms_norm", "torch", "bfloat16"): 0.05, ("rms_norm", "triton", "bfloat16"): 0.08,
             ("rms_norm", "torch", "bfloat16", "large"): 0.9, ("rms_norm", "triton", "bfloat16", "large"): 0.4}
    (rec,) = recommendations(results, times)
    assert rec["use"] == "torch" and "triton for training-size calls (0.4 ms" in rec["text"]
    # linear_cross_entropy's "torch" materialises the logits: checked, never chosen by auto
    results = [passed("linear_cross_entropy", "torch"), passed("linear_cross_entropy", "triton")]
    times = {("linear_cross_entropy", "torch", "bfloat16"): 1.0, ("linear_cross_entropy", "triton", "bfloat16"): 2.0}
    (rec,) = recommendations(results, times)
    assert rec["use"] == "triton"


def test_untimed_recommendation_follows_dispatch_order():
    # attention_decode has no timing case: dispatch takes the first verified backend in
    # registration order (triton before sdpa), and the doctor must name the same one
    from gpuparity import dispatch
    from gpuparity.checks.results import CheckResult, Status
    from gpuparity.doctor import recommendations
    order = [b.name for b in dispatch.backends("attention_decode") if not b.fallback]
    assert order.index("triton") < order.index("sdpa")
    results = [CheckResult(op="attention_decode", backend=name, dtype="bfloat16", case="c", status=Status.PASS,
                           device="cuda") for name in ("sdpa", "triton")]
    (rec,) = recommendations(results, {})
    assert rec["use"] == "triton"
