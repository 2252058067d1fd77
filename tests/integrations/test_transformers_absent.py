"""Without transformers, gpuparity imports, patch() works on plain torch models, and the
integration says how to install the extra."""
from __future__ import annotations

import subprocess
import sys

SCRIPT = r"""
import sys
sys.modules["transformers"] = None  # import transformers raises ImportError
import torch.nn as nn
import gpuparity
summary = gpuparity.patch(nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4)))
assert summary == ["1"], summary.lines()
from gpuparity.integrations import transformers as hf
try:
    hf.register()
except ImportError as exc:
    assert "gpuparity[hf]" in str(exc), exc
else:
    raise AssertionError("register() without transformers must raise ImportError")
print("ok")
"""


def test_gpuparity_without_transformers():
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-2000:]
