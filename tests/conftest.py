"""Test-wide settings: the probe cache lives in a temporary folder, never in ~/.cache."""
from __future__ import annotations

import os
import sys
import tempfile

import pytest

# GPU runs of the suite (on a lent machine): GPUPARITY_TEST_DEVICE=cuda. Importing device_env
# sets TRITON_INTERPRET=1 on the CPU, before any test module can import triton.
from device_env import ON_GPU, TEST_DEVICE, check_interpreter_is_live

if not ON_GPU:
    # Two costs of Triton's interpreter that are not the kernels' work (tests/interpreter_speedups.py):
    # reductions with a kernel's own combine function one element at a time (LayerNorm's backward
    # 6 s -> under 0.2 s) and re-patching triton.language on every helper call inside a kernel.
    import interpreter_speedups
    interpreter_speedups.install()

_CACHE_PREFIX = "gpuparity-test-cache-"
if os.environ.get("PYTEST_XDIST_WORKER") and os.path.basename(
        os.environ.get("GPUPARITY_CACHE_DIR", "")).startswith(_CACHE_PREFIX):
    # pytest -n: a worker inherits the controller's environment, this folder included; each worker
    # gets a cache of its own, as a serial run has (a folder the user set is kept).
    del os.environ["GPUPARITY_CACHE_DIR"]
os.environ.setdefault("GPUPARITY_CACHE_DIR", tempfile.mkdtemp(prefix=_CACHE_PREFIX))
# The suite tests the backends auto verifies: a first call waits for its verdict and runs on the
# verified backend (by default, where checks run in a worker, it would run on the op's baseline,
# torch's own, meanwhile). tests/test_first_calls_pending.py tests the default.
os.environ.setdefault("GPUPARITY_FIRST_CALLS", "wait")


def pytest_configure(config):
    """pytest -n N: the N workers share the machine's cores, so each worker's torch takes its
    share of them, not all: N workers of all-core OpenMP teams oversubscribe the CPU, and a team
    waits on (and spins for) a thread the other worker's team took the core from. (A thread count
    can change the last bits of a float reduction on the CPU; the suite passes with either.)"""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0") or 0)
    if os.environ.get("PYTEST_XDIST_WORKER") and workers > 1:
        import torch
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        torch.set_num_threads(max(1, cores // workers))


@pytest.fixture
def test_device() -> str:
    return TEST_DEVICE


@pytest.fixture(scope="module")
def triton_interpreter_is_live():
    """For Triton kernel test modules (pytestmark = pytest.mark.usefixtures(...)): fail the module
    at once when the interpreter is not in use on the CPU."""
    check_interpreter_is_live()
    yield


@pytest.fixture(autouse=True)
def _seeded_global_rng():
    """Every test starts from the same global RNG state, whatever ran before it: a test that
    draws unseeded inputs sees the same ones on every run and in every order."""
    import torch
    torch.manual_seed(0)
    yield


@pytest.fixture(autouse=True)
def _fresh_resolutions():
    """Each test decides backends afresh: tests replace dispatch internals (verdict_for) with
    monkeypatch, which the remembered resolutions (and prepared launches) of an earlier test
    would not see."""
    from gpuparity import dispatch
    from gpuparity.backends import triton_common
    dispatch.forget()
    triton_common.clear_plans()  # prepared launches too (tests patch tile tables and families)
    yield


@pytest.fixture(autouse=True)
def _no_prepare_left_running():
    """A test that patched a model leaves `prepare`'s background threads to finish before the next
    test queues its own calls (a thread left waiting for its worker took the next test's queue)."""
    yield
    selection = sys.modules.get("gpuparity.checks.selection")
    if selection is not None and selection._PREPARE_RUNNING[0]:
        selection.wait_prepared(120)
        selection.prepare_idle(60)
