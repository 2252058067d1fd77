"""Sweep the decode kernel's tile (BLOCK_N, warps, stages) and split count on the decode suite's
rows (`gpuparity bench attention --suite decode`: B 1/8/64 x Sk 4k/32k/128k, H 32, Hkv 8, D 128,
bf16, one query), timed as the suite times them (triton.testing.do_bench, median, eagerly) and
replayed from a CUDA graph (the shipped config and the five fastest), with cuDNN SDPA (bool
length mask, enable_gqa) in the same process.
Writes one JSON line per (row, config) to --out and prints, per row, the shipped config, the
fastest one and cuDNN's time.

    PYTHONPATH=src python benchmarks/tune_decode.py --out decode-tune.jsonl

GPU only (exits 2 without one).
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import sys

ROWS = {f"b{b}-{sk // 1024}k": (b, sk) for sk in (4096, 32768, 131072) for b in (1, 8, 64)}


def parse(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="JSON-lines file, one line per (row, config)")
    parser.add_argument("--rows", default=",".join(ROWS), help=f"comma-separated, of {', '.join(ROWS)}")
    parser.add_argument("--block-n", default="64,128")
    parser.add_argument("--warps", default="4,8")
    parser.add_argument("--stages", default="2,3,4")
    parser.add_argument("--splits", default="1,2,3,4,6,8,16,32,64",
                        help="split counts to try beside the shipped choice (capped at the cache's tiles)")
    parser.add_argument("--tile-kb", type=int, default=200,
                        help="shared-memory budget for K+V tiles while sweeping (the shipped TILE_BYTES "
                             "shrinks stages, then BLOCK_N, past it); the effective tile is recorded")
    parser.add_argument("--no-graph", action="store_true", help="eager timings only")
    args = parser.parse_args(argv)
    unknown = [r for r in args.rows.split(",") if r not in ROWS]
    if unknown:
        parser.error(f"--rows: unknown {unknown}; expected some of {', '.join(ROWS)}")
    for name in ("block_n", "warps", "stages", "splits"):
        value = getattr(args, name)
        if not all(x.isdigit() and int(x) > 0 for x in value.split(",")):
            parser.error(f"--{name.replace('_', '-')}: expected comma-separated positive integers, got {value!r}")
    return args


def main(argv=None) -> int:
    args = parse(argv)
    import torch
    if not torch.cuda.is_available():
        print("tune_decode: needs a GPU (none visible); nothing measured", file=sys.stderr)
        return 2
    os.environ.pop("TRITON_INTERPRET", None)
    from gpuparity.backends import triton_decode as td
    from gpuparity.bench.attention_measure import sdpa
    from gpuparity.bench.common import graphed, time_ms

    ints = lambda s: [int(x) for x in s.split(",")]   # noqa: E731
    heads, kv_heads, dim, dtype = 32, 8, 128, torch.bfloat16
    fam = "amd" if torch.version.hip else "nvidia"
    shipped_cfg = dict(td.VENDOR_CONFIGS[fam])
    shipped_budget = td.TILE_BYTES[fam]
    sms = torch.cuda.get_device_properties(0).multi_processor_count

    def is_shipped(r):
        return r["shipped_splits"] and (r["block_n"], r["warps"], r["stages"]) == (
            shipped_cfg["block_n"], shipped_cfg["num_warps"], shipped_cfg["num_stages"])
    with open(args.out, "w") as out:
        for label in args.rows.split(","):
            batch, seq = ROWS[label]
            gen = torch.Generator(device="cuda").manual_seed(0)
            q = torch.randn(batch, heads, 1, dim, device="cuda", dtype=dtype, generator=gen)
            k = torch.randn(batch, kv_heads, seq, dim, device="cuda", dtype=dtype, generator=gen)
            v = torch.randn(batch, kv_heads, seq, dim, device="cuda", dtype=dtype, generator=gen)
            lengths = torch.full((batch,), seq, dtype=torch.int32, device="cuda")
            mask = (torch.arange(seq, device="cuda").view(1, seq) < lengths.view(batch, 1)).view(batch, 1, 1, seq)
            cudnn = sdpa("cudnn", attn_mask=mask, enable_gqa=True)
            expect = cudnn(q, k, v).float()
            peer = {"eager": time_ms(lambda: cudnn(q, k, v))}
            if not args.no_graph:
                peer["graph"] = time_ms(graphed(lambda: cudnn(q, k, v)))
            results, seen = [], set()
            for block_n, warps, stages in itertools.product(ints(args.block_n), ints(args.warps), ints(args.stages)):
                shipped_tile = (block_n, warps, stages) == (shipped_cfg["block_n"], shipped_cfg["num_warps"],
                                                            shipped_cfg["num_stages"])
                td.TILE_BYTES[fam] = shipped_budget if shipped_tile else args.tile_kb * 1024
                block_n, stages = td.fit_tiles(block_n, stages, dim, 2, td.TILE_BYTES[fam])
                if (block_n, warps, stages) in seen:
                    continue
                seen.add((block_n, warps, stages))
                td.VENDOR_CONFIGS[fam] = {"block_n": block_n, "num_warps": warps, "num_stages": stages}
                shipped = td.choose_splits(batch, kv_heads, seq, block_n, q.device)
                tiles = -(-seq // block_n)
                # split counts that give between half a wave and 16 programs per SM
                tried = {s for s in ints(args.splits) if s <= min(tiles, td.MAX_SPLITS)
                         and sms // 2 <= batch * kv_heads * s <= 16 * sms}
                for splits in sorted(tried | {shipped}):
                    def call(splits=splits):
                        return td.triton_decode(q, k, v, lengths, num_splits=splits)
                    row = {"row": label, "B": batch, "Sk": seq, "block_n": block_n, "warps": warps,
                           "stages": stages, "splits": splits, "shipped_splits": splits == shipped}
                    try:
                        err = float((call().float() - expect).abs().max())
                        row["max_abs_diff_vs_cudnn"] = err
                        row["eager_ms"] = time_ms(call)
                    except Exception as exc:  # noqa: BLE001 - a config that fails is a result
                        row["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
                    row.update({f"cudnn_{m}_ms": t for m, t in peer.items()})
                    out.write(json.dumps(row) + "\n")
                    out.flush()
                    results.append(row)
            ok = sorted((r for r in results if "eager_ms" in r), key=lambda r: r["eager_ms"])
            if not args.no_graph:   # in a CUDA graph: the shipped config and the five fastest eager ones
                for r in ok[:5] + [r for r in ok[5:] if is_shipped(r)]:
                    td.VENDOR_CONFIGS[fam] = {"block_n": r["block_n"], "num_warps": r["warps"],
                                                   "num_stages": r["stages"]}
                    td.TILE_BYTES[fam] = args.tile_kb * 1024
                    r["graph_ms"] = time_ms(graphed(lambda: td.triton_decode(q, k, v, lengths,
                                                                             num_splits=r["splits"])))
                    out.write(json.dumps({**r, "graph_only": True}) + "\n")
            td.VENDOR_CONFIGS[fam], td.TILE_BYTES[fam] = shipped_cfg, shipped_budget
            ship = [r for r in ok if is_shipped(r)]
            best = ok[0] if ok else None
            bad = [r for r in ok if r["max_abs_diff_vs_cudnn"] > 0.05]
            print(f"{label}: cudnn {peer}; shipped {ship[0] if ship else None}; best eager {best}; "
                  f"{len(bad)} configs differ from cuDNN by > 0.05", flush=True)
            del q, k, v, mask
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
