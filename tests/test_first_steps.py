"""A patched model's first steps (issue 31): gpuparity.patch hands the calls its modules will make
to checks/selection.py `prepare`, which verifies their candidates in the kept worker in the
background before the first forward; a first call waits for a verification already under way
instead of checking again, and goes before what the background has queued. Counts what runs;
no timing is asserted."""
from __future__ import annotations

import threading
import time

import pytest
import torch

import gpuparity
from gpuparity.checks import priors, selection, verdicts
from gpuparity.contracts.norms import norm_problem
from gpuparity.contracts.swiglu import swiglu_problem
from gpuparity.ops import select
from device_env import TEST_DEVICE

transformers = pytest.importorskip("transformers")


@pytest.fixture
def empty_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUPARITY_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("GPUPARITY_PROBE", "subprocess")   # checks in the kept worker, as on a GPU
    monkeypatch.setenv(selection.REFINE, "off")
    monkeypatch.delenv(selection.TRUST_UNPROBED, raising=False)
    verdicts.clear_cache()
    yield tmp_path
    assert selection.wait_prepared(600)
    assert selection.prepare_idle(60)
    verdicts.clear_cache()


@pytest.fixture
def verified(monkeypatch):
    """(op, thread name) of every verification, in order (each checks one backend in the worker)."""
    seen, real = [], selection.verify
    monkeypatch.setattr(selection, "verify", lambda op, *rest: seen.append((op, threading.current_thread().name))
                        or real(op, *rest))
    return seen


def _tiny_llama():
    """On the test device: patch() guesses nothing for a CPU model while a GPU is visible."""
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=1, vocab_size=128,
                                      max_position_embeddings=64)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).to(TEST_DEVICE)


def test_patch_verifies_the_models_first_calls_before_the_first_forward(empty_cache, verified):
    model = _tiny_llama()
    try:
        gpuparity.patch(model)
        assert selection.wait_prepared(600)
        before = list(verified)
        # every op the patched Llama calls whose prior does not start at its trusted composition
        # (on a CPU rotary's and the loss's do: checks/priors.py)
        device = torch.device(TEST_DEVICE)
        checked = {op for op in ("rms_norm", "rotary", "attention", "swiglu", "linear_cross_entropy")
                   if priors.order(op, device)[0] != "composition"}
        assert {op for op, _ in before} == checked and "attention" in checked
        assert {thread for _, thread in before} == {selection.PREPARE_THREAD}
        ids = torch.randint(0, 128, (2, 16), device=device)
        mask = torch.ones_like(ids)
        mask[1, 8:] = 0
        loss = model(input_ids=ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100)).loss
        loss.backward()
        assert torch.isfinite(loss)
        assert verified == before           # the first forward and backward found every verdict stored
    finally:
        selection.close_workers()


def test_first_calls_are_the_swapped_modules_ops_in_forward_order():
    from gpuparity.patching import first_calls
    model = _tiny_llama()
    assert len(gpuparity.patch(model))
    calls = first_calls(model)
    assert [p.op for p in calls][:5] == ["rms_norm", "rotary", "attention", "swiglu", "linear_cross_entropy"]
    assert {p.dtype for p in calls} == {torch.float32} and {p.device.type for p in calls} == {TEST_DEVICE}
    attention = [p for p in calls if p.op == "attention"]
    assert {p.kind for p in attention} == {"key_padding+causal"}      # transformers' call with an attention_mask
    assert first_calls(_tiny_llama()) == []                           # nothing swapped, nothing expected


@pytest.fixture
def in_process_checks(monkeypatch):
    """verify's checks run in this process (no worker start), under the kept worker's turn-taking
    as GPUPARITY_PROBE=subprocess has it; returns the ops in the order their checks ran, and a
    gate the first check waits on."""
    order, gate = [], threading.Event()
    real = selection.run_tasks

    def in_process(tasks, **kwargs):
        tasks = list(tasks)
        order.append(tasks[0].op)
        if len(order) == 1:
            assert gate.wait(30)
        return real(tasks, isolate=False)

    monkeypatch.setattr(selection, "run_tasks", in_process)
    monkeypatch.setattr(selection, "prestart", lambda: None)
    # a first call that waits for its verdict (the default serves it on the op's baseline
    # meanwhile: tests/test_first_calls_pending.py)
    monkeypatch.setenv(select.FIRST_CALLS, "wait")
    return order, gate


def _problems():
    x, w = torch.randn(4, 64), torch.randn(64)
    gate, up = torch.randn(4, 64), torch.randn(4, 64)
    return (norm_problem("rms_norm", x, (64,), w, None), norm_problem("layer_norm", x, (64,), w, None),
            swiglu_problem(gate, up))


def test_a_first_call_waits_for_the_verification_under_way(empty_cache, in_process_checks):
    order, gate = in_process_checks
    rms, _, _ = _problems()
    assert select.prepare([rms]) == 1
    deadline = time.monotonic() + 30
    while not order and time.monotonic() < deadline:
        time.sleep(0.01)
    threading.Timer(0.2, gate.set).start()
    assert select.resolve(rms).name == "torch"      # waited for the background's verdict
    assert order == ["rms_norm"]                     # checked once, not twice
    assert select.prepare([rms]) == 0                # queued before: not again


def test_a_first_call_goes_before_what_prepare_queued(empty_cache, in_process_checks):
    order, gate = in_process_checks
    rms, layer, swiglu = _problems()
    assert select.prepare([rms, layer]) == 2

    def release_when_the_caller_waits():
        deadline = time.monotonic() + 30
        while selection._CALLERS_WAITING[0] == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        gate.set()

    deadline = time.monotonic() + 30
    while not order and time.monotonic() < deadline:
        time.sleep(0.01)
    threading.Thread(target=release_when_the_caller_waits, daemon=True).start()
    assert select.resolve(swiglu).name == "torch"
    assert selection.wait_prepared(30)
    # the background's check under way finished; then the caller's, before the rest of the queue
    assert order == ["rms_norm", "swiglu", "layer_norm"]


def test_the_background_takes_the_worker_only_while_no_caller_waits_for_it(empty_cache, in_process_checks):
    order, gate = in_process_checks
    gate.set()
    rms, _, _ = _problems()
    with selection._TURN:
        selection._CALLERS_WAITING[0] += 1       # a first call waiting for the worker
    try:
        select.prepare([rms])
        time.sleep(0.3)
        assert order == []                        # the background waits its turn
    finally:
        with selection._TURN:
            selection._CALLERS_WAITING[0] -= 1
            selection._TURN.notify_all()
    assert selection.wait_prepared(30) and order == ["rms_norm"]


def test_a_guessed_call_starts_no_background_timing_until_its_first_call(empty_cache, in_process_checks,
                                                                         monkeypatch):
    order, gate = in_process_checks
    gate.set()
    monkeypatch.setenv(selection.REFINE, "background")
    timed = []
    monkeypatch.setattr(selection, "_refine_later", timed.append)
    rms, _, _ = _problems()
    select.prepare([rms])
    assert selection.wait_prepared(30)
    assert order == ["rms_norm"] and timed == []    # verified ahead; no timing of every backend for a guess
    select.resolve(rms)
    assert timed == [rms]                            # its first call starts it, as a first call does


def test_prepare_workers_of_their_own_check_side_by_side(empty_cache, monkeypatch):
    monkeypatch.setenv(selection.PREPARE_WORKERS, "2")
    pools, both = [], threading.Barrier(2, timeout=30)
    real = selection.run_tasks

    def in_process(tasks, **kwargs):
        tasks = list(tasks)
        pools.append((tasks[0].op, kwargs["pool"]))
        if len(pools) <= 2:
            both.wait()        # the first two checks run at the same time, or this times out
        return real(tasks, isolate=False)

    monkeypatch.setattr(selection, "run_tasks", in_process)
    assert select.prepare(list(_problems())) == 3
    assert selection.wait_prepared(60) and selection.prepare_idle(60)
    assert {op for op, _ in pools} == {"rms_norm", "layer_norm", "swiglu"}
    assert len({id(pool) for _, pool in pools[:2]}) == 2                  # a worker each
    assert all(not name.startswith("prepare-") for name in selection._POOLS)   # ended with their threads
    monkeypatch.setenv(selection.PREPARE_WORKERS, "many")
    with pytest.raises(ValueError, match=selection.PREPARE_WORKERS):
        select.prepare(list(_problems()))


def test_prepare_workers_default_to_one_per_four_cores_on_a_gpu_only(monkeypatch):
    """Unset, GPUPARITY_PREPARE_WORKERS is 0 for CPU calls (the caller's cores) and, for GPU calls,
    one worker per 4 host cores, at most MAX_DEFAULT_PREPARE_WORKERS (the first-call checks are
    mostly Triton compiles, one core each); a set value wins."""
    import dataclasses
    monkeypatch.delenv(selection.PREPARE_WORKERS, raising=False)
    on_cpu = list(_problems())
    on_gpu = [dataclasses.replace(p, device=torch.device("cuda")) for p in on_cpu]
    for cores, expected in ((2, 0), (8, 2), (16, 4), (128, selection.MAX_DEFAULT_PREPARE_WORKERS)):
        monkeypatch.setattr(selection.os, "cpu_count", lambda cores=cores: cores)
        assert selection._prepare_workers(on_cpu) == 0
        assert selection._prepare_workers(on_gpu) == expected
    monkeypatch.setenv(selection.PREPARE_WORKERS, "0")
    assert selection._prepare_workers(on_gpu) == 0
