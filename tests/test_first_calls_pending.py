"""First calls do not wait for a verdict (issue 43 item 5; ops/select.py GPUPARITY_FIRST_CALLS): while
the verdict of the backend auto would choose is pending, a call is served by the op's baseline (what
torch runs for it without gpuparity), the check goes on in the background, and the calls after the
verdict is stored take the backend if it passed, never if it failed. Under torch.compile the graph
waits for the verdict. A planted verification (select.use) decides when each verdict arrives:
nothing here depends on timing."""
from __future__ import annotations

import threading

import pytest
import torch

import gpuparity
from gpuparity import dispatch, priors
from gpuparity.checks import selection, verdicts
from gpuparity.contracts.norms import norm_problem, rms_norm_composition
from gpuparity.ops import select
from gpuparity.registry import Backend

WAIT_S = 30   # a bound on waiting for a planted verdict's thread, never reached when the code is right


class _GatedVerification:
    """Verdicts from `table`, each made in a background thread that waits for `gate`: `verdict_soon`
    returns None until then (the real one starts the check in a thread too)."""

    def __init__(self, table):
        self.table, self.gate, self.asked, self.stored_now = table, threading.Event(), [], {}
        self.threads = []

    def stored(self, problem, backend):
        return self.stored_now.get(backend.name)

    def verdict(self, problem, backend):       # the waiting one
        self.asked.append(("verdict", backend.name))
        assert self.gate.wait(WAIT_S)
        self.stored_now[backend.name] = self.table[backend.name]
        return self.stored_now[backend.name]

    def verdict_soon(self, problem, backend):
        self.asked.append(("soon", backend.name))
        if backend.name in self.stored_now:
            return self.stored_now[backend.name]
        if not any(t.name == backend.name and t.is_alive() for t in self.threads):
            def check():
                if self.gate.wait(WAIT_S):
                    self.stored_now[backend.name] = self.table[backend.name]
                    dispatch.forget()              # as the verdict store does on every store
            thread = threading.Thread(target=check, name=backend.name, daemon=True)
            self.threads.append(thread)
            thread.start()
        return None

    def settle(self):
        self.gate.set()
        for thread in self.threads:
            thread.join(WAIT_S)

    def prepare(self, problems, resolve):
        return 0

    def start(self):
        pass


@pytest.fixture
def planted(monkeypatch):
    """A planted rms_norm backend ranked first on a CPU, counting its calls (its result is F.rms_norm's,
    not the composition's bit for bit: x.float() is not taken first)."""
    calls = []

    def fast(x, normalized_shape, weight=None, eps=None):
        calls.append(x.shape)
        return torch.nn.functional.rms_norm(x, normalized_shape, weight, eps)

    dispatch.register(Backend("planted_fast", "rms_norm", fast, "planted for a test", dtypes=(torch.float32,)))
    monkeypatch.setitem(priors.PRIORS["cpu"], "rms_norm", ["planted_fast", "torch", "composition"])
    monkeypatch.delenv(select.FIRST_CALLS, raising=False)
    yield calls
    dispatch.unregister("rms_norm", "planted_fast")
    select.use(None)


def _inputs():
    gen = torch.Generator().manual_seed(0)
    return torch.randn(4, 64, generator=gen), torch.randn(64, generator=gen)


PASSED = {"passed": True, "reason": "planted", "time_ms": None}
FAILED = {"passed": False, "reason": "planted: wrong"}


def test_a_pending_verdict_does_not_block_the_call_which_runs_on_the_baseline(planted):
    verification = _GatedVerification({"planted_fast": PASSED})
    select.use(verification)
    x, w = _inputs()
    out = gpuparity.rms_norm(x, (64,), w)                         # the gate is shut: a wait would hang here
    assert not verification.gate.is_set() and planted == []
    assert torch.equal(out, rms_norm_composition(x, (64,), w))    # the baseline's result, bit for bit
    assert select.baseline(norm_problem("rms_norm", x, (64,), w, None)).name == "composition"
    assert ("verdict", "planted_fast") not in verification.asked
    gpuparity.rms_norm(x, (64,), w)                                # still pending: the baseline again
    assert planted == [] and len(verification.threads) == 1        # one check, not one per call
    verification.settle()
    gpuparity.rms_norm(x, (64,), w)                                # the verdict is in: the verified backend
    assert planted == [x.shape]


def test_a_backend_whose_verdict_failed_is_never_used(planted):
    verification = _GatedVerification({"planted_fast": FAILED, "torch": PASSED})
    select.use(verification)
    x, w = _inputs()
    problem = norm_problem("rms_norm", x, (64,), w, None)
    for _ in range(3):
        assert select.resolve(problem).name == "composition"      # pending: the baseline
    verification.settle()                                          # planted_fast failed; torch is next, pending
    assert select.resolve(problem).name == "composition"
    verification.settle()
    for _ in range(3):
        assert select.resolve(problem).name == "torch"             # what a waiting first call would choose
        gpuparity.rms_norm(x, (64,), w)
    assert planted == []
    assert [name for what, name in verification.asked if what == "soon"][:1] == ["planted_fast"]


def test_waiting_first_calls_are_the_option(planted, monkeypatch):
    """GPUPARITY_FIRST_CALLS=wait: the first call waits for its verdict and runs on the verified backend."""
    monkeypatch.setenv(select.FIRST_CALLS, "wait")
    verification = _GatedVerification({"planted_fast": PASSED})
    select.use(verification)
    threading.Timer(0.05, verification.gate.set).start()
    x, w = _inputs()
    gpuparity.rms_norm(x, (64,), w)
    assert planted == [x.shape] and ("verdict", "planted_fast") in verification.asked
    monkeypatch.setenv(select.FIRST_CALLS, "later")
    with pytest.raises(ValueError, match=select.FIRST_CALLS):
        select.resolve(norm_problem("rms_norm", torch.randn(2, 8), (8,), torch.randn(8), None))


def test_a_call_no_baseline_serves_waits_for_its_verdict():
    """ALiBi: only the Triton kernels implement it, so neither SDPA nor the composition is a baseline."""
    from gpuparity.contracts.attention import attention_problem
    q = torch.randn(1, 2, 8, 16)
    problem = attention_problem(q, q, q)
    assert select.baseline(problem).name == "sdpa"                 # torch's SDPA, as an unpatched model calls it
    capped = attention_problem(q, q, q, softcap=30.0)
    assert select.baseline(capped).name == "composition"           # SDPA has no softcap
    import dataclasses
    alibi = dataclasses.replace(problem, features=problem.features + (("alibi", True),))
    assert select.baseline(alibi) is None


def test_the_sdpa_baseline_keeps_the_contract_on_empty_rows():
    from gpuparity.backends.sdpa import BASELINE
    from gpuparity.contracts.attention import composition
    q, k, v = (torch.randn(2, 2, 8, 16) for _ in range(3))
    pad = torch.zeros(2, 8, dtype=torch.bool)
    pad[1] = True                                                   # item 1's keys all padding: zeros, not NaN
    got = BASELINE.fn(q, k, v, key_padding_mask=pad, is_causal=True)
    want = composition(q, k, v, key_padding_mask=pad, is_causal=True)
    assert torch.allclose(got, want, atol=1e-5) and not got[1].any() and got[0].any()


def test_under_torch_compile_the_graph_waits_for_the_verdict(planted):
    """resolve_waiting: the traced graph gets the verified backend (a baseline baked in would stay until
    a recompilation), and the trace asks the waiting verdict, not the background one."""
    verification = _GatedVerification({"planted_fast": PASSED})
    select.use(verification)
    threading.Timer(0.05, verification.gate.set).start()
    x, w = _inputs()
    torch._dynamo.reset()
    compiled = torch.compile(lambda a, b: gpuparity.rms_norm(a, (64,), b), backend="eager", fullgraph=True)
    out = compiled(x, w)
    assert ("verdict", "planted_fast") in verification.asked
    assert ("soon", "planted_fast") not in verification.asked
    assert torch.allclose(out, torch.nn.functional.rms_norm(x, (64,), w), atol=1e-6)
    torch._dynamo.reset()


# ----------------------------------------------------------------------------- the checks side
@pytest.fixture
def checks_in_a_gated_worker(tmp_path, monkeypatch):
    """checks/selection with GPUPARITY_PROBE=subprocess (checks in a worker, as on a GPU), but each
    check run here in-process once `gate` is set; an empty verdict store."""
    monkeypatch.setenv("GPUPARITY_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("GPUPARITY_PROBE", "subprocess")
    monkeypatch.setenv(selection.REFINE, "off")
    monkeypatch.delenv(selection.TRUST_UNPROBED, raising=False)
    monkeypatch.delenv(select.FIRST_CALLS, raising=False)
    verdicts.clear_cache()
    gate, ran = threading.Event(), []
    real = selection.run_tasks

    def gated(tasks, **kwargs):
        tasks = list(tasks)
        ran.extend(t.backend for t in tasks)
        assert gate.wait(WAIT_S)
        return real(tasks, isolate=False)

    monkeypatch.setattr(selection, "run_tasks", gated)
    monkeypatch.setattr(selection, "prestart", lambda: None)
    yield gate, ran
    gate.set()
    for thread in list(selection._THREADS):
        if thread.name == selection.SOON_THREAD:
            thread.join(WAIT_S)
    verdicts.clear_cache()


def test_the_checks_side_verifies_a_pending_candidate_in_the_background(checks_in_a_gated_worker):
    gate, ran = checks_in_a_gated_worker
    x, w = _inputs()
    problem = norm_problem("rms_norm", x, (64,), w, None)
    first = priors.order("rms_norm", torch.device("cpu"))[0]
    assert select.resolve(problem).name == "composition"          # the check is gated: the baseline serves
    assert torch.equal(gpuparity.rms_norm(x, (64,), w), rms_norm_composition(x, (64,), w))
    gate.set()
    for thread in list(selection._THREADS):
        if thread.name == selection.SOON_THREAD:
            thread.join(WAIT_S)
    assert select.resolve(problem).name == first                  # verified in the background, stored
    assert set(ran) == {first} and len(ran) == len(selection.first_call_cases("rms_norm", "default"))


def test_where_checks_run_in_this_process_the_first_call_verifies_at_once(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUPARITY_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("GPUPARITY_PROBE", "inprocess")
    monkeypatch.setenv(selection.REFINE, "off")
    monkeypatch.delenv(select.FIRST_CALLS, raising=False)
    verdicts.clear_cache()
    try:
        x, w = _inputs()
        problem = norm_problem("rms_norm", x, (64,), w, None)
        torch_backend = dispatch.get("rms_norm", "torch")
        assert selection.verdict_soon(problem, torch_backend)["passed"]   # checked now: no thread
        assert select.resolve(problem).name == priors.order("rms_norm", torch.device("cpu"))[0]
    finally:
        verdicts.clear_cache()


def test_a_first_call_verification_plans_its_named_cases_without_building_families(monkeypatch):
    """verify plans exactly first_call_cases (plan's cases=): building the op's families first (attention's
    covering array of triples) cost 12 s of the caller's process on an H100 host and 50 s on a loaded CPU."""
    from gpuparity.checks import families

    def no_families(*_args, **_kwargs):
        raise AssertionError("a first-call verification built the op's families")

    planned = []
    monkeypatch.setattr(families, "all_families", no_families)
    monkeypatch.setattr(selection, "run_tasks", lambda tasks, **_: planned.extend(tasks) or [])
    monkeypatch.setattr(selection, "_veto_known", lambda *_args: None)
    monkeypatch.setenv("GPUPARITY_PROBE", "inprocess")
    selection.verify("attention", torch.float32, "key_padding+causal", "cpu", "sdpa_math")
    assert sorted(t.case for t in planned) == sorted(selection.first_call_cases("attention", "key_padding+causal"))
    assert {t.backend for t in planned} == {"sdpa_math"} and {t.dtype for t in planned} == {"float32"}


def test_no_checking_worker_starts_once_the_exit_began(monkeypatch):
    """A background first-call check still waiting for the worker when the exit ended the workers
    must not start a new one while the interpreter finalizes (it fails, and its call kept the baseline)."""
    stopping = threading.Event()
    stopping.set()
    monkeypatch.setattr(selection, "_STOP", stopping)
    with pytest.raises(RuntimeError, match="exiting"):
        selection._pool("verify")
