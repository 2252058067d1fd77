"""`gpuparity explain SPEC`: run a model once forward and backward and list, for each attention,
norm, softmax, loss and rotary call, the backend and kernels that ran and the known issues whose
regime the call is in."""
from __future__ import annotations

import argparse

from ._common import emit_json, human_console, output_json, spec_argument

EXAMPLE = """\
SPEC is module:factory (or path/to/file.py:factory), as for `gpuparity model`:

  gpuparity explain my_models.py:factory --dtype bfloat16
  gpuparity explain benchmarks/monitor_demo.py:planted_qwen2 --device cuda --dtype bfloat16 --json -

Exit codes: 0 no call inside a confirmed known issue's regime, 1 some call is, 2 bad usage or input.
Guide: docs/monitor.md ("Which backend actually ran")."""


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "explain", help="which backend and kernel each attention / norm / rotary call of a model ran",
        description="Run a model from SPEC once, forward and backward, and list for every attention, norm, softmax, "
                    "loss and rotary call the backend that served it (SDPA's own choice included), the kernels a "
                    "profiled rerun of the call launches, and the calls inside a known issue's regime.",
        epilog=EXAMPLE, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("spec", metavar="SPEC", type=spec_argument, help="module:factory returning (model, inputs)")
    parser.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda when available, else cpu)")
    parser.add_argument("--dtype", default=None, help="float32, bfloat16, float16 or float64 (default: the factory's)")
    parser.add_argument("--seed", type=int, default=0, help="torch seed set before the factory")
    parser.add_argument("--factory-arg", action="append", default=[], metavar="KEY=VALUE",
                        help="an option for the factory (repeatable; VALUE is parsed as JSON when it can be)")
    parser.add_argument("--no-backward", action="store_true", help="forward only")
    parser.add_argument("--no-kernels", action="store_true", help="skip the profiled reruns (no kernel names)")
    parser.add_argument("--no-known", action="store_true",
                        help="do not match calls against the known-issue base (and run no probes)")
    parser.add_argument("--json", metavar="FILE", type=output_json, help="write the report as JSON ('-' for stdout)")
    parser.set_defaults(handler=handle_explain)


def _kernels_text(row) -> str:
    kernels = row.get("kernels") or {}
    parts = []
    for phase in ("forward", "backward"):
        names = kernels.get(phase)
        if names:
            shown = ", ".join(names[:3]) + (f" +{len(names) - 3}" if len(names) > 3 else "")
            parts.append(f"{phase[:3]}: {shown}")
    if row.get("kernels_error"):
        parts.append(f"rerun failed: {row['kernels_error']}")
    return "\n".join(parts)


def handle_explain(args) -> int:
    from rich.table import Table

    from ..explain_run import explain
    from ..trace import spec
    from ..trace.store import dtype_from_name
    con = human_console(args)
    device = args.device or spec.default_device()
    built = spec.build(args.spec, device=device, dtype=dtype_from_name(args.dtype) if args.dtype else None,
                       options=spec.parse_factory_args(args.factory_arg), seed=args.seed)
    report = explain(built.model, built.inputs, loss_fn=built.loss_fn, backward=not args.no_backward,
                     kernels=not args.no_kernels, known=not args.no_known)
    data = report.to_dict()
    table = Table(title=f"calls of {args.spec} on {report.device}", show_lines=True)
    for column in ("op", "backend", "calls", "dtype", "shapes", "kernels", "known issues"):
        table.add_column(column, overflow="fold")
    flagged = False
    for row in report.rows:
        marks = []
        for mark in row.get("known_issues", []):
            status = mark.get("status", "not probed")
            flagged |= status == "confirmed"
            style = "bold red" if status == "confirmed" else "yellow"
            marks.append(f"[{style}]{mark['id']} ({status})[/]: {mark['regime']}")
        shapes = " ".join(f"{k}{tuple(v)}" for k, v in row["shapes"].items())
        table.add_row(row["op"], row["backend"], str(row["calls"]), row["dtype"] or "", shapes, _kernels_text(row),
                      "\n".join(marks))
    con.print(table)
    for note in report.notes:
        con.print(f"[yellow]note:[/] {note}")
    if args.json:
        emit_json(con, args.json, data)
    return 1 if flagged else 0
