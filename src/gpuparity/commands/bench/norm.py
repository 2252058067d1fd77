"""`gpuparity bench norm`: its arguments, and the run that calls gpuparity.bench.norm."""
from __future__ import annotations

import argparse
from typing import Tuple

from ...bench.names import NORM_BACKENDS, NORM_CPU_SHAPES, NORM_OPS, NORM_SHAPES
from ._args import add_gbps_arguments, announce, default_shapes, gbps_command_line, parse_list, parse_modes, pick_device

DEFAULT_SHAPES = NORM_SHAPES


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--ops", default="rms,ln", help="rms, ln or both (default both)")
    add_gbps_arguments(parser, DEFAULT_SHAPES, NORM_BACKENDS, NORM_CPU_SHAPES)


def parse_norm_shape(text: str) -> Tuple[int, int]:
    try:
        rows, hidden = (int(part) for part in text.lower().split("x"))
    except ValueError:
        raise ValueError(f"--shapes: expected ROWSxHIDDEN (e.g. 16384x4096), got {text!r}") from None
    if rows < 1 or hidden < 1:
        raise ValueError(f"--shapes: expected positive sizes, got {text!r}")
    return rows, hidden


def run(args: argparse.Namespace) -> "BenchResult":
    from ...bench.norm import bench_norm, estimate_norm
    ops = parse_list(args.ops, NORM_OPS, "--ops")
    device = pick_device(args.device)
    shapes = [parse_norm_shape(s) for s in parse_list(default_shapes(args, device, DEFAULT_SHAPES, NORM_CPU_SHAPES),
                                                      what="--shapes")]
    backends = parse_list(args.backends, NORM_BACKENDS, "--backends")
    modes = parse_modes(args.modes)
    announce("norm", estimate_norm(ops, shapes, args.dtype, backends, modes, device, args.rep_ms), device,
             ("ops", "shapes", "backends", "modes"))
    return bench_norm(ops, shapes, args.dtype, backends, modes, device, rep_ms=args.rep_ms,
                      ceilings=not args.no_ceilings, command=gbps_command_line("norm", args, ("ops",)))
