"""Decode attention against a KV cache on one GPU: gpuparity's split-KV Triton kernel against
torch SDPA (bool mask, enable_gqa) and the plain composition, per (B, Sk) at Hkv 8, H 32, D 128,
bf16, Sq 1. Reports microseconds and GB/s of K+V read (2 * B * Hkv * Sk * D * 2 bytes) against
the device's measured copy bandwidth; writes decode.json and decode.md under --out.

    PYTHONPATH=src python benchmarks/bench_decode.py --out benchmarks/records/h100/decode

GPU only (exits 2 on a machine without one). Each row records the largest difference of the
Triton output from SDPA's (or the composition's); a peer that runs out of memory records "oom"
and the run goes on; rows stop being started after --budget-s. About a minute on an H100.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time


def parse(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/records/decode", help="folder for decode.json and decode.md")
    parser.add_argument("--batches", default="1,4,16,64")
    parser.add_argument("--seqlens", default="4096,16384,65536,131072")
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--q-len", type=int, default=1)
    parser.add_argument("--block-n", default="64,128", help="Triton key tiles to try; the fastest is reported")
    parser.add_argument("--max-cache-gib", type=float, default=40.0, help="skip rows whose K+V exceed this")
    parser.add_argument("--budget-s", type=float, default=150.0, help="stop starting rows after this long")
    parser.add_argument("--splits-per-sm", default="",
                        help="also try B*Hkv*splits ~= F x SMs for each F in this list (e.g. 2,4,8); the "
                             "shipped choice (choose_splits) is always timed and reported beside the best")
    parser.add_argument("--graph", action="store_true",
                        help="time each call replayed from a CUDA graph (device time; without it the "
                             "smallest rows measure the host's launch time too)")
    args = parser.parse_args(argv)
    if not all(f.isdigit() and int(f) > 0 for f in args.splits_per_sm.split(",") if f):
        parser.error(f"--splits-per-sm: expected comma-separated positive integers, got {args.splits_per_sm!r}")
    return args


def gpu_time_us(fn, torch, min_reps=5, target_ms=40.0):
    """Median of CUDA-event timings, repeats sized to ~target_ms (at least min_reps); the L2 is
    flushed by the cache size itself (K+V are far larger than L2 on every row but the smallest)."""
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    torch.cuda.synchronize()
    once = max(start.elapsed_time(end), 1e-3)
    reps = int(max(min_reps, min(200, target_ms / once)))
    times = []
    for _ in range(reps):
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    return 1000.0 * times[len(times) // 2]


def copy_bandwidth(torch) -> float:
    """GB/s of a device-to-device copy of 2 GiB (bytes read + bytes written)."""
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    us = gpu_time_us(lambda: dst.copy_(src), torch)
    del src, dst
    return 2 * (1 << 30) / (us * 1e-6) / 1e9


def main(argv=None) -> int:
    args = parse(argv)
    import torch
    if not torch.cuda.is_available():
        print("bench_decode: needs a CUDA or ROCm GPU (none visible); nothing measured", file=sys.stderr)
        return 2
    os.environ.pop("TRITON_INTERPRET", None)
    from gpuparity.backends import triton_decode as td
    from gpuparity.contracts.decode import decode_composition
    from gpuparity.bench.common import graphed

    started = time.monotonic()
    props = torch.cuda.get_device_properties(0)
    copy_gbs = copy_bandwidth(torch)
    batches = [int(x) for x in args.batches.split(",")]
    seqlens = [int(x) for x in args.seqlens.split(",")]
    blocks = [int(x) for x in args.block_n.split(",")]
    hkv, heads, dim, q_len, dtype = args.kv_heads, args.heads, args.head_dim, args.q_len, torch.bfloat16
    rows = []
    for seq in seqlens:
        for batch in batches:
            row = {"B": batch, "Hkv": hkv, "H": heads, "Sk": seq, "D": dim, "Sq": q_len, "dtype": "bf16"}
            rows.append(row)
            kv_bytes = 2 * batch * hkv * seq * dim * 2
            row["kv_gb"] = kv_bytes / 1e9
            if kv_bytes > args.max_cache_gib * 2 ** 30:
                row["skipped"] = f"K+V {kv_bytes / 2 ** 30:.1f} GiB > --max-cache-gib"
                continue
            if time.monotonic() - started > args.budget_s:
                row["skipped"] = "time budget spent"
                continue
            try:
                q = torch.randn(batch, heads, q_len, dim, device="cuda", dtype=dtype)
                k = torch.randn(batch, hkv, seq, dim, device="cuda", dtype=dtype)
                v = torch.randn(batch, hkv, seq, dim, device="cuda", dtype=dtype)
            except torch.OutOfMemoryError:
                row["skipped"] = "oom allocating the cache"
                torch.cuda.empty_cache()
                continue
            lengths = torch.full((batch,), seq, dtype=torch.int32, device="cuda")
            timed = (lambda fn: gpu_time_us(graphed(fn), torch)) if args.graph else \
                (lambda fn: gpu_time_us(fn, torch))
            best = None
            for block in blocks:
                shipped = td.choose_splits(batch, hkv, seq, block, q.device)
                tries = {shipped: "shipped"}
                for factor in (int(f) for f in args.splits_per_sm.split(",") if f):
                    splits = max(1, min(-(-factor * props.multi_processor_count // (batch * hkv)),
                                        -(-seq // block), td.MAX_SPLITS))
                    tries.setdefault(splits, f"{factor}x SMs")
                for splits, label in tries.items():
                    us = timed(lambda: td.triton_decode(q, k, v, lengths, block_n=block, num_splits=splits))
                    if label == "shipped" and ("shipped_us" not in row or us < row["shipped_us"]):
                        row["shipped_us"], row["shipped_splits"] = us, splits
                    if best is None or us < best[0]:
                        best = (us, block, splits, label)
            row["triton_us"], row["triton_block_n"], row["num_splits"], row["splits_rule"] = best
            mine = td.triton_decode(q, k, v, lengths, block_n=best[1], num_splits=best[2]).float()
            for name, fn in (("sdpa", td.decode_sdpa), ("composition", decode_composition)):
                try:
                    theirs = fn(q, k, v, lengths)
                    row[f"{name}_us"] = timed(lambda: fn(q, k, v, lengths))
                    if "max_abs_diff" not in row:
                        row["max_abs_diff"] = float((mine - theirs.float()).abs().max())
                        row["diff_against"] = name
                    del theirs
                except (torch.OutOfMemoryError, RuntimeError) as exc:
                    row[f"{name}_us"] = None
                    row[f"{name}_error"] = "oom" if "out of memory" in str(exc).lower() else str(exc)[:160]
                torch.cuda.empty_cache()
            for name in ("triton", "sdpa", "composition"):
                if row.get(f"{name}_us"):
                    row[f"{name}_gbs"] = kv_bytes / (row[f"{name}_us"] * 1e-6) / 1e9
            row["triton_of_copy"] = row["triton_gbs"] / copy_gbs
            peers = [row[f"{n}_us"] for n in ("sdpa", "composition") if row.get(f"{n}_us")]
            row["speedup_vs_best_peer"] = min(peers) / row["triton_us"] if peers else None
            del q, k, v, mine
            torch.cuda.empty_cache()
            print(f"B={batch:3d} Sk={seq:6d}: triton {row['triton_us']:9.1f} us ({row['triton_of_copy']:.0%} of copy), "
                  f"sdpa {row.get('sdpa_us') or float('nan'):9.1f} us", flush=True)
    record = {"command": "python benchmarks/bench_decode.py " + " ".join(argv if argv is not None else sys.argv[1:]),
              "device": props.name, "sms": props.multi_processor_count, "torch": torch.__version__,
              "copy_gbs": copy_gbs, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
              "seconds": time.monotonic() - started, "rows": rows,
              "shape": {"Hkv": hkv, "H": heads, "D": dim, "Sq": q_len},
              "timing": "CUDA graph replay" if args.graph else "eager calls"}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "decode.json"), "w") as handle:
        json.dump(record, handle, indent=1)
    with open(os.path.join(args.out, "decode.md"), "w") as handle:
        handle.write(markdown(record))
    print(f"wrote {args.out}/decode.json and decode.md in {record['seconds']:.0f} s")
    return 0


def markdown(record) -> str:
    def cell(value, fmt):
        return "-" if value is None else format(value, fmt)
    lines = [f"# Decode attention, {record['device']} ({record['sms']} SMs), torch {record['torch']}", "",
             f"`{record['command']}`; copy bandwidth {record['copy_gbs']:.0f} GB/s (read + write); "
             f"Hkv {record['shape']['Hkv']}, H {record['shape']['H']}, D {record['shape']['D']}, bf16, "
             f"Sq {record['shape']['Sq']}; GB/s = K+V bytes read / time; timed as "
             f"{record.get('timing', 'eager calls')}.", "",
             "| B | Sk | splits (rule) | triton us | GB/s | % of copy | shipped splits: us | sdpa us | composition us | "
             "vs best peer | max abs diff |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in record["rows"]:
        if "skipped" in row:
            lines.append(f"| {row['B']} | {row['Sk']} | skipped: {row['skipped']} | | | | | | | | |")
            continue
        lines.append(
            f"| {row['B']} | {row['Sk']} | {row['num_splits']} ({row.get('splits_rule', '-')}) | {row['triton_us']:.1f} | "
            f"{row['triton_gbs']:.0f} | {row['triton_of_copy']:.0%} | "
            f"{row.get('shipped_splits', '-')}: {cell(row.get('shipped_us'), '.1f')} | {cell(row.get('sdpa_us'), '.1f') if row.get('sdpa_us') else row.get('sdpa_error', '-')} | "
            f"{cell(row.get('composition_us'), '.1f') if row.get('composition_us') else row.get('composition_error', '-')} | "
            f"{cell(row.get('speedup_vs_best_peer'), '.2f')}x | {cell(row.get('max_abs_diff'), '.2g')} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
