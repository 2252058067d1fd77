"""Arguments the benches share: the GB/s benches' common options, comma lists, the device, and
the command line recorded in a result, the estimate said before a bench starts. No torch at
import (bench/names.py has the names): `gpuparity bench NAME --help` answers at once."""
from __future__ import annotations

import argparse
import sys
from typing import Any, Dict, Optional, Sequence

from ...bench.names import DTYPE_NAMES, MODES


class BenchUsageError(ValueError):
    """Bad arguments, reported as `gpuparity bench NAME: ...` with exit code 2."""


def parse_list(text: str, allowed: Optional[Sequence[str]] = None, what: str = "value") -> list:
    items = [item.strip() for item in str(text).split(",") if item.strip()]
    if allowed is not None:
        bad = [item for item in items if item not in allowed]
        if bad:
            raise ValueError(f"{what}: expected a comma-separated subset of {list(allowed)}, got {bad}")
    if not items:
        raise ValueError(f"{what}: expected at least one entry, got {text!r}")
    return items


def pick_device(name: Optional[str]) -> "torch.device":
    import torch
    if name is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device: {name} requested but no CUDA or ROCm GPU is visible")
    return device


def add_gbps_arguments(parser: argparse.ArgumentParser, default_shapes: str, backends: Sequence[str],
                       cpu_shapes: str) -> None:
    """The options of every GB/s bench (norm, rope): shapes, dtype, backends, modes, files."""
    parser.add_argument("--shapes", default=None,
                        help=f"comma-separated shapes (default {default_shapes}; on a CPU {cpu_shapes})")
    parser.add_argument("--dtype", default="bf16", choices=sorted(DTYPE_NAMES), help="input dtype (default bf16)")
    parser.add_argument("--backends", default=",".join(backends),
                        help=f"comma-separated subset of {','.join(backends)}")
    parser.add_argument("--modes", default="fwd,fwd+bwd",
                        help="comma-separated fwd, fwd+bwd, fwd:graph, fwd+bwd:graph (default fwd,fwd+bwd); "
                             "':graph' times the same step captured in a CUDA graph: the kernels without "
                             "per-call host overhead")
    parser.add_argument("--device", default=None, help="cuda (default when a GPU is visible) or cpu")
    parser.add_argument("--rep-ms", type=float, default=100.0, help="timing budget per measurement, ms")
    parser.add_argument("--json", dest="json_path", default=None, help="write rows + metadata as JSON")
    parser.add_argument("--md", dest="markdown_path", metavar="MD_PATH", default=None, help="write a Markdown table")
    parser.add_argument("--plot", dest="plot_path", default=None, help="write a bar plot (PNG, needs matplotlib)")
    parser.add_argument("--no-ceilings", action="store_true", help="skip measuring the copy bandwidth")


def default_shapes(args, device, gpu: str, cpu: str) -> str:
    """--shapes, else the bench's default for the device (CPU-sized on a CPU); recorded in args
    so that the command line of the result names the shapes that ran."""
    if args.shapes is None:
        args.shapes = cpu if str(device).startswith("cpu") else gpu
    return args.shapes


def announce(name: str, plan: Dict[str, Any], device, parts: Sequence[str]) -> None:
    """The estimate a bench says on stderr before it starts (the library never prints): its
    measurements (`parts`: the plan's factors, e.g. shapes, backends, modes) and rough seconds."""
    seconds = plan["seconds"]
    about = f"{seconds:.0f} s" + (f" (~{seconds / 60:.0f} min)" if seconds >= 120 else "")
    factors = " x ".join(f"{plan[part]} {part}" for part in parts)
    print(f"gpuparity bench {name}: {factors}: {plan['measurements']} measurements on {device}, about {about} "
          f"(a rough estimate); Ctrl-C shows the rows finished so far", file=sys.stderr, flush=True)


def parse_modes(text: str) -> list:
    return parse_list(text, MODES, "--modes")


def gbps_command_line(name: str, args, extra: Sequence[str] = ()) -> str:
    """The canonical `gpuparity bench NAME ...` that reproduces this GB/s run."""
    parts = [f"gpuparity bench {name}"]
    for key in tuple(extra) + ("shapes", "dtype", "backends", "modes", "device", "rep_ms"):
        value = getattr(args, key, None)
        if value is not None:
            parts.append(f"--{key.replace('_', '-')} {value}")
    for key, flag in (("json_path", "--json"), ("markdown_path", "--md"), ("plot_path", "--plot")):
        if getattr(args, key, None):
            parts.append(f"{flag} {getattr(args, key)}")
    return " ".join(parts)
