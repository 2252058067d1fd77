"""gpuparity.flash_attn's rotary, fused residual norm and cross entropy beside FlashAttention's own
Triton kernels for them (issue 46 item 4), forward + backward in bf16 at LLM shapes.

FlashAttention's files (flash_attn/ops/triton/rotary.py, layer_norm.py, cross_entropy.py, and the
two helpers layer_norm.py imports) are loaded by path from an export of a FlashAttention checkout
(benchmarks/scripts/fa_triton_prepare.sh writes .fa_src/) under the module names fa_ref_triton_*,
which gpuparity.flash_attn.install() does not shadow; layer_norm.py's `from flash_attn.utils...`
imports see FlashAttention's own helper files only while it loads. The files are run as they are.
The sides: gpuparity.flash_attn's same-named functions on their default backends ("auto", first calls
waiting for their verdict: GPUPARITY_FIRST_CALLS=wait) and
FlashAttention's functions (rotary: its apply_rotary in its ApplyRotaryEmb's forward/backward
form, as flash_attn.layers.rotary calls it; layers/rotary.py itself needs einops).

Per case: both sides checked first against a float64 reference (max |error| of every output and
gradient; FlashAttention's test criterion: ours <= 2 x theirs + atol), then timed in interleaved
rounds (each round both sides, the first side alternating): CUDA-event device time per call over
--iters back-to-back calls, host wall time per call (from an idle GPU until the call returns,
median), and the peak of torch.cuda.max_memory_allocated over one call above what was allocated
before it. The first call of each side (Triton compiles and autotuning, gpuparity's first-call
verification) is timed apart. Writes fa_triton_speed.md and .json under --out.

    bash benchmarks/scripts/fa_triton_prepare.sh
    PYTHONPATH=src python benchmarks/fa_triton_speed.py --fa-src .fa_src --out OUT
    PYTHONPATH=src python benchmarks/fa_triton_speed.py --dry-run     # CPU: tiny shapes, the interpreter
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import importlib.util
import json
import math
import os
import statistics
import sys
import time
import types
from typing import Any, Callable, Dict, List, Optional, Tuple

FA_FILES = {"rotary": "flash_attn/ops/triton/rotary.py", "layer_norm": "flash_attn/ops/triton/layer_norm.py",
            "cross_entropy": "flash_attn/ops/triton/cross_entropy.py"}
FA_HELPERS = {"flash_attn.utils.torch": "flash_attn/utils/torch.py",
              "flash_attn.utils.library": "flash_attn/utils/library.py"}
SIDES = ("gpuparity", "flash_attn")


@dataclasses.dataclass
class Case:
    name: str
    kind: str            # rotary | norm | ce
    mode: str            # fwd | fwd+bwd
    params: Dict[str, Any]


def cases(dry_run: bool) -> List[Case]:
    """The LLM shapes (--dry-run: the same arguments at tiny sizes)."""
    b, s, h, d = (1, 8, 2, 16) if dry_run else (4, 4096, 32, 128)
    rows, hidden = (6, 40) if dry_run else (8192, 4096)
    vocabs = (50, 70) if dry_run else (32000, 128256)
    decode_b, table = (3, 16) if dry_run else (64, 4096)
    out = [Case(f"rotary ({b}, {s}, {h}, {d})", "rotary", "fwd+bwd", dict(B=b, S=s, H=h, D=d, table=s, offsets=False)),
           Case(f"rotary decode ({decode_b}, 1, {h}, {d}), per-sequence offsets", "rotary", "fwd",
                dict(B=decode_b, S=1, H=h, D=d, table=table, offsets=True))]
    for norm in ("rms", "layer"):
        for fp32 in (False, True):
            residual = "fp32 residual, residual_in_fp32=True" if fp32 else "residual in x's dtype"
            out.append(Case(f"{norm}_norm_fn {rows} x {hidden}, {residual}, prenorm", "norm", "fwd+bwd",
                            dict(rows=rows, hidden=hidden, rms=norm == "rms", residual_in_fp32=fp32)))
    for vocab in vocabs:
        out.append(Case(f"cross_entropy_loss {rows} x {vocab}", "ce", "fwd+bwd", dict(rows=rows, vocab=vocab)))
    return out


# ----------------------------------------------------------------------------- FlashAttention's files
def _load(name: str, path: str) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"fa_triton_speed: cannot load {path} as a module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def cpu_stand_ins() -> None:
    """--dry-run on a CPU: FlashAttention's files ask CUDA what they need (layer_norm.py the current
    device's warp size when it loads, to autotune over the warp counts that fit 1024 threads;
    rotary.py enters torch.cuda.device(x.device.index)). They are told a warp of 1024 threads
    (one autotune config: the interpreter has no timer to choose among several) and 2 SMs, and given a no-op
    device context. Never on a GPU."""
    import torch
    torch.cuda.current_device = lambda: 0
    torch.cuda.get_device_properties = lambda device=None: types.SimpleNamespace(warp_size=1024,
                                                                                 multi_processor_count=2)
    torch.cuda.device = lambda index=None: contextlib.nullcontext()


def load_flash_attention(src: str) -> Dict[str, types.ModuleType]:
    """FlashAttention's three Triton files as fa_ref_triton_<name>; missing files name the prepare script."""
    missing = [rel for rel in (*FA_FILES.values(), *FA_HELPERS.values()) if not os.path.isfile(os.path.join(src, rel))]
    if missing:
        raise SystemExit(f"fa_triton_speed: --fa-src {src!r} lacks {missing}; run "
                         "benchmarks/scripts/fa_triton_prepare.sh (it exports them into .fa_src/)")
    shadowed = ("flash_attn", "flash_attn.utils", *FA_HELPERS)
    saved = {name: sys.modules.get(name) for name in shadowed}
    try:
        for package in ("flash_attn", "flash_attn.utils"):
            module = types.ModuleType(package)
            module.__path__ = []
            sys.modules[package] = module
        for name, rel in FA_HELPERS.items():
            sys.modules[name] = _load("fa_ref_" + name.replace(".", "_"), os.path.join(src, rel))
        return {key: _load(f"fa_ref_triton_{key}", os.path.join(src, rel)) for key, rel in FA_FILES.items()}
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module


def fa_commit(src: str) -> Optional[str]:
    path = os.path.join(src, "COMMIT")
    return open(path).read().strip() if os.path.isfile(path) else None


# ----------------------------------------------------------------------------- the calls
def fa_rotary_function(apply_rotary):
    """FlashAttention's ApplyRotaryEmb (flash_attn/layers/rotary.py) over its apply_rotary: the
    forward rotates, the backward rotates the gradient by the conjugate."""
    import torch

    class ApplyRotaryEmb(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, cos, sin, seqlen_offsets):
            ctx.save_for_backward(cos, sin)
            ctx.seqlen_offsets = seqlen_offsets
            return apply_rotary(x, cos, sin, seqlen_offsets=seqlen_offsets)

        @staticmethod
        def backward(ctx, do):
            cos, sin = ctx.saved_tensors
            return apply_rotary(do, cos, sin, seqlen_offsets=ctx.seqlen_offsets, conjugate=True), None, None, None

    return ApplyRotaryEmb.apply


@dataclasses.dataclass
class Built:
    inputs: List[Any]                  # tensors (those requiring grad get gradients) and other arguments
    grads: List[Any]                   # grad_outputs for the backward (fwd+bwd)
    call: Dict[str, Callable]          # side -> fn(*inputs) -> output tensor or tuple
    reference: Callable                # float64 fn(*inputs) -> outputs (autograd for the gradients)
    check_rows: Optional[int] = None   # the reference on the first rows only (cross entropy)


def build(case: Case, fa: Dict[str, types.ModuleType], device, dtype) -> Built:
    import torch
    import gpuparity.flash_attn.layers.rotary as gp_rotary
    import gpuparity.flash_attn.ops.triton.cross_entropy as gp_ce
    import gpuparity.flash_attn.ops.triton.layer_norm as gp_ln

    gen = torch.Generator(device="cpu").manual_seed(0)

    def randn(*shape, dt=dtype, scale=1.0, grad=False):
        t = (torch.randn(*shape, generator=gen) * scale).to(device=device, dtype=dt)
        return t.requires_grad_(grad)

    p = case.params
    backward = case.mode == "fwd+bwd"
    if case.kind == "rotary":
        half = p["D"] // 2
        angle = torch.arange(p["table"], dtype=torch.float64)[:, None] * 10000.0 ** (-torch.arange(half) / half)
        cos, sin = (f(angle).to(device=device, dtype=dtype) for f in (torch.cos, torch.sin))
        offsets = (torch.randint(0, p["table"] - p["S"], (p["B"],), generator=gen).to(device=device, dtype=torch.int32)
                   if p["offsets"] else 0)
        x = randn(p["B"], p["S"], p["H"], p["D"], grad=backward)
        fa_apply = fa_rotary_function(fa["rotary"].apply_rotary)

        def reference(x, cos, sin, offsets):
            position = torch.arange(x.shape[1], device=x.device)[None, :] + (
                offsets.long()[:, None] if torch.is_tensor(offsets) else offsets)
            c, s = cos.double()[position][:, :, None, :], sin.double()[position][:, :, None, :]
            x1, x2 = x[..., :half], x[..., half:]
            return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)

        return Built([x, cos, sin, offsets], [randn(*x.shape)] if backward else [],
                     {"gpuparity": lambda x, cos, sin, o: gp_rotary.apply_rotary_emb(x, cos, sin, seqlen_offsets=o),
                      "flash_attn": fa_apply}, reference)
    if case.kind == "norm":
        rows, hidden, rms = p["rows"], p["hidden"], p["rms"]
        x = randn(rows, hidden, grad=True)
        residual = randn(rows, hidden, dt=torch.float32 if p["residual_in_fp32"] else dtype, grad=True)
        weight = (1 + 0.1 * randn(hidden, dt=torch.float32)).to(dtype).requires_grad_()
        bias = None if rms else randn(hidden, scale=0.1, grad=True)
        eps = 1e-5
        fa_fn = fa["layer_norm"].rms_norm_fn if rms else fa["layer_norm"].layer_norm_fn
        gp_fn = gp_ln.rms_norm_fn if rms else gp_ln.layer_norm_fn
        options = dict(eps=eps, prenorm=True, residual_in_fp32=p["residual_in_fp32"])

        def side(fn):
            return lambda x, residual, weight, bias: fn(x, weight, bias, residual=residual, **options)

        def reference(x, residual, weight, bias):
            s = x + residual
            if rms:
                normed = s * torch.rsqrt(s.square().mean(-1, keepdim=True) + eps)
            else:
                centered = s - s.mean(-1, keepdim=True)
                normed = centered * torch.rsqrt(centered.square().mean(-1, keepdim=True) + eps)
            out = normed * weight + (0 if bias is None else bias)
            return out, s

        return Built([x, residual, weight, bias], [randn(rows, hidden), randn(rows, hidden, dt=residual.dtype)],
                     {"gpuparity": side(gp_fn), "flash_attn": side(fa_fn)}, reference)
    rows, vocab = p["rows"], p["vocab"]
    logits = randn(rows, vocab, scale=2.0, grad=True)
    labels = torch.randint(0, vocab, (rows,), generator=gen).to(device)
    labels[::7] = -100   # ignored rows, as padding leaves them

    def side(fn):
        def loss(logits, labels):
            losses, _ = fn(logits, labels)
            return losses.sum() / (labels != -100).sum()
        return loss

    def reference(logits, labels):
        keep = labels != -100
        lse = torch.logsumexp(logits, dim=-1)
        picked = logits.gather(1, labels.clamp(min=0)[:, None])[:, 0]
        return torch.where(keep, lse - picked, torch.zeros_like(lse)).sum() / keep.sum()

    return Built([logits, labels], [torch.ones((), device=device)],
                 {"gpuparity": side(gp_ce.cross_entropy_loss), "flash_attn": side(fa["cross_entropy"].cross_entropy_loss)},
                 reference, check_rows=min(rows, 2048))


def _as_tuple(out) -> tuple:
    return out if isinstance(out, tuple) else (out,)


def _leaves(inputs) -> List[Any]:
    import torch
    return [t for t in inputs if torch.is_tensor(t) and t.requires_grad]


def step(built: Built, side: str, backward: bool) -> Callable[[], tuple]:
    """One call of a side: the forward, and with backward the gradients of the leaves (returned,
    not accumulated: no extra kernel per call)."""
    import torch
    fn, leaves = built.call[side], _leaves(built.inputs)

    def run():
        outs = _as_tuple(fn(*built.inputs))
        if not backward:
            return outs
        return outs + tuple(torch.autograd.grad(outs, leaves, built.grads[:len(outs)]))
    return run


def errors(built: Built, side: str, backward: bool) -> List[float]:
    """Max |side - float64 reference| of each output and gradient (the reference's own rows when
    check_rows is set)."""
    import torch
    rows = built.check_rows
    cut = (lambda t: t[:rows]) if rows else (lambda t: t)
    inputs = [cut(t.detach()).requires_grad_(t.requires_grad) if torch.is_tensor(t) and t.dim() >= 1 else t
              for t in built.inputs]
    got = step(Built(inputs, built.grads, built.call, built.reference), side, backward)()
    wide = [t.detach().double().requires_grad_(t.requires_grad) if torch.is_tensor(t) and t.is_floating_point() else t
            for t in inputs]
    want = _as_tuple(built.reference(*wide))
    if backward:
        grads = [g.double() for g in built.grads[:len(want)]]
        want = want + tuple(torch.autograd.grad(want, _leaves(wide), grads))
    return [float((g.detach().double() - w.detach()).abs().max()) for g, w in zip(got, want)]


# ----------------------------------------------------------------------------- timing
def _sync(device) -> None:
    import torch
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def device_ms(run, iters: int, device) -> Optional[float]:
    """CUDA-event milliseconds per call over `iters` back-to-back calls (None on a CPU)."""
    import torch
    if device.type != "cuda":
        return None
    _sync(device)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        run()
    end.record()
    _sync(device)
    return start.elapsed_time(end) / iters


def host_ms(run, iters: int, device) -> float:
    """Median wall milliseconds from an idle device until a call returns."""
    times = []
    for _ in range(iters):
        _sync(device)
        started = time.perf_counter()
        run()
        times.append((time.perf_counter() - started) * 1e3)
    _sync(device)
    return statistics.median(times)


def peak_mib(run, device) -> Optional[float]:
    import torch
    if device.type != "cuda":
        return None
    gc.collect()
    _sync(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    run()
    _sync(device)
    return (torch.cuda.max_memory_allocated(device) - before) / 2 ** 20


def run_case(case: Case, fa, device, dtype, rounds: int, iters: int) -> Dict[str, Any]:
    built = build(case, fa, device, dtype)
    backward = case.mode == "fwd+bwd"
    runs = {side: step(built, side, backward) for side in SIDES}
    row: Dict[str, Any] = {"case": case.name, "mode": case.mode, "params": case.params, "sides": {}}
    for side in SIDES:
        started = time.perf_counter()
        runs[side]()
        _sync(device)
        row["sides"][side] = {"first_call_s": time.perf_counter() - started, "errors": errors(built, side, backward),
                              "device_ms": [], "host_ms": []}
    ours, theirs = row["sides"]["gpuparity"]["errors"], row["sides"]["flash_attn"]["errors"]
    atol = 1e-3 if case.kind != "ce" else 1e-5
    row["check"] = all(math.isfinite(o) and o <= 2 * t + atol for o, t in zip(ours, theirs))
    for side in SIDES:
        row["sides"][side]["peak_mib"] = peak_mib(runs[side], device)
    for r in range(rounds):
        for side in (SIDES if r % 2 == 0 else SIDES[::-1]):
            row["sides"][side]["device_ms"].append(device_ms(runs[side], iters, device))
            row["sides"][side]["host_ms"].append(host_ms(runs[side], max(3, iters // 4), device))
    for side in SIDES:
        values = row["sides"][side]
        timed = [t for t in values["device_ms"] if t is not None]
        values["device_ms_median"] = statistics.median(timed) if timed else None
        values["host_ms_median"] = statistics.median(values["host_ms"])
    gp, fa_side = row["sides"]["gpuparity"], row["sides"]["flash_attn"]
    row["fa_over_gpuparity"] = (fa_side["device_ms_median"] / gp["device_ms_median"]
                                if gp["device_ms_median"] else None)
    row["memory_gpuparity_over_fa"] = (gp["peak_mib"] / fa_side["peak_mib"]
                                       if gp["peak_mib"] and fa_side["peak_mib"] else None)
    return row


def _fmt(value, digits=3) -> str:
    return "-" if value is None else f"{value:.{digits}g}"


def markdown(rows: List[Dict[str, Any]], meta: Dict[str, Any]) -> str:
    lines = ["# gpuparity.flash_attn beside FlashAttention's Triton kernels", "",
             f"FlashAttention {meta['fa_commit']}; {meta['device_name']}; torch {meta['torch']}, triton {meta['triton']}; "
             f"{meta['dtype']}; {meta['rounds']} interleaved rounds x {meta['iters']} calls; command: `{meta['command']}`",
             "", "| case | mode | gpuparity ms | FA ms | FA / gpuparity | host ms (gp / FA) | peak MiB (gp / FA) | "
             "max err vs fp64 (gp / FA) | check | first call s (gp / FA) |", "|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        gp, fa = row["sides"]["gpuparity"], row["sides"]["flash_attn"]
        lines.append(
            f"| {row['case']} | {row['mode']} | {_fmt(gp['device_ms_median'])} | {_fmt(fa['device_ms_median'])} | "
            f"{_fmt(row['fa_over_gpuparity'])} | {_fmt(gp['host_ms_median'])} / {_fmt(fa['host_ms_median'])} | "
            f"{_fmt(gp['peak_mib'], 4)} / {_fmt(fa['peak_mib'], 4)} | {_fmt(max(gp['errors']))} / "
            f"{_fmt(max(fa['errors']))} | {'ok' if row['check'] else 'FAIL'} | "
            f"{gp['first_call_s']:.1f} / {fa['first_call_s']:.1f} |")
    lines += ["", "ms: CUDA-event device time per call, median over rounds. FA / gpuparity > 1: gpuparity faster. "
              "check: every output and gradient of gpuparity within 2 x FlashAttention's error + atol "
              "(its tests' criterion) against float64."]
    return "\n".join(lines) + "\n"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--fa-src", default=".fa_src", help="an export of FlashAttention's files (fa_triton_prepare.sh)")
    p.add_argument("--out", default=None, help="folder for fa_triton_speed.md and .json (else the table is printed)")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds (each: both sides)")
    p.add_argument("--iters", type=int, default=20, help="back-to-back calls per timing")
    p.add_argument("--cases", default=None, help="comma-separated substrings of case names (default: all)")
    p.add_argument("--dry-run", action="store_true",
                   help="tiny shapes on the CPU under Triton's interpreter: the plumbing (loading, references, "
                        "both sides, outputs), no timing worth reading")
    args = p.parse_args(argv)
    if args.rounds < 1 or args.iters < 1:
        p.error(f"--rounds and --iters: expected >= 1, got {args.rounds} and {args.iters}")
    return args


def write_outputs(out: Optional[str], name: str, table: str, payload: Dict[str, Any]) -> None:
    """<name>.md (the table) and <name>.json under `out` when given; the table printed."""
    if out:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, f"{name}.md"), "w") as f:
            f.write(table)
        with open(os.path.join(out, f"{name}.json"), "w") as f:
            json.dump(payload, f, indent=1)
    print(table)


def pick_device(dry_run: bool, script: str, stand_ins: bool = True):
    """The GPU, or with --dry-run the CPU under Triton's interpreter (with cpu_stand_ins() for
    FlashAttention's files unless stand_ins is False); gpuparity's
    first calls wait for their verdict (else a call of "auto" could be served by the op's baseline,
    torch's composition, while its check runs, and that is what would be timed)."""
    os.environ.setdefault("GPUPARITY_FIRST_CALLS", "wait")
    import torch
    if torch.cuda.is_available() and not dry_run:
        return torch.device("cuda")
    if not dry_run:
        raise SystemExit(f"{script}: no CUDA device; FlashAttention's kernels need a GPU (--dry-run runs "
                         "tiny shapes under Triton's interpreter on the CPU)")
    os.environ.setdefault("TRITON_INTERPRET", "1")   # before anything imports triton
    if stand_ins:
        cpu_stand_ins()
    return torch.device("cpu")


def main(argv=None) -> int:
    args = parse_args(argv)
    device = pick_device(args.dry_run, "fa_triton_speed")
    on_gpu = device.type == "cuda"
    import torch
    dtype = torch.bfloat16 if on_gpu else torch.float32   # the interpreter's bf16 is not the GPU's
    fa = load_flash_attention(args.fa_src)
    import triton
    selected = [c for c in cases(args.dry_run)
                if args.cases is None or any(part in c.name for part in args.cases.split(","))]
    if not selected:
        raise SystemExit(f"fa_triton_speed: --cases {args.cases!r} matches none of {[c.name for c in cases(False)]}")
    rounds, iters = (1, 2) if args.dry_run else (args.rounds, args.iters)
    rows = []
    for case in selected:
        rows.append(run_case(case, fa, device, dtype, rounds, iters))
        print(f"fa_triton_speed: {case.name}: done", file=sys.stderr)
    meta = {"fa_commit": fa_commit(args.fa_src), "torch": torch.__version__, "triton": triton.__version__,
            "device_name": torch.cuda.get_device_name(device) if on_gpu else "CPU (Triton interpreter, --dry-run)",
            "dtype": str(dtype).replace("torch.", ""), "rounds": rounds, "iters": iters,
            "command": " ".join(["python", "benchmarks/fa_triton_speed.py", *(argv if argv is not None else sys.argv[1:])])}
    write_outputs(args.out, "fa_triton_speed", markdown(rows, meta), {"meta": meta, "rows": rows})
    return 0 if all(row["check"] for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
