"""Verified auto-selection: only backends whose probe passed here; reasons in words."""
from __future__ import annotations

import pytest
import torch

from gpuparity import dispatch
from gpuparity.checks import selection, verdicts
from gpuparity.ops import select
from gpuparity.dispatch import Backend, BackendUnavailable, Problem


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUPARITY_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("GPUPARITY_PROBE", "inprocess")
    verdicts.clear_cache()
    yield tmp_path
    verdicts.clear_cache()


def fast_but_wrong(x, dim=-1):
    return torch.softmax(x * 1.1, dim=dim)


def test_auto_never_picks_a_backend_that_failed_its_probe(fresh_cache, monkeypatch):
    from gpuparity import priors
    dispatch.register(Backend("fast_but_wrong", "softmax", fast_but_wrong, "planted"))
    # ranked first (as if the fastest), so that a first call verifies it before torch
    monkeypatch.setitem(priors.PRIORS["cpu"], "softmax", ["fast_but_wrong", "torch"])
    try:
        problem = Problem("softmax", torch.device("cpu"), torch.float32)
        explanation = select.explain(problem)
        rows = {row["name"]: row for row in explanation["candidates"]}
        assert rows["fast_but_wrong"]["status"] == "failed-probe"
        assert "failed" in rows["fast_but_wrong"]["reason"]
        assert explanation["chosen"] == "torch"
        # the verdicts are cached on disk, keyed by the platform fingerprint
        assert list(fresh_cache.glob("probes-cpu-*.json"))
    finally:
        dispatch.unregister("softmax", "fast_but_wrong")


def test_named_backend_that_cannot_serve_raises_with_reasons(fresh_cache):
    problem = Problem("attention", torch.device("cpu"), torch.bfloat16, "key_padding",
                      (("head_dim", 64), ("has_mask", True)))
    with pytest.raises(BackendUnavailable) as info:
        select.resolve(problem, "sdpa_flash")
    assert "sdpa_flash" in str(info.value) and ("GPU" in str(info.value) or "cuda" in str(info.value))
    with pytest.raises(ValueError, match="expected one of"):
        select.resolve(problem, "no_such_backend")


def test_fallback_when_nothing_verified(fresh_cache, monkeypatch):
    problem = Problem("softmax", torch.device("cpu"), torch.float32)
    monkeypatch.setattr(selection, "verdict_for", lambda p, b: {"passed": False, "reason": "planted"})
    assert select.explain(problem)["chosen"] == "composition"


def test_fp32_verdicts_under_tf32_are_keyed_apart():
    """A verdict made with TF32 off must not serve a process that turned it on (its fp32
    kernels then run differently), nor the other way round."""
    import torch

    from gpuparity.checks.verdicts import verdict_dtype
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    before = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = False
        assert verdict_dtype("attention", torch.float32, cuda) == "float32"
        torch.backends.cuda.matmul.allow_tf32 = True
        assert verdict_dtype("attention", torch.float32, cuda) == "float32+tf32"
        assert verdict_dtype("matmul", torch.float32, cuda) == "float32+tf32"
        assert verdict_dtype("attention", torch.bfloat16, cuda) == "bfloat16"    # 16-bit: no TF32
        assert verdict_dtype("rms_norm", torch.float32, cuda) == "float32"        # no matmul inside
        assert verdict_dtype("attention", torch.float32, cpu) == "float32"        # no TF32 on CPUs
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before


def test_child_processes_get_the_callers_fp32_switches():
    import torch

    from gpuparity.isolate import TF32_ENV, apply_fp32_switches, child_env, fp32_switches
    saved = fp32_switches()
    try:
        apply_fp32_switches("matmul_tf32=1,cudnn_tf32=0")
        assert torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
        assert child_env()[TF32_ENV] == fp32_switches() == "matmul_tf32=1,cudnn_tf32=0"
    finally:
        apply_fp32_switches(saved)
    assert fp32_switches() == saved


def test_resolutions_are_remembered_until_what_decides_them_changes(fresh_cache, monkeypatch):
    """resolve() keeps its answer per problem (a training loop calls it every step) and forgets
    it when the verdicts, the registry or the switches in its key change."""
    from gpuparity import priors
    problem = Problem("softmax", torch.device("cpu"), torch.float32)
    failing = set()
    asked = []

    def verdict(p, backend):
        asked.append(backend.name)
        return {"passed": backend.name not in failing, "time_ms": 5.0}

    monkeypatch.setattr(selection, "verdict_for", verdict)
    # the planted backend is tried first once registered
    monkeypatch.setitem(priors.PRIORS["cpu"], "softmax", ["planted_fast", "torch"])
    verdicts.clear_cache()
    dispatch.backends("softmax")   # the built-in backends register (and forget()) on first use: before, not during
    verdicts.load(verdicts.cache_path(problem.device))   # so does the store's first read
    first = select.resolve(problem)
    count = len(asked)
    assert count > 0
    assert select.resolve(problem) is first and len(asked) == count      # remembered: no verdicts asked
    dispatch.register(Backend("planted_fast", "softmax", torch.softmax, "planted"))
    try:
        assert select.resolve(problem).name == "planted_fast"             # a registration is seen
        failing.add("planted_fast")
        assert select.resolve(problem).name == "planted_fast"             # still remembered
        verdicts.store_verdicts(torch.device("cpu"), {})                    # new verdicts: decide again
        assert select.resolve(problem).name != "planted_fast"
        count = len(asked)
        monkeypatch.setenv("GPUPARITY_TRUST_UNPROBED", "1")                 # part of the key
        select.resolve(problem)
        assert len(asked) > count
    finally:
        dispatch.unregister("softmax", "planted_fast")
        verdicts.clear_cache()


def test_large_calls_are_ranked_by_the_large_timing(fresh_cache, monkeypatch):
    # A backend that wins the small timing case (host-bound on a GPU) must not be picked for a
    # training-size call that another backend serves faster: the large timing ranks those.
    from gpuparity.contracts import get_spec
    from gpuparity.contracts.norms import norm_problem
    monkeypatch.setenv("GPUPARITY_TRUST_UNPROBED", "0")
    small = norm_problem("rms_norm", torch.zeros(4, 64), (64,), None, None)
    large = norm_problem("rms_norm", torch.zeros(1).expand(4096, 1024), (1024,), None, None)
    assert not get_spec("rms_norm").is_large(small) and get_spec("rms_norm").is_large(large)
    stored = {}
    for backend in dispatch.backends("rms_norm"):
        times = {"torch": (1.0, 9.0), "compile": (2.0, 3.0)}.get(backend.name, (5.0, 5.0))
        stored[verdicts.verdict_key(small, backend)] = {"passed": backend.name in ("torch", "compile"), "reason": "",
                                                      "time_ms": times[0], "time_ms_large": times[1]}
    verdicts.store_verdicts(torch.device("cpu"), stored)
    assert select.resolve(small).name == "torch"
    assert select.resolve(large).name == "compile"
    rows = {row["name"]: row for row in select.explain(large)["candidates"]}
    assert rows["compile"]["time_ms"] == 3.0 and rows["torch"]["time_ms"] == 9.0
    assert "ranked after compile (9 ms measured here)" in rows["torch"]["reason"]


def test_large_timing_cases_run_on_gpus_only():
    from gpuparity.checks.plan import timing_tasks
    keys = [("attention", "sdpa_math", "float32"), ("attention", "triton", "float32"),
            ("rms_norm", "torch", "float32"), ("rms_norm", "triton", "float32")]
    on_cpu = {(t.op, t.case) for t in timing_tasks(keys, "cpu")}
    on_gpu = {(t.op, t.case) for t in timing_tasks(keys, "cuda:0")}
    assert on_cpu == {("attention", "timing"), ("rms_norm", "timing")}
    assert on_gpu == on_cpu | {("attention", "timing-large"), ("rms_norm", "timing-large")}


REENTRY = """
import sys, threading
sys.path.insert(0, {folder!r})
from gpuparity import backends, dispatch
line = backends._LINES["softmax"]
backends.MODULES = backends.MODULES[:3] + ("planted_reentry",) + backends.MODULES[3:]
backends._LINES["softmax"] = line[:1] + ("planted_reentry",) + line[1:]
try:
    dispatch.backends("softmax")
except backends.RegistrationError as exc:
    print("refused:", "half filled" in str(exc))
backends.MODULES = tuple(m for m in backends.MODULES if m != "planted_reentry")
backends._LINES["softmax"] = line
seen = []
worker = threading.Thread(target=lambda: seen.append(len(dispatch.backends("rms_norm"))))
worker.start(); seen.append(len(dispatch.backends("rms_norm"))); worker.join()
print("seen", seen)
"""


def test_no_one_sees_the_registry_half_filled(tmp_path):
    """A module of backends.MODULES that asks for the registry at its import (it would see only the
    modules before it) is refused with RegistrationError, instead of answered from half the registry;
    two threads' first calls both see every backend (a fresh interpreter: the registry is filled once)."""
    import ast
    import subprocess
    import sys
    (tmp_path / "planted_reentry.py").write_text("from gpuparity import dispatch\nBACKENDS = dispatch.backends('softmax')\n")
    done = subprocess.run([sys.executable, "-c", REENTRY.format(folder=str(tmp_path))], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert lines[0] == "refused: True", lines
    counts = ast.literal_eval(lines[1].split(" ", 1)[1])
    assert len(counts) == 2 and counts[0] == counts[1] == len(dispatch.backends("rms_norm")), lines
