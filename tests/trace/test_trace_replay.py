"""trace.replay: each module's own error on the recorded inputs; the planted module is named."""
from __future__ import annotations

import os

import pytest
import torch

from gpuparity import trace
from gpuparity.trace.store import TraceMismatch

from trace_models import factory

SPEC = os.path.join(os.path.dirname(__file__), "trace_models.py") + ":factory"
PLANTED = "blocks.2.act"


def _record(tmp_path, name, **options):
    model, inputs = factory(**options)
    return trace.record(model, inputs, str(tmp_path / name), spec=SPEC, factory_args=options)


def test_replay_of_a_clean_trace_passes(tmp_path):
    result = trace.replay(_record(tmp_path, "good"), device="cpu")
    assert result.passed
    assert all(r.status == "ok" for r in result.forward + result.backward)
    assert result.identity == "identical"


def test_replay_names_the_module_that_was_wrong_when_recorded(tmp_path):
    bad = _record(tmp_path, "bad", bug="forward")
    result = trace.replay(bad, device="cpu", factory_args={"bug": "none"})
    culprit = result.culprit_forward
    assert culprit.key == PLANTED and culprit.deviates == "recorded"
    # the containers around it fail too (they contain it) but are not named; nothing earlier fails
    failing = [r.key for r in result.forward if r.failed]
    assert failing[0] == PLANTED and set(failing) <= {PLANTED, "blocks.2", "(model)"}
    assert result.culprit_backward.key == PLANTED


def test_replay_names_the_module_that_is_wrong_here(tmp_path):
    good = _record(tmp_path, "good")
    result = trace.replay(good, SPEC, device="cpu", factory_args={"bug": "backward"})
    assert result.culprit_forward is None
    assert result.culprit_backward.key == PLANTED
    # (no assertion on `deviates`: the float64 referee runs this machine's module code, here the
    # planted one, so it sides with this machine; it tells kernels apart, not model code)


def test_replay_in_bf16_passes(tmp_path):
    result = trace.replay(_record(tmp_path, "bf16", dtype=torch.bfloat16), device="cpu")
    assert result.passed, [(r.key, r.reason) for r in result.forward + result.backward if r.failed]


def test_replay_refuses_other_weights(tmp_path):
    good = _record(tmp_path, "good")
    with pytest.raises(TraceMismatch, match="refusing to replay"):
        trace.replay(good, device="cpu", factory_args={"weights_seed": 7})


def test_sampled_inputs_cannot_be_replayed(tmp_path):
    model, inputs = factory()
    sampled = trace.record(model, inputs, str(tmp_path / "s"), max_elements=40, spec=SPEC)
    result = trace.replay(sampled, device="cpu")
    skipped = [r for r in result.forward if r.status == "skipped"]
    assert skipped and "sampled" in skipped[0].reason


def test_replay_needs_a_spec(tmp_path):
    model, inputs = factory()
    recorded = trace.record(model, inputs, str(tmp_path / "nospec"))
    with pytest.raises(ValueError, match="SPEC"):
        trace.replay(recorded, device="cpu")
