"""`gpuparity env`: the platform report."""
from __future__ import annotations

import json

from .. import platform
from ..report.files import write_json
from ._common import add_json, console


def register(subparsers) -> None:
    parser = subparsers.add_parser("env", help="what machine is this: vendor, build, devices, libraries, numerics flags",
                                   description="The platform report (never fails: what cannot be read says why). "
                                               "Save it with --json to evaluate known issues elsewhere: "
                                               "gpuparity known-issues --platform env.json")
    add_json(parser, "the platform report")
    parser.set_defaults(handler=handle)


def handle(args) -> int:
    from ..report.terminal import render_platform  # imports torch: not for `env --help`
    report = platform.collect()
    if args.json == "-":
        print(json.dumps(report, indent=1, default=str))
        return 0
    if args.json:
        write_json(args.json, report)
    con = console()
    render_platform(con, report)
    if args.json:
        con.print(f"[dim]wrote {args.json}[/]")
    return 0
