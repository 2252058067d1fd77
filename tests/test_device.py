"""get_device(): a verified device, or the CPU with a warning that says why."""
from __future__ import annotations

import warnings

import pytest
import torch

from gpuparity import device as device_mod
from gpuparity.isolate import call_isolated


def test_cpu_is_returned_as_is():
    assert device_mod.get_device("cpu") == torch.device("cpu")


def test_missing_gpu_warns_and_falls_back(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.warns(RuntimeWarning, match="no GPU"):
        assert device_mod.get_device("cuda:0") == torch.device("cpu")


def test_crashing_gpu_falls_back_to_cpu(monkeypatch):
    """User story 2: the smoke workload kills its process; the caller survives and gets the CPU."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(device_mod, "call_isolated",
                        lambda target, kwargs, timeout: call_isolated("os:abort", {}, timeout=timeout))
    device_mod._VERIFIED.clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        chosen = device_mod.get_device("cuda:0")
    device_mod._VERIFIED.clear()
    assert chosen == torch.device("cpu")
    assert any("CRASH" in str(w.message) and "SIGABRT" in str(w.message) for w in caught), [str(w.message) for w in caught]


def test_smoke_workload_is_right_on_cpu():
    errors = device_mod.smoke("cpu")
    assert set(errors) == {"matmul", "conv2d", "softmax", "train_step"}
    assert all(v < 1e-4 for v in errors.values()), errors


def test_bad_argument():
    with pytest.raises(TypeError, match="prefer"):
        device_mod.get_device(3)
