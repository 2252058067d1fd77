"""Tables of `gpuparity bench` results: rich for the terminal, markdown and JSON files. Attention
has its own layout (times, TFLOP/s, memory per backend row); the GB/s benches (norm, rope)
share one (a GB/s column per backend)."""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

from rich.console import Console
from rich.table import Table

from ..bench.attention import GRAPH_MODE, NOTES, target_summary
from ..bench.common import OURS, BenchResult, BenchRow, summarise
from ..checks.results import clip
from .files import write_json, write_text


def _fmt(value, spec="{:.3f}"):
    return "-" if value is None else spec.format(value)


def render_terminal(result: BenchResult, console: Optional[Console] = None) -> None:
    """Print the result's table (and attention's targets, or the GB/s benches' skip reasons)."""
    if result.bench == "attention":
        console = console or Console(width=max(140, Console().width))
        _attention_terminal(result.rows, console)
    else:
        console = console or Console()
        _gbps_terminal(result, console)
    if result.meta.get("partial"):
        console.print(f"[bold red]{partial_note(result)}[/]")


def partial_note(result: BenchResult) -> str:
    """The line under an interrupted bench's table: what it holds and what did not run."""
    return (f"partial: interrupted by {result.meta.get('interrupted') or 'SIGINT'}; {len(result.rows)} rows finished "
            f"and are shown, the rest did not run")


def markdown(result: BenchResult) -> str:
    if result.bench == "attention":
        text = _attention_markdown(result.rows, result.meta)
    else:
        text = _gbps_markdown(result.title, result.rows, result.meta, result.backends)
    return text + (f"\n_{partial_note(result)}_\n" if result.meta.get("partial") else "")


def write_markdown(path: str, result: BenchResult) -> str:
    return write_text(path, markdown(result))


def write_result_json(path: str, result: BenchResult) -> str:
    """The metadata (schema_version, date, command, platform, ...) and every row."""
    return write_json(path, result.as_dict())


def attention_progress(step: str, rows: Optional[List[BenchRow]]) -> str:
    """The progress line of one attention backend on one case: its label before it runs, then
    each mode's time (or why it did not run)."""
    if rows is None:
        return step
    return "  " + "  ".join(f"{r.mode} {_fmt(r.time_ms)} ms" if r.status == "ok" else
                            f"{r.mode} {r.status}: {clip(r.reason, 100)}" for r in rows)


# ----------------------------------------------------------------------------- attention
def _by_backend(rows: List[BenchRow]) -> Dict[Tuple, Dict[str, BenchRow]]:
    """(shape, pad, backend) -> {mode: row}, in the order the rows were measured."""
    by_key: Dict[Tuple, Dict[str, BenchRow]] = {}
    for r in rows:
        by_key.setdefault((r.shape, r.params.get("pad"), r.backend), {})[r.mode] = r
    return by_key


def _graph_cell(graph: Optional[BenchRow]) -> str:
    return "-" if graph is None else (_fmt(graph.time_ms) if graph.status == "ok" else graph.status)


def _attention_cells(modes: Dict[str, BenchRow]) -> List[str]:
    """fwd ms, fwd+bwd ms, host ms, graph ms, TFLOP/s (or GB/s), % of ceiling, peak MB, x math,
    rel err of one (shape, pad, backend) whose rows ran. host ms and the rest are of the main
    mode: forward+backward, or the forward where that is all (decode, --fwd-only)."""
    fwd, both = modes.get("fwd"), modes.get("fwd+bwd")
    main = both or fwd
    peak = main.peak_mem_bytes
    rate = _fmt(main.tflops, "{:.0f}") if main.tflops else _fmt(main.gbps, "{:.0f} GB/s")
    ceiling = main.params.get("of_ceiling")
    return [_fmt(fwd.time_ms if fwd else None), _fmt(both.time_ms if both else None),
            _fmt(main.params.get("host_ms")), _graph_cell(modes.get(GRAPH_MODE)), rate,
            _fmt(100 * ceiling if ceiling is not None else None, "{:.0f}%"),
            _fmt(peak / 2 ** 20 if peak is not None else None, "{:.0f}"),
            _fmt(main.params.get("speedup_vs_math"), "{:.1f}"), _fmt((fwd or both).params.get("rel_err"), "{:.1e}")]


ATTENTION_COLUMNS = ("fwd ms", "fwd+bwd ms", "host ms", "graph f+b ms", "TFLOP/s", "% ceil", "peak MB", "x math",
                     "rel err")


def _attention_markdown(rows: List[BenchRow], meta: Dict[str, object]) -> str:
    lines = [f"# Attention benchmark: {meta.get('machine', '')}", "",
             f"- date: {meta.get('date')}", f"- command: `{meta.get('command')}`"]
    ceilings = meta.get("ceilings") or {}
    if ceilings:
        lines.append(f"- ceilings measured in the same run: bf16 matmul {ceilings.get('bf16_matmul_tflops', 0):.0f} "
                     f"TFLOP/s, copy {ceilings.get('copy_tbps', 0):.2f} TB/s")
    lines += ["", "Times in ms (median of triton.testing.do_bench), forward / forward+backward; host ms = host time "
              "to issue one eager step (forward+backward, or the forward where only it runs; the backends of a case "
              "timed in interleaved rounds); TFLOP/s "
              "dense-equivalent for the dense suite, attended pairs only for window/varlen; decode: GB/s of K+V "
              "read; % ceil = of the bf16 matmul rate (of the copy rate for GB/s) measured in the run; "
              "peak = extra memory; rel err = forward vs float64 (first batch item).", "",
              "| shape (B,H,S,D) | pad | backend | fwd ms | fwd+bwd ms | host ms | f+b in a CUDA graph ms | "
              "TFLOP/s (GB/s) | % ceil | peak MB | x math f+b | rel err |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for (shape, pad, backend), modes in _by_backend(rows).items():
        any_row = modes.get("fwd") or modes.get("fwd+bwd")
        if any_row.status != "ok":
            lines.append(f"| {shape} | {pad} | {backend} | {any_row.status}: {clip(any_row.reason, 120)} |"
                         + " |" * (len(ATTENTION_COLUMNS) - 1))
            continue
        lines.append(f"| {shape} | {pad} | {backend} | " + " | ".join(_attention_cells(modes)) + " |")
    summary = target_summary(rows)
    if summary:
        lines += ["", "## Targets (triton, forward+backward), decode rows: forward", "",
                  "| shape | pad | vs best peer (>= 1) | same, in CUDA graphs | vs math (>= 10) | memory vs cuDNN (<= 1.25) "
                  "| host vs cuDNN (<= 1) | pad/dense time (<= 0.8, llm) |",
                  "|---|---|---|---|---|---|---|---|"]
        for entry in summary:
            peer = entry.get("vs_best_peer")
            peer_graph = entry.get("vs_best_peer_graph")
            lines.append("| {} | {} | {} | {} | {} | {} | {} | {} |".format(
                entry["shape"], entry["pad"],
                f"{peer:.2f}x ({entry['best_peer']})" if peer is not None else "-",
                f"{peer_graph:.2f}x ({entry['best_peer_graph']})" if peer_graph is not None else "-",
                _fmt(entry.get("vs_math"), "{:.1f}x"), _fmt(entry.get("mem_vs_cudnn"), "{:.2f}"),
                _fmt(entry.get("host_vs_cudnn"), "{:.2f}"), _fmt(entry.get("pad_vs_dense_time"), "{:.2f}")))
    for name, note in NOTES.items():
        lines.append(f"\n{name}: {note}.")
    return "\n".join(lines) + "\n"


def _attention_terminal(rows: List[BenchRow], console: Console) -> None:
    table = Table(title="gpuparity bench attention")
    for column in ("shape", "pad", "backend") + ATTENTION_COLUMNS:
        table.add_column(column, justify="left" if column in ("shape", "backend") else "right")
    for (shape, pad, backend), modes in _by_backend(rows).items():
        any_row = modes.get("fwd") or modes.get("fwd+bwd")
        if any_row.status != "ok":
            table.add_row(shape, str(pad), backend, f"[yellow]{any_row.status}[/]")
            continue
        table.add_row(shape, str(pad), backend, *_attention_cells(modes))
    console.print(table)
    for backend, reason in _not_measured(rows):
        console.print(f"[yellow]{backend}[/]: {reason}")
    for entry in target_summary(rows):
        console.print("triton {shape} pad {pad}: ".format(**entry) + ", ".join(
            f"{k} {v:.2f}" for k, v in entry.items() if isinstance(v, float) and k not in ("time_ms", "pad")))


# ----------------------------------------------------------------------------- GB/s benches
def _gbps_cells(rows: List[BenchRow], backends: Sequence[str], cell) -> List[Tuple[str, str, List[str], Dict]]:
    """(shape, mode, one cell per backend, summary entry) in the order measured; cell(row,
    backend) formats an ok row."""
    index = {(r.shape, r.mode, r.backend): r for r in rows}
    summary = {(s["shape"], s["mode"]): s for s in summarise(rows)}
    out = []
    for shape in dict.fromkeys(r.shape for r in rows):
        for mode in dict.fromkeys(r.mode for r in rows if r.shape == shape):
            cells = []
            for backend in backends:
                row = index.get((shape, mode, backend))
                cells.append("" if row is None else (cell(row, backend) if row.status == "ok" else row.status))
            out.append((shape, mode, cells, summary.get((shape, mode), {})))
    return out


def _not_measured(rows: List[BenchRow]) -> List[Tuple[str, str]]:
    return sorted({(r.backend, r.reason) for r in rows if r.status != "ok"})


def _gbps_markdown(title: str, rows: List[BenchRow], meta: Dict[str, object], backends: Sequence[str]) -> str:
    copy = (meta.get("ceilings") or {}).get("copy_tbps")
    lines = [f"# {title}", "", f"- machine: {meta.get('machine')}", f"- date: {meta.get('date')}",
             f"- command: `{meta.get('command')}`"]
    versions = meta.get("versions") or {}
    if versions:
        lines.append("- versions: " + ", ".join(f"{k} {v}" for k, v in versions.items()))
    if copy:
        lines.append(f"- measured copy bandwidth: {copy * 1000:.0f} GB/s (bytes read + written)")
    lines += ["", "Effective GB/s (time in ms); % of copy bandwidth for ours.", ""]
    lines += ["| shape | mode | " + " | ".join(backends) + " | ours / best peer |", "|" + "---|" * (len(backends) + 3)]

    def cell(row: BenchRow, backend: str) -> str:
        text = f"{row.gbps:.0f} ({row.time_ms:.3f})"
        if backend == OURS and copy:
            text += f" {100 * row.gbps / (copy * 1000):.0f}%"
        return text
    for shape, mode, cells, entry in _gbps_cells(rows, backends, cell):
        ratio = entry.get("ratio")
        versus = "" if ratio is None else f"{ratio:.2f}x vs {entry.get('best_peer')}"
        lines.append(f"| {shape} | {mode} | " + " | ".join(cells) + f" | {versus} |")
    skipped = _not_measured(rows)
    if skipped:
        lines += ["", "Not measured:"]
        lines += [f"- {backend}: {reason}" for backend, reason in skipped]
    return "\n".join(lines) + "\n"


def _gbps_terminal(result: BenchResult, console: Console) -> None:
    copy = (result.meta.get("ceilings") or {}).get("copy_tbps")
    table = Table(title=result.title + (f" - copy {copy * 1000:.0f} GB/s" if copy else ""))
    table.add_column("shape")
    table.add_column("mode")
    for backend in result.backends:
        table.add_column(backend + " GB/s", justify="right")
    table.add_column("ours / best peer", justify="right")
    for shape, mode, cells, entry in _gbps_cells(result.rows, result.backends, lambda row, _: f"{row.gbps:.0f}"):
        ratio = entry.get("ratio")
        table.add_row(shape, mode, *cells, "" if ratio is None else f"{ratio:.2f}x")
    console.print(table)
    for backend, reason in _not_measured(result.rows):
        console.print(f"[yellow]{backend}[/]: {reason}")
