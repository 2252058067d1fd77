"""The probe decides, not the version rule: an entry that only a version range rules out is
still probed on this machine, and its probe's result is the status; the version rule only says
whether the issue was expected here."""
import os
import textwrap

import pytest

from gpuparity.known import CONFIRMED, DOES_NOT_APPLY, RULED_OUT, evaluate, load_issues
from gpuparity.known import engine
from gpuparity.known.rules import evaluate_rule
from gpuparity import platform as platform_mod


@pytest.fixture
def verdict_probes(tmp_path, monkeypatch):
    """A test-only probe module: one probe that fails, one that passes, one that cannot tell."""
    (tmp_path / "verdict_known_probes.py").write_text(textwrap.dedent("""
        def fails(device):
            return {"failed": True, "detail": "12288 non-finite grad_q values"}

        def passes(device):
            return {"failed": False, "detail": "0 non-finite values"}

        def cannot_tell(device):
            return {"failed": None, "detail": "no cuDNN kernel here"}
    """))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])))
    monkeypatch.setattr(engine, "PROBE_MODULE", "verdict_known_probes")


def _entry(rule, probe, issue_id="FIXTURE"):
    base = {issue["id"]: issue for issue in load_issues()}["SDPA-CUDNN"]
    return {**base, "id": issue_id, "rule": rule, "probe": probe, "probe_needs_gpu": False}


def _torch_range(op, bound):
    return {"torch_version": {op: bound}}


NOT_THIS_TORCH = _torch_range("<", "1.0")      # a version rule that says "not expected here"
THIS_TORCH = _torch_range(">=", "1.0")         # one that says "expected here"


def test_the_version_rule_alone_rules_the_fixture_out():
    assert not evaluate_rule(NOT_THIS_TORCH, platform_mod.current()).applies   # the rule alone rules it out


def test_version_says_no_but_probe_fails_is_confirmed(verdict_probes):
    (result,) = evaluate(issues=[_entry(NOT_THIS_TORCH, "fails")], device="cpu")
    assert result.status == CONFIRMED
    assert result.expected is False
    assert result.why[0].startswith("torch ") and " is not < 1.0" in result.why[0]
    assert engine.VERSION_ONLY_NOTE in result.why
    assert result.why[-1].startswith("probe failed here, although its version rule did not expect it here: 12288")


def test_version_says_yes_but_probe_clean_is_not_reproduced(verdict_probes):
    (result,) = evaluate(issues=[_entry(THIS_TORCH, "passes")], device="cpu")
    assert result.status == RULED_OUT
    assert result.expected is True
    assert result.why[-1] == "not reproduced here, its probe passed: 0 non-finite values"


def test_a_version_excluded_entry_whose_probe_cannot_tell_keeps_the_rule(verdict_probes):
    (result,) = evaluate(issues=[_entry(NOT_THIS_TORCH, "cannot_tell")], device="cpu")
    assert result.status == DOES_NOT_APPLY
    assert result.probe_outcome["verdict"] == "may apply"


def test_a_version_range_inside_any_of_is_still_only_a_version(verdict_probes):
    rule = {"any_of": [_torch_range("==", "0.4.0"), _torch_range("<", "1.0")]}
    (result,) = evaluate(issues=[_entry(rule, "fails")], device="cpu")
    assert result.status == CONFIRMED


def test_a_platform_clause_still_rules_out_without_probing(verdict_probes):
    """Vendor and arch are not versions: a ROCm kernel bug cannot be tested on another build."""
    other = "amd" if platform_mod.current().get("vendor") != "amd" else "nvidia"
    (result,) = evaluate(issues=[_entry({"vendor": other, **THIS_TORCH}, "fails")], device="cpu")
    assert result.status == DOES_NOT_APPLY and result.probe_outcome is None


def test_a_saved_report_is_judged_by_its_rules(verdict_probes, fixture_platform):
    report = fixture_platform("h100_cuda")
    report["torch"]["version"] = "0.9.0"
    (result,) = evaluate(report, issues=[_entry(THIS_TORCH, "fails")])
    assert result.status == DOES_NOT_APPLY and result.probe_outcome is None
