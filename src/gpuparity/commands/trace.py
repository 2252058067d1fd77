"""`gpuparity trace record|compare|replay`: find the module where two machines diverge."""
from __future__ import annotations

import argparse
import json
import sys

from ..report.files import write_json, write_text
from ._common import console, input_trace, output_dir, output_file, output_json, reports_user_errors, spec_argument

EXAMPLE = """\
SPEC is module:factory (or path/to/file.py:factory); the factory returns (model, inputs):

  def factory(device="cpu", dtype=torch.float32):
      torch.manual_seed(0)
      model = MyModel().eval()             # weights made on the CPU, seeded ...
      x = torch.randn(8, 128, 64)
      return model.to(device, dtype), (x.to(device, dtype),)   # ... then moved

Walkthrough: docs/diverging-runs.md"""


def _add_factory_args(parser) -> None:
    parser.add_argument("--factory-arg", action="append", default=[], metavar="KEY=VALUE",
                        help="an option for the factory (repeatable; VALUE is parsed as JSON when it can be)")


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "trace", help="record, compare and replay per-module activations to find where two machines diverge",
        description="Record a model's per-module activations and gradients on one machine, compare with another "
                    "machine's recording, and replay a recording to name the module whose own computation differs.",
        epilog=EXAMPLE, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="trace_command", metavar="ACTION")

    record = sub.add_parser("record", help="run a model once and record every module's inputs, outputs and gradients",
                            epilog=EXAMPLE, formatter_class=argparse.RawDescriptionHelpFormatter)
    record.add_argument("spec", metavar="SPEC", type=spec_argument, help="module:factory returning (model, inputs)")
    record.add_argument("--out", required=True, metavar="PATH", type=output_dir, help="the trace directory to write")
    record.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: the first GPU, else cpu)")
    record.add_argument("--dtype", default=None, help="float32, bfloat16, float16 or float64 (default: the factory's)")
    record.add_argument("--seed", type=int, default=0, help="torch seed set before the factory and the forward")
    record.add_argument("--include", action="append", default=None, metavar="PATTERN",
                        help="record only modules whose name matches (fnmatch; repeatable; the model is '(model)')")
    record.add_argument("--max-elements", type=int, default=None, metavar="N",
                        help="store at most N elements per tensor (a fixed sample, the same on every machine); "
                             "replay needs full tensors")
    record.add_argument("--no-grads", action="store_true", help="forward only")
    _add_factory_args(record)
    record.set_defaults(handler=reports_user_errors(handle_record))

    compare = sub.add_parser("compare", help="compare two traces module by module (B against A)")
    compare.add_argument("a", metavar="A", type=input_trace, help="the reference trace")
    compare.add_argument("b", metavar="B", type=input_trace, help="the trace to check")
    compare.add_argument("--json", metavar="FILE", type=output_json, help="write the comparison as JSON ('-' for stdout)")
    compare.add_argument("--html", metavar="FILE", type=output_file, help="write a self-contained HTML report with the plot")
    compare.add_argument("--plot", metavar="FILE.png", type=output_file, help="plot the error along depth (needs matplotlib)")
    compare.add_argument("--all", action="store_true", help="show every row")
    compare.set_defaults(handler=handle_compare)

    replay = sub.add_parser("replay", help="run each recorded module on this machine with the recorded inputs")
    replay.add_argument("trace", metavar="A", type=input_trace, help="the trace to replay")
    replay.add_argument("--spec", default=None, type=spec_argument, help="module:factory (default: the SPEC the trace was recorded with)")
    replay.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: the first GPU, else cpu)")
    replay.add_argument("--no-referee", action="store_true", help="skip the float64 replay of each module")
    replay.add_argument("--no-grads", action="store_true", help="forward only")
    _add_factory_args(replay)
    replay.add_argument("--json", metavar="FILE", type=output_json, help="write the replay as JSON ('-' for stdout)")
    replay.add_argument("--html", metavar="FILE", type=output_file, help="write a self-contained HTML report")
    replay.add_argument("--plot", metavar="FILE.png", type=output_file, help="plot each module's own error (needs matplotlib)")
    replay.add_argument("--all", action="store_true", help="show every row")
    replay.set_defaults(handler=reports_user_errors(handle_replay))
    parser.set_defaults(handler=lambda args: (parser.print_help(), 2)[1])


def _plot_or_usage(path):
    if path:
        from ..report.plots import require_matplotlib
        require_matplotlib()


def handle_record(args) -> int:
    import torch
    from ..trace import record, spec
    from ..trace.store import dtype_from_name
    device = args.device or spec.default_device()
    dtype = dtype_from_name(args.dtype) if args.dtype else None
    options = spec.parse_factory_args(args.factory_arg)
    built = spec.build(args.spec, device=device, dtype=dtype, options=options, seed=args.seed)
    trace = record(built.model, built.inputs, args.out, grads=not args.no_grads, include=args.include,
                   max_elements=args.max_elements, seed=args.seed, loss_fn=built.loss_fn, spec=args.spec,
                   factory_args=options)
    con = console()
    size = sum(int(torch.tensor(m["shape"]).prod()) if m["shape"] else 1 for m in trace.tensor_meta.values())
    con.print(f"recorded {len(trace.calls)} module calls, {len(trace.tensor_meta)} tensors "
              f"(~{size:,} elements) on {trace.device} in {trace.dtype} to {args.out}")
    for note in trace.meta.get("notes", []):
        con.print(f"[yellow]note:[/] {note}")
    return 0


def _emit(args, data, render, html_fn, con) -> None:
    if args.json == "-":
        print(json.dumps(data, indent=1, default=str))
    else:
        render(con, data, show_all=args.all)
        if args.json:
            write_json(args.json, data)
            con.print(f"[dim]wrote {args.json}[/]")
    if args.html:
        write_text(args.html, html_fn(data))
        if args.json != "-":
            con.print(f"[dim]wrote {args.html}[/]")


def _verdict_command(args, command: str, run, render, html_fn, plot_panels) -> int:
    """compare and replay: refuse --plot without matplotlib, run, show/write the data, draw the
    plot; 2 for a usage error or a trace that cannot be read or paired, else the verdict."""
    from ..report import plots
    from ..trace.store import TraceCorrupt, TraceMismatch
    try:
        _plot_or_usage(args.plot)
    except plots.PlotUnavailable as exc:
        print(f"gpuparity trace {command}: error: {exc}", file=sys.stderr)
        return 2
    con = console()
    try:
        result = run()
    except (TraceMismatch, TraceCorrupt) as exc:
        print(f"gpuparity trace {command}: error: {exc}", file=sys.stderr)
        return 2
    data = result.to_dict()
    _emit(args, data, render, html_fn, con)
    if args.plot:
        panels, title = plot_panels(data)
        plots.error_along_depth_png(panels, args.plot, title)
        if args.json != "-":
            con.print(f"[dim]wrote {args.plot}[/]")
    return 0 if result.passed else 1


def handle_compare(args) -> int:
    from ..report.trace_report import comparison_html, render_comparison
    from ..trace import compare

    def panels(data):
        return ([("forward: relative error of B against A", data["forward"], data["first_forward"]),
                 ("backward (own backward of each call)", data["backward"], data["first_backward"])],
                f"{data['a']['path']} vs {data['b']['path']}")
    return _verdict_command(args, "compare", lambda: compare(args.a, args.b), render_comparison, comparison_html,
                            panels)


def handle_replay(args) -> int:
    from ..report.trace_report import render_replay, replay_html
    from ..trace import replay, spec

    def run():
        return replay(args.trace, args.spec, device=args.device, factory_args=spec.parse_factory_args(args.factory_arg),
                      referee=not args.no_referee, grads=not args.no_grads)

    def panels(data):
        out = []
        for direction in ("forward", "backward"):
            rows = [dict(r, passed=r["status"] != "diverged") for r in data[direction]]
            culprit = data[f"culprit_{direction}"]
            first = next((r for r in rows if culprit and r["key"] == culprit["key"]), None)
            out.append((f"{direction}: each module's own error, here vs recorded", rows, first))
        return out, f"replay of {data['trace']['path']} on {data['here']['device']}"
    return _verdict_command(args, "replay", run, render_replay, replay_html, panels)
