"""Where a first-call verification spends its time: `checks.selection.verify` run in this process
under cProfile, as a checking worker runs it, after this process has set its GPU up (context,
fp64/fp32/bf16 products, SDPA), so that what is left is the check's own first-use cost. Use an
empty GPUPARITY_CACHE_DIR (nothing verified yet); run twice with one TRITON_CACHE_DIR to see a
cold and a warm Triton cache. Needs a GPU (the CPU runs checks in process anyway). This is a
script: it prints.

    GPUPARITY_CACHE_DIR=$(mktemp -d) PYTHONPATH=src python3 benchmarks/profile_first_check.py
    ... --calls rms_norm:default,attention:key_padding+causal --dtype bf16 --top 45
"""
from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import sys
import time


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", default="rms_norm:default,attention:key_padding+causal,rms_norm:default",
                        help="op:kind pairs verified in this order (a repeat shows the cost once paid)")
    parser.add_argument("--backend", default="triton")
    parser.add_argument("--dtype", default="bf16", choices=("bf16", "fp16", "fp32"))
    parser.add_argument("--top", type=int, default=45, help="rows of the profile, by cumulative and own time")
    args = parser.parse_args(argv)
    import torch
    import torch.nn.functional as F
    if not torch.cuda.is_available():
        print("profile_first_check: needs a CUDA or ROCm GPU", file=sys.stderr)
        return 2
    os.environ.setdefault("GPUPARITY_PROBE", "inprocess")
    os.environ.setdefault("GPUPARITY_PROBE_REFINE", "off")
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    started = time.monotonic()
    torch.zeros(1, device="cuda")
    for product_dtype in (torch.float64, torch.float32, torch.bfloat16):
        square = torch.ones(64, 64, device="cuda", dtype=product_dtype)
        float((square @ square).sum())
    q = torch.ones(1, 2, 64, 64, device="cuda", dtype=torch.bfloat16)
    float(F.scaled_dot_product_attention(q, q, q, is_causal=True).sum())
    print(f"GPU set-up {time.monotonic() - started:.2f} s")
    started = time.monotonic()
    from gpuparity.backends import load_all
    from gpuparity.checks.selection import verify
    load_all()
    print(f"imports {time.monotonic() - started:.2f} s")
    profile = cProfile.Profile()
    for call in args.calls.split(","):
        op, kind = call.split(":", 1)
        started = time.monotonic()
        profile.enable()
        verdicts = verify(op, dtype, kind, "cuda", args.backend)
        profile.disable()
        print(f"{op} ({kind}) on {args.backend}: {time.monotonic() - started:.2f} s, passed "
              f"{[v.get('passed') for v in verdicts.values()]}", flush=True)
    for order in ("cumulative", "tottime"):
        text = io.StringIO()
        pstats.Stats(profile, stream=text).sort_stats(order).print_stats(args.top)
        print(text.getvalue())
    return 0


if __name__ == "__main__":
    sys.exit(main())
