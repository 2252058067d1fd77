"""The `gpuparity bench` tables and plots, from hand-made results: which rows and cells a user
sees, in the terminal, the markdown file, the JSON file and the PNG."""
from __future__ import annotations

import json

from rich.console import Console

from gpuparity.bench.common import BenchResult, BenchRow
from gpuparity.report import bench_table, plots


def _text(result: BenchResult) -> str:
    console = Console(record=True, width=200)
    bench_table.render_terminal(result, console)
    return console.export_text()


def _gbps_result(copy_tbps=None) -> BenchResult:
    rows = [BenchRow("norm", "rms 8x64", "triton", "bfloat16", "fwd", time_ms=0.5, gbps=300.0),
            BenchRow("norm", "rms 8x64", "torch", "bfloat16", "fwd", time_ms=1.0, gbps=150.0),
            BenchRow("norm", "rms 8x64", "liger", "bfloat16", "fwd", status="skip",
                     reason="Liger-Kernel is not importable here"),
            BenchRow("norm", "rms 8x64", "torch", "bfloat16", "fwd+bwd:graph", status="skip",
                     reason="CUDA graphs need a GPU")]
    meta = {"schema_version": 1, "machine": "test box", "date": "today", "command": "gpuparity bench norm",
            "versions": {"torch": "9.9"}, "ceilings": {"copy_tbps": copy_tbps} if copy_tbps else {}}
    return BenchResult("norm", rows, meta, ["triton", "torch", "liger"], "RMSNorm / LayerNorm, bf16, cpu")


def _attention_result() -> BenchResult:
    def row(backend, mode, ms, pad=0.25, **params):
        return BenchRow("attention", "(2,2,32,16)", backend, "bf16", mode, time_ms=ms, tflops=1.0,
                        peak_mem_bytes=2 ** 21, params={"pad": pad, **params})
    rows = [row("math", "fwd", 4.0, rel_err=1e-3), row("math", "fwd+bwd", 8.0, speedup_vs_math=1.0),
            row("cudnn", "fwd", 1.0), row("cudnn", "fwd+bwd", 2.0),
            row("triton", "fwd", 0.5, rel_err=2e-3), row("triton", "fwd+bwd", 1.0, speedup_vs_math=8.0),
            BenchRow("attention", "(2,2,32,16)", "flex", "bf16", "fwd", status="skip", reason="no GPU here",
                     params={"pad": 0.25}),
            BenchRow("attention", "(2,2,32,16)", "triton", "bf16", "fwd+bwd:graph", status="skip",
                     reason="CUDA graphs need a GPU", params={"pad": 0.25})]
    return BenchResult("attention", rows, {"schema_version": 1, "machine": "test box", "command": "c"},
                       ["math", "cudnn", "flex", "triton"], "attention bf16, key padding")


def test_gbps_terminal_table_has_a_column_per_backend_and_says_why_rows_were_skipped():
    text = _text(_gbps_result())
    assert "RMSNorm / LayerNorm, bf16, cpu" in text
    assert "triton GB/s" in text and "liger GB/s" in text
    fwd = next(line for line in text.splitlines() if "rms 8x64" in line and " fwd " in line)
    assert "300" in fwd and "150" in fwd and "skip" in fwd and "2.00x" in fwd  # ours / best peer
    assert "liger: Liger-Kernel is not importable here" in text
    assert "torch: CUDA graphs need a GPU" in text


def test_gbps_markdown_shows_percent_of_copy_bandwidth_and_the_peer_it_beats():
    text = bench_table.markdown(_gbps_result(copy_tbps=0.6))
    assert text.startswith("# RMSNorm / LayerNorm, bf16, cpu\n")
    assert "- measured copy bandwidth: 600 GB/s" in text and "- versions: torch 9.9" in text
    assert "| shape | mode | triton | torch | liger | ours / best peer |" in text
    assert "| rms 8x64 | fwd | 300 (0.500) 50% | 150 (1.000) | skip | 2.00x vs torch |" in text
    assert "| rms 8x64 | fwd+bwd:graph |  | skip |  |  |" in text
    assert "- liger: Liger-Kernel is not importable here" in text


def test_attention_tables_show_one_line_per_backend_with_skips_and_targets():
    result = _attention_result()
    text = _text(result)
    triton = next(line for line in text.splitlines() if "triton" in line and "(2,2,32,16)" in line)
    assert "0.500" in triton and "1.000" in triton and "8.0" in triton and "skip" in triton  # graph cell
    assert "flex" in text and "no GPU here" in text
    assert "vs_best_peer 2.00" in text  # the ANCHORS.md targets: cudnn 2 ms, triton 1 ms
    md = bench_table.markdown(result)
    assert "| (2,2,32,16) | 0.25 | triton | 0.500 | 1.000 | - | skip | 1 | - | 2 | 8.0 | 2.0e-03 |" in md
    assert "| (2,2,32,16) | 0.25 | flex | skip: no GPU here | | | | | | | | |" in md
    assert "## Targets (triton, forward+backward)" in md and "2.00x (cudnn)" in md
    assert "flash: ignores the mask" in md


def test_attention_progress_names_the_step_then_each_mode():
    rows = _attention_result().rows
    assert bench_table.attention_progress("bert pad 0 math", None) == "bert pad 0 math"
    line = bench_table.attention_progress("bert pad 0 math", [rows[0], rows[6]])
    assert "fwd 4.000 ms" in line and "fwd skip: no GPU here" in line


def test_bench_files_carry_schema_version_and_every_row(tmp_path):
    result = _gbps_result()
    path = bench_table.write_result_json(str(tmp_path / "sub" / "norm.json"), result)
    data = json.loads(open(path).read())
    assert data["schema_version"] == 1 and data["command"] == "gpuparity bench norm"
    assert [(r["backend"], r["mode"], r["status"]) for r in data["rows"]] == [
        (r.backend, r.mode, r.status) for r in result.rows]
    md = bench_table.write_markdown(str(tmp_path / "norm.md"), result)
    assert "| rms 8x64 | fwd |" in open(md).read()


def test_bench_png_is_written_for_both_layouts(tmp_path):
    for result in (_gbps_result(), _attention_result()):
        path = plots.bench_png(result, str(tmp_path / f"{result.bench}.png"))
        with open(path, "rb") as handle:
            assert handle.read(8) == b"\x89PNG\r\n\x1a\n"


def test_a_result_fails_only_when_a_backend_raised():
    result = _gbps_result()
    assert not result.failed  # skips are gaps, not failures
    result.rows.append(BenchRow("norm", "rms 8x64", "eager", "bfloat16", "fwd", status="error", reason="boom"))
    assert result.failed
