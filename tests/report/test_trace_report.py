"""report/trace_report.py and the error-along-depth plots of report/plots.py: what a trace
comparison, a replay, a compile choice and a workload comparison show."""
from __future__ import annotations

from rich.console import Console

from gpuparity.report import plots, trace_report


def _row(index, key, err, passed=True, **extra):
    return {"index": index, "key": key, "type": "Linear", "what": "module", "err": err, "inherited": 1e-6,
            "allowed": 1e-4, "max_abs": err, "passed": passed, "worst_index": [0], "tensor": "out",
            "reason": "" if passed else "err > allowed", **extra}


def _comparison(diverges: bool):
    forward = [_row(0, "embed", 1e-6), _row(1, "block.attn", 5e-2 if diverges else 1e-6, passed=not diverges)]
    side = {"path": "a.pt", "device": "cuda", "dtype": "bf16", "machine": "box <1>"}
    return {"a": side, "b": dict(side, path="b.pt"), "identity": {"weights": "same", "inputs": "same"},
            "forward": forward, "backward": [], "first_forward": forward[1] if diverges else None,
            "first_backward": None, "passed": not diverges, "notes": ["a note"]}


def _record(render, *args) -> str:
    console = Console(record=True, width=220)
    render(console, *args)
    return console.export_text()


def test_comparison_names_the_first_divergent_module_or_says_they_agree():
    text = _record(trace_report.render_comparison, _comparison(True))
    assert "DIVERGES" in text and "first divergent module, forward:  block.attn (Linear): relative error 0.05" in text
    assert "note: a note" in text and "the traces diverge" in text
    text = _record(trace_report.render_comparison, _comparison(False))
    assert "no module diverges (forward)" in text and "the traces agree" in text


def test_rows_to_show_keeps_the_rows_around_the_first_divergence():
    rows = [_row(i, f"m{i}", 1e-6) for i in range(100)]
    shown = trace_report.rows_to_show(rows, rows[70], show_all=False, limit=10)
    assert [r["index"] for r in shown] == list(range(65, 75))
    assert len(trace_report.rows_to_show(rows, rows[70], show_all=True)) == 100


def test_comparison_html_is_escaped_and_has_the_svg_plot():
    page = trace_report.comparison_html(_comparison(True))
    assert page.startswith("<!doctype html>") and "box &lt;1&gt;" in page and "<svg" in page
    assert "the traces diverge" in page and "<b class='bad'>block.attn</b>" in page


def test_replay_names_the_culprit_in_terminal_and_html():
    rows = [{"index": 0, "key": "block.mlp", "type": "MLP", "err": 3e-2, "allowed": 1e-4, "status": "diverged",
             "reason": "own error too large", "deviates": "here", "max_abs": 1.0, "worst_index": [1]}]
    data = {"trace": {"path": "t.pt", "device": "cuda", "dtype": "bf16", "machine": "m"},
            "here": {"device": "cpu", "machine": "h", "spec": "s"}, "identity": "same", "forward": rows,
            "backward": [], "culprit_forward": rows[0], "culprit_backward": None, "passed": False}
    text = _record(trace_report.render_replay, data)
    assert "block.mlp (MLP): own error 0.03 > allowed 0.0001" in text
    assert "agrees with the recorded run, not with this machine" in text
    assert "a module's own computation differs" in trace_report.replay_html(data)


def test_compile_choice_and_workload_comparison_give_the_verdict():
    choice = {"referee": "eager fp64", "attempts": [
        {"backend": "inductor", "status": "wrong", "err": 0.5, "eager_err": 1e-3, "allowed": 1e-2, "seconds": 2.0,
         "reason": "wrong answer"},
        {"backend": "eager", "status": "ok", "err": 1e-3, "eager_err": 1e-3, "allowed": 1e-2, "seconds": 0.1}],
        "known_issues": ["torch-123"], "wrong_answer": True, "fell_back": True, "backend": "eager"}
    text = _record(trace_report.render_compile_choice, choice)
    assert "WRONG ANSWER" in text and "use backend='eager' (a backend gave a wrong answer)" in text
    assert "torch-123" in text
    run = {"workload": "tiny", "attn": "sdpa", "device": "cpu", "dtype": "fp32", "status": "ok", "machine": "m",
           "step_time_ms_median": 12.0}
    data = {"a": run, "b": run, "final": [{"name": "loss", "a": 1.0, "b": 1.2, "rel_diff": 0.2, "passed": False}],
            "final_tolerance": 0.05, "tracking": {"worst_rel_diff": None}, "problems": ["b diverged"],
            "passed": False}
    text = _record(trace_report.render_workload_comparison, data)
    assert "20.00%" in text and "> 5%" in text and "problem: b diverged" in text and "the runs diverge" in text


def test_error_along_depth_svg_marks_diverging_calls_and_png_is_written(tmp_path):
    rows = _comparison(True)["forward"]
    svg = plots.error_along_depth_svg(rows, "forward <A>")
    assert svg.startswith("<svg") and "forward &lt;A&gt;" in svg
    assert svg.count("<circle") == 1 and "<title>block.attn</title>" in svg
    assert "nothing compared" in plots.error_along_depth_svg([], "empty")
    path = plots.error_along_depth_png([("forward", rows, rows[1])], str(tmp_path / "depth.png"), "t")
    assert open(path, "rb").read(4) == b"\x89PNG"
