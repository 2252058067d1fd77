"""Rotary tile sizes A/B in one process: the half-split and interleaved kernels at 1024-, 2048-
and 4096-element tiles (8 elements per thread), beside torch.compile; q and k rotated forward,
as `gpuparity bench rope` does, alternating rounds.

    PYTHONPATH=src python benchmarks/rope_variants.py --rounds 3 --out variants.jsonl

Times: do_bench medians (L2 flushed before each step, as the bench) and CUDA-graph replays of
ten steps (no host time). Also counts the vector width of the global loads/stores in each
compiled variant's PTX.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import re

import torch
import triton.testing

from gpuparity.backends import compiled
from gpuparity.backends import triton_rotary as tr
from gpuparity.bench.common import graphed


def graph_ms(step, inner=10):
    def steps():
        for _ in range(inner):
            step()
    replay = graphed(steps)
    replay()
    torch.cuda.synchronize()
    return triton.testing.do_bench(replay, warmup=20, rep=100, return_mode="median") / inner


def ptx_loads():
    """{"BLOCK_M=.. INTERLEAVED=..": [counts of ld/st.global vector widths]} from the compiled
    kernels (their constants are keyed by argument index)."""
    names = list(tr._rotary_kernel.arg_names)
    wanted = {names.index(name): name for name in ("BLOCK_M", "INTERLEAVED", "CONJUGATE")}
    out = {}
    caches = getattr(tr._rotary_kernel, "device_caches", {})
    for cache in caches.values():
        kernels = cache[0] if isinstance(cache, tuple) else cache
        for kernel in kernels.values():
            try:
                ptx = kernel.asm["ptx"]
                consts = dict(getattr(kernel.src, "constants", {}) or {})
            except Exception:  # noqa: BLE001
                continue
            label = []
            for key, value in consts.items():
                index = key[0] if isinstance(key, tuple) and len(key) == 1 else key
                name = wanted.get(index, index if index in wanted.values() else None)
                if name is not None:
                    label.append(f"{name}={value}")
            counts = {}
            for op in re.findall(r"(ld\.global[\.\w]*|st\.global[\.\w]*)", ptx):
                counts[op] = counts.get(op, 0) + 1
            out.setdefault(" ".join(sorted(label)) or "?", []).append(counts)
    return out


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default="variants.jsonl")
    args = parser.parse_args()
    dtype = torch.bfloat16
    records = []
    for batch, heads, seqlen, head_dim in ((64, 4, 1024, 32), (8, 32, 4096, 128)):
        gen = torch.Generator(device="cpu").manual_seed(0)
        shape = (batch, seqlen, heads, head_dim)
        q = torch.randn(shape, generator=gen).to("cuda", dtype)
        k = torch.randn(shape, generator=gen).to("cuda", dtype)
        angles = torch.rand(seqlen, head_dim // 2, generator=gen).cuda()
        cos, sin = angles.cos(), angles.sin()
        moved = 4 * q.numel() * 2
        base = tr.rotary_config(heads, head_dim // 2, 0, max_seqlen=seqlen)
        variants = {}
        for inter in (False, True):
            for tile in (1024, 2048, 4096):
                block_m = max(1, tile // (base.block_h * 2 * base.block_r))
                warps = max(1, min(16, tile // (32 * tr.ELEMS_PER_THREAD)))
                cfg = dataclasses.replace(base, block_m=block_m, num_warps=warps)
                name = f"{'interleaved' if inter else 'half'} tile {tile} (m{block_m} w{warps})"
                variants[name + (" shipped" if cfg == base else "")] = (cfg, inter)
        for inter in (False, True):
            ref = tr.rotary_launch(q, cos, sin, interleaved=inter, seqlen_offsets=0, cu_seqlens=None,
                                   max_seqlen=None, inplace=False, conjugate=False, config=base)
            for name, (cfg, inter_v) in variants.items():
                if inter_v != inter:
                    continue
                got = tr.rotary_launch(q, cos, sin, interleaved=inter, seqlen_offsets=0, cu_seqlens=None,
                                       max_seqlen=None, inplace=False, conjugate=False, config=cfg)
                assert torch.equal(got, ref), name  # same math per element, other tiles

        def ours(cfg, inter):
            def step():
                for x in (q, k):
                    tr.rotary_launch(x, cos, sin, interleaved=inter, seqlen_offsets=0, cu_seqlens=None,
                                     max_seqlen=None, inplace=False, conjugate=False, config=cfg)
            return step

        torch._dynamo.reset()

        def comp():
            compiled.compiled_apply_rotary(q, cos, sin)
            compiled.compiled_apply_rotary(k, cos, sin)
        steps = {name: ours(*spec) for name, spec in variants.items()}
        steps["compile half"] = comp
        for rnd in range(args.rounds):
            for name, step in steps.items():
                step()
                torch.cuda.synchronize()
                flushed = triton.testing.do_bench(step, warmup=10, rep=60, return_mode="median")
                graphed = graph_ms(step)
                rec = {"shape": [batch, heads, seqlen, head_dim], "variant": name, "round": rnd,
                       "do_bench_ms": flushed, "graph_ms": graphed,
                       "graph_gbps": moved / graphed / 1e6, "do_bench_gbps": moved / flushed / 1e6}
                records.append(rec)
                print(json.dumps(rec), flush=True)
    with open(args.out, "w") as fh:
        for rec in records:
            fh.write(json.dumps(rec) + "\n")
        fh.write(json.dumps({"ptx": ptx_loads()}) + "\n")
    # medians per shape/variant
    by = {}
    for rec in records:
        by.setdefault((tuple(rec["shape"]), rec["variant"]), []).append(rec)
    for (shape, name), recs in by.items():
        d = sorted(r["do_bench_ms"] for r in recs)[len(recs) // 2]
        g = sorted(r["graph_ms"] for r in recs)[len(recs) // 2]
        print(f"{str(shape):22s} {name:28s} do_bench {d * 1e3:7.2f} us   graph {g * 1e3:7.2f} us")


if __name__ == "__main__":
    main()
