"""`gpuparity bench rope`: its arguments, and the run that calls gpuparity.bench.rope."""
from __future__ import annotations

import argparse
from typing import Tuple

from ...bench.names import LAYOUTS, ROPE_BACKENDS, ROPE_CPU_SHAPES, ROPE_SHAPES
from ._args import add_gbps_arguments, announce, default_shapes, gbps_command_line, parse_list, parse_modes, pick_device

DEFAULT_SHAPES = ROPE_SHAPES


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--layouts", default=",".join(LAYOUTS), help="half, interleaved, varlen (default all)")
    add_gbps_arguments(parser, DEFAULT_SHAPES, ROPE_BACKENDS, ROPE_CPU_SHAPES)


def parse_rope_shape(text: str) -> Tuple[int, int, int, int]:
    try:
        batch, heads, seqlen, head_dim = (int(part) for part in text.lower().split("x"))
    except ValueError:
        raise ValueError(f"--shapes: expected BxHxTxD (e.g. 8x32x4096x128), got {text!r}") from None
    if min(batch, heads, seqlen, head_dim) < 1 or head_dim % 2:
        raise ValueError(f"--shapes: expected positive sizes and an even D, got {text!r}")
    return batch, heads, seqlen, head_dim


def run(args: argparse.Namespace) -> "BenchResult":
    from ...bench.rope import bench_rope, estimate_rope
    device = pick_device(args.device)
    shapes = [parse_rope_shape(s) for s in parse_list(default_shapes(args, device, DEFAULT_SHAPES, ROPE_CPU_SHAPES),
                                                      what="--shapes")]
    layouts = parse_list(args.layouts, LAYOUTS, "--layouts")
    backends = parse_list(args.backends, ROPE_BACKENDS, "--backends")
    modes = parse_modes(args.modes)
    announce("rope", estimate_rope(shapes, layouts, args.dtype, backends, modes, device, args.rep_ms), device,
             ("shapes", "layouts", "backends", "modes"))
    return bench_rope(shapes, layouts, args.dtype, backends, modes, device, rep_ms=args.rep_ms,
                      ceilings=not args.no_ceilings, command=gbps_command_line("rope", args, ("layouts",)))
