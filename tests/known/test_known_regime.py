"""A confirmed known issue with a regime (an avoid entry's `when`) rules a backend out only for
the calls inside it: SDPA-CUDNN-MASK-LSE keeps backend="auto" off cuDNN SDPA for calls that need
gradients at key length % 128 == 64 (with a mask, or without is_causal), and leaves it free for the
others."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from gpuparity import dispatch
from gpuparity.checks import selection
from gpuparity.checks.results import CheckResult, Status
from gpuparity.doctor import recommendations
from gpuparity.known import avoid
from gpuparity.known.engine import load_issues, validate_issue
from gpuparity.ops import select
from gpuparity.contracts.attention import attention_problem

ISSUE = "SDPA-CUDNN-MASK-LSE"
SDPA = ("sdpa_math", "sdpa_cudnn")


def _confirmed():
    return avoid.from_results([{"id": ISSUE, "status": "confirmed"}])


def _problem(k_len, *, mask=True, grad=True, q_len=None, causal=False):
    q = torch.zeros(1, 2, q_len or k_len, 64, dtype=torch.bfloat16, requires_grad=grad)
    k = torch.zeros(1, 2, k_len, 64, dtype=torch.bfloat16, requires_grad=grad)
    attn_mask = torch.ones(q.shape[2], k_len, dtype=torch.bool) if mask else None
    return attention_problem(q, k, k, attn_mask=attn_mask, is_causal=causal)


def test_the_entry_declares_the_regime():
    (entry,) = _confirmed()
    assert (entry.backend, entry.device_type) == ("sdpa_cudnn", "cuda")
    assert entry.regime == {"causal_without_mask": False, "requires_grad": True, "k_len_mod": [128, 64]}
    assert avoid.regime_text(entry.regime) == ("with a mask or without is_causal, gradients required, "
                                               "key length % 128 == 64")


@pytest.mark.parametrize("k_len, mask, grad, causal, inside", [
    (192, True, True, False, True), (704, True, True, False, True), (1088, True, True, False, True),
    (64, True, True, False, True), (192, True, True, True, True),  # a mask, with or without is_causal
    (192, False, True, False, True),                     # no mask, not causal: failed on an H200 too
    (192, False, True, True, False),                     # is_causal alone (SDPA's causal path) is clean
    (256, True, True, False, False), (193, True, True, False, False),   # other remainders
    (192, True, False, False, False),                    # inference
])
def test_the_regime_is_a_shape_rule_over_the_call(k_len, mask, grad, causal, inside):
    (entry,) = _confirmed()
    assert avoid.in_regime(entry.regime, _problem(k_len, mask=mask, grad=grad, causal=causal)) is inside


def test_a_key_padding_mask_or_window_counts_as_a_mask_and_no_grad_mode_as_no_gradients():
    (entry,) = _confirmed()
    q = torch.zeros(1, 2, 192, 64, dtype=torch.bfloat16, requires_grad=True)
    padding = torch.zeros(1, 192, dtype=torch.bool)
    assert avoid.in_regime(entry.regime, attention_problem(q, q, q, key_padding_mask=padding))
    assert avoid.in_regime(entry.regime, attention_problem(q, q, q, window=(8, 0)))
    with torch.no_grad():
        assert not avoid.in_regime(entry.regime, attention_problem(q, q, q, key_padding_mask=padding))


def test_stored_verdicts_keep_passing_and_carry_the_regime():
    verdicts = {"attention|sdpa_cudnn|bfloat16|bool_mask": {"passed": True, "reason": "passed 9 probe checks"}}
    avoid.apply(verdicts, _confirmed() * 2, "cuda")          # applied twice: recorded once
    verdict = verdicts["attention|sdpa_cudnn|bfloat16|bool_mask"]
    assert verdict["passed"] is True and len(verdict["avoid_when"]) == 1
    vetoed = avoid.veto(_problem(192), verdict)
    assert vetoed["passed"] is False and ISSUE in vetoed["reason"]
    assert avoid.veto(_problem(256), verdict) is verdict
    assert avoid.apply({"attention|sdpa_cudnn|bfloat16|x": {"passed": True}}, _confirmed(), "cpu") is None


@pytest.fixture
def sdpa_only(monkeypatch):
    """backend="auto" choosing among SDPA's math and cuDNN backends on this CPU machine: cuDNN made
    available here and the faster of the two, the issue confirmed (as the doctor stores it)."""
    table = {b.name: b for b in dispatch.backends("attention")}
    cudnn = dataclasses.replace(table["sdpa_cudnn"], availability=None, device_types=("cuda", "cpu"))
    monkeypatch.setattr(dispatch, "backends", lambda op: [table["sdpa_math"], cudnn, table["composition"]])
    stored = {"sdpa_math": {"passed": True, "reason": "verified", "time_ms": 1.0},
              "sdpa_cudnn": {"passed": True, "reason": "verified", "time_ms": 0.1}}
    verdicts = {f"attention|{name}|bfloat16|default": dict(v) for name, v in stored.items()}
    avoid.apply(verdicts, _confirmed(), "cuda")   # as the doctor stores them on the GPU machine
    by_backend = {key.split("|")[1]: v for key, v in verdicts.items()}
    monkeypatch.setattr(selection, "verdict_for", lambda problem, backend: by_backend[backend.name])
    # auto tries candidates fastest first (ops/select.py rank): here by the prior, cuDNN first
    from gpuparity import priors
    monkeypatch.setitem(priors.PRIORS["cpu"], "attention", ["sdpa_cudnn", "sdpa_math"])
    dispatch.forget()
    yield
    dispatch.forget()


def test_auto_keeps_cudnn_off_the_regime_and_free_outside_it(sdpa_only):
    # with every verdict asked (no rank) and through the ops layer's resolve (its rank order)
    assert dispatch.resolve(_problem(1088), "auto", verdict=select.verdict).name == "sdpa_math"
    assert dispatch.resolve(_problem(1024), "auto", verdict=select.verdict).name == "sdpa_cudnn"
    assert select.resolve(_problem(192), "auto").name == "sdpa_math"              # in the regime
    assert select.resolve(_problem(256), "auto").name == "sdpa_cudnn"             # Sk % 128 == 0
    assert select.resolve(_problem(192, mask=False), "auto").name == "sdpa_math"   # no mask, not causal
    assert select.resolve(_problem(192, mask=False, causal=True), "auto").name == "sdpa_cudnn"  # is_causal alone
    assert select.resolve(_problem(192, grad=False), "auto").name == "sdpa_cudnn"  # inference
    rows = {r["name"]: r for r in select.explain(_problem(704))["candidates"]}
    assert rows["sdpa_cudnn"]["status"] == "failed-probe" and ISSUE in rows["sdpa_cudnn"]["reason"]


def test_first_call_probe_records_the_regime(monkeypatch):
    monkeypatch.setattr(selection, "plan", lambda *a, **k: ([], []))
    monkeypatch.setattr(selection, "run_tasks", lambda *a, **k: [])
    monkeypatch.setattr(selection, "verdicts_from_results",
                        lambda results: {"attention|sdpa_cudnn|bfloat16|bool_mask": {"passed": True, "reason": "ok"}})
    on_cpu = [dataclasses.replace(a, device_type=None) for a in _confirmed()]   # this probe runs on the CPU
    monkeypatch.setattr(avoid, "confirmed_here", lambda op, dtype, device, backends: on_cpu)
    monkeypatch.setattr(selection.get_spec("attention"), "timing_params", lambda: None)
    verdicts = selection.check_op("attention", torch.bfloat16, "bool_mask", "cpu")
    verdict = verdicts["attention|sdpa_cudnn|bfloat16|bool_mask"]
    assert verdict["passed"] is True and verdict["avoid_when"][0]["issue"] == ISSUE


def test_doctor_recommendation_names_the_calls_to_keep_off_cudnn():
    results = [CheckResult(op="attention", backend=name, dtype="bfloat16", case="basic", status=Status.PASS,
                           device="cuda") for name in SDPA]
    times = {("attention", "sdpa_math", "bfloat16"): 1.0, ("attention", "sdpa_cudnn", "bfloat16"): 0.1}
    (rec,) = recommendations(results, times, _confirmed(), "cuda")
    assert rec["use"] == "sdpa_cudnn" and not rec["avoid"]
    assert ("keep sdpa_cudnn off calls with a mask or without is_causal, gradients required, key length % 128 "
            f"== 64 (known issue {ISSUE} confirmed here" in rec["text"])
    assert rec["avoid_calls"][0]["backend"] == "sdpa_cudnn"


def test_malformed_regimes_are_refused():
    entry = {issue["id"]: issue for issue in load_issues()}[ISSUE]
    bad = {**entry, "avoid": [{"op": "attention", "backend": "sdpa_cudnn", "when": {"k_len_mod": [128]}}]}
    with pytest.raises(ValueError, match=r"when.k_len_mod must be \[modulus, remainder\]"):
        validate_issue(bad)
    with pytest.raises(ValueError, match="when must be a non-empty object"):
        validate_issue({**entry, "avoid": [{"op": "attention", "backend": "sdpa_cudnn", "when": {}}]})
