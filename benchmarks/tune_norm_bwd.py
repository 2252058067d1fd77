"""Second sweep of the fused norm backward (bf16) on the GPU at hand: rows per program, warps,
persistent programs per SM and prefetching the next tile or not (--stages adds Triton's
software-pipelining depth, which changed nothing on an H100), for LayerNorm and
RMSNorm at the hidden sizes where forward+backward must reach 2.5 TB/s (ANCHORS.md). Prints
the best configs per case next to the shipped one; --out keeps every row.

    PYTHONPATH=src python benchmarks/tune_norm_bwd.py --out bwd_sweep.json
"""
from __future__ import annotations

import argparse
import json

import torch
import triton.testing

from gpuparity.backends import triton_norms as tn


def bench(fn) -> float:
    fn()
    torch.cuda.synchronize()
    return triton.testing.do_bench(fn, warmup=10, rep=40, return_mode="median")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=None)
    parser.add_argument("--shapes", default="16384x4096,65536x1024")
    parser.add_argument("--warps", default="4,8,16,32")
    parser.add_argument("--per-sm", default="1,2,3,4", help="persistent programs per SM to sweep")
    parser.add_argument("--stages", default="0", help="num_stages values to sweep; 0 = Triton's default")
    parser.add_argument("--shipped-only", action="store_true",
                        help="time only the shipped config (A/B runs of two versions of the kernels)")
    args = parser.parse_args()
    rows_out = []
    for text in args.shapes.split(","):
        n_rows, hidden = (int(v) for v in text.split("x"))
        x = torch.randn(n_rows, hidden, device="cuda", dtype=torch.bfloat16)
        dy = torch.randn_like(x)
        weight = torch.randn(hidden, device="cuda", dtype=torch.bfloat16)
        bias = torch.randn(hidden, device="cuda", dtype=torch.bfloat16)
        moved = 3 * x.numel() * 2
        for is_rms in (False, True):
            op = "rms" if is_rms else "ln"
            _, stats = tn.norm_forward(x, 1, weight, None if is_rms else bias, 1e-5, is_rms)
            bias_dtype = None if is_rms else bias.dtype
            shipped = tn.norm_config(hidden, True)
            t = bench(lambda: tn.norm_backward(dy, x, 1, weight, bias_dtype, stats, is_rms))
            base = {"op": op, "shape": [n_rows, hidden]}
            shipped_row = {**base, "cfg": "shipped " + str(shipped), "ms": t, "gbps": moved / t / 1e6}
            rows_out.append(shipped_row)
            block = shipped.block_n
            results = []
            if args.shipped_only:
                print(f"{op} {n_rows}x{hidden} bwd: shipped {shipped_row['gbps']:.0f} GB/s ({t * 1000:.1f} us)",
                      flush=True)
                continue
            for rows in sorted({max(1, 2048 // block), max(1, 4096 // block), max(1, 8192 // block)}):
                for warps in [int(v) for v in args.warps.split(",")]:
                    if rows * block // (32 * warps) < 2:
                        continue
                    for stages, prefetch in [(int(v) or None, p) for v in args.stages.split(",") for p in (False, True)]:
                        for per_sm in [int(v) for v in args.per_sm.split(",")]:
                            # the shipped one-launch reduction (finish) where it applies, so the
                            # candidates and the shipped row differ only in the swept knobs
                            cfg = tn.NormConfig(block, rows, warps, False, per_sm, stages, prefetch,
                                                finish=shipped.finish)
                            try:
                                t = bench(lambda: tn.norm_backward(dy, x, 1, weight, bias_dtype, stats, is_rms,
                                                                   config=cfg))
                            except Exception as exc:  # noqa: BLE001 - a config that does not build is a row
                                rows_out.append({**base, "cfg": [rows, warps, per_sm, stages, prefetch], "error": str(exc)[:160]})
                                continue
                            row = {**base, "cfg": [rows, warps, per_sm, stages, prefetch], "ms": t, "gbps": moved / t / 1e6}
                            rows_out.append(row)
                            results.append(row)
            results.sort(key=lambda r: r["ms"])
            print(f"{op} {n_rows}x{hidden} bwd: shipped {shipped} {shipped_row['gbps']:.0f} GB/s; "
                  "best [rows, warps, programs/SM, stages, prefetch]: "
                  + "; ".join(f"{r['cfg']} {r['gbps']:.0f}" for r in results[:5]), flush=True)
        del x, dy
    if args.out:
        with open(args.out, "w", encoding="utf-8") as handle:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                       "triton": triton.__version__, "rows": rows_out}, handle, indent=1)


if __name__ == "__main__":
    main()
