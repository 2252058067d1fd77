"""The first backend="auto" call verifies only the candidate it would choose (ops/select.py ranks,
checks/selection.py verifies), in the order of the timings stored here or of the device family's
priors (priors.py),
and still keeps the contract: only a backend that passed here is chosen, and a confirmed known
issue still rules one out."""
from __future__ import annotations

import logging
import queue
import time

import pytest
import torch

import gpuparity
from gpuparity import dispatch
from gpuparity.registry import Backend
from gpuparity import priors
from gpuparity.checks import selection, verdicts
from gpuparity.ops import select
from gpuparity.contracts.norms import norm_problem


@pytest.fixture
def empty_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUPARITY_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("GPUPARITY_PROBE", "inprocess")
    monkeypatch.setenv(selection.REFINE, "off")
    monkeypatch.delenv(selection.TRUST_UNPROBED, raising=False)
    verdicts.clear_cache()
    yield tmp_path
    verdicts.clear_cache()


@pytest.fixture
def checks_run(monkeypatch):
    """Every check task the probe runs, in order."""
    ran = []
    real = selection.run_tasks

    def counting(tasks, **kwargs):
        tasks = list(tasks)
        ran.extend(tasks)
        return real(tasks, **kwargs)

    monkeypatch.setattr(selection, "run_tasks", counting)
    return ran


def _rms_inputs():
    return torch.randn(4, 64), torch.randn(64)


def test_a_first_auto_call_verifies_only_the_candidate(empty_cache, checks_run):
    x, w = _rms_inputs()
    out = gpuparity.rms_norm(x, (64,), w)
    assert torch.allclose(out, torch.nn.functional.rms_norm(x, (64,), w), atol=1e-5)
    first = priors.order("rms_norm", torch.device("cpu"))[0]
    assert {t.backend for t in checks_run} == {first}                      # one backend checked
    assert {t.mode for t in checks_run} == {"check"}                       # and nothing timed
    assert len(checks_run) == len(selection.first_call_cases("rms_norm", "default")) <= 8
    rows = {r["name"]: r for r in select.explain(norm_problem("rms_norm", x, (64,), w, None))["candidates"]}
    assert rows[first]["status"] == "verified"
    # the others are listed with their reasons, never checked for the choice
    assert {r["status"] for name, r in rows.items() if name != first} <= {"unchecked", "never-auto", "fallback",
                                                                          "unsupported"}
    gpuparity.rms_norm(x, (64,), w)
    assert len(checks_run) == len(selection.first_call_cases("rms_norm", "default"))   # the verdict is kept


def _planted(name, fn, monkeypatch):
    dispatch.register(Backend(name, "rms_norm", fn, "planted for a test", dtypes=(torch.float32,)))
    monkeypatch.setitem(priors.PRIORS["cpu"], "rms_norm", [name, "torch", "composition"])


def test_a_candidate_that_fails_verification_gives_way_to_the_next(empty_cache, checks_run, monkeypatch):
    def wrong(x, normalized_shape, weight=None, eps=None):
        return torch.nn.functional.rms_norm(x, normalized_shape, weight, eps) * 1.01

    _planted("planted_wrong", wrong, monkeypatch)
    try:
        x, w = _rms_inputs()
        problem = norm_problem("rms_norm", x, (64,), w, None)
        assert select.resolve(problem).name == "torch"
        assert [t.backend for t in checks_run][0] == "planted_wrong"
        assert {t.backend for t in checks_run} == {"planted_wrong", "torch"}, repr(checks_run)
        rows = {r["name"]: r for r in select.explain(problem)["candidates"]}
        assert rows["planted_wrong"]["status"] == "failed-probe"
        # a failed verdict is kept: even timed fastest, the backend is never chosen
        key = verdicts.verdict_key(problem, dispatch.get("rms_norm", "planted_wrong"))
        verdicts.store_verdicts(problem.device, {key: {**verdicts.load(verdicts.cache_path(problem.device))[key],
                                                       "time_ms": 0.001}})
        assert select.resolve(problem).name == "torch"
    finally:
        dispatch.unregister("rms_norm", "planted_wrong")


def test_a_confirmed_known_issue_still_rules_the_candidate_out(empty_cache, checks_run, monkeypatch):
    from gpuparity.known import avoid
    asked = []

    def confirmed(op, dtype, device, backends):
        asked.append(list(backends))
        return [avoid.Avoid("PLANTED-ISSUE", "rms_norm", "torch", remedy="use another backend")]

    monkeypatch.setattr(avoid, "confirmed_here", confirmed)
    x, w = _rms_inputs()
    problem = norm_problem("rms_norm", x, (64,), w, None)
    chosen = select.resolve(problem)
    assert asked == [["torch"]]                                  # the issues bearing on the candidate only
    assert chosen.name != "torch"
    rows = {r["name"]: r for r in select.explain(problem)["candidates"]}
    assert "PLANTED-ISSUE" in rows["torch"]["reason"]


@pytest.fixture
def fast_backend():
    """A second correct rms_norm backend that runs on any machine (triton serves CPU tensors only
    under the interpreter, so not on a GPU machine's CPU), ranked last by the CPU priors."""
    def fast(x, normalized_shape, weight=None, eps=None):
        return torch.nn.functional.rms_norm(x, normalized_shape, weight, eps)

    dispatch.register(Backend("planted_fast", "rms_norm", fast, "planted for a test", dtypes=(torch.float32,)))
    yield "planted_fast"
    dispatch.unregister("rms_norm", "planted_fast")


def test_stored_timings_rank_before_the_priors(empty_cache, checks_run, fast_backend):
    x, w = _rms_inputs()
    problem = norm_problem("rms_norm", x, (64,), w, None)
    stored = {verdicts.verdict_key(problem, dispatch.get("rms_norm", "torch")): {"passed": True, "reason": "", "time_ms": 9.0},
              verdicts.verdict_key(problem, dispatch.get("rms_norm", fast_backend)): {"passed": True, "reason": "", "time_ms": 1.0}}
    verdicts.store_verdicts(problem.device, stored)
    assert select.resolve(problem).name == fast_backend and checks_run == []


def test_a_slow_first_call_logs_one_info_line_and_no_warning(empty_cache, monkeypatch, caplog):
    real = selection.verify

    def slow(*args):
        time.sleep(dispatch.SLOW_RESOLUTION_S + 0.1)
        return real(*args)

    monkeypatch.setattr(selection, "verify", slow)
    x, w = _rms_inputs()
    with caplog.at_level(logging.DEBUG, logger="gpuparity"):
        gpuparity.rms_norm(x, (64,), w)
        gpuparity.rms_norm(x, (64,), w)
    said = [r for r in caplog.records if r.name.startswith("gpuparity")]
    assert [r.levelno for r in said] == [logging.INFO], [r.getMessage() for r in said]
    assert "rms_norm" in said[0].getMessage()


def test_background_timings_refine_the_choice(empty_cache, monkeypatch, fast_backend):
    monkeypatch.setenv(selection.REFINE, "background")
    # a queue and thread of this test's own: on a GPU machine earlier tests in this process queue
    # real background timings (minutes of GPU checks) that this job would otherwise wait behind
    monkeypatch.setattr(selection, "_REFINE_QUEUE", queue.Queue())
    monkeypatch.setattr(selection, "_REFINE_THREAD", None)
    monkeypatch.setattr(selection, "REFINE_QUIET_S", 0.2)   # shipped: 10 s after the last first-call check
    x, w = _rms_inputs()
    problem = norm_problem("rms_norm", x, (64,), w, None)

    def timed(op, dtype, kind, device, backends=None, **_):
        return {verdicts.verdict_key(problem, dispatch.get(op, name)): {"passed": True, "reason": "timed", "time_ms": t}
                for name, t in (("torch", 5.0), (fast_backend, 1.0))}

    monkeypatch.setattr(selection, "check_op", timed)
    assert select.resolve(problem).name == "torch"               # the prior, verified
    deadline = time.monotonic() + 30
    while select.resolve(problem).name != fast_backend and time.monotonic() < deadline:
        time.sleep(0.05)
    assert select.resolve(problem).name == fast_backend          # the timings arrived


def test_the_verification_worker_stays_alive_across_calls(empty_cache, monkeypatch):
    monkeypatch.setenv("GPUPARITY_PROBE", "subprocess")
    monkeypatch.setenv(select.FIRST_CALLS, "wait")   # each call verifies before it returns
    try:
        x, w = _rms_inputs()
        gpuparity.rms_norm(x, (64,), w)
        pid = selection._pool("verify").proc.pid
        gpuparity.layer_norm(x, (64,), w)
        assert selection._pool("verify").proc.pid == pid and selection._pool("verify").proc.poll() is None
    finally:
        selection.close_workers()


def test_a_kind_without_cases_is_verified_on_every_feature_it_uses():
    """A call kind no contract case has (attention with key padding, a window and ALiBi) is
    verified on the quick cases and, for each of its features, a case that has it: the ALiBi
    the call asks for is exercised before the candidate serves it."""
    from gpuparity.contracts import get_spec
    spec = get_spec("attention")
    kinds = {c.name: spec.kind(c.params) for c in spec.cases()}
    kind = "key_padding+window+alibi"
    assert kind not in kinds.values()
    chosen = selection.first_call_cases("attention", kind)
    for feature in ("key_padding", "window", "alibi"):
        assert any(feature in kinds[name].split("+") for name in chosen), (feature, chosen)
    assert set(selection.first_call_cases("attention", "causal")) <= {n for n, k in kinds.items() if k == "causal"}


class _PlantedVerification:
    """A verification that answers from a table and notes what the selector asked of it."""

    def __init__(self, table):
        self.table, self.asked = table, []

    def stored(self, problem, backend):
        self.asked.append(("stored", backend.name))
        return self.table.get(backend.name)

    def verdict(self, problem, backend):
        self.asked.append(("verdict", backend.name))
        return self.table.get(backend.name, {"passed": False, "reason": "planted: no verdict"})

    def prepare(self, problems, resolve):
        self.asked.append(("prepare", [resolve(p).name for p in problems]))
        return len(problems)

    def start(self):
        self.asked.append(("start",))


def test_the_selector_chooses_and_asks_verification_only_through_its_interface(monkeypatch):
    """ops/select.py ranks (stored timings, else priors), applies a confirmed known issue's veto,
    and picks; the verification it is handed only answers (a planted one here, nothing checked).
    torch is timed fastest but a regime recorded on its verdict holds this call: the selector
    fails it for this call and takes the next, while the verdict it was handed stays passing."""
    torch_verdict = {"passed": True, "reason": "planted", "time_ms": 1.0,
                     "avoid_when": [{"issue": "PLANTED-1", "when": {"hidden": 64}, "reason": "planted issue"}]}
    planted = _PlantedVerification({"torch": torch_verdict, "compile": {"passed": True, "reason": "planted",
                                                                        "time_ms": 9.0}})
    monkeypatch.setitem(priors.PRIORS["cpu"], "rms_norm", ["torch", "compile", "composition"])
    x, w = _rms_inputs()
    select.use(planted)
    try:
        problem = norm_problem("rms_norm", x, (64,), w, None)
        assert select.resolve(problem).name == "compile"
        assert ("verdict", "torch") in planted.asked and torch_verdict["passed"]   # handed back untouched
        rows = {r["name"]: r for r in select.explain(problem)["candidates"]}
        assert rows["torch"]["status"] == "failed-probe" and rows["torch"]["reason"] == "planted issue"
        wide = norm_problem("rms_norm", torch.randn(4, 32), (32,), torch.randn(32), None)
        assert select.resolve(wide).name == "torch"                                 # outside the regime
        planted.asked.clear()
        assert select.prepare([problem]) == 1 and planted.asked[0] == ("start",)
        assert planted.asked[-1] == ("prepare", ["compile"])
    finally:
        select.use(None)
