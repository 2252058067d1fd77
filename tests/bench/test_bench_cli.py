"""`gpuparity bench` on the CPU: the tables and JSON it writes, CUDA-graph modes that say why
they did not run, and usage errors. (Speed itself is measured on GPUs, under benchmarks/.)"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest


def bench(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "gpuparity", "bench", *args], capture_output=True, text=True,
                          timeout=timeout)


def test_norm_bench_writes_rows_and_skips_graph_modes_on_the_cpu(tmp_path):
    out, md = tmp_path / "norm.json", tmp_path / "norm.md"
    proc = bench("norm", "--ops", "rms,ln", "--shapes", "33x96", "--backends", "torch,eager",
                 "--modes", "fwd,fwd+bwd,fwd+bwd:graph", "--rep-ms", "2", "--no-ceilings",
                 "--json", str(out), "--md", str(md))
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = json.loads(out.read_text())["rows"]
    assert {(r["shape"], r["mode"]) for r in rows} == {
        (f"{op} 33x96", mode) for op in ("rms", "ln") for mode in ("fwd", "fwd+bwd", "fwd+bwd:graph")}
    timed = [r for r in rows if not r["mode"].endswith(":graph")]
    assert all(r["status"] == "ok" and r["time_ms"] > 0 and r["gbps"] > 0 for r in timed)
    graphs = [r for r in rows if r["mode"].endswith(":graph")]
    assert all(r["status"] == "skip" and "CUDA graphs need a GPU" in r["reason"] for r in graphs)
    assert "| rms 33x96 | fwd+bwd:graph |" in md.read_text()


def test_rope_and_attention_benches_run_on_the_cpu(tmp_path):
    out = tmp_path / "rope.json"
    proc = bench("rope", "--shapes", "2x2x16x8", "--backends", "eager", "--modes", "fwd+bwd", "--rep-ms", "2",
                 "--no-ceilings", "--json", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = json.loads(out.read_text())["rows"]
    assert {r["params"]["layout"] for r in rows} == {"half", "interleaved", "varlen"}
    assert all(r["status"] == "ok" for r in rows)
    md = tmp_path / "att.md"
    proc = bench("attention", "--shapes", "2,2,32,16", "--pad", "0,0.25", "--backends", "math", "--graph",
                 "--markdown", str(md))
    assert proc.returncode == 0, proc.stderr[-2000:]
    text = md.read_text()
    assert "f+b in a CUDA graph ms" in text and "| (2,2,32,16) | 0.25 | math |" in text


def test_bad_bench_arguments_are_usage_errors():
    proc = bench("norm", "--modes", "fwd,bogus", timeout=120)
    assert proc.returncode == 2 and "--modes" in proc.stderr and "bogus" in proc.stderr
    proc = bench("attention", "--shapes", "nope", timeout=120)
    assert proc.returncode == 2 and "unknown shape 'nope'" in proc.stderr


def test_time_row_times_each_mode_and_turns_a_raising_peer_into_an_error_row():
    import torch
    from gpuparity.bench import common
    calls = []

    def make_step():
        calls.append("built")
        return lambda: calls.append("step")
    rows = {mode: common.BenchRow("x", "s", "b", "float32", mode) for mode in ("fwd", "fwd+bwd", "fwd:graph")}
    for mode, row in rows.items():
        common.time_row(row, mode, torch.device("cpu"), 1.0, lambda: None, make_step, 1000, 3000)
    assert rows["fwd"].gbps * rows["fwd"].time_ms == pytest.approx(1000 / 1e6)
    assert rows["fwd+bwd"].gbps * rows["fwd+bwd"].time_ms == pytest.approx(3000 / 1e6) and calls[0] == "built"
    assert rows["fwd:graph"].status == "skip" and rows["fwd:graph"].time_ms is None
    broken = common.BenchRow("x", "s", "b", "float32", "fwd")
    common.time_row(broken, "fwd", torch.device("cpu"), 1.0, lambda: 1 / 0, make_step, 1, 1)
    assert broken.status == "error" and "ZeroDivisionError" in broken.reason
