"""trace.compare: no false alarms across dtypes; the first divergent module is the planted one."""
from __future__ import annotations

import pytest
import torch

from gpuparity import trace
from gpuparity.trace.store import TraceMismatch

from trace_models import factory

PLANTED = "blocks.2.act"


def _record(tmp_path, name, **options):
    model, inputs = factory(**options)
    return trace.record(model, inputs, str(tmp_path / name))


def _failing(rows):
    return [r.key for r in rows if not r.passed]


def test_fp32_vs_bf16_has_no_false_alarm(tmp_path):
    result = trace.compare(_record(tmp_path, "fp32"), _record(tmp_path, "bf16", dtype=torch.bfloat16))
    assert result.identity == {"weights": "equal within rounding", "inputs": "equal within rounding"}
    assert _failing(result.forward) == [] and _failing(result.backward) == []
    assert result.passed
    # the errors are real (bf16 rounding), just within the policy
    assert max(r.err for r in result.forward) > 1e-3


def test_identical_runs_agree_exactly(tmp_path):
    result = trace.compare(_record(tmp_path, "a"), _record(tmp_path, "b"))
    assert result.passed and result.identity["weights"] == "identical"
    assert all(r.err == 0 for r in result.forward)


def test_planted_forward_bug_is_the_first_divergent_module(tmp_path):
    good = _record(tmp_path, "good")
    bad = _record(tmp_path, "bad", bug="forward")
    result = trace.compare(good, bad)
    assert not result.passed
    first = result.first_forward
    assert first.key == PLANTED and first.what == "output"
    # nothing before it diverges; what comes after inherits its error and is not blamed
    before = result.forward[:first.index]
    assert before and all(r.passed for r in before)
    assert 0.04 < first.err < 0.06
    assert result.first_backward.key == PLANTED


def test_planted_backward_bug_is_named_in_the_backward(tmp_path):
    result = trace.compare(_record(tmp_path, "good"), _record(tmp_path, "bad", bug="backward"))
    assert result.first_forward is None
    assert result.first_backward.key == PLANTED
    assert _failing(result.backward)[0] == PLANTED


def test_fp32_vs_bf16_planted_bug_still_found(tmp_path):
    result = trace.compare(_record(tmp_path, "good"), _record(tmp_path, "bad", bug="forward", dtype=torch.bfloat16))
    assert result.first_forward.key == PLANTED


def test_different_weights_or_inputs_are_refused(tmp_path):
    good = _record(tmp_path, "good")
    with pytest.raises(TraceMismatch, match="refusing to compare.*different weights"):
        trace.compare(good, _record(tmp_path, "w", weights_seed=3))
    with pytest.raises(TraceMismatch, match="different inputs"):
        trace.compare(good, _record(tmp_path, "i", inputs_seed=3))


def test_sampled_traces_compare_over_the_common_sample(tmp_path):
    model, inputs = factory()
    full = trace.record(model, inputs, str(tmp_path / "full"))
    bad_model, bad_inputs = factory(bug="forward")
    sampled = trace.record(bad_model, bad_inputs, str(tmp_path / "s"), max_elements=40)
    result = trace.compare(full, sampled)
    assert result.first_forward.key == PLANTED
    # the worst element is named in the full tensor's coordinates
    assert len(result.first_forward.worst_index) == 2
