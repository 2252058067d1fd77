"""The CLI as a script and a user see it: `--json -` gives stdout one JSON document, bad input
stops before anything runs, a failed check prints the command that reruns exactly it, and the
probe cache tells an unsupported backend from a failed probe."""
from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys

import pytest

from gpuparity.checks.results import CheckResult, Status
from gpuparity.cli import main
from gpuparity.report.terminal import rerun_command

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# A softmax off by 1% in its logits: every check FAILs, with errors that depend on the inputs.
OFF_SOFTMAX = "import torch\n\ndef softmax_off(x, dim=-1):\n    return torch.softmax(x * 1.01, dim=dim)\n"


def run_cli(*args, timeout=300, cwd=None):
    return subprocess.run([sys.executable, "-m", "gpuparity", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd)


def test_check_json_dash_puts_only_json_on_stdout_and_the_rest_on_stderr(tmp_path):
    (tmp_path / "off.py").write_text(OFF_SOFTMAX)
    proc = run_cli("check", "--op", "softmax", "--impl", "off.py:softmax_off", "--dtype", "fp32", "--level", "quick",
                   "--case", "rows_17,odd_781", "--json", "-", cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr[-3000:]
    data = json.loads(proc.stdout)  # the whole of stdout is the document
    assert data["kind"] == "check" and len(data["results"]) == 2
    assert "checks against float64" in proc.stderr and "Failed checks" in proc.stderr and "rerun:" in proc.stderr


def test_doctor_json_dash_puts_only_json_on_stdout_and_the_rest_on_stderr():
    proc = run_cli("doctor", "--quick", "--ops", "softmax", "--backend", "torch", "--dtype", "fp32", "--no-probes",
                   "--json", "-")
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(proc.stdout)
    assert data["kind"] == "doctor" and data["battery"]["tally"]["PASS"] > 0
    assert {r["backend"] for r in data["battery"]["results"]} == {"torch"}  # --backend is --backends
    assert "gpuparity doctor:" in proc.stderr and "all checks passed" in proc.stderr


@pytest.mark.parametrize("args,needles", [
    (["check", "--op", "softmax", "--impl", "no_such_module_xyz:softmax"], ["--impl", "no_such_module_xyz", "fn(x"]),
    (["check", "--op", "softmax", "--impl", "json:no_such_function"], ["--impl", "no attribute 'no_such_function'"]),
    (["check", "--op", "softmax", "--impl", "json:__name__"], ["--impl", "not a callable"]),
    (["check", "--op", "softmax", "--backend", "torch,tritn"], ["tritn", "composition, torch"]),
    (["doctor", "--ops", "softmax,rms_norm", "--backends", "torch,tritn"], ["tritn", "composition", "triton"]),
    (["doctor", "--ops", "softmax,rms_norm", "--backend", "tritn"], ["tritn", "composition", "triton"]),
    (["doctor", "--device", "cuda:7"], ["device", "cuda:7"]),
    (["doctor", "--device", "meta"], ["device", "'meta'"]),
    (["doctor", "--device", "cuda:x"], ["device", "'cuda:x'"]),
    (["check", "--op", "softmax", "--case", "rows_17,no_such_case"], ["no_such_case", "rows_17, odd_781"]),
    (["check", "--op", "softmax", "--case", "width_32768", "--level", "quick"], ["width_32768", "--level full"]),
    # a case that exists at this level but runs in 16-bit dtypes only at --full: not a run of nothing
    (["check", "--op", "layer_norm", "--case", "near_constant_rows", "--dtype", "bf16", "--device", "cpu"],
     ["near_constant_rows", "selects no check", "--level full"]),
])
def test_bad_input_exits_2_before_anything_runs(args, needles, capsys):
    assert main(args) == 2
    out, err = capsys.readouterr()
    assert all(needle in err for needle in needles), err
    # nothing ran and nothing was estimated: no tally, no table, no "N checks ... about S s"
    assert out == "" and "cannot run here" not in err and "pass," not in err


def test_failed_check_prints_a_command_that_reruns_exactly_it(tmp_path, capsys):
    (tmp_path / "off.py").write_text(OFF_SOFTMAX)
    impl = f"{tmp_path / 'off.py'}:softmax_off"
    first = tmp_path / "first.json"
    assert main(["check", "--op", "softmax", "--impl", impl, "--dtype", "fp32", "--level", "quick", "--seed", "7",
                 "--json", str(first)]) == 1
    commands = [line.split("rerun:", 1)[1] for line in capsys.readouterr().out.splitlines() if "rerun:" in line]
    results = json.loads(first.read_text())["results"]
    assert len(commands) == len(results) >= 4 and all(r["base_seed"] == 7 for r in results)
    argv = shlex.split(commands[1])  # not the first case: the seed must come from --seed and --case
    assert argv[:2] == ["gpuparity", "check"] and argv[argv.index("--seed") + 1] == "7"
    assert argv[argv.index("--level") + 1] == "quick"
    original = next(r for r in results if r["case"] == argv[argv.index("--case") + 1])

    assert main(argv[1:] + ["--json", "-"]) == 1
    (again,) = json.loads(capsys.readouterr().out)["results"]
    assert again["seed"] == original["seed"] != 7  # the derived per-check seed
    assert (again["case"], again["dtype"], again["status"]) == (original["case"], original["dtype"], "FAIL")
    assert again["comparisons"] == original["comparisons"]  # same inputs: the same errors, to the last bit


def test_rerun_command_names_the_backend_or_the_impl_and_needs_the_base_seed():
    result = CheckResult("attention", "sdpa_math", "causal", "bfloat16", "cuda:1", Status.FAIL, seed=123,
                         base_seed=5, level="default")
    assert rerun_command(result) == ("gpuparity check --op attention --backend sdpa_math --dtype bfloat16 "
                                     "--case causal --seed 5 --level default --device cuda:1")
    # a run with a short --timeout: the rerun keeps it, or a hang there would pass here
    assert rerun_command(result, timeout=2.5).endswith("--device cuda:1 --timeout 2.5")
    result.backend = "impl:my dir/kern.py:attn"
    assert "--impl 'my dir/kern.py:attn'" in rerun_command(result)
    result.base_seed = None  # a record from before the base seed was kept
    assert rerun_command(result) is None


def test_cache_show_tells_unsupported_from_failed(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("GPUPARITY_CACHE_DIR", str(tmp_path))
    # as checks/selection.py and checks/battery.verdicts_from_results store them
    verdicts = {
        "layer_norm|torch|float32|plain": {"passed": True, "reason": "passed 6 probe checks", "time_ms": 1.07},
        "layer_norm|triton|float32|plain": {"passed": False, "reason": "triton: no CUDA or ROCm GPU visible"},
        "layer_norm|compile|float32|plain": {"passed": False, "reason": "failed 1/6 probe checks"},
        "rms_norm|compile|float32|default": {"passed": False, "checks": 6, "failed": 2,
                                             "reason": "failed 2/6 checks, e.g. odd: FAIL out"},
    }
    (tmp_path / "probes-cpu-test.json").write_text(json.dumps({"schema_version": 1, "verdicts": verdicts}))
    assert main(["cache", "show"]) == 0
    rows = {tuple(cell.strip() for cell in line.split("│")[1:5]): line
            for line in capsys.readouterr().out.splitlines() if line.count("│") > 5}
    assert "unsupported: triton: no CUDA or ROCm GPU visible" in rows[("layer_norm", "triton", "float32", "plain")]
    assert "failed" not in rows[("layer_norm", "triton", "float32", "plain")].split("│")[5]
    assert rows[("layer_norm", "compile", "float32", "plain")].split("│")[5].strip() == "failed"
    assert rows[("rms_norm", "compile", "float32", "default")].split("│")[5].strip() == "failed"
    assert rows[("layer_norm", "torch", "float32", "plain")].split("│")[5].strip() == "passed"


def test_known_issues_doc_example_matches_the_base(capsys):
    """docs/known-issues.md shows the summary line for a saved platform; it must count every entry."""
    fixture = "tests/fixtures/platforms/rdna2_gfx1030_rocm62.json"
    assert main(["known-issues", "--platform", os.path.join(REPO, fixture)]) == 0
    printed = re.search(r"^\d+ known issues: .*$", capsys.readouterr().out, re.M).group(0)
    with open(os.path.join(REPO, "docs", "known-issues.md"), encoding="utf-8") as handle:
        doc = handle.read()
    assert f"$ gpuparity known-issues --platform {fixture}" in doc
    assert re.search(r"^\d+ known issues: .*$", doc, re.M).group(0) == printed
