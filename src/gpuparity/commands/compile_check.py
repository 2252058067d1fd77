"""`gpuparity compile-check SPEC`: which torch.compile backend gives right answers for this
model on this machine. Exit 0: a compiled backend is safe to use, or the compilers only
refused loudly (exceptions; safe_compile falls back). Exit 1: a backend gave a wrong answer
(silent corruption: a failed check). Exit 2: bad usage."""
from __future__ import annotations

import argparse
import json

from ..report.files import write_json
from ._common import console, output_json, reports_user_errors, spec_argument, split_list


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "compile-check", help="check torch.compile backends for a model against a float64 run",
        description="Compile the model from SPEC (module:factory returning (model, inputs), as for "
                    "`gpuparity trace record`) with each backend in turn, compare with a float64 run "
                    "(compiled RMSE <= max(2 x eager RMSE, floor)) and report which one safe_compile would use. "
                    "Exit 1 when a backend gives a wrong answer.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("spec", metavar="SPEC", type=spec_argument, help="module:factory returning (model, inputs)")
    parser.add_argument("--backends", default="inductor,aot_eager,eager",
                        help="comma-separated, in order of preference (default: inductor,aot_eager,eager)")
    parser.add_argument("--mode", default=None, help="torch.compile mode (e.g. max-autotune)")
    parser.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: the first GPU, else cpu)")
    parser.add_argument("--dtype", default=None, help="float32, bfloat16, float16 (default: the factory's)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--factory-arg", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--json", metavar="FILE", type=output_json, help="write the result as JSON ('-' for stdout)")
    parser.set_defaults(handler=reports_user_errors(handle))


def handle(args) -> int:
    from .. import platform
    from ..compile import compile_check
    from ..report.trace_report import render_compile_choice
    from ..trace import spec
    from ..trace.store import dtype_from_name
    backends = split_list(args.backends)
    if not backends:
        raise ValueError("--backends: expected at least one backend name")
    device = args.device or spec.default_device()
    built = spec.build(args.spec, device=device, dtype=dtype_from_name(args.dtype) if args.dtype else None,
                       options=spec.parse_factory_args(args.factory_arg), seed=args.seed)
    kwargs = {"mode": args.mode} if args.mode else {}
    _, choice = compile_check(built.model, built.inputs, backends=backends, **kwargs)
    data = choice.to_dict()
    data.update(spec=args.spec, device=str(device), platform=platform.collect())
    if args.json == "-":
        print(json.dumps(data, indent=1, default=str))
    else:
        con = console()
        render_compile_choice(con, data)
        if args.json:
            write_json(args.json, data)
            con.print(f"[dim]wrote {args.json}[/]")
    return 1 if choice.wrong_answer else 0
