"""Test-wide settings: the probe cache lives in a temporary folder, never in ~/.cache."""
from __future__ import annotations

import os
import tempfile

import pytest

os.environ.setdefault("GPUPARITY_CACHE_DIR", tempfile.mkdtemp(prefix="gpuparity-test-cache-"))
# GPU runs of the suite (on a lent machine): GPUPARITY_TEST_DEVICE=cuda
TEST_DEVICE = os.environ.get("GPUPARITY_TEST_DEVICE", "cpu")


@pytest.fixture
def test_device() -> str:
    return TEST_DEVICE
