"""`gpuparity bench attention`: its arguments (suites, shapes, pads, backends), and the run that
calls gpuparity.bench.attention (progress on stderr, one line per backend and case)."""
from __future__ import annotations

import argparse
from typing import Dict, List, Tuple

from ...bench.names import (BACKENDS, CPU_SHAPES, CPU_SUITE_SHAPES, DECODE_KV_HEADS, DECODE_SHAPES, DTYPE_NAMES, SHAPES,
                            SUITE_SHAPES, SUITES, WINDOW_SHAPES, WINDOWS)
from ._args import BenchUsageError, announce, pick_device


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--suite", default="dense",
                        help="comma-separated suites: %s, or all (default dense: key padding). window: causal "
                             "sliding window; varlen: packed sequences; decode: one query against a KV cache "
                             "(B,H,S,D = B, query heads, cache length, head dim)" % ", ".join(SUITES))
    parser.add_argument("--shapes", default=None,
                        help="comma-separated names (%s, decode: %s, CPU-sized: %s) or B,H,S,D groups separated by "
                             "';' or spaces (default: all the shapes of docs/targets.md; window: %s; decode: the decode "
                             "grid; on a CPU the CPU-sized ones, window: cpu-m, decode: %s)"
                             % (", ".join(SHAPES), ", ".join(DECODE_SHAPES), ", ".join(CPU_SHAPES),
                                ", ".join(WINDOW_SHAPES), ", ".join(CPU_SUITE_SHAPES["decode"])))
    parser.add_argument("--windows", default=",".join(map(str, WINDOWS)),
                        help="window suite: comma-separated left window sizes (default %(default)s)")
    parser.add_argument("--kv-heads", type=int, default=DECODE_KV_HEADS,
                        help="decode suite: KV heads (GQA; must divide H, default %(default)s)")
    parser.add_argument("--dtype", default="bf16", choices=sorted(DTYPE_NAMES))
    parser.add_argument("--pad", default="0,0.25",
                        help="mean fractions of padded keys per batch item, comma-separated (default 0,0.25)")
    parser.add_argument("--backends", default=",".join(BACKENDS),
                        help="comma-separated subset of %s" % ", ".join(BACKENDS))
    parser.add_argument("--fwd-only", action="store_true", help="time the forward only")
    parser.add_argument("--graph", action="store_true",
                        help="also time forward+backward captured in a CUDA graph (the kernels without "
                             "per-call host overhead, as under torch.cuda.graphs)")
    parser.add_argument("--no-error", action="store_true", help="skip the float64 error column")
    parser.add_argument("--json", dest="json_path", default=None, help="write the rows and the platform here")
    parser.add_argument("--markdown", "--md", dest="markdown_path", default=None, help="write a markdown table here")
    parser.add_argument("--plot", dest="plot_path", default=None, help="write a bar chart (PNG) here")
    parser.add_argument("--device", default=None, help="device (default: cuda if available, else cpu)")
    parser.add_argument("--seed", type=int, default=0)


def parse_shapes(text: str) -> List[Tuple[str, Tuple[int, int, int, int]]]:
    """'bert,llm-4k' or '2,4,128,64' or 'bert;2,4,128,64' -> [(label, (B, H, S, D))]."""
    shapes = []
    tokens = [t for t in text.replace(";", " ").split() if t]
    for token in tokens:
        parts = [p for p in token.split(",") if p]
        if all(p.strip().isdigit() for p in parts):
            if len(parts) % 4:
                raise ValueError(f"--shapes: expected names or B,H,S,D groups of 4 integers, got {token!r}")
            for i in range(0, len(parts), 4):
                dims = tuple(int(p) for p in parts[i:i + 4])
                if min(dims) < 1:
                    raise ValueError(f"--shapes: dimensions must be >= 1, got {dims}")
                shapes.append((f"({','.join(map(str, dims))})", dims))
            continue
        named = {**SHAPES, **DECODE_SHAPES, **CPU_SHAPES}
        for name in parts:
            if name not in named:
                raise ValueError(f"--shapes: unknown shape {name!r}; expected one of {sorted(named)} or B,H,S,D")
            shapes.append((f"{name} ({','.join(map(str, named[name]))})", named[name]))
    if not shapes:
        raise ValueError("--shapes: expected at least one shape")
    return shapes


def parse_pads(text: str) -> List[float]:
    try:
        pads = [float(p) for p in text.split(",") if p.strip()]
    except ValueError:
        raise ValueError(f"--pad: expected comma-separated fractions in [0, 1), got {text!r}") from None
    if not pads or any(not 0.0 <= p < 1.0 for p in pads):
        raise ValueError(f"--pad: expected comma-separated fractions in [0, 1), got {text!r}")
    return pads


def parse_backends(text: str) -> List[str]:
    names = [b.strip() for b in text.split(",") if b.strip()]
    unknown = [b for b in names if b not in BACKENDS]
    if unknown or not names:
        raise ValueError(f"--backends: expected a comma-separated subset of {list(BACKENDS)}, got {text!r}")
    return names


def parse_suites(text: str) -> List[str]:
    names = [s.strip() for s in text.split(",") if s.strip()]
    if names == ["all"]:
        return list(SUITES)
    if not names or any(name not in SUITES for name in names):
        raise ValueError(f"--suite: expected all or a comma-separated subset of {list(SUITES)}, got {text!r}")
    return names


def parse_windows(text: str) -> List[int]:
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise ValueError(f"--windows: expected comma-separated positive integers, got {text!r}")
    return [int(p) for p in parts]


def suite_shapes(suites: List[str], text, kv_heads: int, cpu: bool = False) -> Dict[str, list]:
    """Each suite's shapes: the --shapes given (for every suite), else the suite's default (on a
    CPU its CPU-sized default: docs/targets.md's shapes take minutes per backend there)."""
    defaults = CPU_SUITE_SHAPES if cpu else SUITE_SHAPES
    out = {suite: parse_shapes(text or ",".join(defaults[suite])) for suite in suites}
    for label, dims in out.get("decode", []):
        if kv_heads < 1 or dims[1] % kv_heads:
            raise ValueError(f"--kv-heads: expected a divisor of the decode shape's H={dims[1]} ({label}), "
                             f"got {kv_heads}")
    return out


def command_line(args: argparse.Namespace) -> str:
    """The `gpuparity bench attention ...` that reproduces this run."""
    return (f"gpuparity bench attention --suite {args.suite}" + (f" --shapes '{args.shapes}'" if args.shapes else "")
            + f" --dtype {args.dtype} --pad {args.pad} --backends {args.backends}"
            + (f" --windows {args.windows}" if "window" in parse_suites(args.suite) else "")
            + (f" --kv-heads {args.kv_heads}" if "decode" in parse_suites(args.suite) else "")
            + (" --fwd-only" if args.fwd_only else "") + (" --graph" if args.graph else "")
            + "".join(f" --{flag} {value}" for flag, value in (("json", args.json_path), ("markdown", args.markdown_path),
                                                             ("plot", args.plot_path)) if value))


def run(args: argparse.Namespace) -> "BenchResult":
    from rich.console import Console
    from ...bench.attention import bench_attention, estimate_attention
    from ...report.bench_table import attention_progress
    device = str(pick_device(args.device))
    try:
        suites = parse_suites(args.suite)
        shapes = suite_shapes(suites, args.shapes, args.kv_heads, cpu=device.startswith("cpu"))
        pads = parse_pads(args.pad)
        backends = parse_backends(args.backends)
        windows = parse_windows(args.windows)
    except ValueError as exc:
        raise BenchUsageError(str(exc)) from None
    announce("attention", estimate_attention(shapes, pads, backends, device, fwd_only=args.fwd_only, graph=args.graph,
                                             windows=windows), device, ("shapes", "pads", "backends", "modes"))
    console = Console(stderr=True)
    return bench_attention(shapes[suites[0]], pads, backends, args.dtype, device, fwd_only=args.fwd_only,
                           with_error=not args.no_error, seed=args.seed, graph=args.graph,
                           progress=lambda step, rows: console.log(attention_progress(step, rows)),
                           command=command_line(args), suites=suites, windows=windows, kv_heads=args.kv_heads,
                           suite_shapes=shapes)
