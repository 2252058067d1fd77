"""GPUPARITY_WORKER_WARM (checks/worker.py): a worker asked to warm up has, when it says READY,
imported what its first check imports (torch's symbolic shapes, the check modules) and set up
the GPU it names; it says what it set up on its READY line, which the pool keeps."""
from __future__ import annotations

import pytest

from gpuparity.checks import worker
from gpuparity.checks.plan import plan
from gpuparity.checks.pool import WorkerPool


@pytest.mark.parametrize("value, expected", [(None, None), ("", None), ("0", None), ("1", "cuda"),
                                             ("cuda", "cuda"), ("cuda:1", "cuda:1")])
def test_the_switch_names_a_device_or_nothing(value, expected):
    assert worker.warm_target(value) == expected


def test_a_switch_that_names_no_gpu_is_refused():
    with pytest.raises(ValueError, match="GPUPARITY_WORKER_WARM.*'cpu'"):
        worker.warm_target("cpu")


def test_warm_device_without_a_gpu_sets_nothing_up():
    import torch
    if torch.cuda.is_available():
        assert set(worker.warm_device("cuda")) == {"context", "triton", "cublas", "autograd"}
    else:
        assert worker.warm_device("cuda:0") == {}


@pytest.mark.parametrize("warm", ["0", "1"])
def test_the_worker_has_imported_the_first_checks_modules_when_it_is_ready(warm):
    """Ready means ready for a first check: with the warm-up, the check modules and torch's symbolic
    shapes were imported before READY (a thread beside the device's set-up); without it, the
    symbolic shapes only (as before). Either way a check then runs."""
    pool = WorkerPool(env={worker.WARM: warm})
    try:
        assert pool.wait_ready(180)
        info = pool.ready_info
        assert info["warm"] == ("cuda" if warm == "1" else None), info
        assert "torch.fx.experimental.symbolic_shapes" in info["imported"], info
        checks = {"gpuparity.checks.execute", "gpuparity.checks.plan", "gpuparity.checks.relations"}
        if warm == "1":
            assert checks <= set(info["imported"]), info
        assert info["seconds"] > 0
        tasks, _ = plan(["rms_norm"], "quick", "cpu", ["float32"], ["torch"])
        answer = pool.run(tasks[0], 120)
        assert answer["status"] == "PASS", answer
    finally:
        pool.close()


@pytest.mark.parametrize("set_to, gpu, expected", [(None, True, {"GPUPARITY_WORKER_WARM": "1"}), (None, False, None),
                                                    ("0", True, None), ("1", True, None)])
def test_first_call_workers_warm_up_by_default_on_a_gpu_machine(monkeypatch, set_to, gpu, expected):
    """The first-call workers start warmed where there is a GPU (the first compiled steps wait for
    their first verdicts), unless the caller set the switch (then the environment says it, as is)."""
    import torch
    from gpuparity.checks import selection
    if set_to is None:
        monkeypatch.delenv(worker.WARM, raising=False)
    else:
        monkeypatch.setenv(worker.WARM, set_to)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpu)
    assert selection._warm_env() == expected
