"""Which cases run in which dtype at each level."""
from __future__ import annotations

import torch

from gpuparity.checks.battery import plan
from gpuparity.contracts import get_spec
from gpuparity.contracts.base import OpSpec


def test_fp16_runs_the_quick_cases_at_the_default_level_when_bf16_runs_every_case(monkeypatch):
    # as on a GPU: all three dtypes
    monkeypatch.setattr(OpSpec, "dtypes", lambda self, device, level="default":
                        [torch.float32, torch.bfloat16, torch.float16])
    quick = {c.name for c in get_spec("softmax").cases() if c.level == "quick"}
    default = {c.name for c in get_spec("softmax").cases() if c.at("default")}
    assert quick < default

    def cases(tasks, dtype):  # the listed cases (family members follow the same dtype rule)
        return {t.case for t in tasks if t.dtype == dtype and t.backend == "torch" and "." not in t.case}

    tasks, _ = plan(["softmax"], "default", "cpu")
    assert cases(tasks, "bfloat16") == default
    assert cases(tasks, "float16") == quick
    tasks, _ = plan(["softmax"], "full", "cpu")
    assert cases(tasks, "float16") == {c.name for c in get_spec("softmax").cases()}
    # asking for fp16 alone checks it on every default case
    tasks, _ = plan(["softmax"], "default", "cpu", dtypes=["float16"])
    assert cases(tasks, "float16") == default
