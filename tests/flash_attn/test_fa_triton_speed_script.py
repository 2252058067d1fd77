"""benchmarks/fa_triton_speed.py's plumbing that needs neither a GPU nor FlashAttention's files:
its arguments, its cases (every shape the issue names, the dry run's at tiny sizes) and the
error that names the prepare script when the files are missing. (The dry run itself, FlashAttention's
kernels in Triton's interpreter beside gpuparity's, needs the exported files: the report's command.)"""
from __future__ import annotations

import importlib.util
import os
import sys

import pytest

PATH = os.path.join(os.path.dirname(__file__), os.pardir, os.pardir, "benchmarks", "fa_triton_speed.py")
spec = importlib.util.spec_from_file_location("fa_triton_speed", PATH)
script = importlib.util.module_from_spec(spec)
sys.modules.setdefault("fa_triton_speed", script)   # its dataclasses look their module up
spec.loader.exec_module(script)


def test_cases_cover_the_issue_shapes():
    names = [c.name for c in script.cases(False)]
    assert "rotary (4, 4096, 32, 128)" in names and any("decode" in n for n in names)
    norms = [c for c in script.cases(False) if c.kind == "norm"]
    assert {(c.params["rms"], c.params["residual_in_fp32"]) for c in norms} == {
        (True, False), (True, True), (False, False), (False, True)}
    assert all((c.params["rows"], c.params["hidden"]) == (8192, 4096) for c in norms)
    assert {c.params["vocab"] for c in script.cases(False) if c.kind == "ce"} == {32000, 128256}
    assert [c.kind for c in script.cases(True)] == [c.kind for c in script.cases(False)]


def test_arguments_and_missing_files(tmp_path):
    with pytest.raises(SystemExit):
        script.parse_args(["--rounds", "0"])
    assert script.parse_args(["--dry-run"]).dry_run
    with pytest.raises(SystemExit, match="fa_triton_prepare.sh"):
        script.load_flash_attention(str(tmp_path))
