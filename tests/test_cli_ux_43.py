"""Issue 43 item 4, what a new user tripped on: `bench` on a CPU (CPU-sized shapes, an estimate
before it starts, the rows finished so far on Ctrl-C), get_device validating like the CLI, counts
that leave the skips out, reasons cut between words, the workload's attention backend named, the
Apptainer definition naming its own file, and help texts without a literal %%."""
from __future__ import annotations

import argparse
import json
import os
import signal
import types

import pytest
import torch
from rich.console import Console

from gpuparity import cli
from gpuparity.checks.results import CheckResult, Status


def _interrupt_self():
    # what Ctrl-C does: SIGINT to this process; cli.main's handler raises Interrupted(SIGINT)
    os.kill(os.getpid(), signal.SIGINT)


# --------------------------------------------------------------------------- 1. bench on a CPU
def test_attention_defaults_to_cpu_sized_shapes_on_a_cpu_and_docs_shapes_on_a_gpu():
    from gpuparity.commands.bench.attention import suite_shapes
    cpu = suite_shapes(["dense", "window", "varlen", "decode"], None, 8, cpu=True)
    for suite, shapes in cpu.items():
        for label, (batch, heads, seq, head_dim) in shapes:
            per_forward = 4.0 * batch * heads * seq * (1 if suite == "decode" else seq) * head_dim
            assert per_forward < 1e9, f"{suite} {label}: {per_forward / 1e9:.1f} GFLOP per forward on a CPU"
    gpu = suite_shapes(["dense"], None, 8, cpu=False)
    assert any(label.startswith("llm-4k") for label, _ in gpu["dense"])
    named = suite_shapes(["dense"], "llm-4k", 8, cpu=True)      # shapes named: they run, CPU or not
    assert [label for label, _ in named["dense"]] == ["llm-4k (4,16,4096,64)"]


def test_attention_bench_says_its_estimate_before_it_starts(tmp_path, capsys):
    out = tmp_path / "att.json"
    code = cli.main(["bench", "attention", "--pad", "0", "--backends", "fa2", "--fwd-only", "--no-error",
                     "--device", "cpu", "--json", str(out)])
    err = capsys.readouterr().err
    assert code == 0, err[-2000:]
    estimate = err.index("gpuparity bench attention: 2 shapes x 1 pads x 1 backends x 1 modes: 2 measurements on cpu, "
                         "about ")
    assert estimate < err.index("fa2")              # said before the first backend runs
    rows = json.loads(out.read_text())["rows"]
    assert {row["shape"].split()[0] for row in rows} == {"cpu-s", "cpu-m"}


def test_the_estimate_grows_with_shapes_backends_and_modes():
    from gpuparity.bench.attention import estimate_attention
    small = {"dense": [("s", (1, 2, 64, 16))]}
    large = {"dense": [("s", (1, 2, 64, 16)), ("l", (4, 16, 4096, 64))]}
    one = estimate_attention(small, [0.0], ["math"], "cpu", fwd_only=True)
    assert one["measurements"] == 1 and 0 < one["seconds"] < 5
    more = estimate_attention(large, [0.0, 0.25], ["math", "flash"], "cpu")
    assert more["measurements"] == 2 * 2 * 2 * 2
    assert more["seconds"] > 60          # llm-4k on a CPU: minutes, said before it starts


def test_ctrl_c_in_bench_attention_writes_the_rows_finished_and_exits_130(tmp_path, capsys, monkeypatch):
    from gpuparity.report import bench_table
    real = bench_table.attention_progress

    def progress(step, rows):
        if rows is None and step.endswith(" fa2"):      # math has finished: Ctrl-C now
            _interrupt_self()
        return real(step, rows)
    monkeypatch.setattr(bench_table, "attention_progress", progress)
    out, md = tmp_path / "att.json", tmp_path / "att.md"
    code = cli.main(["bench", "attention", "--shapes", "1,1,16,8", "--pad", "0", "--backends", "math,fa2",
                     "--fwd-only", "--no-error", "--device", "cpu", "--json", str(out), "--markdown", str(md)])
    captured = capsys.readouterr()
    assert code == 130, captured.err[-2000:]
    data = json.loads(out.read_text())
    assert data["partial"] is True and data["interrupted"] == "SIGINT"
    assert [(r["backend"], r["mode"], r["status"]) for r in data["rows"]] == [("math", "fwd", "ok")]
    assert "partial: interrupted by SIGINT; 1 rows finished" in md.read_text()
    assert "(1,1,16,8)" in captured.out and "math" in captured.out   # the table of what finished
    assert "interrupted by SIGINT: 1 rows finished (exit 130)" in captured.err


def test_ctrl_c_in_bench_norm_keeps_the_rows_timed_and_leaves_out_the_one_cut(tmp_path, capsys, monkeypatch):
    import torch.nn.functional as F
    from gpuparity.bench import common, norm
    real, calls = common.time_row, []
    # two plain peers (the real list imports torch.compile's stack: seconds)
    monkeypatch.setattr(norm, "norm_peers", lambda op, device: {
        name: (lambda x, w, b, eps: F.rms_norm(x, x.shape[-1:], w, eps), "") for name in ("torch", "eager")})

    def time_row(row, *args, **kwargs):
        calls.append(row.backend)
        if len(calls) == 2:           # the second backend was being timed
            _interrupt_self()
        return real(row, *args, **kwargs)
    monkeypatch.setattr(common, "time_row", time_row)
    out = tmp_path / "norm.json"
    code = cli.main(["bench", "norm", "--ops", "rms", "--shapes", "8x16", "--backends", "torch,eager",
                     "--modes", "fwd", "--rep-ms", "1", "--no-ceilings", "--device", "cpu", "--json", str(out)])
    captured = capsys.readouterr()
    assert code == 130, captured.err[-2000:]
    assert "gpuparity bench norm: 1 ops x 1 shapes x 2 backends x 1 modes: 2 measurements on cpu" in captured.err
    data = json.loads(out.read_text())
    assert data["partial"] is True
    assert [(r["backend"], r["status"]) for r in data["rows"]] == [("torch", "ok")]
    assert data["rows"][0]["time_ms"] > 0


def test_rope_and_norm_default_to_cpu_sized_shapes_on_a_cpu():
    from gpuparity.bench.names import NORM_CPU_SHAPES, NORM_SHAPES, ROPE_CPU_SHAPES, ROPE_SHAPES
    from gpuparity.commands.bench._args import default_shapes
    args = argparse.Namespace(shapes=None)
    assert default_shapes(args, "cpu", NORM_SHAPES, NORM_CPU_SHAPES) == NORM_CPU_SHAPES == args.shapes
    args = argparse.Namespace(shapes=None)
    assert default_shapes(args, torch.device("cuda"), ROPE_SHAPES, ROPE_CPU_SHAPES) == ROPE_SHAPES
    args = argparse.Namespace(shapes="2x2x16x8")
    assert default_shapes(args, "cpu", ROPE_SHAPES, ROPE_CPU_SHAPES) == "2x2x16x8"
    for text in NORM_CPU_SHAPES.split(","):
        rows, hidden = (int(p) for p in text.split("x"))
        assert rows * hidden <= 1 << 22


# --------------------------------------------------------------------------- 3. one device check
def test_get_device_refuses_a_device_it_cannot_use_before_any_work(monkeypatch):
    from gpuparity import device as device_mod

    def no_smoke(*args, **kwargs):
        raise AssertionError("the smoke test ran for a device name that cannot work")
    monkeypatch.setattr(device_mod, "call_isolated", no_smoke)
    with pytest.raises(ValueError) as caught:
        device_mod.get_device("tpu")
    message = str(caught.value)
    assert message.startswith("prefer: ") and "'tpu'" in message and "'cuda:N'" in message
    assert device_mod.get_device("cpu") == torch.device("cpu")


def test_the_cli_and_the_api_check_a_device_with_the_same_function(capsys):
    from gpuparity.device import device_name
    assert cli.main(["doctor", "--device", "tpu"]) == 2
    with pytest.raises(ValueError) as caught:
        device_name("tpu")
    assert f"gpuparity doctor: error: {caught.value}" in capsys.readouterr().err
    assert device_name("cuda") == "cuda:0" and device_name(torch.device("cuda", 1)) == "cuda:1"
    for bad in ("cuda:x", "gpu", "meta", "cuda:0 "):
        with pytest.raises(ValueError, match="device: expected"):
            device_name(bad)


# --------------------------------------------------------------------------- 4. counts without the skips
def test_battery_progress_counts_the_checks_that_run_not_the_skips():
    from gpuparity.checks import battery
    seen, cases = [], []

    def first_two(op, case):
        if case.name not in cases and len(cases) < 2:
            cases.append(case.name)
        return case.name in cases
    run = battery.run_battery(["attention"], "quick", "cpu", dtypes=["float32"], backends=["sdpa_math", "sdpa_flash"],
                              isolate=False, case_filter=first_two,
                              progress=lambda done, total, r: seen.append((done, total, r.status)))
    decided = [r for r in run.results if r.status == Status.SKIP]
    ran = len(run.results) - len(decided)
    assert decided and ran                      # sdpa_flash: skipped up front on a CPU
    assert {total for _, total, _ in seen} == {ran}
    assert seen[-1][0] == ran
    assert all(done == 0 for done, _, status in seen if status == Status.SKIP)


def test_doctor_interrupted_counts_the_checks_that_ran(tmp_path, capsys, monkeypatch):
    from gpuparity import doctor
    from gpuparity.checks.results import ResultStream
    stream = tmp_path / "results.jsonl"
    totals = []

    def result(status):
        return CheckResult(op="softmax", backend="torch", case="c", dtype="float32", device="cpu", status=status)

    def run_doctor(options, progress):
        totals.append(progress.total)
        with ResultStream(str(stream)) as sink:
            for status in (Status.SKIP, Status.SKIP, Status.SKIP, Status.PASS):
                sink.write(result(status))
        raise KeyboardInterrupt
    monkeypatch.setattr(doctor, "estimate", lambda options: {"checks": 5, "skipped": 3, "seconds": 1.0})
    monkeypatch.setattr(doctor, "run_doctor", run_doctor)
    code = cli.main(["doctor", "--device", "cpu", "--stream", str(stream), "--no-probes"])
    out = capsys.readouterr().out
    assert code == 130
    assert totals == [5]                         # the progress denominator: the checks that run
    assert "1 of 5 checks ran" in " ".join(out.split())


def test_doctor_interrupted_tells_the_checks_a_backend_declined_at_their_turn(tmp_path, capsys, monkeypatch):
    """A planned check that SKIPs when it runs (a backend declining the case) is neither "ran" nor
    missing: the interrupt line says so (the H100's --quick said "681 of 683 checks ran" with all done)."""
    from gpuparity import doctor
    from gpuparity.checks.results import ResultStream
    stream = tmp_path / "results.jsonl"

    def result(status):
        return CheckResult(op="softmax", backend="torch", case="c", dtype="float32", device="cpu", status=status)

    def run_doctor(options, progress):
        with ResultStream(str(stream)) as sink:
            for status in (Status.SKIP, Status.SKIP, Status.SKIP, Status.PASS, Status.SKIP, Status.PASS):
                sink.write(result(status))
        raise KeyboardInterrupt
    monkeypatch.setattr(doctor, "estimate", lambda options: {"checks": 5, "skipped": 2, "seconds": 1.0})
    monkeypatch.setattr(doctor, "run_doctor", run_doctor)
    code = cli.main(["doctor", "--device", "cpu", "--stream", str(stream), "--no-probes"])
    out = " ".join(capsys.readouterr().out.split())
    assert code == 130
    assert "2 of 5 checks ran, 2 more skipped when their turn came" in out


# --------------------------------------------------------------------------- 5. reasons cut between words
def test_clip_never_cuts_inside_a_number():
    from gpuparity.checks.results import clip
    text = "max error 3.1e-02 > allowed 1.0e-02 at row 7: expected -0.61234 got 0.5"
    for limit in range(10, len(text)):
        cut = clip(text, limit)
        assert len(cut) <= limit and cut.endswith("\u2026")
        assert text.startswith(cut[:-1])
        rest = text[len(cut) - 1:]
        assert not (cut[-2:-1].isdigit() and rest[:1].isdigit()), cut
        assert not cut[:-1].endswith(("-0.6", "3.1e-0", "-0.61")), cut
    assert clip(text, len(text)) == text
    assert clip("-0.61234567890123", 8) == "\u2026"      # a lone number is never cut into


def test_the_results_table_cuts_a_long_reason_between_words():
    from gpuparity.report.terminal import render_results
    why_prefix = len("c/float32: ")
    filler = "word " * ((212 - why_prefix) // 5)
    reason = filler + "x" * (212 - why_prefix - len(filler)) + " expected -0.61234567 got 0.5"
    failed = CheckResult(op="softmax", backend="torch", case="c", dtype="float32", device="cpu", status=Status.FAIL,
                         reason=reason)
    console = Console(record=True, width=400)
    render_results(console, [failed])
    shown = console.export_text()
    assert "expected\u2026" in shown or "\u2026" in shown
    assert "-0.6" not in shown


# --------------------------------------------------------------------------- 6. the workload's attention
def test_a_workload_record_names_auto_not_none(monkeypatch, tmp_path, capsys):
    import gpuparity.isolate
    from gpuparity.workloads import run
    outcome = types.SimpleNamespace(ok=True, value={"status": "ok", "error": "", "metrics": [], "final": {}})
    monkeypatch.setattr(gpuparity.isolate, "call_isolated", lambda *args, **kwargs: outcome)
    record = run("aam", steps=1, size="small", device="cpu", isolate=True)
    assert record["attn"] == "auto"
    out = tmp_path / "run.json"
    fake = dict(record, metrics=[{"time_ms": 1.0}], final={"acc": 0.5}, step_time_ms_median=1.0)
    monkeypatch.setattr("gpuparity.workloads.run", lambda *args, **kwargs: fake)
    assert cli.main(["workload", "run", "aam", "--device", "cpu", "--out", str(out)]) == 0
    line = " ".join(capsys.readouterr().out.split())
    assert "attn=auto (resolved per call)" in line and "None" not in line


# --------------------------------------------------------------------------- 7. templates and help texts
def test_the_apptainer_definition_names_the_file_it_is_written_as(tmp_path):
    target = tmp_path / "gp.def"
    assert cli.main(["template", "apptainer", "--vendor", "amd", "--out", str(target)]) == 0
    text = target.read_text()
    assert "apptainer build gp.sif gp.def" in text and "apptainer test --rocm gp.sif" in text
    assert "gpuparity.def" not in text and "gpuparity.sif" not in text
    from gpuparity.templates import apptainer_definition
    assert "apptainer build gpuparity.sif gpuparity.def" in apptainer_definition("nvidia")
    with pytest.raises(ValueError, match="filename"):
        apptainer_definition("nvidia", filename="my dir/x.def")


def _parsers(parser):
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):
                yield from _parsers(sub)


def test_no_help_text_shows_a_doubled_percent_sign():
    seen = 0
    for parser in _parsers(cli.build_parser()):
        seen += 1
        text = parser.format_help()
        assert "%%" not in text, f"{parser.prog}: {text[text.index('%%') - 60:text.index('%%') + 20]!r}"
    assert seen > 20
    apptainer = next(p for p in _parsers(cli.build_parser()) if p.prog.endswith("template apptainer"))
    assert "%test" in " ".join(apptainer.format_help().split())
