"""A confirmed known issue's remedy wins over a passing battery verdict: in the doctor's
recommendations, in the verdicts the doctor stores and in the first-call probe of auto."""
from __future__ import annotations

import pytest
import torch

from gpuparity import dispatch
from gpuparity.checks import selection
from gpuparity.checks.results import CheckResult, Status
from gpuparity.doctor import recommendations
from gpuparity.known import avoid
from gpuparity.known.engine import load_issues, validate_issue

LN_GRAD = avoid.Avoid("TORCH-CPU-BF16-LN-GRAD", "layer_norm", "torch", "bfloat16", "cpu", "use fp32")


def test_every_avoid_entry_names_a_registered_backend():
    entries = [(issue["id"], a) for issue in load_issues() for a in issue.get("avoid", [])]
    assert entries, "the base has avoid entries"
    for issue_id, entry in entries:
        assert dispatch.get(entry["op"], entry["backend"]), issue_id   # raises on a typo
    with pytest.raises(ValueError, match="avoid entries"):
        validate_issue({**load_issues()[0], "avoid": [{"op": "layer_norm"}]})


def test_matching_follows_op_backend_dtype_and_device():
    assert LN_GRAD.matches("layer_norm", "torch", "bfloat16", "cpu")
    assert not LN_GRAD.matches("layer_norm", "torch", "float32", "cpu")
    assert not LN_GRAD.matches("layer_norm", "torch", "bfloat16", "cuda")
    assert not LN_GRAD.matches("layer_norm", "triton", "bfloat16", "cpu")
    assert not LN_GRAD.matches("rms_norm", "torch", "bfloat16", "cpu")


def _passed(backend):
    return CheckResult(op="layer_norm", backend=backend, dtype="bfloat16", case="basic", status=Status.PASS,
                       device="cpu")


def test_recommendation_does_not_contradict_a_confirmed_issue():
    results = [_passed("torch"), _passed("composition")]
    times = {("layer_norm", "torch", "bfloat16"): 0.1, ("layer_norm", "composition", "bfloat16"): 0.5}
    plain = recommendations(results, times)[0]
    assert plain["use"] == "torch"
    ruled = recommendations(results, times, [LN_GRAD], "cpu")[0]
    assert ruled["use"] == "composition"
    assert "known issue TORCH-CPU-BF16-LN-GRAD" in ruled["text"]
    assert ruled["avoid"][0]["known_issue"] == "TORCH-CPU-BF16-LN-GRAD"


def test_stored_verdicts_are_failed_by_a_confirmed_issue():
    verdicts = {"layer_norm|torch|bfloat16|default": {"passed": True}, "layer_norm|torch|float32|default": {"passed": True}}
    avoid.apply(verdicts, [LN_GRAD], "cpu")
    assert verdicts["layer_norm|torch|bfloat16|default"]["passed"] is False
    assert "TORCH-CPU-BF16-LN-GRAD" in verdicts["layer_norm|torch|bfloat16|default"]["reason"]
    assert verdicts["layer_norm|torch|float32|default"]["passed"] is True


def test_first_call_probe_applies_confirmed_issues(monkeypatch):
    """check_op: the battery passed torch, the known issue is confirmed here: torch fails."""
    monkeypatch.setattr(selection, "plan", lambda *a, **k: ([], []))
    monkeypatch.setattr(selection, "run_tasks", lambda *a, **k: [])
    monkeypatch.setattr(selection, "verdicts_from_results",
                        lambda results: {"layer_norm|torch|bfloat16|default": {"passed": True, "reason": "planted"}})
    asked = []
    monkeypatch.setattr(avoid, "confirmed_here", lambda op, dtype, device, backends: asked.append(op) or [LN_GRAD])
    verdicts = selection.check_op("layer_norm", torch.bfloat16, "default", "cpu")
    assert asked == ["layer_norm"]
    assert verdicts["layer_norm|torch|bfloat16|default"]["passed"] is False


@pytest.mark.slow
def test_the_cpu_bf16_layer_norm_issue_is_confirmed_by_its_real_probe():
    found = avoid.confirmed_here("layer_norm", torch.bfloat16, torch.device("cpu"), ["torch", "triton"])
    assert [(a.issue, a.backend) for a in found] == [("TORCH-CPU-BF16-LN-GRAD", "torch")]
    assert avoid.confirmed_here("rms_norm", torch.bfloat16, torch.device("cpu"), ["torch"]) == []
