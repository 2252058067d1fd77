"""Sweep tile configs of gpuparity's Triton attention kernels on the GPU at hand and print the
fastest per kernel and head dim (the tables in backends/triton_attention.py come from here).

    PYTHONPATH=src python benchmarks/tune_attention.py [--budget-s 240] [--json out.json]

Each candidate is checked against SDPA (cuDNN or efficient) before it is timed; a config
that fails to compile, runs out of shared memory or gives a wrong answer is dropped.
"""
from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn.functional as F
import triton.testing

from gpuparity.backends import triton_attention as ta
from gpuparity.bench.attention import SHAPES, make_case

TC = ta.TileConfig
CANDIDATES = {
    "fwd": [TC(32, 32, 4, 3), TC(64, 32, 4, 3), TC(32, 64, 4, 3), TC(64, 64, 2, 3), TC(128, 64, 4, 3), TC(128, 64, 8, 3), TC(128, 128, 8, 3), TC(128, 32, 4, 3), TC(64, 64, 4, 3),
            TC(64, 32, 4, 4), TC(128, 64, 4, 4), TC(128, 128, 8, 2), TC(64, 128, 4, 3), TC(128, 64, 8, 4),
            TC(64, 64, 4, 4), TC(128, 128, 4, 2),
            # 2026-11-21, for D=128 on Hopper (our forward trailed flex's there)
            TC(128, 64, 8, 2), TC(128, 32, 8, 3), TC(128, 32, 8, 4), TC(64, 128, 4, 2), TC(64, 64, 4, 2),
            TC(64, 128, 8, 3), TC(64, 32, 4, 4)],
    "dkdv": [TC(32, 32, 4, 3), TC(16, 64, 4, 3), TC(32, 32, 2, 3), TC(32, 128, 4, 3), TC(32, 128, 4, 4), TC(64, 128, 8, 3), TC(32, 64, 4, 3), TC(64, 64, 4, 3),
             TC(16, 128, 4, 3), TC(32, 128, 8, 3), TC(64, 128, 4, 2), TC(64, 64, 8, 3), TC(32, 64, 4, 5)],
    "dq": [TC(32, 32, 4, 3), TC(32, 64, 4, 3), TC(64, 16, 4, 3), TC(128, 32, 4, 3), TC(128, 64, 8, 3), TC(64, 64, 4, 3), TC(64, 32, 4, 3), TC(128, 32, 8, 3),
           TC(128, 64, 4, 2), TC(64, 64, 4, 4), TC(128, 32, 4, 4)],
}
# 2026-11-21, for the D=128 backward on Hopper (flex's backward led ours there);
# --recent sweeps only these and the shipped config
RECENT = {
    "fwd": [],
    "dkdv": [TC(64, 128, 8, 2), TC(128, 128, 8, 2), TC(64, 64, 4, 2), TC(32, 128, 4, 2), TC(128, 64, 8, 2),
             TC(64, 128, 8, 4)],
    "dq": [TC(128, 64, 8, 2), TC(128, 128, 8, 2), TC(64, 128, 4, 2), TC(64, 64, 4, 2), TC(128, 32, 8, 2),
           TC(64, 128, 8, 3)],
}
for _kernel, _extra in RECENT.items():
    CANDIDATES[_kernel] = CANDIDATES[_kernel] + _extra
# shapes per head dim bucket
TUNE_SHAPES = {32: ["aam-nuc", "aam-asv"], 64: ["bert", "llm-4k"], 128: ["llm-8k"]}


def _parse_candidates(text: str):
    """"dkdv=32x128x8x2,16x128x8x3;dq=..." -> {kernel: [TileConfig]}"""
    out = {}
    for part in filter(None, text.split(";")):
        kernel, _, configs = part.partition("=")
        if kernel not in CANDIDATES:
            raise SystemExit(f"--candidates: expected a kernel of {sorted(CANDIDATES)}, got {kernel!r}")
        tiles = []
        for config in filter(None, configs.split(",")):
            fields = config.split("x")
            if len(fields) != 4 or not all(f.isdigit() for f in fields):
                raise SystemExit(f"--candidates: expected block_m x block_n x warps x stages (e.g. 64x64x4x2) "
                                 f"for {kernel}, got {config!r}")
            tiles.append(TC(*map(int, fields)))
        out[kernel] = tiles
    return out


def _compiled_kernels(kernel_name: str) -> dict:
    """{id: (warps, stages, shared bytes, registers, spilled registers)} of every compiled variant of one
    of the attention kernels (Triton keeps them per device; registers and spills are read when a
    kernel is loaded, so only launched ones have them)."""
    fn = ta.launch.kernel_table()[kernel_name]
    found = {}
    for cache in getattr(fn, "device_caches", {}).values():
        kernels = cache[0] if isinstance(cache, tuple) else cache
        for compiled in getattr(kernels, "values", lambda: [])():
            meta = compiled.metadata
            found[id(compiled)] = (meta.num_warps, meta.num_stages, meta.shared,
                                   getattr(compiled, "n_regs", None), getattr(compiled, "n_spills", None))
    return found


def _time(fn):
    return triton.testing.do_bench(fn, warmup=10, rep=40, return_mode="median")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--budget-s", type=float, default=240)
    parser.add_argument("--json", default=None)
    parser.add_argument("--pad", type=float, default=0.25)
    parser.add_argument("--buckets", default="32,64,128")
    parser.add_argument("--family", default="nvidia_sm90")
    parser.add_argument("--overrides", default=None, help="write the winners here (GPUPARITY_ATTENTION_CONFIGS format)")
    parser.add_argument("--kernels", default="fwd,dkdv,dq", help="which kernels to sweep (default all three)")
    parser.add_argument("--shapes", default=None, help="tune on these suite shapes instead of TUNE_SHAPES' (one bucket)")
    parser.add_argument("--recent", action="store_true", help="only the shipped config and the RECENT candidates")
    parser.add_argument("--candidates", default=None,
                        help='only the shipped config and these, e.g. "dkdv=32x128x8x2,16x128x8x3;dq=128x64x8x3" '
                             "(block_m x block_n x warps x stages); prints each one's registers and spills")
    args = parser.parse_args()
    explicit = _parse_candidates(args.candidates) if args.candidates else None
    start = time.time()
    table = ta.CONFIGS[args.family]
    results = {}
    overrides = {}
    for bucket, names in TUNE_SHAPES.items():
        if str(bucket) not in args.buckets.split(","):
            continue
        names = args.shapes.split(",") if args.shapes else names
        cases = [make_case(n, SHAPES[n], args.pad, torch.bfloat16, "cuda", 0) for n in names]
        refs = []
        for case in cases:
            mask = (~case.key_padding_mask)[:, None, None, :]
            q, k, v = (t.detach().requires_grad_() for t in (case.q, case.k, case.v))
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            grads = torch.autograd.grad(out, (q, k, v), case.dout)
            refs.append((out.detach(), grads))
        for kernel in [k for k in ("fwd", "dkdv", "dq") if k in args.kernels.split(",")]:
            key = (bucket, 2)
            default = table[kernel][key]
            # time the general table's candidates at every length: the short-key entry (which
            # would serve k_len <= SHORT_KEYS instead) is set aside for the sweep
            short = ta.SHORT_CONFIGS.get(args.family, {}).get(kernel, {}).pop(key, None)
            if short is not None:
                print(f"d{bucket} {kernel}: short-key entry {short} set aside for the sweep", flush=True)
            scores = []
            known = _compiled_kernels(kernel)
            if explicit is not None:
                candidates = [default] + [c for c in explicit.get(kernel, []) if c != default]
            else:
                candidates = [default] + RECENT[kernel] if args.recent else CANDIDATES[kernel]
            for cfg in candidates:
                if time.time() - start > args.budget_s:
                    break
                table[kernel][key] = cfg
                ta.clear_plans()
                total = 0.0
                try:
                    for case, (ref_out, ref_grads) in zip(cases, refs):
                        q, k, v = (t.detach().requires_grad_() for t in (case.q, case.k, case.v))
                        masks = ta.prepare_masks(case.q, case.k, key_padding_mask=case.key_padding_mask)
                        scale = case.dims[3] ** -0.5
                        out, lse = ta.attention_forward(case.q, case.k, case.v, masks, False, scale)
                        dq, dk, dv = ta.attention_backward(case.dout, case.q, case.k, case.v, out, lse, masks, False, scale)
                        for got, want in ((out, ref_out), (dq, ref_grads[0]), (dk, ref_grads[1]), (dv, ref_grads[2])):
                            err = ((got.float() - want.float()).norm() / want.float().norm()).item()
                            if not err < 2e-2:
                                raise AssertionError(f"error {err:.3g}")
                        if kernel == "fwd":
                            total += _time(lambda: ta.attention_forward(case.q, case.k, case.v, masks, False, scale))
                        else:
                            total += _time(lambda: ta.attention_backward(case.dout, case.q, case.k, case.v, out, lse,
                                                                         masks, False, scale))
                    scores.append((total, cfg))
                    seen = _compiled_kernels(kernel)
                    resources = [r for key, r in seen.items() if key not in known]
                    known.update(seen)
                    print(f"d{bucket} {kernel} {cfg}: {total:.3f} ms; compiled (warps, stages, shared, regs, spills): "
                          f"{resources}", flush=True)
                except Exception as exc:  # noqa: BLE001
                    print(f"d{bucket} {kernel} {cfg}: FAILED {type(exc).__name__}: {str(exc)[:120]}", flush=True)
            scores.sort(key=lambda item: item[0])
            best = scores[0][1] if scores else default
            table[kernel][key] = best
            ta.clear_plans()
            results[f"d{bucket}.{kernel}"] = [(t, dataclasses_tuple(c)) for t, c in scores]
            print(f"BEST d{bucket} {kernel}: {best} (default {default})", flush=True)
            overrides.setdefault(kernel, {})[f"{bucket},2"] = dataclasses_tuple(best)
    if args.overrides:
        with open(args.overrides, "w") as handle:
            json.dump({args.family: overrides}, handle, indent=1)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(results, handle, indent=1)


def dataclasses_tuple(cfg):
    return [cfg.block_m, cfg.block_n, cfg.num_warps, cfg.num_stages]


if __name__ == "__main__":
    main()
