"""Test-wide settings: the probe cache lives in a temporary folder, never in ~/.cache."""
from __future__ import annotations

import os
import tempfile

import pytest

os.environ.setdefault("GPUPARITY_CACHE_DIR", tempfile.mkdtemp(prefix="gpuparity-test-cache-"))
# GPU runs of the suite (on a lent machine): GPUPARITY_TEST_DEVICE=cuda
TEST_DEVICE = os.environ.get("GPUPARITY_TEST_DEVICE", "cpu")
# Without a GPU, Triton kernels run in its interpreter; the variable must be set before triton
# is first imported (the AOT compile test clears it in its own process).
if TEST_DEVICE == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture
def test_device() -> str:
    return TEST_DEVICE


@pytest.fixture(autouse=True)
def _seeded_global_rng():
    """Every test starts from the same global RNG state, whatever ran before it: a test that
    draws unseeded inputs sees the same ones on every run and in every order."""
    import torch
    torch.manual_seed(0)
    yield


@pytest.fixture(autouse=True)
def _fresh_resolutions():
    """Each test decides backends afresh: tests replace dispatch internals (probe_verdict) with
    monkeypatch, which the remembered resolutions (and prepared launches) of an earlier test
    would not see."""
    from gpuparity import dispatch
    from gpuparity.backends import triton_common
    dispatch.forget()
    triton_common.clear_plans()  # prepared launches too (tests patch tile tables and families)
    yield
