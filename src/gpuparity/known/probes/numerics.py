"""Probes of norms, softmax, matmul (TF32, large M, 2 GiB outputs, bf16 support) and conv2d
against float64 or exact answers."""
from __future__ import annotations

import contextlib
import os
import warnings
from typing import Any, Dict

import torch
import torch.nn.functional as F

from ...contracts.norms import layer_norm as reference_layer_norm, rms_norm as reference_rms_norm
from .base import finding, first_line, grad_leaves, inconclusive, judge, probe, randn, rel_err, summarize, sync, upcast


def _cpu_layer_norm_grad(dtype: torch.dtype) -> Dict[str, Any]:
    """F.layer_norm backward on the CPU in a 16-bit dtype against float64, two cases: rows with
    mean/std 50 (weight and input gradients), and 1024 rows of mean 0 whose bias gradient is a
    plain column sum (what a sum kept in the 16-bit dtype loses, as sqrt(rows))."""
    gen = torch.Generator().manual_seed(0)
    comparisons = []
    for rows, width, mean, spread, labels in ((64, 256, 5.0, 0.1, ("dweight", "dx")),
                                              (1024, 256, 0.0, 1.0, ("dbias",))):
        x = mean + spread * torch.randn(rows, width, generator=gen, dtype=torch.float64)
        weight = 1 + 0.5 * torch.randn(width, generator=gen, dtype=torch.float64)
        grad_out = torch.randn(rows, width, generator=gen, dtype=torch.float64).to(dtype)
        bias = torch.randn(width, generator=gen, dtype=torch.float64)
        inputs = [t.to(dtype) for t in (x, weight, bias)]
        with_bias = "dbias" in labels
        leaves = {}
        for name, cast in (("got", dtype), ("ref", torch.float64), ("base", torch.float32)):
            leaves[name] = [t.clone().to(cast).requires_grad_(True) for t in inputs]
            x_, w_, b_ = leaves[name]
            try:
                F.layer_norm(x_, (width,), w_, b_ if with_bias else None).backward(grad_out.to(cast))
            except RuntimeError as exc:   # a torch whose CPU kernel refuses this dtype
                return inconclusive(f"CPU {dtype} layer_norm backward did not run: {first_line(exc)}")
        for label in labels:
            index = {"dx": 0, "dweight": 1, "dbias": 2}[label]
            comparisons.append(judge(f"{label} ({rows} rows)", leaves["got"][index].grad, leaves["ref"][index].grad,
                                     leaves["base"][index].grad.to(dtype), dtype))
    name = str(dtype).replace("torch.", "")
    return summarize(comparisons, f"CPU {name} layer_norm(256) backward, rows mean/std 50 and 1024 rows of mean 0")


@probe(default="cpu")
def cpu_bf16_layer_norm_grad(dev: torch.device) -> Dict[str, Any]:
    """bf16 F.layer_norm backward on the CPU (whatever `device` is) against float64."""
    return _cpu_layer_norm_grad(torch.bfloat16)


@probe(default="cpu")
def cpu_fp16_layer_norm_grad(dev: torch.device) -> Dict[str, Any]:
    """fp16 F.layer_norm backward on the CPU (whatever `device` is) against float64."""
    return _cpu_layer_norm_grad(torch.float16)


# Rows whose losses (2000 each) sum to 128000 > 65504, the fp16 maximum, while their mean fits.
CE_ROWS, CE_CLASSES, CE_ROW_LOSS = 64, 8, 2000.0


@probe(default="cpu")
def fp16_cross_entropy_mean(dev: torch.device) -> Dict[str, Any]:
    """fp16 F.cross_entropy(reduction='mean') over rows whose losses sum past the fp16 maximum while
    their mean fits, against float64: on the CPU, and on `dev` too when it is another device.
    reduction='sum' (the true sum does not fit fp16: inf is right) and bf16 are measured, not judged."""
    logits = torch.zeros(CE_ROWS, CE_CLASSES, dtype=torch.float64)
    logits[:, 0] = CE_ROW_LOSS
    target = torch.ones(CE_ROWS, dtype=torch.long)
    ref = F.cross_entropy(logits, target)
    devices = [torch.device("cpu")] + ([dev] if dev.type != "cpu" else [])
    comparisons, measured = [], {"expected": float(ref)}
    for where in devices:
        x, t = logits.to(where, torch.float16), target.to(where)
        try:
            got = F.cross_entropy(x, t)
        except (RuntimeError, NotImplementedError) as exc:   # no fp16 kernel there (CPU before torch 2.4)
            measured[f"{where.type}_error"] = first_line(exc)
            continue
        base = F.cross_entropy(x.float(), t).to(torch.float16)
        sync(where)
        comparisons.append(judge(f"{where.type} loss", got.detach().cpu(), ref, base.detach().cpu(), torch.float16))
        measured[f"{where.type}_mean"] = float(got)
        measured[f"{where.type}_sum"] = float(F.cross_entropy(x, t, reduction="sum"))
        measured[f"{where.type}_bf16_mean"] = float(F.cross_entropy(x.to(torch.bfloat16), t))
    if not comparisons:
        return inconclusive("fp16 F.cross_entropy did not run: " + "; ".join(
            f"{key[:-6]}: {value}" for key, value in measured.items() if key.endswith("_error")), **measured)
    what = (f"fp16 F.cross_entropy mean of {CE_ROWS} rows of loss {CE_ROW_LOSS:g} (their sum {CE_ROWS * CE_ROW_LOSS:g} "
            f"> fp16 max 65504), expected {CE_ROW_LOSS:g}: "
            + ", ".join(f"{d} gave {measured.get(f'{d.type}_mean', 'an error')}" for d in devices))
    return {**summarize(comparisons, what), **measured}


ONEHOT_ROWS, ONEHOT_CLASSES, ONEHOT_MARGIN = 64, 40, 9.0


@probe(default="cpu")
def bf16_cross_entropy_onehot(dev: torch.device) -> Dict[str, Any]:
    """bf16 F.cross_entropy on near one-hot rows (the target's logit 9 above normal ones: losses of
    ~0.005), per row (reduction='none') against float64, judged against the same loss computed in fp32
    from the bf16 logits and rounded to bf16 once: on the CPU, and on `dev` too when it is another device."""
    logits = randn((ONEHOT_ROWS, ONEHOT_CLASSES), "cpu", torch.float32, 11).to(torch.bfloat16)
    target = torch.randint(0, ONEHOT_CLASSES, (ONEHOT_ROWS,), generator=torch.Generator().manual_seed(12))
    logits[torch.arange(ONEHOT_ROWS), target] += ONEHOT_MARGIN
    ref = F.cross_entropy(logits.double(), target, reduction="none")
    devices = [torch.device("cpu")] + ([dev] if dev.type != "cpu" else [])
    comparisons, measured = [], {"expected_mean_loss": float(ref.mean())}
    for where in devices:
        x, t = logits.to(where), target.to(where)
        got = F.cross_entropy(x, t, reduction="none")
        base = F.cross_entropy(x.float(), t, reduction="none").to(torch.bfloat16)
        sync(where)
        comparisons.append(judge(f"{where.type} per-row loss", got.detach().cpu(), ref, base.detach().cpu(),
                                 torch.bfloat16))
        measured[f"{where.type}_rel_err"] = rel_err(got.detach().cpu().double(), ref)
        measured[f"{where.type}_fp32_rel_err"] = rel_err(base.detach().cpu().double(), ref)
    what = (f"bf16 F.cross_entropy on {ONEHOT_ROWS} near one-hot rows (losses ~{float(ref.mean()):.2g}): "
            + ", ".join(f"{d.type} relative error {measured[f'{d.type}_rel_err']:.3g} (fp32 then rounded: "
                        f"{measured[f'{d.type}_fp32_rel_err']:.3g})" for d in devices))
    return {**summarize(comparisons, what), **measured}


@probe
def norm_weight_grads(dev: torch.device) -> Dict[str, Any]:
    """LayerNorm(256) and RMSNorm(256): output, input, weight and bias gradients against float64."""
    rows, width = 64, 256
    x = randn((rows, width), dev, torch.float32, 1)
    weight = randn((width,), dev, torch.float32, 2) + 1.0
    bias = randn((width,), dev, torch.float32, 3)
    grad_out = randn((rows, width), dev, torch.float32, 4)
    comparisons = []
    cases = [("layer_norm", lambda x_, w_, b_: F.layer_norm(x_, (width,), w_, b_),
              lambda x_, w_, b_: reference_layer_norm(x_, (width,), w_, b_))]
    if hasattr(F, "rms_norm"):
        cases.append(("rms_norm", lambda x_, w_, b_: F.rms_norm(x_, (width,), w_, eps=1e-6),
                      lambda x_, w_, b_: reference_rms_norm(x_, (width,), w_, eps=1e-6)))
    for name, op, ref_op in cases:
        leaves = grad_leaves((x, weight, bias))
        base_leaves = grad_leaves((x, weight, bias))
        ref_leaves = [upcast(t, True) for t in (x, weight, bias)]
        out, base, ref = op(*leaves), ref_op(*base_leaves), ref_op(*ref_leaves)
        out.backward(grad_out)
        base.backward(grad_out)
        ref.backward(grad_out.detach().to("cpu", torch.float64))
        comparisons.append(judge(f"{name} out", out, ref, base, torch.float32))
        for label, index in (("dx", 0), ("dweight", 1), ("dbias", 2)):
            if ref_leaves[index].grad is None:
                continue
            comparisons.append(judge(f"{name} {label}", leaves[index].grad, ref_leaves[index].grad,
                                       base_leaves[index].grad, torch.float32))
    return summarize(comparisons, f"LayerNorm/RMSNorm({width}) fp32 fwd+bwd on {dev}")


@probe
def layer_norm_huge_rows(dev: torch.device, rows: int = 2 ** 23 + 8, width: int = 5) -> Dict[str, Any]:
    """layer_norm over (2^23 + 8, 5) fp32 (about 170 MB): the rows past 2^23 against float64."""
    generator = torch.Generator().manual_seed(1)
    x = torch.randn((rows, width), generator=generator).to(dev)
    out = F.layer_norm(x, (width,))
    sync(dev)
    tail = torch.arange(max(0, rows - 4096), rows)
    head = torch.arange(0, min(rows, 1024))
    picked = torch.cat([head, tail])
    got = out[picked.to(dev)].detach().cpu()
    ref = reference_layer_norm(x[picked.to(dev)].detach().to("cpu", torch.float64), (width,))
    zero_rows = int((got[len(head):] == 0).all(dim=-1).sum())
    comparison = judge("layer_norm tail rows", got, ref, None, torch.float32)
    del x, out
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    result = summarize([comparison], f"layer_norm of ({rows}, {width}) fp32, first 1024 and last 4096 rows")
    result["zero_tail_rows"] = zero_rows
    return result


@probe
def softmax_fp64_odd(dev: torch.device) -> Dict[str, Any]:
    """fp64 softmax rows over odd widths between 512 and 1024 must sum to 1."""
    worst, worst_width = 0.0, None
    for width in (515, 781, 1023):
        for x in (torch.zeros(2, width, dtype=torch.float64, device=dev),
                  torch.randn(2, width, dtype=torch.float64, device=dev)):
            error = float((x.softmax(-1).sum(-1) - 1).abs().max())
            if error > worst:
                worst, worst_width = error, width
    failed = worst > 1e-12
    return finding(failed, f"fp64 softmax row sums: worst |sum - 1| = {worst:.3g}"
                   + (f" at width {worst_width}" if failed else " over widths 515, 781, 1023"), max_error=worst)


# TF32 rounds inputs to 10 mantissa bits: relative error ~3e-4 on random data; fp32 ~1e-7.
TF32_LEVEL = 1e-4
BF16_LEVEL = 1e-3


@probe(gpu=True)
def tf32_defaults(dev: torch.device) -> Dict[str, Any]:
    """fp32 matmul and conv2d against float64 under this process's default flags."""
    a, b = randn((512, 512), dev, torch.float32, 1), randn((512, 512), dev, torch.float32, 2)
    matmul_err = rel_err(a @ b, a.double().cpu() @ b.double().cpu())
    x, w = randn((4, 32, 16, 16), dev, torch.float32, 3), randn((32, 32, 3, 3), dev, torch.float32, 4)
    conv_err = rel_err(F.conv2d(x, w, padding=1), F.conv2d(x.double().cpu(), w.double().cpu(), padding=1))
    flags = {"matmul_allow_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
             "cudnn_allow_tf32": bool(torch.backends.cudnn.allow_tf32),
             "float32_matmul_precision": torch.get_float32_matmul_precision(),
             "HIPBLASLT_ALLOW_TF32": os.environ.get("HIPBLASLT_ALLOW_TF32")}
    reduced = [name for name, err in (("matmul", matmul_err), ("conv2d", conv_err)) if err > TF32_LEVEL]
    detail = (f"fp32 {' and '.join(reduced)} ran at reduced (TF32-level) precision by default"
              if reduced else "fp32 matmul and conv2d ran at full fp32 precision by default")
    detail += f" (matmul err {matmul_err:.2g}, conv err {conv_err:.2g}; flags {flags})"
    return finding(bool(reduced), detail, matmul_err=matmul_err, conv_err=conv_err, flags=flags)


@probe(gpu=True)
def xf32_high_precision(dev: torch.device) -> Dict[str, Any]:
    """fp32 matmul with float32_matmul_precision 'high' vs 'highest' against float64."""
    a, b = randn((1024, 1024), dev, torch.float32, 1), randn((1024, 1024), dev, torch.float32, 2)
    ref = a.double().cpu() @ b.double().cpu()
    before = torch.get_float32_matmul_precision()
    errors = {}
    try:
        for precision in ("highest", "high"):
            torch.set_float32_matmul_precision(precision)
            errors[precision] = rel_err(a @ b, ref)
    finally:
        torch.set_float32_matmul_precision(before)
    failed = errors["high"] > BF16_LEVEL
    return finding(failed, f"fp32 matmul error vs float64: 'highest' {errors['highest']:.2g}, 'high' {errors['high']:.2g}"
                   + (" (bf16-level)" if failed else " (TF32-level or better)"), errors=errors)


@probe
def gemm_large_m(dev: torch.device) -> Dict[str, Any]:
    """ones(600000, 4) @ eye(4) in fp32 must be all ones (M > 2^19)."""
    out = torch.ones(600000, 4, device=dev) @ torch.eye(4, device=dev)
    wrong = (out != 1).any(dim=1)
    count = int(wrong.sum())
    first = int(wrong.nonzero()[0, 0]) if count else None
    return finding(count > 0, f"{count} of 600000 rows wrong" + (f", first at row {first}" if count else ""),
                   wrong_rows=count, first_wrong_row=first)


@probe(gpu=True)
def gemm_small_dim_fp32(dev: torch.device) -> Dict[str, Any]:
    """fp32 matmuls with m == 1 and n == 1 (K = 4096) against float64: 16-bit-level error means the
    BLAS ran them at reduced precision (ROCm/legacy-rocm-build#5640, rocBLAS/hipBLAS gemm_ex, ROCm 7.1.0)."""
    a, b = randn((512, 4096), dev, torch.float32, 1), randn((4096, 512), dev, torch.float32, 2)
    errors = {}
    for label, left, right in (("n == 1", a, b[:, :1]), ("m == 1", a[:1], b), ("both > 1", a, b)):
        errors[label] = rel_err(torch.mm(left, right), left.double().cpu() @ right.double().cpu())
    reduced = [label for label in ("n == 1", "m == 1") if errors[label] > TF32_LEVEL]
    return finding(bool(reduced), "fp32 GEMM error vs float64: " + ", ".join(f"{k} {v:.2g}" for k, v in errors.items())
                   + (f"; {' and '.join(reduced)} at reduced precision" if reduced else ""), errors=errors)


@probe(gpu=True)
def gemm_transposed_fp32(dev: torch.device) -> Dict[str, Any]:
    """fp32 matmul with both operands transposed (A^T B^T), against float64 and the NN product
    (ROCm/legacy-rocm-build#4615: hipBLASLt TT with FP32/XF32 wrong on ROCm 6.4.0)."""
    a, b = randn((384, 256), dev, torch.float32, 1), randn((512, 384), dev, torch.float32, 2)
    ref = (a.double().cpu().t() @ b.double().cpu().t())
    tt = rel_err(a.t() @ b.t(), ref)
    nn = rel_err(a.t().contiguous() @ b.t().contiguous(), ref)
    failed = tt > BF16_LEVEL and tt > 10 * nn
    return finding(failed, f"fp32 A^T B^T error vs float64 {tt:.2g} (same product from contiguous copies {nn:.2g})",
                   tt_err=tt, nn_err=nn)


@probe(gpu=True)
def gemm_2gib_tail(dev: torch.device) -> Dict[str, Any]:
    """bf16 GEMM into a NaN-prefilled output of more than 2 GiB with M % 256 != 0: tail written?"""
    m, n, k = 2 ** 17 + 100, 8192, 64
    needed = m * n * 2 + (m + n) * k * 2
    free, _ = torch.cuda.mem_get_info(dev)
    if free < needed * 1.2:
        return inconclusive(f"needs {needed / 2**30:.1f} GiB free on the GPU, has {free / 2**30:.1f} GiB")
    a, b = randn((m, k), dev, torch.bfloat16, 1), randn((k, n), dev, torch.bfloat16, 2)
    out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device=dev)
    torch.matmul(a, b, out=out)
    sync(dev)
    nan_rows = int(torch.isnan(out).any(dim=1).sum())
    first = int(torch.isnan(out).any(dim=1).nonzero()[0, 0]) if nan_rows else None
    del out
    torch.cuda.empty_cache()
    return finding(nan_rows > 0, f"{nan_rows} of {m} output rows never written (still NaN)"
                   + (f", first at row {first}" if nan_rows else f"; output {m * n * 2 / 2**30:.2f} GiB"),
                   unwritten_rows=nan_rows)


@probe(gpu=True)
def bf16_emulated(dev: torch.device) -> Dict[str, Any]:
    """Is bf16 reported as supported on a GPU that only emulates it (capability < 8.0)?"""
    capability = torch.cuda.get_device_capability(dev)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        reported = bool(torch.cuda.is_bf16_supported())
        try:
            native = bool(torch.cuda.is_bf16_supported(including_emulation=False))
        except TypeError:
            native = capability >= (8, 0)
    failed = reported and not native
    return finding(failed, f"capability {capability[0]}.{capability[1]}: is_bf16_supported() {reported}, "
                           f"native bf16 {native}" + (" (emulated: slow)" if failed else ""),
                   capability=list(capability), reported=reported, native=native)


def _conv_unfold(x, weight, stride: int, padding: int):
    """conv2d as unfold + matmul: a baseline that does not go through cuDNN/MIOpen."""
    batch, _, height, width = x.shape
    out_channels, _, kh, kw = weight.shape
    columns = F.unfold(x, (kh, kw), padding=padding, stride=stride)
    out = weight.reshape(out_channels, -1) @ columns
    out_h = (height + 2 * padding - kh) // stride + 1
    out_w = (width + 2 * padding - kw) // stride + 1
    return out.reshape(batch, out_channels, out_h, out_w)


@probe
def conv2d_vs_fp64(dev: torch.device) -> Dict[str, Any]:
    """conv2d fp32 (TF32 off) against float64 over several shapes, forward and gradients."""
    shapes = [((2, 3, 32, 32), (16, 3, 3, 3), 1, 1), ((4, 64, 14, 14), (64, 64, 3, 3), 1, 1),
              ((1, 16, 64, 64), (32, 16, 5, 5), 2, 2), ((8, 32, 7, 7), (48, 32, 1, 1), 1, 0)]
    previous = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    comparisons = []
    try:
        for index, (x_shape, w_shape, stride, padding) in enumerate(shapes):
            x, w = randn(x_shape, dev, torch.float32, 2 * index), randn(w_shape, dev, torch.float32, 2 * index + 1)
            leaves = grad_leaves((x, w))
            base_leaves = grad_leaves((x, w))
            ref_leaves = [upcast(t, True) for t in (x, w)]
            out = F.conv2d(*leaves, stride=stride, padding=padding)
            ref = F.conv2d(*ref_leaves, stride=stride, padding=padding)
            with _no_tf32_matmul():
                base = _conv_unfold(*base_leaves, stride, padding)
            grad_out = torch.randn(ref.shape, generator=torch.Generator().manual_seed(index), dtype=torch.float64)
            out.backward(grad_out.to(dev, torch.float32))
            base.backward(grad_out.to(dev, torch.float32))
            ref.backward(grad_out)
            label = f"conv2d {x_shape}x{w_shape} s{stride}"
            comparisons.append(judge(f"{label} out", out, ref, base, torch.float32))
            comparisons.append(judge(f"{label} dx", leaves[0].grad, ref_leaves[0].grad, base_leaves[0].grad, torch.float32))
            comparisons.append(judge(f"{label} dw", leaves[1].grad, ref_leaves[1].grad, base_leaves[1].grad, torch.float32))
    finally:
        torch.backends.cudnn.allow_tf32 = previous
    return summarize(comparisons, f"conv2d fp32 fwd+bwd, {len(shapes)} shapes")


@contextlib.contextmanager
def _no_tf32_matmul():
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(previous)


@probe
def conv_train_step(dev: torch.device) -> Dict[str, Any]:
    """A small CNN: three SGD steps with conv2d forward and backward (a GPU fault crashes the probe)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(),
        torch.nn.Conv2d(16, 32, 3, stride=2, padding=1), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(32, 10)).to(dev)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    x = randn((8, 3, 32, 32), dev, torch.float32, 1)
    target = torch.arange(8, device=dev) % 10
    losses = []
    for _ in range(3):
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), target)
        loss.backward()
        optimizer.step()
        losses.append(float(loss.item()))
    sync(dev)
    finite = all(map(lambda value: value == value and abs(value) != float("inf"), losses))
    return finding(not finite, f"3 conv training steps ran; losses {', '.join(f'{l:.4f}' for l in losses)}"
                   + ("" if finite else " (not finite)"), losses=losses)


@probe
def lstm_vs_fp64(dev: torch.device) -> Dict[str, Any]:
    """nn.LSTM (2 layers, batch 128 > 100, 8 steps) fp32 forward on `dev` against float64, with the native
    (non-cuDNN/MIOpen) implementation on `dev` as the baseline (pytorch/pytorch#177834: MIOpen's LSTM
    wrong or crashing on ROCm 7.14 / gfx1201 for batches above 100)."""
    torch.manual_seed(0)
    lstm = torch.nn.LSTM(input_size=16, hidden_size=32, num_layers=2, batch_first=True)
    x = randn((128, 8, 16), dev, torch.float32, 1)
    reference = lstm.double()(x.detach().to("cpu", torch.float64))[0]
    lstm = lstm.float().to(dev)
    previous = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    try:
        with torch.no_grad():
            out = lstm(x)[0]
            with torch.backends.cudnn.flags(enabled=False):
                native = lstm(x)[0]
        sync(dev)
    finally:
        torch.backends.cudnn.allow_tf32 = previous
    return summarize([judge("LSTM output", out, reference, native, torch.float32)],
                     f"nn.LSTM(16, 32, 2 layers) fp32, batch 128 x 8 steps on {dev}")
