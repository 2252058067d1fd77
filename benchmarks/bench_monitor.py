"""The monitor's cost on the Llama training step of bench_model.py (same config, batch and
optimizer): gpuparity.patch attention-only and full, eager, 2048 tokens; rounds alternate
without / with `gpuparity.monitor(model, every=N)` on one model (ABBA order: plain first in even
rounds, monitored first in odd ones, so a drift of the clock falls on both), and the medians of
the rounds' step times are compared. The monitor object lives across its rounds (its call counters
go on, so sampling stays every N-th call); its checks are drained between rounds, outside the
timed steps, so a round without the monitor never runs beside a check. Each variant prints
its due samples, how many were checked, over_budget and dropped, the checks' host time and
their GPU wait, and the overhead; out/.../monitor-overhead.json holds every round.

    PYTHONPATH=src python benchmarks/bench_monitor.py --rounds 6 --steps 15 --out out/monitor-overhead
    PYTHONPATH=src python benchmarks/bench_monitor.py --device cpu --dtype fp32 --layers 1 --hidden 128 \
        --heads 4 --kv-heads 2 --vocab 256 --seq 64 --rounds 2 --steps 2 --every 5     # smoke
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_model import build_batch  # noqa: E402  (the same padded batch as the model benchmark)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--pad", type=float, default=0.25)
    p.add_argument("--variants", default="gpuparity-attn,gpuparity")
    p.add_argument("--every", type=int, default=100)
    p.add_argument("--check-device", default="auto", choices=("auto", "device", "cpu"),
                   help="where the monitor's float64 checks run (gpuparity.monitor's check_device)")
    p.add_argument("--max-overhead", default="default",
                   help="gpuparity.monitor's max_overhead (the checks' host time as a share of the monitored "
                        "time): 'default' (the monitor's), a fraction, or 'none'")
    p.add_argument("--slice-rows-above", default="default",
                   help="gpuparity.monitor's slice_rows_above: 'default', elements, or 'none' (always whole)")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--steps", type=int, default=20, help="timed steps per round")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="bf16", choices=("bf16", "fp16", "fp32"))
    p.add_argument("--out", default="out/monitor-overhead")
    return p.parse_args(argv)


def build(args, variant):
    """bench_model.py's model, batch and step for one variant (attention-only or full patch)."""
    import transformers
    from transformers.models.llama import modeling_llama

    import gpuparity
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    config = transformers.LlamaConfig(
        hidden_size=args.hidden, intermediate_size=int(args.hidden * 2.75), num_hidden_layers=args.layers,
        num_attention_heads=args.heads, num_key_value_heads=args.kv_heads, vocab_size=args.vocab,
        max_position_embeddings=max(8192, args.seq), attn_implementation="sdpa")
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).to(device=args.device, dtype=dtype)
    include = (modeling_llama.LlamaAttention,) if variant == "gpuparity-attn" else None
    gpuparity.patch(model, include=include)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    ids, mask, labels = (t.to(args.device) for t in build_batch(args, args.seq, torch))

    def step():
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()
    return model, step


def timed(step, steps, sync):
    sync()
    started = time.perf_counter()
    for _ in range(steps):
        step()
    sync()
    return 1e3 * (time.perf_counter() - started) / steps


def main(argv=None):
    args = parse_args(argv)
    import gpuparity
    os.makedirs(args.out, exist_ok=True)
    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
    rows = []
    for variant in args.variants.split(","):
        model, step = build(args, variant)
        for _ in range(args.warmup):
            step()
        options = {}
        for name, value, kind in (("max_overhead", args.max_overhead, float),
                                  ("slice_rows_above", args.slice_rows_above, int)):
            if value.lower() != "default":
                options[name] = None if value.lower() == "none" else kind(value)
        mon = gpuparity.monitor(model, every=args.every, check_device=args.check_device, **options)
        share = mon.max_overhead
        plain, watched = [], []

        def monitored():
            with mon:
                watched.append(timed(step, args.steps, sync))
            # leaving the block drained the checks: the next plain round runs alone
        for number in range(args.rounds):
            for arm in ((lambda: plain.append(timed(step, args.steps, sync))), monitored)[::1 if number % 2 == 0 else -1]:
                arm()
        report = mon.report()
        row = {"variant": variant, "every": args.every, "plain_ms": plain, "monitor_ms": watched,
               "plain_median_ms": statistics.median(plain), "monitor_median_ms": statistics.median(watched),
               "due_total": sum(report.due.values()), "checked_total": sum(report.checked.values()),
               "due": report.due, "sampled": report.sampled, "checked": report.checked, "calls": report.calls,
               "dropped": report.dropped, "over_budget": report.over_budget, "max_overhead": share,
               "slice_rows_above": mon.slice_rows_above, "slice_attention_above": mon.slice_attention_above,
               "failures": len(report.failures), "skipped": report.skipped,
               "errors": report.errors[:3], "check_host_s": report.check_host_s,
               "check_gpu_wait_s": report.check_gpu_wait_s,
               "check_device": args.check_device, "checked_on": report.checked_on, "moved_to_cpu": report.moved_to_cpu}
        row["overhead"] = row["monitor_median_ms"] / row["plain_median_ms"] - 1
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if not k.endswith("_ms")}), flush=True)
        print(f"{variant}: plain {row['plain_median_ms']:.2f} ms, monitor {row['monitor_median_ms']:.2f} ms "
              f"(median of {args.rounds} rounds x {args.steps} steps): {100 * row['overhead']:+.2f}%; "
              f"checked {row['checked_total']} of {row['due_total']} due samples (over_budget {report.over_budget}, "
              f"dropped {report.dropped}, failures {len(report.failures)}, errors {len(report.errors)}); "
              f"checks {report.check_host_s:.3f} s host, {report.check_gpu_wait_s:.3f} s GPU wait", flush=True)
        del model, step
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()
    result = {"schema_version": 1, "command": "python benchmarks/bench_monitor.py " + " ".join(sys.argv[1:]),
              "date": time.strftime("%Y-%m-%d"), "torch": torch.__version__,
              "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None, "rows": rows}
    with open(os.path.join(args.out, "monitor-overhead.json"), "w") as handle:
        json.dump(result, handle, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
