"""The command line as a user runs it: exit codes, JSON with schema_version, clear errors."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from gpuparity.cli import main


def run_cli(*args, timeout=600):
    return subprocess.run([sys.executable, "-m", "gpuparity", *args], capture_output=True, text=True, timeout=timeout)


def test_env_json(tmp_path, capsys):
    out = tmp_path / "env.json"
    assert main(["env", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["schema_version"] == 1 and "devices" in data


def test_doctor_quick_on_cpu_writes_complete_reports(tmp_path):
    out, page = tmp_path / "doctor.json", tmp_path / "doctor.html"
    # torch and composition backends only: the Triton ones run in the (slow) interpreter here
    proc = run_cli("doctor", "--quick", "--ops", "softmax,rms_norm,attention", "--no-probes",
                   "--backends", "torch,composition,sdpa_math",
                   "--json", str(out), "--html", str(page))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["schema_version"] == 1 and data["platform"]["schema_version"] == 1
    assert data["battery"]["tally"]["PASS"] > 20 and data["exit_code"] == 0
    assert any(r["op"] == "attention" and r["use"] for r in data["recommendations"])
    skipped = [r for r in data["battery"]["results"] if r["status"] == "SKIP"]
    assert all(r["reason"] for r in skipped)  # a SKIP always says why
    html = page.read_text()
    assert "<html" in html and "script" not in html.lower() and "all checks passed" in html
    assert "Recommended configuration" in proc.stdout
    # where the time went, per phase, in the report and on the terminal
    assert list(data["phases_s"]) == ["platform", "battery", "known issues (after the battery)", "timing"]
    assert all(seconds >= 0 for seconds in data["phases_s"].values())
    assert "time: platform" in proc.stdout


@pytest.mark.parametrize("args,needle", [
    (["check", "--op", "attention", "--device", "cuda:3"], "device"),
    (["check", "--op", "attention", "--dtype", "fp8"], "dtype"),
    (["known-issues", "--platform", "/nonexistent.json"], "nonexistent"),
    (["doctor", "--device", "tpu"], "device"),
])
def test_bad_input_exits_2_with_a_clear_message(args, needle):
    proc = run_cli(*args, timeout=120)
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert needle in proc.stderr


def test_unknown_op_is_usage_error():
    proc = run_cli("check", "--op", "dropout", timeout=60)
    assert proc.returncode == 2 and "invalid choice" in proc.stderr


def test_check_user_impl_passes_and_signature():
    proc = run_cli("check", "--op", "softmax", "--impl", "torch:softmax", "--level", "quick")
    assert proc.returncode == 0, proc.stdout[-2000:]
    proc = run_cli("check", "--op", "attention", "--signature", timeout=60)
    assert "key_padding_mask" in proc.stdout
