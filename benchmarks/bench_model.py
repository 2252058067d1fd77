"""A Llama-style training step, side by side on one host: transformers as shipped (sdpa),
`attn_implementation="gpuparity"` alone, `gpuparity.patch(model)` and Liger-Kernel's
`apply_liger_kernel_to_llama`, each eagerly and under torch.compile; tokens/s (over real tokens
and over all positions), the first steps' time, peak memory and the loss curve against the
unpatched model's.

The variants alternate in rounds (each round runs every variant once per mode and length, in an
order rotated round to round), so that a host that drifts (clocks, another tenant) shifts every
variant alike; each figure is the median over the rounds, with the spread (min-max) beside it.
Each run is its own process: Liger patches transformers' module globals, and a fresh process
gives each run its own peak-memory reading. Same seed, same weights and the same padded batches
in every run. A run that crashes (Liger under torch.compile) is a row saying so, not the end of
the benchmark. The rows share one probe cache (--cache-dir), filled by the first gpuparity run
(background timing off there: GPUPARITY_PROBE_REFINE=off, so no probe competes with the steps).
--first-steps then times the first 3 eager steps of each variant in a fresh process with an
EMPTY probe cache (Triton's cache warm from the rounds), as a user's first run meets them.

    python benchmarks/bench_model.py --out out/model --rounds 3 --first-steps   # the issue's shapes
    python benchmarks/bench_model.py --layers 2 --hidden 256 --heads 4 --kv-heads 2 --seqs 128 \
        --steps 3 --device cpu --dtype fp32 --rounds 2 --modes eager      # a smoke run without a GPU
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

# the default run: as shipped, attention alone through transformers' interface, the full patch, Liger
VARIANTS = ("sdpa", "attn-impl", "gpuparity", "liger")
EXTRA = ("liger-norm-rope",)
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
    p.add_argument("--pad", type=float, default=0.25, help="fraction of the batch's tokens that are padding "
                   "(0.25: one item full, the other half padded)")
    p.add_argument("--steps", type=int, default=10, help="timed steps after --warmup")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="bf16", choices=("bf16", "fp16", "fp32"))
    p.add_argument("--out", default="out/model", help="folder for model.json and model.md")
    p.add_argument("--rounds", type=int, default=3, help="rounds of every variant, mode and length")
    p.add_argument("--first-steps", action="store_true",
                   help="also time each variant's first eager steps with an empty probe cache (first length)")
    p.add_argument("--cache-dir", default=None, help="the rows' shared probe cache (default: OUT/probe-cache)")
    p.add_argument("--deadline-s", type=float, default=None,
                   help="start no run after this many seconds (rows not run say so); results so far are kept")
    p.add_argument("--child-timeout", type=float, default=600.0, help="seconds one run may take")
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
    import logging

    import torch
    import transformers
    if variant != "sdpa" and not variant.startswith("liger"):
        import gpuparity  # noqa: F401 - at the top, as a script has it (on a GPU it starts the first-call worker)
    # gpuparity's INFO lines (a first call that verified a backend says which and how long) go
    # into the row, not to the terminal
    said = []
    handler = logging.Handler(logging.INFO)
    handler.emit = lambda record: said.append(f"{time.perf_counter():.2f} {record.getMessage()}")
    logging.getLogger("gpuparity").addHandler(handler)
    logging.getLogger("gpuparity").setLevel(logging.INFO)
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
    attn = "sdpa"
    if variant == "attn-impl":
        from gpuparity.integrations.transformers import register
        register()                          # attn_implementation="gpuparity"; nothing else swapped
        attn = "gpuparity"
    config = transformers.LlamaConfig(
        hidden_size=args.hidden, intermediate_size=args.intermediate or int(args.hidden * 2.75),
        num_hidden_layers=args.layers, num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
        vocab_size=args.vocab, max_position_embeddings=max(8192, seq), attn_implementation=attn)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).to(device=device, dtype=dtype)
    if variant == "attn-impl":
        notes.append(f"attn_implementation={model.config._attn_implementation}")
    if variant == "gpuparity" or variant in PARTIAL or variant in FORCED:
        import gpuparity
        from transformers.models.llama import modeling_llama
        include = (getattr(modeling_llama, PARTIAL[variant]),) if variant in PARTIAL else None
        summary = gpuparity.patch(model, include=include, backend=FORCED.get(variant, "auto"))
        notes.append(f"patched {len(summary)} modules, left {len(getattr(summary, 'left', []))}")
    model.train()
    # fused AdamW where the device has it (CUDA), else foreach
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, **({"fused": True} if device.type == "cuda"
                                                                    else {"foreach": True}))
    ids, mask, labels = (t.to(device) for t in build_batch(args, seq, torch))
    tokens = int(mask.sum())
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()

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
    said.append(f"{started:.2f} first step starts")
    for _ in range(args.warmup):
        losses.append(float(step()))
    sync()
    warm_s = time.perf_counter() - started
    peak_all = torch.cuda.max_memory_allocated() / 2 ** 30 if device.type == "cuda" else None
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
    positions = args.batch * seq
    return {"variant": variant, "mode": mode, "seq": seq, "tokens_per_step": tokens, "positions_per_step": positions,
            "tokens_per_s": tokens * args.steps / elapsed, "positions_per_s": positions * args.steps / elapsed,
            "step_ms": 1e3 * elapsed / args.steps, "peak_gib": peak,
            "peak_warmup_gib": peak_all, "warmup_s": warm_s, "losses": losses, "notes": notes, "log": said}


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


def _spread(values, fmt):
    if not values:
        return ""
    if len(values) == 1:
        return fmt.format(values[0])
    return f"{fmt.format(statistics.median(values))} ({fmt.format(min(values))}-{fmt.format(max(values))})"


def _loss_drift(losses, ref):
    return max(abs(a - b) / max(abs(b), 1e-6) for a, b in zip(losses, ref))


def summarize(rows):
    """Per (seq, mode, variant): the rounds' rows folded into medians and spreads."""
    groups = {}
    for r in rows:
        if r.get("phase", "round") == "round":
            groups.setdefault((r["seq"], r["mode"], r["variant"]), []).append(r)
    out = []
    for (seq, mode, variant), members in groups.items():
        ok = [r for r in members if "error" not in r and "not_run" not in r]
        errors = sorted({r["error"] for r in members if "error" in r})
        out.append({"seq": seq, "mode": mode, "variant": variant, "runs": len(ok), "errors": errors,
                    "not_run": sum(1 for r in members if "not_run" in r),
                    "tokens_per_s": [r["tokens_per_s"] for r in ok], "positions_per_s": [r["positions_per_s"] for r in ok],
                    "step_ms": [r["step_ms"] for r in ok], "peak_gib": [r["peak_gib"] for r in ok if r["peak_gib"] is not None],
                    "warmup_s": [r["warmup_s"] for r in ok], "losses": ok[0]["losses"] if ok else None,
                    "notes": ok[0]["notes"] if ok else []})
    return out


def markdown(result):
    summary = summarize(result["rows"])
    by = {(s["seq"], s["mode"], s["variant"]): s for s in summary}

    def median(s, field):
        return statistics.median(s[field]) if s and s[field] else None

    lines = [f"# Llama-style training step: {result['title']}", "", f"Command: `{result['command']}`", "",
             f"Date: {result['date']}; versions: {json.dumps(result['versions'])}", "",
             "Medians over the rounds, (min-max) beside; tokens/s over real tokens, and over all positions "
             "(padding included); first 3 steps: the warm-up steps' wall time in that run (probe cache shared "
             "by the rounds); peak: the timed steps' peak allocated memory.", "",
             "| seq | mode | variant | runs | tokens/s (real) | tokens/s (all positions) | step ms | first 3 steps s "
             "| peak GiB | vs sdpa | vs attn-impl | vs liger | loss max rel diff vs sdpa |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for s in summary:
        if not s["runs"]:
            why = "; ".join(s["errors"]) or f"not run ({s['not_run']} runs: past the deadline)"
            lines.append(f"| {s['seq']} | {s['mode']} | {s['variant']} | 0 | {why[:160]} | | | | | | | | |")
            continue
        ratios = []
        for other in ("sdpa", "attn-impl", "liger"):
            ref = by.get((s["seq"], s["mode"], other))
            mine, theirs = median(s, "tokens_per_s"), median(ref, "tokens_per_s")
            ratios.append("" if theirs is None or other == s["variant"] else f"{mine / theirs:.3f}x")
        ref = by.get((s["seq"], s["mode"], "sdpa"))
        drift = "" if not ref or not ref["losses"] else f"{_loss_drift(s['losses'], ref['losses']):.2e}"
        errors = f" ({len(s['errors'])} crashed)" if s["errors"] else ""
        lines.append("| " + " | ".join([str(s["seq"]), s["mode"], s["variant"], f"{s['runs']}{errors}",
                                         _spread(s["tokens_per_s"], "{:.0f}"), _spread(s["positions_per_s"], "{:.0f}"),
                                         _spread(s["step_ms"], "{:.1f}"), _spread(s["warmup_s"], "{:.1f}"),
                                         _spread(s["peak_gib"], "{:.2f}"), *ratios, drift]) + " |")
    first = [r for r in result["rows"] if r.get("phase") == "first-steps"]
    if first:
        lines += ["", "First eager steps in a fresh process with an EMPTY probe cache (Triton's cache warm): "
                  "the warm-up steps' wall time (model built, before the first step, not counted)", "",
                  "| seq | variant | first 3 steps s | vs sdpa | note |", "|---|---|---|---|---|"]
        base = next((r["warmup_s"] for r in first if r["variant"] == "sdpa" and "warmup_s" in r), None)
        for r in first:
            if "warmup_s" not in r:
                lines.append(f"| {r['seq']} | {r['variant']} | {r.get('error', 'not run')[:160]} | | |")
                continue
            delta = "" if base is None else f"{r['warmup_s'] - base:+.1f} s"
            lines.append(f"| {r['seq']} | {r['variant']} | {r['warmup_s']:.1f} | {delta} | {'; '.join(r['notes'])} |")
    return "\n".join(lines) + "\n"


def _child(args, child_argv, variant, mode, seq, env, timeout):
    cmd = [sys.executable, os.path.abspath(__file__), *child_argv, "--one", f"{variant}:{mode}:{seq}"]
    try:
        # faulthandler: a child that aborts (SIGABRT, e.g. std::terminate at exit) prints every
        # thread's Python stack, kept in the row's stderr_tail
        proc = subprocess.run(cmd, capture_output=True, text=True, env={**env, "PYTHONFAULTHANDLER": "1"},
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"variant": variant, "mode": mode, "seq": seq, "error": f"timed out after {timeout:g} s"}
    if proc.returncode == 0:
        return json.loads(proc.stdout.strip().splitlines()[-1])
    lines = [l for l in proc.stderr.strip().splitlines() if l.strip()]
    cause = next((l for l in reversed(lines) if "Error" in l or "error" in l), lines[-1] if lines else "")
    return {"variant": variant, "mode": mode, "seq": seq,
            "error": f"crashed (exit {proc.returncode}): {cause.strip()[:300]}", "stderr_tail": lines[-80:]}


def _strip(argv, *names):
    """argv without the options in names (and their values): a child gets the model's options only."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        if a in names:
            skip = a not in ("--first-steps",)
            continue
        if any(a.startswith(n + "=") for n in names):
            continue
        out.append(a)
    return out


def main(argv=None):
    args = parse_args(argv)
    if args.one:
        variant, mode, seq = args.one.split(":")
        print(json.dumps(run_one(args, variant, mode, int(seq))))
        return 0
    if args.rounds < 0 or (args.rounds == 0 and not args.first_steps):
        raise SystemExit(f"--rounds: expected at least 1 (0 only with --first-steps), got {args.rounds}")
    variants = args.variants.split(",")
    for variant in variants:
        if variant not in VARIANTS + EXTRA and variant not in PARTIAL and variant not in FORCED:
            raise SystemExit(f"--variants: unknown {variant!r}; expected names from "
                             f"{list(VARIANTS + EXTRA) + list(PARTIAL) + list(FORCED)}")
    os.makedirs(args.out, exist_ok=True)
    started = time.monotonic()
    given = list(argv if argv is not None else sys.argv[1:])
    child_argv = _strip(given, "--rounds", "--first-steps", "--cache-dir", "--deadline-s", "--child-timeout", "--out")
    child_argv += ["--out", args.out]
    cache = args.cache_dir or os.path.join(args.out, "probe-cache")
    env = {**os.environ, "GPUPARITY_CACHE_DIR": cache, "GPUPARITY_PROBE_REFINE": "off"}
    seqs = [int(s) for s in args.seqs.split(",")]
    modes = args.modes.split(",")
    result = {"schema_version": 2, "title": f"{args.layers} layers, hidden {args.hidden}, {args.heads} heads, "
              f"{args.kv_heads} kv heads, batch {args.batch}, pad {args.pad}, {args.dtype}, "
              f"{args.warmup} warm-up + {args.steps} timed steps, {args.rounds} rounds",
              "command": "python benchmarks/bench_model.py " + " ".join(given), "date": time.strftime("%Y-%m-%d"),
              "versions": versions(), "rows": []}

    def save():
        with open(os.path.join(args.out, "model.json"), "w") as handle:
            json.dump(result, handle, indent=1)
        with open(os.path.join(args.out, "model.md"), "w") as handle:
            handle.write(markdown(result))

    def late():
        return args.deadline_s is not None and time.monotonic() - started > args.deadline_s

    def run(variant, mode, seq, phase, env, round_, setting=""):
        if late():
            row = {"variant": variant, "mode": mode, "seq": seq, "not_run": "past --deadline-s"}
        else:
            row = _child(args, child_argv, variant, mode, seq, env, args.child_timeout)
        row.update(phase=phase, round=round_)
        if setting:
            row["notes"] = row.get("notes", []) + [setting]
        result["rows"].append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "losses"}), file=sys.stderr, flush=True)
        save()

    for round_ in range(args.rounds):
        # modes in the order given (eager first by default): its rows come back even when the
        # compiled ones run out of time; the first-steps rows come after the first mode's
        for m, mode in enumerate(modes):
            for seq in seqs:
                shift = round_ % len(variants)
                for variant in variants[shift:] + variants[:shift]:
                    run(variant, mode, seq, "round", env, round_)
            if round_ == 0 and m == 0 and args.first_steps:
                first_steps(run, variants, seqs)
    if args.rounds == 0:
        first_steps(run, variants, seqs)
    save()
    print(markdown(result))
    return 0


def first_steps(run, variants, seqs):
    """Each variant's first eager steps in a fresh process with an empty probe cache, then the
    full patch again without the background timing (what the verification alone costs)."""
    settings = [(v, {}, "background timing as shipped" if v in ("attn-impl", "gpuparity") else "") for v in variants]
    settings.append(("gpuparity", {"GPUPARITY_PROBE_REFINE": "off"}, "GPUPARITY_PROBE_REFINE=off"))
    for variant, extra, setting in settings:
        empty = tempfile.mkdtemp(prefix="gpuparity-first-steps-")
        try:
            env = {k: v for k, v in os.environ.items() if k != "GPUPARITY_PROBE_REFINE"}
            run(variant, "eager", seqs[0], "first-steps", {**env, **extra, "GPUPARITY_CACHE_DIR": empty}, 0, setting)
        finally:
            shutil.rmtree(empty, ignore_errors=True)

if __name__ == "__main__":
    sys.exit(main())
