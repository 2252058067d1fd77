"""A check that aborts, segfaults or hangs becomes CRASH / TIMEOUT; the run goes on and the
report is complete."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from gpuparity.checks.battery import run_battery
from gpuparity.isolate import call_isolated
from gpuparity.checks.results import Status, read_stream

IMPLS = os.path.join(os.path.dirname(__file__), "planted_impls.py")


def only_first_case(op, case):
    return case.name == "rows_17"


def test_abort_and_segfault_become_crash_and_the_run_goes_on(tmp_path):
    stream = tmp_path / "results.jsonl"
    results = []
    for name in ("softmax_abort", "softmax_segfault"):
        battery = run_battery(["softmax"], "quick", "cpu", dtypes=["float32"], impl=f"{IMPLS}:{name}",
                              stream_path=str(stream), case_filter=None, crash_limit=None)
        results += battery.results
        crashes = [r for r in battery.results if r.status == Status.CRASH]
        assert len(crashes) == len(battery.results) >= 4, [(r.case, r.status) for r in battery.results]
        assert "SIG" in crashes[0].reason, crashes[0].reason  # killed by SIGABRT / SIGSEGV
    streamed = list(read_stream(str(stream)))
    assert len(streamed) == len(results)


def test_hang_becomes_timeout():
    battery = run_battery(["softmax"], "quick", "cpu", dtypes=["float32"], impl=f"{IMPLS}:softmax_hang",
                          timeout=3, case_filter=only_first_case)
    assert [r.status for r in battery.results] == [Status.TIMEOUT]
    assert "no answer within 3 s" in battery.results[0].reason


def test_errors_are_results_not_tracebacks():
    for name, expected in [("softmax_raises", "raised RuntimeError: kernel launch failed"),
                           ("softmax_wrong_shape", "wrong shape"),
                           ("softmax_wrong_dtype", "returned dtype float64, expected float32"),
                           ("softmax_nan", "NaN/Inf")]:
        battery = run_battery(["softmax"], "quick", "cpu", dtypes=["float32"], impl=f"{IMPLS}:{name}",
                              isolate=False, case_filter=only_first_case)
        (result,) = battery.results
        assert result.status.bad and expected in result.reason, (name, result.status, result.reason)


def test_unimportable_impl_is_an_error_with_the_reason(tmp_path):
    broken = tmp_path / "broken.py"
    broken.write_text("import not_a_module_anywhere\n")
    battery = run_battery(["softmax"], "quick", "cpu", dtypes=["float32"], impl=f"{broken}:fn", isolate=False,
                          case_filter=only_first_case)
    (result,) = battery.results
    assert result.status == Status.ERROR and "not_a_module_anywhere" in result.reason
    battery = run_battery(["softmax"], "quick", "cpu", dtypes=["float32"], impl="json:no_such_function",
                          isolate=False, case_filter=only_first_case)
    assert "has no attribute" in battery.results[0].reason


def test_check_command_with_crashing_impl_exits_1_and_writes_complete_json(tmp_path):
    out = tmp_path / "check.json"
    proc = subprocess.run([sys.executable, "-m", "gpuparity", "check", "--op", "softmax", "--impl",
                           f"{IMPLS}:softmax_segfault", "--dtype", "fp32", "--level", "quick", "--json", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr
    data = json.loads(out.read_text())
    assert data["schema_version"] == 1 and data["platform"]["schema_version"] == 1
    # three crashes in a row, then the rest is not run (test_cutoffs.py)
    assert data["tally"]["CRASH"] == 3 and data["tally"]["CRASH"] + data["tally"]["NOT_RUN"] == len(data["results"])
    assert "CRASH" in proc.stdout


def test_call_isolated_outcomes():
    ok = call_isolated("gpuparity.platform:summary_line", {"report": {}}, timeout=60)
    assert ok.status == "ok" and isinstance(ok.value, str)
    err = call_isolated("gpuparity.platform:parse_version", {"nope": 1}, timeout=60)
    assert err.status == "error" and "TypeError" in err.error
    crash = call_isolated("os:abort", {}, timeout=60)
    assert crash.status == "crash" and "SIGABRT" in crash.error
