"""A Llama-style training step, three ways side by side: transformers as shipped (sdpa),
Liger-Kernel's `apply_liger_kernel_to_llama`, and `gpuparity.patch`, each eagerly and under
torch.compile; tokens/s, peak memory and the loss curve against the unpatched model's.

Each (variant, mode, sequence length) runs in its own process: Liger patches transformers'
module globals, and a fresh process gives each run its own peak-memory reading. Same seed,
same weights and the same padded batches in every run.

    python benchmarks/bench_model.py --out out/model            # the issue's shapes (H100: ~8 min)
    python benchmarks/bench_model.py --layers 2 --hidden 256 --heads 4 --kv-heads 2 --seqs 128 \
        --steps 3 --device cpu --dtype fp32                       # a smoke run without a GPU
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time

VARIANTS = ("sdpa", "liger", "liger-norm-rope", "gpuparity")
# gpuparity with one kind of module swapped, to tell the ops' shares apart (not in the default run)
PARTIAL = {"gpuparity-attn": "LlamaAttention", "gpuparity-norm": "LlamaRMSNorm", "gpuparity-mlp": "LlamaMLP"}
# gpuparity with every op forced to one backend instead of backend="auto"'s verified choice
FORCED = {"gpuparity-triton": "triton"}
MODES = ("eager", "compile")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--intermediate", type=int, default=None, help="MLP width (default 2.75 x hidden)")
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--seqs", default="2048,4096")
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--pad", type=float, default=0.25, help="fraction of the batch's tokens that are padding")
    p.add_argument("--steps", type=int, default=12, help="timed steps after --warmup")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="bf16", choices=("bf16", "fp16", "fp32"))
    p.add_argument("--out", default="out/model", help="folder for model.json and model.md")
    p.add_argument("--profile", action="store_true",
                   help="also write profile-VARIANT-MODE-SEQ.txt under --out: host ms per step (the time "
                        "step() takes to return) and torch.profiler's top kernels over 3 steps")
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)   # VARIANT:MODE:SEQ, run in this process
    return p.parse_args(argv)


def build_batch(args, seq, torch):
    """Token ids and an attention mask with right padding: item i keeps a length that leaves
    --pad of the batch's tokens as padding overall."""
    gen = torch.Generator().manual_seed(1234 + seq)
    ids = torch.randint(0, args.vocab, (args.batch, seq), generator=gen)
    mask = torch.ones(args.batch, seq, dtype=torch.long)
    for i in range(args.batch):
        # items alternate between full length and a length that makes the mean padding --pad
        keep = seq if i % 2 == 0 else max(1, int(seq * (1 - 2 * args.pad)))
        mask[i, keep:] = 0
    labels = ids.masked_fill(mask == 0, -100)
    return ids, mask, labels


def run_one(args, variant, mode, seq):
    import torch
    import transformers
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    device = torch.device(args.device)
    notes = []
    if variant == "liger":
        from liger_kernel.transformers import apply_liger_kernel_to_llama
        apply_liger_kernel_to_llama()       # its defaults: rope, rms_norm, swiglu, fused linear cross entropy
    elif variant == "liger-norm-rope":
        from liger_kernel.transformers import apply_liger_kernel_to_llama
        apply_liger_kernel_to_llama(rope=True, rms_norm=True, swiglu=False, cross_entropy=False,
                                    fused_linear_cross_entropy=False)
    config = transformers.LlamaConfig(
        hidden_size=args.hidden, intermediate_size=args.intermediate or int(args.hidden * 2.75),
        num_hidden_layers=args.layers, num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
        vocab_size=args.vocab, max_position_embeddings=max(8192, seq), attn_implementation="sdpa")
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).to(device=device, dtype=dtype)
    if variant == "gpuparity" or variant in PARTIAL or variant in FORCED:
        import gpuparity
        from transformers.models.llama import modeling_llama
        include = (getattr(modeling_llama, PARTIAL[variant]),) if variant in PARTIAL else None
        summary = gpuparity.patch(model, include=include, backend=FORCED.get(variant, "auto"))
        notes.append(f"patched {len(summary)} modules, left {len(getattr(summary, 'left', []))}")
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    ids, mask, labels = (t.to(device) for t in build_batch(args, seq, torch))
    tokens = int(mask.sum())

    def step():
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    if mode == "compile":
        step = torch.compile(step)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    losses = []
    started = time.perf_counter()
    for _ in range(args.warmup):
        losses.append(float(step()))
    sync()
    warm_s = time.perf_counter() - started
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    started = time.perf_counter()
    timed = [step() for _ in range(args.steps)]
    sync()
    elapsed = time.perf_counter() - started
    losses += [float(t) for t in timed]
    peak = torch.cuda.max_memory_allocated() / 2 ** 30 if device.type == "cuda" else None
    if args.profile:
        write_profile(args, f"{variant}-{mode}-{seq}", step, sync, torch)
    if mode == "compile":
        from torch._dynamo.utils import counters
        notes.append(f"dynamo: {sum(counters['graph_break'].values())} graph breaks, "
                     f"{counters['stats'].get('unique_graphs', 0)} graphs")
    return {"variant": variant, "mode": mode, "seq": seq, "tokens_per_step": tokens,
            "tokens_per_s": tokens * args.steps / elapsed, "step_ms": 1e3 * elapsed / args.steps,
            "peak_gib": peak, "warmup_s": warm_s, "losses": losses, "notes": notes}


def write_profile(args, label, step, sync, torch):
    """Host time per step (how long step() takes to return, the GPU left to run behind it) and
    the profiler's kernels by device time, so a slow row says whether host or device is why."""
    host = []
    for _ in range(5):
        sync()
        started = time.perf_counter()
        step()
        host.append(1e3 * (time.perf_counter() - started))
    sync()
    from torch.profiler import ProfilerActivity, profile
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if args.device == "cuda" else [])
    with profile(activities=activities) as prof:
        for _ in range(3):
            step()
        sync()
    sort = "self_cuda_time_total" if args.device == "cuda" else "self_cpu_time_total"
    with open(os.path.join(args.out, f"profile-{label}.txt"), "w") as handle:
        handle.write(f"host ms per step (returned, not synced), 5 steps: {[round(h, 2) for h in host]}\n")
        handle.write(prof.key_averages().table(sort_by=sort, row_limit=30, max_name_column_width=70))
        if args.device == "cuda":   # where the host time goes (ops by their own CPU time)
            handle.write("\n\nby self CPU time:\n")
            handle.write(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30,
                                                   max_name_column_width=70))


def versions():
    out = {"python": platform.python_version()}
    for name in ("torch", "triton", "transformers", "liger_kernel", "gpuparity"):
        try:
            module = __import__(name)
            out[name] = getattr(module, "__version__", "?")
        except Exception as exc:  # noqa: BLE001 - a missing peer is a row, not a crash
            out[name] = f"absent ({type(exc).__name__})"
    try:
        import torch
        if torch.cuda.is_available():
            out["gpu"] = torch.cuda.get_device_name(0)
    except Exception:  # noqa: BLE001
        pass
    return out


def markdown(result):
    rows = result["rows"]
    base = {(r["mode"], r["seq"]): r for r in rows if r.get("variant") == "sdpa" and "error" not in r}
    liger = {(r["mode"], r["seq"]): r for r in rows if r.get("variant") == "liger" and "error" not in r}
    lines = [f"# Llama-style training step: {result['title']}", "", f"Command: `{result['command']}`", "",
             f"Versions: {json.dumps(result['versions'])}", "",
             "| seq | mode | variant | tokens/s | step ms | peak GiB | vs sdpa | vs liger | loss max rel diff vs sdpa |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['seq']} | {r['mode']} | {r['variant']} | error: {r['error'][:120]} | | | | | |")
            continue
        ref = base.get((r["mode"], r["seq"]))
        lig = liger.get((r["mode"], r["seq"]))
        drift = None if ref is None else max(abs(a - b) / max(abs(b), 1e-6) for a, b in zip(r["losses"], ref["losses"]))
        cells = [str(r["seq"]), r["mode"], r["variant"], f"{r['tokens_per_s']:.0f}", f"{r['step_ms']:.1f}",
                 "" if r["peak_gib"] is None else f"{r['peak_gib']:.2f}",
                 "" if ref is None else f"{r['tokens_per_s'] / ref['tokens_per_s']:.2f}x",
                 "" if lig is None else f"{r['tokens_per_s'] / lig['tokens_per_s']:.2f}x",
                 "" if drift is None else f"{drift:.2e}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    args = parse_args(argv)
    if args.one:
        variant, mode, seq = args.one.split(":")
        print(json.dumps(run_one(args, variant, mode, int(seq))))
        return 0
    os.makedirs(args.out, exist_ok=True)
    rows = []
    child_argv = [a for a in (argv if argv is not None else sys.argv[1:])]
    for seq in (int(s) for s in args.seqs.split(",")):
        for mode in args.modes.split(","):
            for variant in args.variants.split(","):
                if variant not in VARIANTS and variant not in PARTIAL and variant not in FORCED:
                    raise SystemExit(f"--variants: unknown {variant!r}; expected names from "
                                     f"{list(VARIANTS) + list(PARTIAL) + list(FORCED)}")
                cmd = [sys.executable, os.path.abspath(__file__), *child_argv, "--one", f"{variant}:{mode}:{seq}"]
                proc = subprocess.run(cmd, capture_output=True, text=True)
                if proc.returncode == 0:
                    row = json.loads(proc.stdout.strip().splitlines()[-1])
                else:
                    row = {"variant": variant, "mode": mode, "seq": seq,
                           "error": (proc.stderr.strip().splitlines() or ["exit %d" % proc.returncode])[-1]}
                rows.append(row)
                print(json.dumps({k: v for k, v in row.items() if k != "losses"}), file=sys.stderr, flush=True)
    result = {"schema_version": 1, "title": f"{args.layers} layers, hidden {args.hidden}, {args.heads} heads, "
              f"{args.kv_heads} kv heads, batch {args.batch}, pad {args.pad}, {args.dtype}",
              "command": "python benchmarks/bench_model.py " + " ".join(child_argv), "date": time.strftime("%Y-%m-%d"),
              "versions": versions(), "rows": rows}
    with open(os.path.join(args.out, "model.json"), "w") as handle:
        json.dump(result, handle, indent=1)
    with open(os.path.join(args.out, "model.md"), "w") as handle:
        handle.write(markdown(result))
    print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
