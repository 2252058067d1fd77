"""`gpuparity model SPEC`: check a model on one machine, its device run against float64 on the
CPU, and name the first module whose own computation diverges."""
from __future__ import annotations

import argparse
import json

from ..report.files import write_json, write_text
from ._common import human_console, output_file, output_json, reports_user_errors, spec_argument

EXAMPLE = """\
SPEC is module:factory (or path/to/file.py:factory), as for `gpuparity trace record`:

  def factory(device="cpu", dtype=torch.float32):
      torch.manual_seed(0)
      model = MyModel().eval()             # weights made on the CPU, seeded ...
      x = torch.randn(8, 128, 64)
      return model.to(device, dtype), (x.to(device, dtype),)   # ... then moved

  gpuparity model my_models.py:factory --dtype bfloat16 --html model.html
  gpuparity model my_models.py:factory --include 'layers.3*'     # too big for a float64 copy

A model in training mode with dropout is checked in eval mode (said in the output): two runs
cannot draw the same dropout masks. A diverging torch LayerNorm/RMSNorm in a known issue
confirmed on this machine is labelled with the issue's id.

Exit codes: 0 no module diverges beyond the policy and none reads the padding, 1 one does,
2 bad usage or input, or a forward that draws random numbers in eval mode (nothing to compare).
Guide: docs/user-guide.md ("Check a whole model on one machine")."""


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "model", help="run a model on the device and in float64 on the CPU; name the module that diverges",
        description="Run a model from SPEC on the device in its dtype and on the CPU in float64 from the same weights "
                    "and inputs, forward and backward; compare every module and name the first whose own computation "
                    "diverges beyond the tolerance policy.",
        epilog=EXAMPLE, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("spec", metavar="SPEC", type=spec_argument, help="module:factory returning (model, inputs)")
    parser.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: the first verified GPU, else cpu)")
    parser.add_argument("--dtype", default=None, help="float32, bfloat16, float16 or float64 (default: the factory's)")
    parser.add_argument("--seed", type=int, default=0, help="torch seed set before the factory and the forward")
    parser.add_argument("--include", action="append", default=None, metavar="PATTERN",
                        help="check only modules whose name matches (fnmatch; repeatable; the model is '(model)'), "
                             "each on the inputs the device run recorded for it: for models too big for a float64 "
                             "copy")
    parser.add_argument("--no-grads", action="store_true", help="forward only")
    parser.add_argument("--no-padding-check", action="store_true",
                        help="skip the padding-invariance check (run when the inputs hold a padding mask: the padded "
                             "positions are changed and the real tokens' outputs and gradients must not move)")
    parser.add_argument("--factory-arg", action="append", default=[], metavar="KEY=VALUE",
                        help="an option for the factory (repeatable; VALUE is parsed as JSON when it can be)")
    parser.add_argument("--json", metavar="FILE", type=output_json, help="write the report as JSON ('-' for stdout)")
    parser.add_argument("--html", metavar="FILE", type=output_file, help="write a self-contained HTML report")
    parser.add_argument("--all", action="store_true", help="show every row")
    parser.set_defaults(handler=reports_user_errors(handle_model))


def handle_model(args) -> int:
    from ..report.trace_report import model_check_html, render_model_check
    from ..trace import spec
    from ..trace.model_check import check_model
    from ..trace.store import dtype_from_name
    con = human_console(args)
    result = check_model(args.spec, device=args.device, dtype=dtype_from_name(args.dtype) if args.dtype else None,
                         factory_args=spec.parse_factory_args(args.factory_arg), seed=args.seed,
                         include=args.include, grads=not args.no_grads, padding=not args.no_padding_check)
    data = result.to_dict()
    render_model_check(con, data, show_all=args.all)
    if args.json == "-":
        print(json.dumps(data, indent=1, default=str))
    elif args.json:
        write_json(args.json, data)
        con.print(f"[dim]wrote {args.json}[/]")
    if args.html:
        write_text(args.html, model_check_html(data))
        con.print(f"[dim]wrote {args.html}[/]")
    return 0 if result.passed else 1
