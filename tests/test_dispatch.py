"""Verified auto-selection: only backends whose probe passed here; reasons in words."""
from __future__ import annotations

import pytest
import torch

from gpuparity import dispatch
from gpuparity.dispatch import Backend, BackendUnavailable, Problem


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUPARITY_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("GPUPARITY_PROBE", "inprocess")
    dispatch.clear_cache()
    yield tmp_path
    dispatch.clear_cache()


def fast_but_wrong(x, dim=-1):
    return torch.softmax(x * 1.1, dim=dim)


def test_auto_never_picks_a_backend_that_failed_its_probe(fresh_cache, caplog):
    dispatch.register(Backend("fast_but_wrong", "softmax", fast_but_wrong, "planted"))
    try:
        problem = Problem("softmax", torch.device("cpu"), torch.float32)
        with caplog.at_level("INFO", logger="gpuparity"):
            explanation = dispatch.explain(problem)
        # the slow first probe is announced (the library logs, never prints), once
        announced = [r for r in caplog.records if "first softmax call" in r.getMessage()]
        assert len(announced) == 1 and announced[0].levelname == "WARNING"
        caplog.clear()
        dispatch.explain(problem)
        assert not [r for r in caplog.records if "first softmax call" in r.getMessage()]
        rows = {row["name"]: row for row in explanation["candidates"]}
        assert rows["fast_but_wrong"]["status"] == "failed-probe"
        assert "failed" in rows["fast_but_wrong"]["reason"]
        assert explanation["chosen"] == "torch"
        # the verdicts are cached on disk, keyed by the platform fingerprint
        assert list(fresh_cache.glob("probes-cpu-*.json"))
    finally:
        dispatch._REGISTRY["softmax"].pop("fast_but_wrong")


def test_named_backend_that_cannot_serve_raises_with_reasons(fresh_cache):
    problem = Problem("attention", torch.device("cpu"), torch.bfloat16, "key_padding",
                      (("head_dim", 64), ("has_mask", True)))
    with pytest.raises(BackendUnavailable) as info:
        dispatch.resolve(problem, "sdpa_flash")
    assert "sdpa_flash" in str(info.value) and ("GPU" in str(info.value) or "cuda" in str(info.value))
    with pytest.raises(ValueError, match="expected one of"):
        dispatch.resolve(problem, "no_such_backend")


def test_fallback_when_nothing_verified(fresh_cache, monkeypatch):
    problem = Problem("softmax", torch.device("cpu"), torch.float32)
    monkeypatch.setattr(dispatch, "probe_verdict", lambda p, b: {"passed": False, "reason": "planted"})
    assert dispatch.explain(problem)["chosen"] == "composition"
