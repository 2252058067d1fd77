"""`gpuparity bench rope`: its arguments, and the run that calls gpuparity.bench.rope."""
from __future__ import annotations

import argparse
from typing import Tuple

from ...bench.common import BenchResult
from ...bench.rope import LAYOUTS, ROPE_BACKENDS, bench_rope
from ._args import add_gbps_arguments, gbps_command_line, parse_list, parse_modes, pick_device

DEFAULT_SHAPES = "8x32x4096x128,64x4x1024x32"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--layouts", default=",".join(LAYOUTS), help="half, interleaved, varlen (default all)")
    add_gbps_arguments(parser, DEFAULT_SHAPES, ROPE_BACKENDS)


def parse_rope_shape(text: str) -> Tuple[int, int, int, int]:
    try:
        batch, heads, seqlen, head_dim = (int(part) for part in text.lower().split("x"))
    except ValueError:
        raise ValueError(f"--shapes: expected BxHxTxD (e.g. 8x32x4096x128), got {text!r}") from None
    if min(batch, heads, seqlen, head_dim) < 1 or head_dim % 2:
        raise ValueError(f"--shapes: expected positive sizes and an even D, got {text!r}")
    return batch, heads, seqlen, head_dim


def run(args: argparse.Namespace) -> BenchResult:
    shapes = [parse_rope_shape(s) for s in parse_list(args.shapes, what="--shapes")]
    layouts = parse_list(args.layouts, LAYOUTS, "--layouts")
    backends = parse_list(args.backends, ROPE_BACKENDS, "--backends")
    modes = parse_modes(args.modes)
    device = pick_device(args.device)
    return bench_rope(shapes, layouts, args.dtype, backends, modes, device, rep_ms=args.rep_ms,
                      ceilings=not args.no_ceilings, command=gbps_command_line("rope", args, ("layouts",)))
