"""benchmarks/ce_sweep.py's plumbing on the CPU (Triton's interpreter, tiny shapes and blocks,
without FlashAttention's files): every candidate of both loss kernels checked against float64 and
passing, the shipped defaults among them, the JSON and the table written."""
from __future__ import annotations

import importlib.util
import json
import os
import sys

import pytest

BENCH = os.path.join(os.path.dirname(__file__), os.pardir, os.pardir, "benchmarks")


def _script():
    sys.path.insert(0, os.path.abspath(BENCH))
    spec = importlib.util.spec_from_file_location("ce_sweep", os.path.join(BENCH, "ce_sweep.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_dry_run_checks_every_candidate_and_writes_the_tables(tmp_path, monkeypatch):
    pytest.importorskip("triton")
    import torch
    if torch.cuda.is_available():
        pytest.skip("the dry run is the CPU's (on a GPU the lead runs the sweep itself)")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    script = _script()
    assert script.main(["--dry-run", "--shapes", "5x37xfloat32", "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "ce_sweep.json").read_text())
    (shape,) = report["shapes"]
    assert (shape["rows"], shape["vocab"]) == (5, 37)
    for kind, candidates in (("fwd", script.DRY_FWD), ("bwd", script.DRY_BWD)):
        configs = {tuple(r["config"]) for r in shape[kind]}
        assert configs >= set(candidates) and sum(r["default"] for r in shape[kind]) == 1
        assert all(r["errors"]["ok"] and r["errors"]["grad"] < 1e-6 for r in shape[kind])
    assert shape["features_check"]["ok"]
    assert "| fwd |" in (tmp_path / "ce_sweep.md").read_text()


def test_a_wrong_gradient_fails_the_check():
    """The check the sweep marks each candidate with is not vacuous."""
    import torch
    script = _script()
    logits = torch.randn(4, 9, dtype=torch.float64)
    labels = torch.tensor([1, script.IGNORE, 3, 8])
    grad_losses = torch.ones(4)
    want = script.reference(logits, labels, grad_losses)
    valid = labels != script.IGNORE
    good = script.errors((want[0].float(), want[1].float(), want[2].float()), want, torch.float32, valid)
    bad = script.errors((want[0].float(), want[1].float(), want[2].float() * 1.01), want, torch.float32, valid)
    assert good["ok"] and not bad["ok"]
