"""`gpuparity bench attention` on the CPU: host time per step beside the device time, the
window/varlen/decode suites, FlashAttention columns that skip with the import error, and the
targets (host_vs_cudnn) and ceiling fractions computed from the rows."""
from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
import torch

from gpuparity.bench import attention, attention_measure, common
from gpuparity.bench.common import BenchRow


def test_host_time_is_the_per_call_host_clock_of_back_to_back_calls():
    calls = []

    def step():
        calls.append(1)
        time.sleep(0.002)
    host = common.host_time_ms(step, calls=5, rounds=3)
    assert len(calls) == 15 and 2.0 <= host < 50.0      # ms per call, not per batch of calls, never negative
    with pytest.raises(ValueError, match="calls"):
        common.host_time_ms(step, calls=0)
    with pytest.raises(ValueError, match="rounds"):
        common.host_time_ms(step, rounds=0)


def test_host_time_is_the_median_round():
    """One slow round (a shared host's hiccup) does not move the figure."""
    sleeps = iter([0.030] * 4 + [0.002] * 8)   # round 1 slow, rounds 2-3 fast
    host = common.host_time_ms(lambda: time.sleep(next(sleeps)), calls=4, rounds=3)
    assert 2.0 <= host < 15.0


def test_interleaved_host_times_take_each_backends_rounds_in_turn():
    """Round 1 of every function, then round 2 of every function, ...: a host that slows down
    half way slows every backend alike; a function that raises is left out."""
    order = []
    slow = {"on": False}

    def make(name):
        def step():
            order.append(name)
            time.sleep(0.010 if slow["on"] else 0.002)
            if len(order) == 6:     # the host slows down after the first round of all three
                slow["on"] = True
        return step
    times = common.interleaved_host_ms({n: make(n) for n in "abc"}, calls=2, rounds=3)
    assert order == ["a", "a", "b", "b", "c", "c"] * 3
    assert set(times) == set("abc") and all(t >= 9.0 for t in times.values())   # the median round: slow for all

    def broken():
        raise RuntimeError("no second call")
    times = common.interleaved_host_ms({"a": make("a"), "broken": broken}, calls=1, rounds=2)
    assert set(times) == {"a"}
    with pytest.raises(ValueError, match="calls"):
        common.interleaved_host_ms({"a": make("a")}, calls=0)


def test_measure_puts_host_ms_on_eager_rows_and_skips_a_backend_that_cannot_run_with_its_reason():
    x = torch.ones(3, requires_grad=False)

    def slow(a):
        time.sleep(0.002)
        return a * 2
    setup = attention_measure.Setup(slow, (x,), torch.ones(3), lambda out: 0.0)
    base = dict(bench="attention", shape="s", backend="b", dtype="fp32")
    rows = attention_measure.measure(base, {"pad": 0.0}, lambda: setup, ("fwd", "fwd+bwd"), flops_fwd=1e6)
    assert [r.status for r in rows] == ["ok", "ok"]
    for row in rows:
        assert row.params["host_ms"] >= 1.5 and row.time_ms >= 1.5 and row.params["rel_err"] == 0.0
    assert rows[1].tflops == pytest.approx(rows[0].tflops * rows[0].time_ms / rows[1].time_ms * 3.5)

    def broken():
        raise ImportError("fa9: cannot import flash_attn.nine")
    skipped = attention_measure.measure(base, {}, broken, ("fwd", "fwd+bwd"))
    assert [r.status for r in skipped] == ["skip", "skip"]
    assert all(r.reason == "ImportError: fa9: cannot import flash_attn.nine" for r in skipped)


def test_run_workloads_interleaves_host_rounds_except_for_cases_that_read_over_a_gib():
    """Two backends on a small case: their host rounds alternate after both were measured; on a
    case whose forward reads more than INTERLEAVE_MAX_BYTES each backend's rounds run while it is
    measured (its kept step would keep its input copies beside the next backend's). Either way
    every eager row gets host_ms."""
    calls = []

    def workload(bytes_fwd):
        def build(name):
            def fn(a):
                calls.append(name)
                return a * 2
            return attention_measure.Setup(fn, (torch.ones(3),), None, None)
        return attention_measure.Workload("case", {"pad": 0.0}, build, bytes_fwd=bytes_fwd, forward_only=True)

    def order(bytes_fwd):
        calls.clear()
        rows = attention_measure.run_workloads([workload(bytes_fwd)], ["a", "b"], "fp32", "cpu", with_error=False)
        assert [r.backend for r in rows] == ["a", "b"] and all(r.params["host_ms"] >= 0 for r in rows)
        tail = calls[-6:]       # the host rounds come last on the CPU: one round of 3 calls each
        return tail
    assert order(1e6) == ["a"] * 3 + ["b"] * 3 and calls.index("b") < len(calls) - 6   # b measured before a's host round
    assert order(2.0 * attention_measure.INTERLEAVE_MAX_BYTES)[-3:] == ["b"] * 3
    assert calls.index("b") > calls.index("a") and "a" not in calls[calls.index("b"):]


def test_flash_columns_say_what_failed_to_import():
    for name, module in (("fa2", "flash_attn"), ("fa4", "flash_attn.cute")):
        try:
            attention_measure.flash_function(name, "flash_attn_varlen_func")
        except ImportError as exc:
            assert f"{name}: cannot import {module}" in str(exc) or "has no flash_attn_varlen_func" in str(exc)
        else:
            pytest.skip(f"{module} is installed here")


def _row(backend, mode, ms, host=None, shape="s", pad=0.25, **kw):
    params = {"pad": pad, **({"host_ms": host} if host is not None else {}), **kw.pop("params", {})}
    return BenchRow("attention", shape, backend, "bf16", mode, params=params, time_ms=ms, **kw)


def test_targets_report_host_time_against_cudnn_and_decode_against_its_best_peer():
    rows = [_row("triton", "fwd+bwd", 1.0, host=0.1), _row("cudnn", "fwd+bwd", 2.0, host=0.2),
            _row("flex", "fwd+bwd", 1.5, host=0.3),
            _row("triton", "fwd", 0.5, host=0.05, shape="d", pad=0.0, params={"suite": "decode"}),
            _row("math", "fwd", 2.0, host=0.01, shape="d", pad=0.0, params={"suite": "decode"})]
    summary = {entry["shape"]: entry for entry in attention.target_summary(rows)}
    assert summary["s"]["host_vs_cudnn"] == pytest.approx(0.5)
    assert summary["s"]["best_peer"] == "flex" and summary["s"]["vs_best_peer"] == pytest.approx(1.5)
    assert summary["d"]["vs_best_peer"] == pytest.approx(4.0) and "host_vs_cudnn" not in summary["d"]


def test_ceiling_fractions_use_the_matmul_rate_and_the_copy_rate_for_gbps_rows():
    rows = [_row("triton", "fwd", 1.0, tflops=500.0), _row("triton", "fwd", 1.0, gbps=1500.0),
            _row("flex", "fwd", None, status="skip", reason="no GPU")]
    attention.add_ceiling_fractions(rows, {"bf16_matmul_tflops": 1000.0, "copy_tbps": 3.0})
    assert rows[0].params["of_ceiling"] == pytest.approx(0.5) and rows[1].params["of_ceiling"] == pytest.approx(0.5)
    assert "of_ceiling" not in rows[2].params


def bench(*args, timeout=600):
    return subprocess.run([sys.executable, "-m", "gpuparity", "bench", "attention", *args], capture_output=True,
                          text=True, timeout=timeout)


def test_every_suite_gives_rows_on_the_cpu_with_host_time_and_reasoned_skips(tmp_path):
    out, md = tmp_path / "att.json", tmp_path / "att.md"
    proc = bench("--suite", "all", "--shapes", "2,4,32,16", "--kv-heads", "2", "--pad", "0.25", "--windows", "8",
                 "--dtype", "fp32", "--device", "cpu", "--backends", "math,triton,flex,fa4", "--json", str(out),
                 "--markdown", str(md))
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(out.read_text())
    rows = result["rows"]
    suites = {"dense": "(2,4,32,16)", "window": "(2,4,32,16) window 8", "varlen": "(2,4,32,16) varlen",
              "decode": "(2,4,32,16) decode Hkv 2"}
    for suite, label in suites.items():
        mine = [r for r in rows if r["shape"] == label]
        ok = [r for r in mine if r["status"] == "ok"]
        assert {r["backend"] for r in ok} == {"math", "triton"}, (suite, mine)
        assert all(r["params"]["host_ms"] > 0 and r["time_ms"] > 0 for r in ok)
        assert all(r["params"]["rel_err"] < 1e-4 for r in ok)
        assert all((r["gbps"] or 0) > 0 if suite == "decode" else r["tflops"] > 0 for r in ok)
        skipped = [r for r in mine if r["status"] == "skip"]
        assert {r["backend"] for r in skipped} == {"flex", "fa4"} and all(r["reason"] for r in skipped)
        assert all("flash_attn.cute" in r["reason"] for r in skipped if r["backend"] == "fa4")
    assert {r["mode"] for r in rows if "decode" in r["shape"]} == {"fwd"}
    assert result["suites"] == ["dense", "window", "varlen", "decode"]
    assert "--suite all" in result["command"] and "--kv-heads 2" in result["command"]
    text = md.read_text()
    assert "| host ms |" in text and "| (2,4,32,16) window 8 | 0.0 | fa4 | skip: ImportError: fa4: cannot import" in text


def test_bad_suite_arguments_are_usage_errors():
    proc = bench("--suite", "sparse", timeout=120)
    assert proc.returncode == 2 and "--suite" in proc.stderr and "sparse" in proc.stderr
    proc = bench("--suite", "decode", "--shapes", "1,4,64,16", "--kv-heads", "3", timeout=120)
    assert proc.returncode == 2 and "--kv-heads" in proc.stderr and "H=4" in proc.stderr
    proc = bench("--suite", "window", "--windows", "0", timeout=120)
    assert proc.returncode == 2 and "--windows" in proc.stderr
