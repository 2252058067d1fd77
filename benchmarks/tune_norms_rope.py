"""Tile-config sweep for the Triton norm and rotary kernels on the GPU at hand: every candidate
(rows per program, warps, backward programs per SM; positions x heads per rotary program) timed
on the ANCHORS.md shapes, with torch's own F.* beside them. The shipped heuristics in
backends/triton_norms.py and triton_rotary.py were set from its output.

    PYTHONPATH=src python benchmarks/tune_norms_rope.py --out sweep.json
"""
from __future__ import annotations

import argparse
import itertools
import json
import time

import torch
import torch.nn.functional as F
import triton.testing

from gpuparity.backends import triton_norms as tn
from gpuparity.backends import triton_rotary as tr
from gpuparity.bench.common import measure_ceilings


def bench(fn):
    fn()
    torch.cuda.synchronize()
    return triton.testing.do_bench(fn, warmup=10, rep=40, return_mode="median")


def norm_sweep(results, fwd_only=False):
    dtype = torch.bfloat16
    for n_rows, hidden in ((16384, 4096), (65536, 1024), (131072, 128)):
        if fwd_only and hidden > 1024:
            continue
        x = torch.randn(n_rows, hidden, device="cuda", dtype=dtype)
        dy = torch.randn_like(x)
        weight = torch.randn(hidden, device="cuda", dtype=dtype)
        bias = torch.randn(hidden, device="cuda", dtype=dtype)
        block = 1 << (hidden - 1).bit_length()
        fwd_bytes, bwd_bytes = 2 * x.numel() * 2, 3 * x.numel() * 2
        for is_rms in (True, False):
            op = "rms" if is_rms else "ln"
            b = None if is_rms else bias
            torch_fwd = (lambda: F.rms_norm(x, (hidden,), weight, 1e-6)) if is_rms else \
                (lambda: F.layer_norm(x, (hidden,), weight, bias, 1e-5))
            t = bench(torch_fwd)
            results.append({"op": op, "shape": [n_rows, hidden], "mode": "fwd", "cfg": "torch", "ms": t,
                            "gbps": fwd_bytes / t / 1e6})
            y, stats = tn.norm_forward(x, 1, weight, b, 1e-5, is_rms)
            for tile in (1024, 2048, 4096, 8192, 16384):
                if tile < block:
                    continue
                rows = tile // block
                for per_thread in (4, 8, 16, 32):
                    warps = max(1, min(32, tile // (32 * per_thread)))
                    cfg = tn.NormConfig(block, rows, warps, False)
                    try:
                        t = bench(lambda: tn.norm_forward(x, 1, weight, b, 1e-5, is_rms, config=cfg))
                        results.append({"op": op, "shape": [n_rows, hidden], "mode": "fwd",
                                        "cfg": [block, rows, warps], "ms": t, "gbps": fwd_bytes / t / 1e6})
                    except Exception as exc:  # noqa: BLE001
                        results.append({"op": op, "shape": [n_rows, hidden], "mode": "fwd", "cfg": [block, rows, warps],
                                        "error": str(exc)[:200]})
                    if fwd_only:
                        continue
                    for per_sm in (1, 2, 4):
                        tn.BWD_PROGRAMS_PER_SM = per_sm
                        try:
                            t = bench(lambda: tn.norm_backward(dy, x, 1, weight, None if b is None else b.dtype, stats,
                                                               is_rms, config=cfg))
                            results.append({"op": op, "shape": [n_rows, hidden], "mode": "bwd",
                                            "cfg": [block, rows, warps, per_sm], "ms": t, "gbps": bwd_bytes / t / 1e6})
                        except Exception as exc:  # noqa: BLE001
                            results.append({"op": op, "shape": [n_rows, hidden], "mode": "bwd",
                                            "cfg": [block, rows, warps, per_sm], "error": str(exc)[:200]})
                    tn.BWD_PROGRAMS_PER_SM = 2
        del x, dy


def rope_sweep(results):
    dtype = torch.bfloat16
    for batch, heads, seqlen, head_dim in ((8, 32, 4096, 128), (64, 4, 1024, 32)):
        x = torch.randn(batch, seqlen, heads, head_dim, device="cuda", dtype=dtype)
        angles = torch.rand(seqlen, head_dim // 2, device="cuda")
        cos, sin = angles.cos(), angles.sin()
        moved = 2 * x.numel() * 2
        half = head_dim // 2
        for interleaved in (False,):
            for block_h in (1, 4, 8, 16, 32):
                if block_h > heads:
                    continue
                for tile, per_thread in itertools.product((1024, 2048, 4096, 8192), (4, 8, 16)):
                    block_m = tile // (block_h * head_dim)
                    if block_m < 1:
                        continue
                    warps = max(1, min(16, tile // (32 * per_thread)))
                    cfg = tr.RotaryConfig(block_m, block_h, half, 1, warps)
                    try:
                        t = bench(lambda: tr.rotary_launch(x, cos, sin, interleaved=interleaved, seqlen_offsets=0,
                                                           cu_seqlens=None, max_seqlen=None, inplace=False,
                                                           conjugate=False, config=cfg))
                        results.append({"op": "rope-" + ("interleaved" if interleaved else "half"),
                                        "shape": [batch, heads, seqlen, head_dim], "mode": "fwd",
                                        "cfg": [block_m, block_h, warps], "ms": t, "gbps": moved / t / 1e6})
                    except Exception as exc:  # noqa: BLE001
                        results.append({"op": "rope", "shape": [batch, heads, seqlen, head_dim],
                                        "cfg": [block_m, block_h, warps], "error": str(exc)[:200]})
        del x


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="sweep.json")
    parser.add_argument("--only", default="norm,rope", help="norm, normfwd (forward only, hidden <= 1024), rope")
    args = parser.parse_args()
    start = time.time()
    results = []
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
            "ceilings": measure_ceilings()}
    if "normfwd" in args.only.split(","):
        norm_sweep(results, fwd_only=True)
    elif "norm" in args.only.split(","):
        norm_sweep(results)
    if "rope" in args.only:
        rope_sweep(results)
    with open(args.out, "w") as handle:
        json.dump({"meta": meta, "results": results}, handle, indent=1)
    best = {}
    for r in results:
        if "gbps" in r:
            key = (r["op"], tuple(r["shape"]), r["mode"])
            if r["cfg"] == "torch":
                best.setdefault(key + ("torch",), r)
            elif key not in best or r["gbps"] > best[key]["gbps"]:
                best[key] = r
    print(json.dumps(meta["ceilings"]))
    for key in sorted(best, key=str):
        r = best[key]
        print(f"{key}: {r['cfg']} {r['gbps']:.0f} GB/s ({r['ms']:.4f} ms)")
    errors = [r for r in results if "error" in r]
    print(f"{len(results)} runs, {len(errors)} errors, {time.time() - start:.0f} s")
    for r in errors[:5]:
        print("error", r)


if __name__ == "__main__":
    main()
