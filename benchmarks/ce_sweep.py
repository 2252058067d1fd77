"""Launch-parameter sweep of cross_entropy_loss's Triton kernels (gpuparity.flash_attn's
FlashAttention-compatible loss; backends/triton_cross_entropy.py's loss_forward / loss_backward)
on the GPU at hand, beside FlashAttention's own kernel when --fa-src is given.

Per shape ((8192, 32000) and (8192, 128256) bf16, (4096, 32000) fp32; every 7th row ignored, as
fa_triton_speed.py's case), every candidate (BLOCK, num_warps) of the forward kernel and of the
backward kernel (grad_losses an expanded scalar, as a mean's gradient) is first checked against
float64 on the first --check-rows rows (loss, lse, gradient; max |error| and a pass mark), then
timed in interleaved rounds (each round every candidate, the order reversed every other round):
CUDA-event device time per call over --iters back-to-back calls (median over rounds) and host
wall time per call from an idle GPU (median). The shipped defaults (loss_fwd_config /
loss_bwd_config) are marked. Then the whole call, forward alone and forward + backward, of
gpuparity's cross_entropy_loss (its default backend and configs) and, with --fa-src,
FlashAttention's, interleaved the same way. The default configuration is also checked with label
smoothing, z-loss and logit_scale on. GB/s counts one read of all the logits (forward) or one read
and one write (backward), although gpuparity's kernels read no ignored row (FlashAttention's read
them all). A backward row's errors are its gradient's (its loss and lse columns read 0).

Writes ce_sweep.json and ce_sweep.md under --out.

    PYTHONPATH=src python benchmarks/ce_sweep.py --fa-src .fa_src --out OUT/ce
    PYTHONPATH=src python benchmarks/ce_sweep.py --dry-run [--fa-src .fa_src]   # CPU: tiny shapes, interpreter
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any, Callable, Dict, List

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import fa_triton_speed as fts  # noqa: E402 - FlashAttention's files by path, its CPU stand-ins

IGNORE = -100
SHAPES = ((8192, 32000, "bfloat16"), (8192, 128256, "bfloat16"), (4096, 32000, "float32"))
DRY_SHAPES = ((6, 50, "float32"), (5, 131, "float32"))
# (BLOCK, num_warps): 4 to 32 columns a thread, 4 to 32 warps.
FWD_CANDIDATES = ((2048, 4), (4096, 4), (4096, 8), (8192, 8), (8192, 16), (16384, 16), (16384, 32), (32768, 32))
BWD_CANDIDATES = ((1024, 4), (2048, 4), (2048, 8), (4096, 4), (4096, 8), (8192, 8), (8192, 16), (16384, 16))
DRY_FWD = ((16, 1), (64, 2))
DRY_BWD = ((8, 1), (32, 2))


def _sync(device) -> None:
    import torch
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(runs: Dict[str, Callable[[], Any]], rounds: int, iters: int, device) -> Dict[str, Dict[str, Any]]:
    """{name: {device_ms, host_ms}} of each run, in interleaved rounds (the order reversed every
    other round): CUDA-event ms per call over `iters` back-to-back calls, and the median wall ms
    from an idle device until a call returns; the medians over rounds."""
    names = list(runs)
    got = {name: {"device": [], "host": []} for name in names}
    for r in range(rounds):
        for name in (names if r % 2 == 0 else names[::-1]):
            ms = fts.device_ms(runs[name], iters, device)
            if ms is not None:
                got[name]["device"].append(ms)
            got[name]["host"].append(fts.host_ms(runs[name], max(3, iters // 4), device))
    return {name: {"device_ms": statistics.median(v["device"]) if v["device"] else None,
                   "device_ms_rounds": v["device"], "host_ms": statistics.median(v["host"])}
            for name, v in got.items()}


def reference(logits, labels, grad_losses, smoothing=0.0, logit_scale=1.0, lse_square_scale=0.0):
    """float64 (losses, lse, dlogits) of FlashAttention's definition."""
    import torch
    z = logits.double().requires_grad_()
    s = z * logit_scale
    valid = labels != IGNORE
    lse = torch.logsumexp(s, dim=-1)
    picked = s.gather(1, labels.clamp(min=0).long()[:, None])[:, 0]
    losses = lse - (1 - smoothing) * picked - smoothing * s.mean(dim=-1) + lse_square_scale * lse.square()
    losses = torch.where(valid, losses, torch.zeros_like(losses))
    (grad,) = torch.autograd.grad(losses, z, grad_losses.double())
    return losses.detach(), lse.detach(), grad


def errors(got, want, dtype, valid) -> Dict[str, Any]:
    """Max |error| of losses, lse (rows not ignored) and gradient, and whether each is within
    fp32 accumulation (losses, lse) and one rounding to the gradient's dtype."""
    import torch
    losses, lse, grad = got
    want_losses, want_lse, want_grad = want
    # one rounding to the gradient's dtype (fp32: the kernels' exp and sums, ~1e-6 relative)
    rounding = {torch.bfloat16: 2 ** -8, torch.float16: 2 ** -11, torch.float32: 2 ** -16}[dtype]
    out = {"losses": float((losses.double() - want_losses).abs().max()),
           "lse": float((lse.double() - want_lse)[valid].abs().max()) if bool(valid.any()) else 0.0,
           "grad": float((grad.double() - want_grad).abs().max())}
    out["ok"] = bool(out["losses"] <= 1e-4 * max(1.0, float(want_losses.abs().max()))
                     and out["lse"] <= 1e-4 * max(1.0, float(want_lse.abs().max()))
                     and bool(((grad.double() - want_grad).abs()
                               <= 2 * rounding * want_grad.abs() + 1e-6 * want_grad.abs().max()).all()))
    return out


def sweep_shape(rows: int, vocab: int, dtype, device, fa, args, fwd_cands, bwd_cands) -> Dict[str, Any]:
    import torch
    from gpuparity.backends import triton_cross_entropy as kernels
    gen = torch.Generator(device=device).manual_seed(rows + vocab)
    logits = (torch.randn(rows, vocab, generator=gen, device=device) * 2.0).to(dtype)
    labels = torch.randint(0, vocab, (rows,), generator=gen, device=device)
    labels[::7] = IGNORE
    count = int((labels != IGNORE).sum())
    grad_losses = torch.full((), 1.0 / count, device=device).expand(rows)
    check = min(rows, args.check_rows)
    want = reference(logits[:check], labels[:check], grad_losses[:check])
    valid = (labels[:check] != IGNORE)
    hip = torch.version.hip is not None and device.type == "cuda"
    fwd_default, bwd_default = kernels.loss_fwd_config(vocab, hip), kernels.loss_bwd_config(vocab, hip)
    fwd_cands = sorted(set(fwd_cands) | {fwd_default})
    bwd_cands = sorted(set(bwd_cands) | {bwd_default})
    out: Dict[str, Any] = {"rows": rows, "vocab": vocab, "dtype": str(dtype).replace("torch.", ""),
                           "fwd_default": list(fwd_default), "bwd_default": list(bwd_default), "fwd": [], "bwd": []}
    _, lse, _ = kernels.loss_forward(logits, labels, 0.0, 1.0, 0.0, IGNORE, config=fwd_default)
    grad = torch.empty_like(logits)
    fwd_runs, bwd_runs = {}, {}
    for cfg in fwd_cands:
        started = time.perf_counter()
        losses_c, lse_c, _ = kernels.loss_forward(logits[:check], labels[:check], 0.0, 1.0, 0.0, IGNORE, config=cfg)
        grad_c = kernels.loss_backward(grad_losses[:check], logits[:check], lse_c, labels[:check], 0.0, 1.0, 0.0,
                                       IGNORE, torch.empty_like(logits[:check]), config=bwd_default)
        _sync(device)
        row = {"config": list(cfg), "default": cfg == fwd_default, "first_call_s": time.perf_counter() - started,
               "errors": errors((losses_c, lse_c, grad_c), want, dtype, valid)}
        out["fwd"].append(row)
        fwd_runs[str(cfg)] = (lambda c=cfg: kernels.loss_forward(logits, labels, 0.0, 1.0, 0.0, IGNORE, config=c))
    for cfg in bwd_cands:
        started = time.perf_counter()
        grad_c = kernels.loss_backward(grad_losses[:check], logits[:check], lse[:check], labels[:check], 0.0, 1.0,
                                       0.0, IGNORE, torch.empty_like(logits[:check]), config=cfg)
        _sync(device)
        row = {"config": list(cfg), "default": cfg == bwd_default, "first_call_s": time.perf_counter() - started,
               "errors": errors((want[0], want[1], grad_c), want, dtype, valid)}   # the gradient only
        out["bwd"].append(row)
        bwd_runs[str(cfg)] = (lambda c=cfg: kernels.loss_backward(grad_losses, logits, lse, labels, 0.0, 1.0, 0.0,
                                                                  IGNORE, grad, config=c))
    size = logits.numel() * logits.element_size()
    for kind, runs, moved in (("fwd", fwd_runs, size), ("bwd", bwd_runs, 2 * size)):
        times = timed(runs, args.rounds, args.iters, device)
        for row in out[kind]:
            row.update(times[str(tuple(row["config"]))])
            row["gbps"] = moved / row["device_ms"] / 1e6 if row["device_ms"] else None
    # the default configuration with every feature on (correctness only)
    eps, scale, c = 0.1, 0.7, 1e-3
    losses_f, lse_f, _ = kernels.loss_forward(logits[:check], labels[:check], eps, scale, c, IGNORE)
    grad_f = kernels.loss_backward(grad_losses[:check], logits[:check], lse_f, labels[:check], eps, scale, c, IGNORE,
                                   torch.empty_like(logits[:check]))
    out["features_check"] = errors((losses_f, lse_f, grad_f),
                                   reference(logits[:check], labels[:check], grad_losses[:check], eps, scale, c),
                                   dtype, valid)
    out["calls"] = whole_calls(logits, labels, count, device, fa, args)
    return out


def whole_calls(logits, labels, count, device, fa, args) -> Dict[str, Any]:
    """cross_entropy_loss as a user calls it, gpuparity's (default backend) and FlashAttention's:
    forward alone (logits without grad) and forward + backward of losses.sum() / count."""
    import torch
    import gpuparity.flash_attn.ops.triton.cross_entropy as gp_ce
    sides = {"gpuparity": gp_ce.cross_entropy_loss}
    if fa is not None:
        sides["flash_attn"] = fa["cross_entropy"].cross_entropy_loss
    leaf = logits.detach().requires_grad_()
    plain = logits.detach()
    runs = {}
    for side, fn in sides.items():
        def fwd(fn=fn):
            return fn(plain, labels)

        def both(fn=fn):
            losses, _ = fn(leaf, labels)
            return torch.autograd.grad(losses.sum() / count, leaf)
        fwd()
        both()
        runs[f"{side} fwd"], runs[f"{side} fwd+bwd"] = fwd, both
    _sync(device)
    kernels_used = gp_ce.row_steps(logits).native and logits.dtype != torch.float64
    times = timed(runs, args.rounds, args.iters, device)
    return {"gpuparity_on_loss_kernels": bool(kernels_used), **times}


def _fmt(value, digits=3) -> str:
    return "-" if value is None else f"{value:.{digits}g}"


def markdown(results: List[Dict[str, Any]], meta: Dict[str, Any]) -> str:
    lines = ["# cross_entropy_loss kernel sweep", "",
             f"{meta['device_name']}; torch {meta['torch']}, triton {meta['triton']}; FlashAttention {meta['fa_commit']}; "
             f"{meta['rounds']} interleaved rounds x {meta['iters']} calls; command: `{meta['command']}`", ""]
    for res in results:
        lines += [f"## {res['rows']} x {res['vocab']} {res['dtype']}", "",
                  "| kernel | BLOCK, warps | device ms | GB/s | host ms | max err loss / lse / grad | check |",
                  "|---|---|---|---|---|---|---|"]
        for kind in ("fwd", "bwd"):
            best = min((r["device_ms"] for r in res[kind] if r["device_ms"] is not None), default=None)
            for r in res[kind]:
                e = r["errors"]
                mark = (" (default)" if r["default"] else "") + (" **best**" if best is not None and
                                                                 r["device_ms"] == best else "")
                lines.append(f"| {kind} | {r['config'][0]}, {r['config'][1]}{mark} | {_fmt(r['device_ms'])} | "
                             f"{_fmt(r['gbps'], 4)} | {_fmt(r['host_ms'])} | {_fmt(e['losses'])} / {_fmt(e['lse'])} / "
                             f"{_fmt(e['grad'])} | {'ok' if e['ok'] else 'FAIL'} |")
        f = res["features_check"]
        lines += ["", f"default configs with label_smoothing 0.1, logit_scale 0.7, lse_square_scale 1e-3: max err "
                      f"{_fmt(f['losses'])} / {_fmt(f['lse'])} / {_fmt(f['grad'])}, {'ok' if f['ok'] else 'FAIL'}", "",
                  "| whole call | device ms | host ms |", "|---|---|---|"]
        for name, t in res["calls"].items():
            if isinstance(t, dict):
                lines.append(f"| {name} | {_fmt(t['device_ms'])} | {_fmt(t['host_ms'])} |")
        lines += ["", f"gpuparity on the loss kernels: {res['calls']['gpuparity_on_loss_kernels']}", ""]
    return "\n".join(lines) + "\n"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--fa-src", default=None, help="an export of FlashAttention's files (fa_triton_prepare.sh); "
                                                  "without it only gpuparity's kernels are timed")
    p.add_argument("--out", default=None, help="folder for ce_sweep.json and ce_sweep.md (else the table is printed)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--check-rows", type=int, default=256, help="rows checked against float64 per candidate")
    p.add_argument("--shapes", default=None, help="ROWSxVOCABxDTYPE,... (default: the three shapes above)")
    p.add_argument("--dry-run", action="store_true", help="tiny shapes and blocks on the CPU under the interpreter")
    args = p.parse_args(argv)
    if args.rounds < 1 or args.iters < 1 or args.check_rows < 1:
        p.error("--rounds, --iters and --check-rows: expected >= 1")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    device = fts.pick_device(args.dry_run, "ce_sweep", stand_ins=args.fa_src is not None)
    on_gpu = device.type == "cuda"
    import torch
    fa = fts.load_flash_attention(args.fa_src) if args.fa_src else None
    import triton
    if args.shapes:
        shapes = [tuple(int(v) if i < 2 else v for i, v in enumerate(s.split("x"))) for s in args.shapes.split(",")]
    else:
        shapes = DRY_SHAPES if args.dry_run else SHAPES
    fwd_cands, bwd_cands = (DRY_FWD, DRY_BWD) if args.dry_run else (FWD_CANDIDATES, BWD_CANDIDATES)
    warp = 64 if torch.version.hip is not None and on_gpu else 32
    fwd_cands = [c for c in fwd_cands if c[1] * warp <= 1024]
    bwd_cands = [c for c in bwd_cands if c[1] * warp <= 1024]
    rounds, iters = (1, 2) if args.dry_run else (args.rounds, args.iters)
    args.rounds, args.iters = rounds, iters
    started = time.perf_counter()
    results = []
    for rows, vocab, dtype in shapes:
        results.append(sweep_shape(rows, vocab, getattr(torch, dtype), device, fa, args, fwd_cands, bwd_cands))
        print(f"ce_sweep: {rows} x {vocab} {dtype}: done at {time.perf_counter() - started:.0f} s", file=sys.stderr)
    meta = {"fa_commit": fts.fa_commit(args.fa_src) if args.fa_src else None, "torch": torch.__version__,
            "triton": triton.__version__, "seconds": time.perf_counter() - started,
            "device_name": torch.cuda.get_device_name(device) if on_gpu else "CPU (Triton interpreter, --dry-run)",
            "rounds": rounds, "iters": iters,
            "command": " ".join(["python", "benchmarks/ce_sweep.py", *(argv if argv is not None else sys.argv[1:])])}
    fts.write_outputs(args.out, "ce_sweep", markdown(results, meta), {"meta": meta, "shapes": results})
    ok = all(r["errors"]["ok"] for res in results for kind in ("fwd", "bwd") for r in res[kind])
    return 0 if ok and all(res["features_check"]["ok"] for res in results) else 1


if __name__ == "__main__":
    sys.exit(main())
