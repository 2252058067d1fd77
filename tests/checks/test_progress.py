"""Plain progress lines for a stream that is not a terminal (CI logs, pipes, tee)."""
from __future__ import annotations

import io
import os
import subprocess
import sys
import time

from gpuparity.checks.results import CheckResult, Status
from gpuparity.report.terminal import PlainProgress

IMPLS = os.path.join(os.path.dirname(__file__), "planted_impls.py")


def _result(status):
    return CheckResult(op="softmax", backend="torch", case="c", dtype="float32", device="cpu", status=status)


def test_lines_come_while_no_result_arrives_and_once_at_the_end():
    stream = io.StringIO()  # not a terminal
    forwarded = []
    with PlainProgress(stream, "doctor", total=5, every_s=0.05, also=lambda *a: forwarded.append(a[0])) as progress:
        progress(1, 5, _result(Status.PASS))
        progress(2, 5, _result(Status.FAIL))
        time.sleep(0.3)  # a hanging check: no result, lines still come
        progress(3, 5, _result(Status.NOT_RUN))
    lines = stream.getvalue().splitlines()
    assert len(lines) >= 3, lines
    assert lines[0].startswith("doctor: 2/5 checks, 1 failed, ")
    assert lines[-1].startswith("doctor: 3/5 checks, 1 failed, ") and lines[-1].endswith(", 1 not run")
    assert forwarded == [1, 2, 3]  # the progress bar still gets every result


def test_nothing_is_written_on_a_terminal():
    stream = io.StringIO()
    with PlainProgress(stream, "check", every_s=0.01, enabled=False) as progress:
        progress(1, 1, _result(Status.PASS))
        time.sleep(0.05)
    assert stream.getvalue() == ""


def test_check_piped_prints_progress_to_stderr_during_a_hang():
    env = {**os.environ, "GPUPARITY_PROGRESS_S": "1"}
    proc = subprocess.run([sys.executable, "-m", "gpuparity", "check", "--op", "softmax", "--impl",
                           f"{IMPLS}:softmax_hang", "--dtype", "fp32", "--level", "quick", "--case", "rows_17",
                           "--timeout", "4"], capture_output=True, text=True, timeout=240, env=env)
    lines = [line for line in proc.stderr.splitlines() if line.startswith("check: ")]
    assert any(line.startswith("check: 0/? checks, 0 failed") for line in lines), proc.stderr  # while it hangs
    assert lines[-1].startswith("check: 1/1 checks, 1 failed, "), proc.stderr
    assert "check: " not in proc.stdout  # stdout keeps the report
