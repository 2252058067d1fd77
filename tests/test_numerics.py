"""torch's fp32 switches, read through gpuparity.numerics: both of torch's APIs, and never the
"mix of the legacy and new APIs" error that reading the legacy flag raises after a script used
the new one (that error would otherwise reach every fp32 attention call)."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

from gpuparity import numerics


def test_legacy_switches():
    before = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = False
        assert numerics.matmul_tf32() is False
        torch.backends.cuda.matmul.allow_tf32 = True
        assert numerics.matmul_tf32() is True
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before


@pytest.mark.skipif(not hasattr(torch.backends.cuda.matmul, "fp32_precision"),
                    reason="this torch has only the legacy TF32 switches")
def test_new_api_switches_read_without_raising():
    # A separate process: once the new API is used, torch remembers it for the process.
    code = textwrap.dedent("""
        import torch
        from gpuparity import numerics, platform
        from gpuparity.isolate import fp32_switches
        from gpuparity.checks.verdicts import verdict_dtype
        torch.backends.cuda.matmul.fp32_precision = "tf32"
        try:
            torch.backends.cuda.matmul.allow_tf32
            mixed = False
        except RuntimeError:
            mixed = True      # what gpuparity must not run into
        assert numerics.matmul_tf32() is True
        assert verdict_dtype("attention", torch.float32, torch.device("cuda")) == "float32+tf32"
        torch.backends.cuda.matmul.fp32_precision = "ieee"
        assert numerics.matmul_tf32() is False
        torch.backends.cuda.matmul.fp32_precision = "none"     # inherit the global setting
        torch.backends.fp32_precision = "tf32"
        assert numerics.matmul_tf32() is True
        torch.backends.cudnn.conv.fp32_precision = "ieee"
        assert numerics.cudnn_tf32() is False
        print("mixed-error" if mixed else "no-mixed-error", fp32_switches(),
              platform._numerics()["matmul_allow_tf32"])
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split()[-2:] == ["matmul_tf32=1,cudnn_tf32=0", "True"]
