"""Paged vs contiguous decode on one GPU: gpuparity's split-KV Triton kernel reading a paged KV
cache in place through a block table (pages of 256 and 16 tokens in a shuffled order, in
FlashAttention's / vLLM's (num_blocks, page_size, Hkv, D) pool) against the same kernel on a
contiguous cache of the same lengths, per (B, Sk), bf16, H 32, Hkv 8, D 128, one new token.

    PYTHONPATH=src python3 benchmarks/bench_paged_decode.py --out OUT

Every call is replayed from a CUDA graph (device time) and the variants of a row are timed in
interleaved rounds in one process (round r times every variant before round r + 1), so drift
hits them alike; the row reports each variant's median over the rounds and the median of the
per-round ratios paged / contiguous. Each paged output is compared with the contiguous one
(the same keys: the difference should be 0). GPU only (exits 2 without one); writes
paged-decode.json and paged-decode.md under --out.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import time

from bench_decode import gpu_time_us   # median of CUDA-event timings, repeats sized to ~40 ms


def parse(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="out/paged-decode", help="folder for paged-decode.json and .md")
    parser.add_argument("--batches", default="1,8,32,64")
    parser.add_argument("--seqlens", default="2048,8192,32768,131072")
    parser.add_argument("--pages", default="256,16", help="page sizes of the paged variants")
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--max-gib", type=float, default=48.0,
                        help="skip rows whose caches (contiguous + every pool) exceed this")
    parser.add_argument("--budget-s", type=float, default=120.0, help="stop starting rows after this long")
    return parser.parse_args(argv)


def paged_pools(torch, k, v, page, gen):
    """k, v (B, S, Hkv, D) moved onto the same shuffled pages of two (num_blocks, page, Hkv, D)
    pools (B * ceil(S / page) pages plus a few spare ones); returns (k_pool, v_pool, block_table
    int32 (B, ceil(S / page))). Filled one batch item at a time, so the only memory beyond the
    pools is one item's padded copy (B 64 x 128k keeps both caches, 64 GiB, on an 80 GB card)."""
    batch, seq = k.shape[:2]
    blocks = -(-seq // page)
    num_blocks = batch * blocks + 3
    order = torch.randperm(num_blocks, generator=gen)[:batch * blocks].view(batch, blocks).to(k.device)
    pools = []
    for cache in (k, v):
        pool = torch.zeros((num_blocks, page) + tuple(k.shape[2:]), dtype=k.dtype, device=k.device)
        for item in range(batch):
            padded = torch.zeros((blocks * page,) + tuple(k.shape[2:]), dtype=k.dtype, device=k.device)
            padded[:seq] = cache[item]
            pool[order[item]] = padded.view((blocks, page) + tuple(k.shape[2:]))
        pools.append(pool)
        del padded
    return pools[0], pools[1], order.to(torch.int32)


def main(argv=None) -> int:
    args = parse(argv)
    import torch
    if not torch.cuda.is_available():
        print("bench_paged_decode: needs a CUDA or ROCm GPU (none visible); nothing measured", file=sys.stderr)
        return 2
    os.environ.pop("TRITON_INTERPRET", None)
    from gpuparity.backends import triton_decode as td
    from gpuparity.bench.common import graphed

    started, props = time.monotonic(), torch.cuda.get_device_properties(0)
    batches = [int(x) for x in args.batches.split(",")]
    seqlens = [int(x) for x in args.seqlens.split(",")]
    pages = [int(x) for x in args.pages.split(",")]
    hkv, heads, dim, dtype = args.kv_heads, args.heads, args.head_dim, torch.bfloat16
    gen = torch.Generator().manual_seed(0)
    rows = []
    for seq in seqlens:
        for batch in batches:
            row = {"B": batch, "Sk": seq}
            rows.append(row)
            kv_bytes = 2 * batch * hkv * seq * dim * 2
            if kv_bytes * (1 + len(pages)) > args.max_gib * 2 ** 30:
                row["skipped"] = f"caches {kv_bytes * (1 + len(pages)) / 2 ** 30:.0f} GiB > --max-gib"
                continue
            if time.monotonic() - started > args.budget_s:
                row["skipped"] = "time budget spent"
                continue
            q = torch.randn(batch, heads, 1, dim, device="cuda", dtype=dtype)
            # FlashAttention's (B, S, Hkv, D) cache, read through its (B, Hkv, S, D) view
            k = torch.randn(batch, seq, hkv, dim, device="cuda", dtype=dtype)
            v = torch.randn(batch, seq, hkv, dim, device="cuda", dtype=dtype)
            # lengths a little short of full, so the last page of each item is partly used
            lengths = torch.full((batch,), seq - 3, dtype=torch.int32, device="cuda")
            variants = {"contiguous": lambda: td.triton_decode(q, k.transpose(1, 2), v.transpose(1, 2), lengths)}
            for page in pages:
                k_pool, v_pool, table = paged_pools(torch, k, v, page, gen)
                variants[f"page{page}"] = (lambda kp=k_pool, vp=v_pool, t=table: td.triton_decode(
                    q, kp.transpose(1, 2), vp.transpose(1, 2), lengths, block_table=t))
            want = variants["contiguous"]().float()
            for name, fn in variants.items():
                if name != "contiguous":
                    row[f"{name}_max_abs_diff"] = float((fn().float() - want).abs().max())
            replays = {name: graphed(fn) for name, fn in variants.items()}
            times = {name: [] for name in variants}
            for _ in range(args.rounds):
                for name, replay in replays.items():
                    times[name].append(gpu_time_us(replay, torch))
            row["splits"] = td.choose_splits(batch, hkv, seq, td.fit_tiles(64, 3, dim, 2, td.TILE_BYTES["nvidia"])[0],
                                             q.device)
            for name, series in times.items():
                row[f"{name}_us"] = statistics.median(series)
                if name != "contiguous":
                    row[f"{name}_ratio"] = statistics.median(t / c for t, c in zip(series, times["contiguous"]))
            row["kv_gbs"] = kv_bytes / (row["contiguous_us"] * 1e-6) / 1e9
            print(f"B={batch:3d} Sk={seq:6d}: contiguous {row['contiguous_us']:8.1f} us  " +
                  "  ".join(f"page {p}: {row[f'page{p}_us']:8.1f} us ({row[f'page{p}_ratio']:.3f}x)" for p in pages),
                  flush=True)
            del q, k, v, variants, replays, want
            torch.cuda.empty_cache()
    import triton
    record = {"command": "PYTHONPATH=src python3 benchmarks/bench_paged_decode.py " +
                         " ".join(argv if argv is not None else sys.argv[1:]),
              "device": props.name, "sms": props.multi_processor_count, "torch": torch.__version__,
              "triton": triton.__version__, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
              "seconds": time.monotonic() - started, "rows": rows, "pages": pages, "rounds": args.rounds,
              "shape": {"Hkv": hkv, "H": heads, "D": dim, "Sq": 1}}
    os.makedirs(args.out, exist_ok=True)
    for name, text in (("paged-decode.json", json.dumps(record, indent=1)), ("paged-decode.md", markdown(record))):
        with open(os.path.join(args.out, name), "w") as handle:
            handle.write(text)
    print(f"wrote {args.out}/paged-decode.json and paged-decode.md in {record['seconds']:.0f} s")
    return 0


def markdown(record) -> str:
    pages = record["pages"]
    head = " | ".join(f"page {p} us | ratio | max abs diff" for p in pages)
    lines = [f"# Paged vs contiguous decode, {record['device']} ({record['sms']} SMs), torch {record['torch']}, "
             f"triton {record['triton']}", "",
             f"`{record['command']}`; bf16, H {record['shape']['H']}, Hkv {record['shape']['Hkv']}, "
             f"D {record['shape']['D']}, 1 new token, lengths Sk - 3; CUDA-graph replay, {record['rounds']} "
             f"interleaved rounds (median us; ratio = median of per-round paged / contiguous).", "",
             f"| B | Sk | splits | contiguous us | K+V GB/s | {head} |",
             "|---|---|---|---|---|" + "---|---|---|" * len(pages)]
    for row in record["rows"]:
        if "skipped" in row:
            lines.append(f"| {row['B']} | {row['Sk']} | skipped: {row['skipped']} |" + " |" * (2 + 3 * len(pages)))
            continue
        cells = " | ".join(f"{row[f'page{p}_us']:.1f} | {row[f'page{p}_ratio']:.3f} | {row[f'page{p}_max_abs_diff']:.2g}"
                           for p in pages)
        lines.append(f"| {row['B']} | {row['Sk']} | {row['splits']} | {row['contiguous_us']:.1f} | {row['kv_gbs']:.0f} | "
                     f"{cells} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
