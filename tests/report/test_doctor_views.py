"""report/terminal.py and report/html.py: what a doctor report shows, in the terminal and as HTML."""
from __future__ import annotations

from rich.console import Console

from gpuparity.checks.results import CheckResult, Status
from gpuparity.report import html as html_report
from gpuparity.report import terminal


def _results():
    return [CheckResult("softmax", "torch", "small", "fp32", "cpu", Status.PASS),
            CheckResult("softmax", "triton", "small", "fp32", "cpu", Status.FAIL, seed=3, reason="err 1e-2 > 1e-5",
                        base_seed=0, level="quick"),
            CheckResult("softmax", "triton", "big", "fp32", "cpu", Status.PASS),
            CheckResult("rms_norm", "liger", "small", "fp32", "cpu", Status.SKIP, reason="not installed")]


def _doctor_report():
    results = _results()
    return {"platform": {"vendor": "cpu", "torch": {"version": "9.9", "cuda": None, "hip": None}, "devices": [],
                         "cpu_model": "Test CPU", "cpu_count": 2},
            "battery": {"results": [r.to_dict() for r in results],
                        "tally": {"PASS": 2, "FAIL": 1, "ERROR": 0, "CRASH": 0, "TIMEOUT": 0, "SKIP": 1}},
            "exit_code": 1, "machine": "test <box>", "created": "today", "gpuparity_version": "0.1",
            "options": {"level": "quick", "device": "cpu", "seed": 0}, "duration_s": 1.5,
            "recommendations": [{"text": "avoid triton softmax", "avoid": True, "use": False}],
            "known_issues": []}


def _record(render, *args) -> str:
    console = Console(record=True, width=200)
    render(console, *args)
    return console.export_text()


def test_summarize_counts_per_op_and_backend_and_keeps_the_worst_reason():
    rows = {(r["op"], r["backend"]): r for r in terminal.summarize(_results())}
    triton = rows[("softmax", "triton")]
    assert triton["status"] == "FAIL" and triton["counts"]["PASS"] == 1 and triton["counts"]["FAIL"] == 1
    assert triton["reason"] == "err 1e-2 > 1e-5" and triton["example_case"] == "small/fp32"
    assert rows[("rms_norm", "liger")]["status"] == "SKIP" and rows[("rms_norm", "liger")]["reason"] == "not installed"


def test_terminal_doctor_shows_platform_failures_with_rerun_and_the_verdict():
    text = _record(terminal.render_doctor, _doctor_report())
    assert "Platform" in text and "none (CPU only)" in text and "Test CPU (2 cores)" in text
    assert "small/fp32: err 1e-2 > 1e-5" in text
    assert "FAIL softmax" in text and "rerun: gpuparity check --op softmax --backend triton" in text
    assert "avoid triton softmax" in text
    assert "problems found: 2 pass, 1 fail" in text and "on cpu (level quick, seed 0)" in text


def test_html_doctor_is_one_escaped_page_with_the_failed_check():
    page = html_report.render_doctor_html(_doctor_report())
    assert page.startswith("<!doctype html>") and page.rstrip().endswith("</html>")
    assert "<script" not in page  # self-contained: nothing runs, nothing is fetched
    assert "test &lt;box&gt;" in page and "test <box>" not in page
    assert "problems found" in page and "Failed checks (1)" in page and "err 1e-2 &gt; 1e-5" in page
    assert "<li class='bad'>avoid triton softmax</li>" in page
