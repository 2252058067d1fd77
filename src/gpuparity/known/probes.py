"""Runtime probes of the known-issue base: each confirms or rules out one entry on this machine.

Every probe is called in a fresh process (gpuparity.known.engine.run_probe) as
`probe(device="cuda:0")` and returns {"failed": True | False | None, "detail": str, numbers...}:
failed True confirms the issue here, False rules it out, None means it could not tell (no such
kernel, no second GPU, ...). A crash or hang of the process is judged by the caller. Probes
call torch directly (raw SDPA, raw norms), never gpuparity's own wrappers, because they test
the platform, and they keep memory modest.
"""
from __future__ import annotations

import contextlib
import glob
import os
import re
import time
import warnings
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch
import torch.nn.functional as F

PROBES: List[str] = []


def probe(fn: Callable) -> Callable:
    PROBES.append(fn.__name__)
    return fn


# --------------------------------------------------------------------------- helpers
def verdict(failed: Optional[bool], detail: str, **measured: Any) -> Dict[str, Any]:
    return {"failed": failed, "detail": detail, **measured}


def inconclusive(detail: str, **measured: Any) -> Dict[str, Any]:
    return verdict(None, detail, **measured)


def _device(device: str) -> torch.device:
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", 0)
    return dev


def _needs_gpu(dev: torch.device) -> Optional[Dict[str, Any]]:
    if dev.type != "cuda":
        return inconclusive(f"this probe needs a GPU device, got {dev}")
    if not torch.cuda.is_available():
        return inconclusive("torch.cuda.is_available() is False")
    return None


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _first_line(exc: BaseException, limit: int = 300) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {(text[0] if text else '')[:limit]}"


def _is_rocm() -> bool:
    return bool(getattr(torch.version, "hip", None))


SDPA_MEMBERS = {"math": "MATH", "efficient": "EFFICIENT_ATTENTION", "flash": "FLASH_ATTENTION",
                "cudnn": "CUDNN_ATTENTION"}
NO_KERNEL = ("No available kernel", "No viable backend")


class NoKernel(Exception):
    """The forced SDPA backend has no kernel for this call on this build."""


def run_sdpa(backend: str, q, k, v, **kwargs):
    """torch's scaled_dot_product_attention forced to one backend; NoKernel when it refuses."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    member = getattr(SDPBackend, SDPA_MEMBERS[backend], None)
    if member is None:
        raise NoKernel(f"this torch has no SDPBackend.{SDPA_MEMBERS[backend]}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            with sdpa_kernel([member]):
                return F.scaled_dot_product_attention(q, k, v, **kwargs)
        except RuntimeError as exc:
            if any(marker in str(exc) for marker in NO_KERNEL):
                raise NoKernel(_first_line(exc, 200)) from None
            raise


def _composition(q, k, v, attn_mask=None, is_causal=False):
    """matmul-softmax-matmul in q's dtype with an fp32 softmax: the trusted baseline."""
    if k.shape[1] != q.shape[1]:
        group = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = torch.matmul(q, k.transpose(-2, -1)).float() * q.shape[-1] ** -0.5
    allowed = torch.ones(scores.shape[-2:], dtype=torch.bool, device=q.device)
    if is_causal:
        allowed = allowed.tril()
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            allowed = allowed & attn_mask
        else:
            scores = scores + attn_mask.float()
    allowed = allowed & ~torch.isneginf(scores)
    empty = ~allowed.any(-1, keepdim=True)
    scores = scores.masked_fill(~allowed, float("-inf")).masked_fill(empty, 0.0)
    probs = torch.softmax(scores, dim=-1).masked_fill(empty, 0.0)
    return torch.matmul(probs.to(q.dtype), v)


def _upcast(tensor, grad: bool):
    return tensor.detach().to("cpu", torch.float64).requires_grad_(grad)


def attention_vs_fp64(backend: str, q, k, v, *, attn_mask=None, is_causal=False, grads=True,
                      enable_gqa=False, label: str = ""):
    """Raw SDPA forced to `backend` against the float64 reference under the tolerance policy:
    the output and, with grads, dq, dk, dv. Returns the list of Comparisons (NoKernel if refused)."""
    from ..checks.tolerance import compare
    from ..reference import attention as reference_attention

    dtype = q.dtype
    qs, ks, vs = (t.detach().clone().requires_grad_(grads) for t in (q, k, v))
    kwargs: Dict[str, Any] = {"attn_mask": attn_mask, "is_causal": is_causal}
    if enable_gqa:
        kwargs["enable_gqa"] = True
    out = run_sdpa(backend, qs, ks, vs, **kwargs)

    q64, k64, v64 = (_upcast(t, grads) for t in (q, k, v))
    mask64 = None
    if attn_mask is not None:
        mask64 = attn_mask.detach().cpu() if attn_mask.dtype == torch.bool else attn_mask.detach().to("cpu", torch.float64)
    ref = reference_attention(q64, k64, v64, attn_mask=mask64, is_causal=is_causal)
    qb, kb, vb = (t.detach().clone().requires_grad_(grads) for t in (q, k, v))
    base = _composition(qb, kb, vb, attn_mask=attn_mask, is_causal=is_causal)

    name = f"{backend}{' ' + label if label else ''}"
    comparisons = [compare(f"{name} out", out, ref, base, dtype)]
    if grads:
        generator = torch.Generator().manual_seed(1)
        grad_out = torch.randn(ref.shape, generator=generator, dtype=torch.float64)
        ref.backward(grad_out)
        out.backward(grad_out.to(q.device, dtype))
        base.backward(grad_out.to(q.device, dtype))
        for label_grad, mine, theirs, baseline in (("dq", qs, q64, qb), ("dk", ks, k64, kb), ("dv", vs, v64, vb)):
            comparisons.append(compare(f"{name} {label_grad}", mine.grad, theirs.grad, baseline.grad, dtype))
    return comparisons


def summarize(comparisons, what: str) -> Dict[str, Any]:
    """A probe verdict from Comparisons: failed when any comparison failed."""
    failures = [c for c in comparisons if not c.passed]
    worst = max(comparisons, key=lambda c: (c.err or 0.0) / (c.allowed or 1e-30) if c.err is not None else float("inf"))
    measured = {"err": worst.err, "allowed": worst.allowed, "max_abs": worst.max_abs, "checks": len(comparisons),
                "failed_checks": len(failures)}
    if failures:
        return verdict(True, f"{what}: {failures[0].reason}"
                       + (f" (and {len(failures) - 1} more failed checks)" if len(failures) > 1 else ""), **measured)
    return verdict(False, f"{what}: {len(comparisons)} checks within tolerance (worst {worst.name}: "
                          f"err {worst.err:.3g} <= allowed {worst.allowed:.3g})", **measured)


def _random(shape, dev, dtype, seed: int, scale: float = 1.0):
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=generator, dtype=torch.float32) * scale).to(dev, dtype)


def _half(dev: torch.device) -> torch.dtype:
    return torch.float16 if dev.type == "cuda" else torch.float32


# --------------------------------------------------------------------------- attention
@probe
def sdpa_mask_rocm(device: str = "cpu") -> Dict[str, Any]:
    """EFFICIENT SDPA with a key-padding mask (user story 1's shape) against float64."""
    dev = _device(device)
    dtype = _half(dev)
    batch, heads, seq, dim = 4, 4, 150, 32
    lengths = torch.tensor([150, 120, 77, 1])
    key_padding = torch.arange(seq)[None, :] >= lengths[:, None]          # True = padding
    attn_mask = (~key_padding)[:, None, None, :].to(dev)                   # True = attend
    q, k, v = (_random((batch, heads, seq, dim), dev, dtype, seed) for seed in (1, 2, 3))
    try:
        comparisons = attention_vs_fp64("efficient", q, k, v, attn_mask=attn_mask, label="key-padding mask")
    except NoKernel as exc:
        return inconclusive(f"the efficient backend has no kernel here ({exc})")
    return summarize(comparisons, f"efficient SDPA with a key-padding mask, {str(dtype)[6:]} B{batch} H{heads} "
                                  f"S{seq} D{dim}")


@probe
def sdpa_fullmask_nan(device: str = "cpu") -> Dict[str, Any]:
    """Every SDPA backend with one fully masked query row, forward and backward: NaN anywhere?"""
    dev = _device(device)
    dtype = _half(dev)
    batch, heads, q_len, k_len, dim = 2, 2, 8, 16, 32
    mask = torch.ones(batch, 1, q_len, k_len, dtype=torch.bool)
    mask[0, 0, 3, :] = False
    mask = mask.to(dev)
    findings, ran, skipped = [], [], []
    for backend in SDPA_MEMBERS:
        q, k, v = (_random(shape, dev, dtype, seed).requires_grad_(True) for shape, seed in
                   (((batch, heads, q_len, dim), 1), ((batch, heads, k_len, dim), 2), ((batch, heads, k_len, dim), 3)))
        try:
            out = run_sdpa(backend, q, k, v, attn_mask=mask)
        except NoKernel as exc:
            skipped.append(f"{backend} ({exc})")
            continue
        out.backward(torch.ones_like(out))
        _sync(dev)
        ran.append(backend)
        nan_out = bool(torch.isnan(out).any())
        nan_grad = any(bool(torch.isnan(t.grad).any()) for t in (q, k, v))
        if nan_out or nan_grad:
            where = " and ".join(part for part, bad in (("output", nan_out), ("gradients", nan_grad)) if bad)
            findings.append(f"{backend}: NaN in the {where}")
    if not ran:
        return inconclusive("no SDPA backend accepted a bool mask here: " + "; ".join(skipped))
    detail = "; ".join(findings) if findings else f"no NaN from {', '.join(ran)} with a fully masked row (fwd+bwd)"
    if skipped:
        detail += f"; not run: {', '.join(s.split(' ')[0] for s in skipped)}"
    return verdict(bool(findings), detail, backends_run=ran, backends_with_nan=len(findings))


@probe
def sdpa_mask_dtype(device: str = "cuda") -> Dict[str, Any]:
    """fp16 q/k/v with an fp32 additive mask through the efficient backend: NaN or wrong?"""
    dev = _device(device)
    if (skip := _needs_gpu(dev)):
        return skip
    batch, heads, seq, dim = 2, 4, 128, 64
    q, k, v = (_random((batch, heads, seq, dim), dev, torch.float16, seed) for seed in (1, 2, 3))
    bias = _random((batch, 1, seq, seq), dev, torch.float32, 4, scale=0.5)
    bias[..., 100:] = float("-inf")
    try:
        comparisons = attention_vs_fp64("efficient", q, k, v, attn_mask=bias, grads=False, label="fp32 additive mask")
    except NoKernel as exc:
        return inconclusive(f"the efficient backend has no kernel here ({exc})")
    except RuntimeError as exc:
        return verdict(False, f"efficient SDPA refuses the mixed-dtype mask with an error, not NaN: {_first_line(exc)}")
    return summarize(comparisons, "efficient SDPA, fp16 q/k/v with an fp32 additive mask")


@probe
def sdpa_cudnn(device: str = "cuda") -> Dict[str, Any]:
    """cuDNN SDPA against float64, bf16, L=1000 (not a multiple of 128) and Lq=1, fwd+bwd."""
    dev = _device(device)
    if (skip := _needs_gpu(dev)):
        return skip
    comparisons = []
    try:
        for q_len, k_len in ((1000, 1000), (1, 1000)):
            q = _random((2, 4, q_len, 64), dev, torch.bfloat16, 1)
            k, v = (_random((2, 4, k_len, 64), dev, torch.bfloat16, seed) for seed in (2, 3))
            comparisons += attention_vs_fp64("cudnn", q, k, v, label=f"Lq={q_len} Lk={k_len}")
    except NoKernel as exc:
        return inconclusive(f"cuDNN SDPA has no kernel here ({exc})")
    result = summarize(comparisons, "cuDNN SDPA bf16, L=1000 and Lq=1, fwd+bwd")
    result["cudnn_version"] = torch.backends.cudnn.version()
    return result


@probe
def sdpa_cudnn_gqa(device: str = "cuda") -> Dict[str, Any]:
    """cuDNN SDPA with Hq=32, Hkv=4 (GQA) against float64, bf16, fwd+bwd."""
    dev = _device(device)
    if (skip := _needs_gpu(dev)):
        return skip
    q = _random((2, 32, 256, 64), dev, torch.bfloat16, 1)
    k, v = (_random((2, 4, 256, 64), dev, torch.bfloat16, seed) for seed in (2, 3))
    try:
        comparisons = attention_vs_fp64("cudnn", q, k, v, enable_gqa=True, label="Hq=32 Hkv=4")
    except NoKernel as exc:
        return inconclusive(f"cuDNN SDPA has no GQA kernel here ({exc})")
    except TypeError as exc:
        return inconclusive(f"this torch has no enable_gqa in SDPA ({_first_line(exc)})")
    return summarize(comparisons, "cuDNN SDPA GQA (Hq=32, Hkv=4), bf16")


@probe
def sdpa_eff_stride0(device: str = "cuda") -> Dict[str, Any]:
    """Efficient SDPA with expand()ed (stride-0) k/v, bf16, 4-D bool mask, kv_len 33."""
    from ..checks.tolerance import compare
    from ..reference import attention as reference_attention
    dev = _device(device)
    if (skip := _needs_gpu(dev)):
        return skip
    batch, heads, q_len, k_len, dim = 4, 8, 64, 33, 64
    q = _random((batch, heads, q_len, dim), dev, torch.bfloat16, 1)
    k_one, v_one = (_random((1, heads, k_len, dim), dev, torch.bfloat16, seed) for seed in (2, 3))
    k, v = k_one.expand(batch, -1, -1, -1), v_one.expand(batch, -1, -1, -1)
    generator = torch.Generator().manual_seed(4)
    mask = torch.rand((batch, heads, q_len, k_len), generator=generator) > 0.3
    mask[..., 0] = True
    mask = mask.to(dev)
    try:
        out = run_sdpa("efficient", q, k, v, attn_mask=mask)
    except NoKernel as exc:
        return inconclusive(f"the efficient backend has no kernel here ({exc})")
    ref = reference_attention(_upcast(q, False), _upcast(k, False), _upcast(v, False), attn_mask=mask.cpu())
    base = _composition(q, k.contiguous(), v.contiguous(), attn_mask=mask)
    return summarize([compare("efficient stride-0 k/v out", out, ref, base, torch.bfloat16)],
                     "efficient SDPA with stride-0 k/v, bf16, 4-D bool mask, kv_len 33")


@probe
def sdpa_maskgrad(device: str = "cuda") -> Dict[str, Any]:
    """SDPA backward when only a float attn_mask requires grad (an illegal access crashes the probe)."""
    from ..reference import attention as reference_attention
    dev = _device(device)
    if (skip := _needs_gpu(dev)):
        return skip
    q, k, v = (_random((2, 4, 128, 64), dev, torch.float16, seed) for seed in (1, 2, 3))
    bias = _random((2, 4, 128, 128), dev, torch.float16, 4, scale=0.5).requires_grad_(True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    grad_out = _random(out.shape, dev, torch.float16, 5)
    out.backward(grad_out)
    _sync(dev)
    bias64 = _upcast(bias, True)
    ref = reference_attention(_upcast(q, False), _upcast(k, False), _upcast(v, False), attn_mask=bias64)
    ref.backward(grad_out.detach().to("cpu", torch.float64))
    got = bias.grad.detach().to("cpu", torch.float64)
    if not torch.isfinite(got).all():
        return verdict(True, "the mask gradient has NaN/Inf")
    err = float(torch.linalg.vector_norm(got - bias64.grad) / torch.linalg.vector_norm(bias64.grad))
    # fp16 end to end: an error near 1 means garbage, not rounding.
    failed = err > 0.05
    return verdict(failed, f"backward with only the float mask requiring grad ran; mask-gradient relative error "
                           f"{err:.3g} vs float64" + (" (wrong)" if failed else ""), err=err)


@probe
def sdpa_fused_vs_fp64(device: str = "cuda") -> Dict[str, Any]:
    """FLASH and EFFICIENT SDPA against float64: no mask, causal, and (efficient) a key-padding mask."""
    dev = _device(device)
    if (skip := _needs_gpu(dev)):
        return skip
    q, k, v = (_random((2, 4, 256, 64), dev, torch.float16, seed) for seed in (1, 2, 3))
    padding = torch.ones(2, 1, 1, 256, dtype=torch.bool)
    padding[1, ..., 200:] = False
    comparisons, skipped = [], []
    for backend, kwargs, label in (("flash", {}, "no mask"), ("flash", {"is_causal": True}, "causal"),
                                   ("efficient", {}, "no mask"), ("efficient", {"is_causal": True}, "causal"),
                                   ("efficient", {"attn_mask": padding.to(dev)}, "key padding")):
        try:
            comparisons += attention_vs_fp64(backend, q, k, v, label=label, **kwargs)
        except NoKernel as exc:
            skipped.append(f"{backend} {label}: {exc}")
    if not comparisons:
        return inconclusive("no fused backend has a kernel here: " + "; ".join(skipped))
    return summarize(comparisons, "fused SDPA (flash/efficient) fp16 fwd+bwd")


@probe
def sdpa_aotriton_rdna35(device: str = "cuda") -> Dict[str, Any]:
    """The reported RDNA3.5 shapes: fp16 (B4,H8,N4096,D72) forward; fp32 hdim 80 causal fwd+bwd."""
    from ..checks.tolerance import compare
    from ..reference import attention as reference_attention
    dev = _device(device)
    if (skip := _needs_gpu(dev)):
        return skip
    findings, ran, comparisons = [], [], []
    q, k, v = (_random((4, 8, 4096, 72), dev, torch.float16, seed) for seed in (1, 2, 3))
    rows = torch.cat([torch.arange(64), torch.arange(4096 - 64, 4096)])
    # Query rows are independent without a mask, so a slice of rows keeps the reference small.
    ref = reference_attention(_upcast(q[:, :, rows], False), _upcast(k, False), _upcast(v, False))
    base = _composition(q[:, :, rows.to(dev)], k, v)
    for backend in ("flash", "efficient"):
        try:
            out = run_sdpa(backend, q, k, v)
        except NoKernel:
            continue
        _sync(dev)
        ran.append(f"{backend} fp16 D72")
        if torch.isnan(out).any():
            findings.append(f"{backend}: NaN in the fp16 (4,8,4096,72) forward")
        comparisons.append(compare(f"{backend} fp16 D72 out", out[:, :, rows.to(dev)], ref, base, torch.float16))
    q, k, v = (_random((1, 4, 1024, 80), dev, torch.float32, seed) for seed in (4, 5, 6))
    for backend in ("flash", "efficient"):
        try:
            case = attention_vs_fp64(backend, q, k, v, is_causal=True, label="fp32 D80 causal")
        except NoKernel:
            continue
        ran.append(f"{backend} fp32 D80 causal")
        comparisons += case
        if any("NaN" in c.reason for c in case):
            findings.append(f"{backend}: NaN in the fp32 D80 causal case")
    if not ran:
        return inconclusive("no fused backend has a kernel for these shapes here")
    if findings:
        return verdict(True, "; ".join(findings), cases_run=ran)
    result = summarize(comparisons, "RDNA3.5 shapes")
    result["cases_run"] = ran
    return result


@probe
def sdpa_fused_launch(device: str = "cuda") -> Dict[str, Any]:
    """FLASH and EFFICIENT in this fresh process, then `x + 1; synchronize()`: a launch failure
    that only surfaces at a later op shows up here (or crashes the probe)."""
    dev = _device(device)
    if (skip := _needs_gpu(dev)):
        return skip
    q, k, v = (_random((2, 4, 128, 64), dev, torch.float16, seed) for seed in (1, 2, 3))
    findings, ran, skipped = [], [], []
    for backend in ("flash", "efficient"):
        try:
            out = run_sdpa(backend, q, k, v)
            after = torch.ones(16, device=dev) + 1
            _sync(dev)
            total = float(after.sum().item())
            ran.append(backend)
            if not torch.isfinite(out).all() or total != 32.0:
                findings.append(f"{backend}: wrong results after the launch (later op gave {total}, expected 32)")
        except NoKernel as exc:
            skipped.append(f"{backend}: {exc}")
        except RuntimeError as exc:
            findings.append(f"{backend}: {_first_line(exc)}")
    if not ran and not findings:
        return inconclusive("no fused backend has a kernel here: " + "; ".join(skipped))
    if findings:
        return verdict(True, "; ".join(findings))
    return verdict(False, f"{', '.join(ran)} launched and a later op ran cleanly")


@probe
def sdpa_flash_alone(device: str = "cuda") -> Dict[str, Any]:
    """FLASH forced alone (fp16, D64), and EFFICIENT with head_dim 288: which have kernels?"""
    dev = _device(device)
    if (skip := _needs_gpu(dev)):
        return skip
    q, k, v = (_random((2, 4, 128, 64), dev, torch.float16, seed) for seed in (1, 2, 3))
    try:
        run_sdpa("flash", q, k, v)
        _sync(dev)
        flash = "flash ran (fp16, head_dim 64)"
        failed = False
    except NoKernel as exc:
        flash = f"flash has no kernel: {exc}"
        failed = True
    wide = [_random((1, 2, 64, 288), dev, torch.float16, seed) for seed in (4, 5, 6)]
    try:
        run_sdpa("efficient", *wide)
        efficient = "efficient ran with head_dim 288"
    except NoKernel as exc:
        efficient = f"efficient has no kernel for head_dim 288 ({exc})"
    return verdict(failed, f"{flash}; {efficient}")


# --------------------------------------------------------------------------- norms, softmax, matmul, conv
@probe
def cpu_bf16_layer_norm_grad(device: str = "cpu") -> Dict[str, Any]:
    """bf16 F.layer_norm backward on the CPU (whatever `device` is), rows with mean/std 50."""
    from ..checks.tolerance import compare
    gen = torch.Generator().manual_seed(0)
    rows, width = 64, 256
    x = (5.0 + 0.1 * torch.randn(rows, width, generator=gen, dtype=torch.float64)).bfloat16()
    weight = (1 + 0.5 * torch.randn(width, generator=gen, dtype=torch.float64)).bfloat16()
    grad_out = torch.randn(rows, width, generator=gen, dtype=torch.float64).bfloat16()
    got = [t.clone().requires_grad_(True) for t in (x, weight)]
    ref = [t.double().requires_grad_(True) for t in (x, weight)]
    base = [t.float().requires_grad_(True) for t in (x, weight)]
    F.layer_norm(got[0], (width,), got[1]).backward(grad_out)
    F.layer_norm(ref[0], (width,), ref[1]).backward(grad_out.double())
    F.layer_norm(base[0], (width,), base[1]).backward(grad_out.float())
    comparisons = [compare("dweight", got[1].grad, ref[1].grad, base[1].grad.bfloat16(), torch.bfloat16),
                   compare("dx", got[0].grad, ref[0].grad, base[0].grad.bfloat16(), torch.bfloat16)]
    return summarize(comparisons, "CPU bf16 layer_norm(256) backward, rows mean/std 50")


@probe
def norm_weight_grads(device: str = "cuda") -> Dict[str, Any]:
    """LayerNorm(256) and RMSNorm(256): output, input, weight and bias gradients against float64."""
    from ..checks.tolerance import compare
    from .. import reference
    dev = _device(device)
    rows, width = 64, 256
    x = _random((rows, width), dev, torch.float32, 1)
    weight = _random((width,), dev, torch.float32, 2) + 1.0
    bias = _random((width,), dev, torch.float32, 3)
    grad_out = _random((rows, width), dev, torch.float32, 4)
    comparisons = []
    cases = [("layer_norm", lambda x_, w_, b_: F.layer_norm(x_, (width,), w_, b_),
              lambda x_, w_, b_: reference.layer_norm(x_, (width,), w_, b_))]
    if hasattr(F, "rms_norm"):
        cases.append(("rms_norm", lambda x_, w_, b_: F.rms_norm(x_, (width,), w_, eps=1e-6),
                      lambda x_, w_, b_: reference.rms_norm(x_, (width,), w_, eps=1e-6)))
    for name, op, ref_op in cases:
        leaves = [t.detach().clone().requires_grad_(True) for t in (x, weight, bias)]
        base_leaves = [t.detach().clone().requires_grad_(True) for t in (x, weight, bias)]
        ref_leaves = [_upcast(t, True) for t in (x, weight, bias)]
        out, base, ref = op(*leaves), ref_op(*base_leaves), ref_op(*ref_leaves)
        out.backward(grad_out)
        base.backward(grad_out)
        ref.backward(grad_out.detach().to("cpu", torch.float64))
        comparisons.append(compare(f"{name} out", out, ref, base, torch.float32))
        for label, index in (("dx", 0), ("dweight", 1), ("dbias", 2)):
            if ref_leaves[index].grad is None:
                continue
            comparisons.append(compare(f"{name} {label}", leaves[index].grad, ref_leaves[index].grad,
                                       base_leaves[index].grad, torch.float32))
    return summarize(comparisons, f"LayerNorm/RMSNorm({width}) fp32 fwd+bwd on {dev}")


@probe
def layer_norm_huge_rows(device: str = "cuda", rows: int = 2 ** 23 + 8, width: int = 5) -> Dict[str, Any]:
    """layer_norm over (2^23 + 8, 5) fp32 (about 170 MB): the rows past 2^23 against float64."""
    from ..checks.tolerance import compare
    from .. import reference
    dev = _device(device)
    generator = torch.Generator().manual_seed(1)
    x = torch.randn((rows, width), generator=generator).to(dev)
    out = F.layer_norm(x, (width,))
    _sync(dev)
    tail = torch.arange(max(0, rows - 4096), rows)
    head = torch.arange(0, min(rows, 1024))
    picked = torch.cat([head, tail])
    got = out[picked.to(dev)].detach().cpu()
    ref = reference.layer_norm(x[picked.to(dev)].detach().to("cpu", torch.float64), (width,))
    zero_rows = int((got[len(head):] == 0).all(dim=-1).sum())
    comparison = compare("layer_norm tail rows", got, ref, None, torch.float32)
    del x, out
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    result = summarize([comparison], f"layer_norm of ({rows}, {width}) fp32, first 1024 and last 4096 rows")
    result["zero_tail_rows"] = zero_rows
    return result


@probe
def softmax_fp64_odd(device: str = "cuda") -> Dict[str, Any]:
    """fp64 softmax rows over odd widths between 512 and 1024 must sum to 1."""
    dev = _device(device)
    worst, worst_width = 0.0, None
    for width in (515, 781, 1023):
        for x in (torch.zeros(2, width, dtype=torch.float64, device=dev),
                  torch.randn(2, width, dtype=torch.float64, device=dev)):
            error = float((x.softmax(-1).sum(-1) - 1).abs().max())
            if error > worst:
                worst, worst_width = error, width
    failed = worst > 1e-12
    return verdict(failed, f"fp64 softmax row sums: worst |sum - 1| = {worst:.3g}"
                   + (f" at width {worst_width}" if failed else " over widths 515, 781, 1023"), max_error=worst)


def _rel_err(out, ref) -> float:
    out = out.detach().to("cpu", torch.float64)
    return float(torch.linalg.vector_norm(out - ref) / torch.linalg.vector_norm(ref))


# TF32 rounds inputs to 10 mantissa bits: relative error ~3e-4 on random data; fp32 ~1e-7.
TF32_LEVEL = 1e-4
BF16_LEVEL = 1e-3


@probe
def tf32_defaults(device: str = "cuda") -> Dict[str, Any]:
    """fp32 matmul and conv2d against float64 under this process's default flags."""
    dev = _device(device)
    if (skip := _needs_gpu(dev)):
        return skip
    a, b = _random((512, 512), dev, torch.float32, 1), _random((512, 512), dev, torch.float32, 2)
    matmul_err = _rel_err(a @ b, a.double().cpu() @ b.double().cpu())
    x, w = _random((4, 32, 16, 16), dev, torch.float32, 3), _random((32, 32, 3, 3), dev, torch.float32, 4)
    conv_err = _rel_err(F.conv2d(x, w, padding=1), F.conv2d(x.double().cpu(), w.double().cpu(), padding=1))
    flags = {"matmul_allow_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
             "cudnn_allow_tf32": bool(torch.backends.cudnn.allow_tf32),
             "float32_matmul_precision": torch.get_float32_matmul_precision(),
             "HIPBLASLT_ALLOW_TF32": os.environ.get("HIPBLASLT_ALLOW_TF32")}
    reduced = [name for name, err in (("matmul", matmul_err), ("conv2d", conv_err)) if err > TF32_LEVEL]
    detail = (f"fp32 {' and '.join(reduced)} ran at reduced (TF32-level) precision by default"
              if reduced else "fp32 matmul and conv2d ran at full fp32 precision by default")
    detail += f" (matmul err {matmul_err:.2g}, conv err {conv_err:.2g}; flags {flags})"
    return verdict(bool(reduced), detail, matmul_err=matmul_err, conv_err=conv_err, flags=flags)


@probe
def xf32_high_precision(device: str = "cuda") -> Dict[str, Any]:
    """fp32 matmul with float32_matmul_precision 'high' vs 'highest' against float64."""
    dev = _device(device)
    if (skip := _needs_gpu(dev)):
        return skip
    a, b = _random((1024, 1024), dev, torch.float32, 1), _random((1024, 1024), dev, torch.float32, 2)
    ref = a.double().cpu() @ b.double().cpu()
    before = torch.get_float32_matmul_precision()
    errors = {}
    try:
        for precision in ("highest", "high"):
            torch.set_float32_matmul_precision(precision)
            errors[precision] = _rel_err(a @ b, ref)
    finally:
        torch.set_float32_matmul_precision(before)
    failed = errors["high"] > BF16_LEVEL
    return verdict(failed, f"fp32 matmul error vs float64: 'highest' {errors['highest']:.2g}, 'high' {errors['high']:.2g}"
                   + (" (bf16-level)" if failed else " (TF32-level or better)"), errors=errors)


@probe
def gemm_large_m(device: str = "cuda") -> Dict[str, Any]:
    """ones(600000, 4) @ eye(4) in fp32 must be all ones (M > 2^19)."""
    dev = _device(device)
    out = torch.ones(600000, 4, device=dev) @ torch.eye(4, device=dev)
    wrong = (out != 1).any(dim=1)
    count = int(wrong.sum())
    first = int(wrong.nonzero()[0, 0]) if count else None
    return verdict(count > 0, f"{count} of 600000 rows wrong" + (f", first at row {first}" if count else ""),
                   wrong_rows=count, first_wrong_row=first)


@probe
def gemm_2gib_tail(device: str = "cuda") -> Dict[str, Any]:
    """bf16 GEMM into a NaN-prefilled output of more than 2 GiB with M % 256 != 0: tail written?"""
    dev = _device(device)
    if (skip := _needs_gpu(dev)):
        return skip
    m, n, k = 2 ** 17 + 100, 8192, 64
    needed = m * n * 2 + (m + n) * k * 2
    free, _ = torch.cuda.mem_get_info(dev)
    if free < needed * 1.2:
        return inconclusive(f"needs {needed / 2**30:.1f} GiB free on the GPU, has {free / 2**30:.1f} GiB")
    a, b = _random((m, k), dev, torch.bfloat16, 1), _random((k, n), dev, torch.bfloat16, 2)
    out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device=dev)
    torch.matmul(a, b, out=out)
    _sync(dev)
    nan_rows = int(torch.isnan(out).any(dim=1).sum())
    first = int(torch.isnan(out).any(dim=1).nonzero()[0, 0]) if nan_rows else None
    del out
    torch.cuda.empty_cache()
    return verdict(nan_rows > 0, f"{nan_rows} of {m} output rows never written (still NaN)"
                   + (f", first at row {first}" if nan_rows else f"; output {m * n * 2 / 2**30:.2f} GiB"),
                   unwritten_rows=nan_rows)


@probe
def bf16_emulated(device: str = "cuda") -> Dict[str, Any]:
    """Is bf16 reported as supported on a GPU that only emulates it (capability < 8.0)?"""
    dev = _device(device)
    if (skip := _needs_gpu(dev)):
        return skip
    capability = torch.cuda.get_device_capability(dev)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        reported = bool(torch.cuda.is_bf16_supported())
        try:
            native = bool(torch.cuda.is_bf16_supported(including_emulation=False))
        except TypeError:
            native = capability >= (8, 0)
    failed = reported and not native
    return verdict(failed, f"capability {capability[0]}.{capability[1]}: is_bf16_supported() {reported}, "
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
def conv2d_vs_fp64(device: str = "cuda") -> Dict[str, Any]:
    """conv2d fp32 (TF32 off) against float64 over several shapes, forward and gradients."""
    from ..checks.tolerance import compare
    dev = _device(device)
    shapes = [((2, 3, 32, 32), (16, 3, 3, 3), 1, 1), ((4, 64, 14, 14), (64, 64, 3, 3), 1, 1),
              ((1, 16, 64, 64), (32, 16, 5, 5), 2, 2), ((8, 32, 7, 7), (48, 32, 1, 1), 1, 0)]
    previous = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    comparisons = []
    try:
        for index, (x_shape, w_shape, stride, padding) in enumerate(shapes):
            x, w = _random(x_shape, dev, torch.float32, 2 * index), _random(w_shape, dev, torch.float32, 2 * index + 1)
            leaves = [t.detach().clone().requires_grad_(True) for t in (x, w)]
            base_leaves = [t.detach().clone().requires_grad_(True) for t in (x, w)]
            ref_leaves = [_upcast(t, True) for t in (x, w)]
            out = F.conv2d(*leaves, stride=stride, padding=padding)
            ref = F.conv2d(*ref_leaves, stride=stride, padding=padding)
            with _no_tf32_matmul():
                base = _conv_unfold(*base_leaves, stride, padding)
            grad_out = torch.randn(ref.shape, generator=torch.Generator().manual_seed(index), dtype=torch.float64)
            out.backward(grad_out.to(dev, torch.float32))
            base.backward(grad_out.to(dev, torch.float32))
            ref.backward(grad_out)
            label = f"conv2d {x_shape}x{w_shape} s{stride}"
            comparisons.append(compare(f"{label} out", out, ref, base, torch.float32))
            comparisons.append(compare(f"{label} dx", leaves[0].grad, ref_leaves[0].grad, base_leaves[0].grad, torch.float32))
            comparisons.append(compare(f"{label} dw", leaves[1].grad, ref_leaves[1].grad, base_leaves[1].grad, torch.float32))
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
def conv_train_step(device: str = "cuda") -> Dict[str, Any]:
    """A small CNN: three SGD steps with conv2d forward and backward (a GPU fault crashes the probe)."""
    dev = _device(device)
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(),
        torch.nn.Conv2d(16, 32, 3, stride=2, padding=1), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(32, 10)).to(dev)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    x = _random((8, 3, 32, 32), dev, torch.float32, 1)
    target = torch.arange(8, device=dev) % 10
    losses = []
    for _ in range(3):
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), target)
        loss.backward()
        optimizer.step()
        losses.append(float(loss.item()))
    _sync(dev)
    finite = all(map(lambda value: value == value and abs(value) != float("inf"), losses))
    return verdict(not finite, f"3 conv training steps ran; losses {', '.join(f'{l:.4f}' for l in losses)}"
                   + ("" if finite else " (not finite)"), losses=losses)


# --------------------------------------------------------------------------- compile
ENVIRONMENT_PROBLEMS = ("InvalidCxxCompiler", "No working C++ compiler", "Failed to find C compiler",
                        "Cannot find a working triton installation", "Python.h: No such file",
                        "not found in PATH", "CalledProcessError", "cannot find -l")


def _compile_failure(exc: BaseException, confirms: bool = True) -> Dict[str, Any]:
    """A compile error as a verdict: a missing toolchain cannot tell; otherwise the failure
    confirms the entry when a failing compile is its symptom (confirms=True), else cannot tell."""
    text = f"{type(exc).__name__}: {exc}"
    if any(marker in text for marker in ENVIRONMENT_PROBLEMS):
        return inconclusive(f"torch.compile cannot run on this machine (a toolchain problem, not this issue): "
                            f"{_first_line(exc)}")
    if not confirms:
        return inconclusive(f"torch.compile failed, so the compiled result could not be checked: {_first_line(exc, 400)}")
    return verdict(True, f"torch.compile failed: {_first_line(exc, 400)}")


def masked_pooling(x, mask, weight):
    """Attention pooling over valid positions plus a masked mean: the pattern of user story 1.
    x (B, S, D); mask (B, S) bool, True = valid; weight (D, 1)."""
    scores = (x @ weight).squeeze(-1).masked_fill(~mask, float("-inf"))
    any_valid = mask.any(dim=-1, keepdim=True)
    probs = torch.softmax(scores.masked_fill(~any_valid, 0.0), dim=-1).masked_fill(~mask, 0.0)
    pooled = (probs.unsqueeze(-1) * x).sum(dim=1)
    count = mask.sum(dim=-1, keepdim=True).clamp(min=1)
    mean = (x * mask.unsqueeze(-1)).sum(dim=1) / count
    return torch.where(any_valid, pooled + mean, torch.zeros_like(pooled))


@probe
def compile_masked_pooling(device: str = "cuda") -> Dict[str, Any]:
    """torch.compile (inductor) of a masked attention-pooling function, fwd+bwd, against eager
    and float64. Long rows force looped reductions over the bool mask."""
    from ..checks.tolerance import compare
    dev = _device(device)
    batch, seq, dim = 4, 2048, 16
    x = _random((batch, seq, dim), dev, torch.float32, 1)
    weight = _random((dim, 1), dev, torch.float32, 2)
    generator = torch.Generator().manual_seed(3)
    mask = torch.rand((batch, seq), generator=generator) > 0.4
    mask[1, :] = False  # an all-padding sequence
    mask = mask.to(dev)

    def run(fn, inputs):
        leaves = [t.detach().clone().requires_grad_(True) for t in inputs]
        out = fn(leaves[0], mask.to(leaves[0].device), leaves[1])
        out.backward(torch.ones_like(out))
        return out, leaves[0].grad

    eager_out, eager_grad = run(masked_pooling, (x, weight))
    ref_out, ref_grad = run(masked_pooling, (_upcast(x, False), _upcast(weight, False)))
    try:
        import torch._dynamo as dynamo
        dynamo.reset()
        compiled = torch.compile(masked_pooling, backend="inductor", dynamic=False)
        start = time.monotonic()
        out, grad = run(compiled, (x, weight))
        _sync(dev)
        seconds = time.monotonic() - start
    except Exception as exc:  # noqa: BLE001 - any compile failure is the finding
        return _compile_failure(exc)
    result = summarize([compare("compiled out", out, ref_out, eager_out, torch.float32),
                        compare("compiled dx", grad, ref_grad, eager_grad, torch.float32)],
                       "torch.compile of masked attention pooling vs eager (fp32, fwd+bwd)")
    result["compile_s"] = round(seconds, 2)
    return result


@probe
def compile_bf16_block(device: str = "cuda") -> Dict[str, Any]:
    """Embedding + Linear + RMSNorm under bf16 autocast, compiled vs eager vs float64."""
    from ..checks.tolerance import compare
    dev = _device(device)
    torch.manual_seed(0)

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(1000, 256)
            self.linear = torch.nn.Linear(256, 256)
            self.scale = torch.nn.Parameter(torch.ones(256))

        def forward(self, tokens):
            h = self.linear(self.embed(tokens))
            h = h.float()
            return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6) * self.scale

    block = Block().to(dev)
    tokens = torch.randint(0, 1000, (8, 128), generator=torch.Generator().manual_seed(1)).to(dev)
    with torch.autocast(dev.type, dtype=torch.bfloat16):
        eager = block(tokens)
    reference_block = Block().double()
    reference_block.load_state_dict({k: v.double().cpu() for k, v in block.state_dict().items()})
    ref = reference_block(tokens.cpu())
    try:
        import torch._dynamo as dynamo
        dynamo.reset()
        compiled = torch.compile(block, backend="inductor")
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            out = compiled(tokens)
        _sync(dev)
    except Exception as exc:  # noqa: BLE001
        return _compile_failure(exc, confirms=False)
    return summarize([compare("compiled bf16 block", out, ref, eager, torch.bfloat16)],
                     "compiled embedding+linear+RMSNorm under bf16 autocast vs eager")


# --------------------------------------------------------------------------- checkpointing, determinism
@probe
def checkpoint_masked_attention(device: str = "cpu") -> Dict[str, Any]:
    """Masked math-backend attention under torch.utils.checkpoint, fwd+bwd, three ways: the
    sdpa_kernel context around the forward only (as a training loop writes it), around
    forward and backward, and inside the checkpointed function."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.checkpoint import checkpoint
    dev = _device(device)
    batch, heads, seq, dim = 2, 2, 64, 16
    x = _random((batch, seq, heads * dim), dev, torch.float32, 1)
    projection = _random((heads * dim, 3 * heads * dim), dev, torch.float32, 2, scale=0.1)
    lengths = torch.tensor([seq, seq // 2])
    mask = (torch.arange(seq)[None, :] < lengths[:, None])[:, None, None, :].to(dev)

    def attend(inputs):
        q, k, v = (inputs @ projection).view(batch, seq, 3, heads, dim).permute(2, 0, 3, 1, 4)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    def attend_math(inputs):
        with sdpa_kernel([SDPBackend.MATH]):
            return attend(inputs)

    def plain():
        leaf = x.detach().clone().requires_grad_(True)
        with sdpa_kernel([SDPBackend.MATH]):
            attend(leaf).sum().backward()
        return leaf.grad

    def forward_only():
        leaf = x.detach().clone().requires_grad_(True)
        with sdpa_kernel([SDPBackend.MATH]):
            out = checkpoint(attend, leaf, use_reentrant=False)
        out.sum().backward()
        return leaf.grad

    def around_both():
        leaf = x.detach().clone().requires_grad_(True)
        with sdpa_kernel([SDPBackend.MATH]):
            checkpoint(attend, leaf, use_reentrant=False).sum().backward()
        return leaf.grad

    def inside():
        leaf = x.detach().clone().requires_grad_(True)
        checkpoint(attend_math, leaf, use_reentrant=False).sum().backward()
        return leaf.grad

    expected = plain()
    outcomes = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for label, run in (("forward only", forward_only), ("around both", around_both), ("inside", inside)):
            try:
                grad = run()
            except Exception as exc:  # noqa: BLE001 - CheckpointError is the finding
                if "Recomputed values" in str(exc) or type(exc).__name__ == "CheckpointError":
                    outcomes[label] = _first_line(exc, 160)
                    continue
                raise
            same = torch.allclose(grad, expected, rtol=1e-4, atol=1e-5)
            outcomes[label] = "" if same else "gradients differ from the run without checkpointing"
    safe_failures = {label: text for label, text in outcomes.items() if text and label != "forward only"}
    if safe_failures:
        return verdict(True, "math attention + checkpointing fails even with the backend chosen consistently: "
                       + "; ".join(f"context {label}: {text}" for label, text in safe_failures.items()))
    if outcomes["forward only"]:
        # Torch behaviour on every platform, not a fault of this one: the recompute in backward
        # runs outside the sdpa_kernel context and picks another backend.
        return inconclusive("fine when the backend is chosen inside the checkpointed function or the context "
                            "also covers backward; with sdpa_kernel([MATH]) around the forward only the recompute "
                            f"picks another backend (torch behaviour on every platform): {outcomes['forward only']}")
    return verdict(False, "math attention + checkpointing fine in all 3 patterns, "
                          "including the context around the forward only")


@probe
def det_cublas_workspace(device: str = "cuda") -> Dict[str, Any]:
    """Deterministic mode in a fresh CUDA process: does a matmul raise without
    CUBLAS_WORKSPACE_CONFIG, and are two runs bitwise equal?"""
    dev = _device(device)
    if (skip := _needs_gpu(dev)):
        return skip
    config = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    torch.use_deterministic_algorithms(True)
    a, b = _random((16, 256, 512), dev, torch.float32, 1), _random((16, 512, 256), dev, torch.float32, 2)
    try:
        first = torch.bmm(a, b)
        second = torch.bmm(a, b)
        _sync(dev)
    except RuntimeError as exc:
        if "CUBLAS_WORKSPACE_CONFIG" in str(exc):
            return verdict(True, f"deterministic mode raises here with CUBLAS_WORKSPACE_CONFIG={config}: "
                                 f"{_first_line(exc, 200)}", workspace_config=config)
        raise
    finally:
        torch.use_deterministic_algorithms(False)
    equal = bool(torch.equal(first, second))
    return verdict(not equal, f"deterministic bmm with CUBLAS_WORKSPACE_CONFIG={config}: two runs "
                              f"{'bitwise equal' if equal else 'differ'}", workspace_config=config)


@probe
def gemv_twice_bitwise(device: str = "cuda") -> Dict[str, Any]:
    """The same fp32 GEMV and GEMM ten times: bitwise equal without deterministic mode?"""
    dev = _device(device)
    if (skip := _needs_gpu(dev)):
        return skip
    matrix, vector = _random((4096, 4096), dev, torch.float32, 1), _random((4096,), dev, torch.float32, 2)
    a, b = _random((64, 8192), dev, torch.float32, 3), _random((8192, 64), dev, torch.float32, 4)
    gemv = [matrix @ vector for _ in range(10)]
    gemm = [a @ b for _ in range(10)]
    _sync(dev)
    gemv_differ = sum(not torch.equal(gemv[0], other) for other in gemv[1:])
    gemm_differ = sum(not torch.equal(gemm[0], other) for other in gemm[1:])
    failed = bool(gemv_differ or gemm_differ)
    return verdict(failed, f"10 runs each: GEMV differed {gemv_differ} times, split-K GEMM {gemm_differ} times "
                           f"(deterministic algorithms {torch.are_deterministic_algorithms_enabled()}; "
                           f"ROCBLAS_DEFAULT_ATOMICS_MODE={os.environ.get('ROCBLAS_DEFAULT_ATOMICS_MODE')})",
                   gemv_differ=gemv_differ, gemm_differ=gemm_differ)


@probe
def flex_attention_twice(device: str = "cuda") -> Dict[str, Any]:
    """Compiled FlexAttention with a causal block mask, fwd+bwd twice: bitwise equal?"""
    dev = _device(device)
    if (skip := _needs_gpu(dev)):
        return skip
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    except ImportError as exc:
        return inconclusive(f"this torch has no FlexAttention ({exc})")
    q, k, v = (_random((2, 4, 512, 64), dev, torch.bfloat16, seed) for seed in (1, 2, 3))
    try:
        block_mask = create_block_mask(lambda b, h, qi, ki: qi >= ki, None, None, 512, 512, device=str(dev))
        compiled = torch.compile(flex_attention)
        runs = []
        for _ in range(2):
            leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
            out = compiled(*leaves, block_mask=block_mask)
            out.backward(torch.ones_like(out))
            runs.append([out.detach()] + [t.grad for t in leaves])
        _sync(dev)
    except Exception as exc:  # noqa: BLE001
        return _compile_failure(exc, confirms=False)
    names = ("out", "dq", "dk", "dv")
    differ = [name for name, first, second in zip(names, runs[0], runs[1]) if not torch.equal(first, second)]
    return verdict(bool(differ), "compiled FlexAttention twice: " + (
        f"{', '.join(differ)} differ bitwise" if differ else "out, dq, dk, dv bitwise equal"))


# --------------------------------------------------------------------------- collectives
def _free_port() -> int:
    import socket
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _all_reduce_worker(rank: int, world: int, port: int, device_type: str, sizes: Sequence[int], queue) -> None:
    import datetime
    import torch.distributed as dist
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    backend = "nccl" if device_type == "cuda" else "gloo"
    try:
        if device_type == "cuda":
            torch.cuda.set_device(rank)
        dev = torch.device(device_type, rank) if device_type == "cuda" else torch.device("cpu")
        dist.init_process_group(backend, rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60))
        report = []
        expected = world * (world + 1) / 2
        for size in sizes:
            tensor = torch.full((max(1, size // 4),), float(rank + 1), device=dev)
            if device_type == "cuda":
                torch.cuda.synchronize(dev)
            start = time.monotonic()
            dist.all_reduce(tensor)
            if device_type == "cuda":
                torch.cuda.synchronize(dev)
            seconds = time.monotonic() - start
            wrong = int((tensor != expected).sum())
            report.append({"bytes": size, "seconds": seconds, "wrong": wrong})
        dist.destroy_process_group()
        queue.put({"rank": rank, "report": report})
    except Exception as exc:  # noqa: BLE001 - the parent reports it
        queue.put({"rank": rank, "error": _first_line(exc)})


def _all_reduce(device: str, sizes: Sequence[int], deadline_s: float = 45.0) -> Dict[str, Any]:
    import multiprocessing
    dev = _device(device)
    if dev.type == "cuda":
        if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
            return inconclusive("needs at least two GPUs visible to this process")
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    port = _free_port()
    workers = [context.Process(target=_all_reduce_worker, args=(rank, 2, port, dev.type, list(sizes), queue),
                               daemon=True) for rank in range(2)]
    for worker in workers:
        worker.start()
    answers: Dict[int, Dict[str, Any]] = {}
    end = time.monotonic() + deadline_s
    while len(answers) < 2 and time.monotonic() < end:
        try:
            answer = queue.get(timeout=max(0.1, min(1.0, end - time.monotonic())))
            answers[answer["rank"]] = answer
        except Exception:  # noqa: BLE001 - queue.Empty: keep waiting until the deadline
            if not any(worker.is_alive() for worker in workers) and queue.empty():
                break
    for worker in workers:
        worker.join(timeout=1)
        if worker.is_alive():
            worker.kill()
    backend = "NCCL/RCCL" if dev.type == "cuda" else "gloo"
    if len(answers) < 2:
        missing = sorted(set(range(2)) - set(answers))
        return verdict(True, f"2-process {backend} all_reduce did not finish within {deadline_s:g} s "
                             f"(rank {', '.join(map(str, missing))} silent: a hang)")
    errors = [f"rank {rank}: {answer['error']}" for rank, answer in sorted(answers.items()) if "error" in answer]
    if errors:
        return verdict(True, f"2-process {backend} all_reduce failed: {'; '.join(errors)}")
    rows = answers[0]["report"]
    wrong = sum(row["wrong"] for answer in answers.values() for row in answer["report"])
    slowest = max(rows, key=lambda row: row["seconds"])
    sizes_text = ", ".join(_bytes(row["bytes"]) for row in rows)
    return verdict(wrong > 0, f"2-process {backend} all_reduce over {sizes_text}: {wrong} wrong elements; "
                              f"slowest {slowest['seconds'] * 1e3:.1f} ms at {_bytes(slowest['bytes'])}",
                   sizes=[row["bytes"] for row in rows], seconds=[row["seconds"] for row in rows], wrong=wrong)


def _bytes(count: int) -> str:
    for unit, scale in (("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if count >= scale:
            return f"{count / scale:g} {unit}"
    return f"{count} B"


@probe
def all_reduce_timed(device: str = "cuda") -> Dict[str, Any]:
    """A 2-process all_reduce of 4 MiB with a deadline: a hang or wrong sum confirms the issue."""
    return _all_reduce(device, [4 * 2 ** 20])


@probe
def all_reduce_size_sweep(device: str = "cuda") -> Dict[str, Any]:
    """A 2-process all_reduce from 8 B to 4 MiB (the failures start at 512 KiB)."""
    return _all_reduce(device, [8, 1024, 64 * 1024, 512 * 1024, 2 ** 20, 4 * 2 ** 20])


# --------------------------------------------------------------------------- install, permissions, memory
@probe
def arch_smoke(device: str = "cuda") -> Dict[str, Any]:
    """torch's arch list against this device's arch, and one kernel launch."""
    from .rules import arch_in_wheel
    dev = _device(device)
    if (skip := _needs_gpu(dev)):
        return skip
    arch_list = list(torch.cuda.get_arch_list())
    props = torch.cuda.get_device_properties(dev)
    if _is_rocm():
        arch = (getattr(props, "gcnArchName", "") or "").split(":")[0]
    else:
        arch = f"sm_{props.major}{props.minor}"
    listed = arch_in_wheel(arch, arch_list, "amd" if _is_rocm() else "nvidia")
    try:
        value = float((torch.ones(16, device=dev) * 2 + 1).sum().item())
        _sync(dev)
    except RuntimeError as exc:
        return verdict(True, f"{props.name} ({arch}): a kernel launch fails: {_first_line(exc)}; torch's arch list: "
                             f"{', '.join(arch_list)}", arch=arch, arch_list=arch_list)
    if value != 48.0:
        return verdict(True, f"{props.name} ({arch}): a kernel ran but computed {value}, expected 48")
    note = "listed in" if listed else "not listed in (a compatible or overridden target ran)"
    return verdict(False, f"{props.name} ({arch}) is {note} torch's arch list; a kernel launch works",
                   arch=arch, arch_list=arch_list)


@probe
def rocm_perms(device: str = "cpu") -> Dict[str, Any]:
    """Access to /dev/kfd and the render nodes, the user's groups, and torch.cuda.is_available()."""
    import grp
    if not os.path.exists("/dev/kfd"):
        return inconclusive("no /dev/kfd: the amdgpu kernel driver is not loaded (or this is a container "
                            "without the device passed in)")
    access = {path: os.access(path, os.R_OK | os.W_OK) for path in ["/dev/kfd"] + sorted(glob.glob("/dev/dri/renderD*"))}
    groups = sorted({grp.getgrgid(gid).gr_name for gid in os.getgroups() if _group_exists(gid)})
    denied = [path for path, ok in access.items() if not ok]
    available = bool(torch.cuda.is_available())
    if denied:
        owners = {path: _group_of(path) for path in denied}
        return verdict(True, f"no read/write access to {', '.join(denied)} (owned by group "
                             f"{', '.join(sorted(set(owners.values())))}); this user's groups: {', '.join(groups)}",
                       denied=denied, groups=groups, cuda_available=available)
    if not available:
        return inconclusive("the device files are accessible but torch.cuda.is_available() is False "
                            "(check HIP_VISIBLE_DEVICES / ROCR_VISIBLE_DEVICES and the driver)", groups=groups)
    return verdict(False, f"/dev/kfd and {len(access) - 1} render node(s) accessible; GPU available", groups=groups)


def _group_exists(gid: int) -> bool:
    import grp
    try:
        grp.getgrgid(gid)
        return True
    except KeyError:
        return False


def _group_of(path: str) -> str:
    import grp
    try:
        return grp.getgrgid(os.stat(path).st_gid).gr_name
    except (KeyError, OSError):
        return "?"


def _read(path: str) -> Optional[str]:
    try:
        with open(path) as handle:
            return handle.read()
    except OSError:
        return None


def kfd_gfx_targets(root: str = "/sys/class/kfd/kfd/topology/nodes") -> List[int]:
    """The hardware gfx_target_version of each GPU node (the override does not change these)."""
    targets = []
    for properties in sorted(glob.glob(os.path.join(root, "*", "properties"))):
        text = _read(properties) or ""
        match = re.search(r"^gfx_target_version\s+(\d+)", text, re.MULTILINE)
        if match and int(match.group(1)) > 0:
            targets.append(int(match.group(1)))
    return targets


def gfx_name(target: int) -> str:
    """KFD gfx_target_version (major*10000 + minor*100 + stepping) -> 'gfx90a', 'gfx1100'."""
    major, minor, stepping = target // 10000, target // 100 % 100, target % 100
    return f"gfx{major}{minor:x}{stepping:x}"


def override_target(value: str) -> Optional[int]:
    parts = value.strip().split(".")
    if len(parts) != 3 or not all(part.isdigit() for part in parts):
        return None
    major, minor, stepping = (int(part) for part in parts)
    return major * 10000 + minor * 100 + stepping


@probe
def hsa_override(device: str = "cpu", topology_root: str = "/sys/class/kfd/kfd/topology/nodes") -> Dict[str, Any]:
    """HSA_OVERRIDE_GFX_VERSION against each GPU's real gfx target (KFD sysfs); then one matmul
    on the GPU (a stale override crashes it)."""
    value = os.environ.get("HSA_OVERRIDE_GFX_VERSION")
    if not value:
        return verdict(False, "HSA_OVERRIDE_GFX_VERSION is not set in this process")
    wanted = override_target(value)
    if wanted is None:
        return verdict(True, f"HSA_OVERRIDE_GFX_VERSION={value!r} is not MAJOR.MINOR.STEPPING")
    targets = kfd_gfx_targets(topology_root)
    findings = []
    if targets:
        # Same major.minor with another stepping is the common workaround; another family is stale.
        foreign = [gfx_name(t) for t in targets if t // 100 != wanted // 100]
        if foreign:
            findings.append(f"override {value} ({gfx_name(wanted)}) does not match the hardware "
                            f"{', '.join(sorted(set(foreign)))}: code for the wrong family runs on it")
        hardware = ", ".join(sorted({gfx_name(t) for t in targets}))
    else:
        hardware = "unknown (KFD topology not readable)"
    dev = _device(device)
    smoke = ""
    if dev.type == "cuda" and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(dev)
        a = _random((256, 256), dev, torch.float32, 1)
        value_sum = float((a @ a).sum().item())
        _sync(dev)
        smoke = f"; {props.name} reports {getattr(props, 'gcnArchName', '?')} and a matmul ran ({value_sum:.3g})"
    if findings:
        return verdict(True, "; ".join(findings) + smoke, override=value, hardware=hardware)
    if not targets:
        return inconclusive(f"HSA_OVERRIDE_GFX_VERSION={value}; the hardware gfx target could not be read{smoke}",
                            override=value)
    same = all(t == wanted for t in targets)
    note = ("it equals the hardware target and can be removed" if same else
            "same family as the hardware (the usual workaround for an unlisted stepping); it still bypasses "
            "ROCm's support matrix")
    return verdict(False, f"HSA_OVERRIDE_GFX_VERSION={value} ({gfx_name(wanted)}) on {hardware}: {note}{smoke}",
                   override=value, hardware=hardware)


def _drm_memory() -> List[Dict[str, Any]]:
    cards = []
    for device_dir in sorted(glob.glob("/sys/class/drm/card[0-9]*/device")):
        vram, gtt = _read(os.path.join(device_dir, "mem_info_vram_total")), _read(os.path.join(device_dir, "mem_info_gtt_total"))
        if vram is None and gtt is None:
            continue
        cards.append({"card": device_dir.split("/")[-2], "vram_total": int(vram) if vram else None,
                      "gtt_total": int(gtt) if gtt else None})
    return cards


@probe
def apu_memory(device: str = "cuda") -> Dict[str, Any]:
    """torch's view of the APU's memory (mem_get_info) against the VRAM carve-out and GTT in sysfs."""
    dev = _device(device)
    if (skip := _needs_gpu(dev)):
        return skip
    free, total = torch.cuda.mem_get_info(dev)
    cards = _drm_memory()
    if not cards:
        return inconclusive(f"torch sees {total / 2**30:.1f} GiB; no amdgpu memory info in sysfs", torch_total=total)
    card = min(cards, key=lambda c: abs((c["vram_total"] or 0) - total))
    vram, gtt = card["vram_total"] or 0, card["gtt_total"] or 0
    text = (f"torch sees {total / 2**30:.1f} GiB ({free / 2**30:.1f} free); {card['card']}: VRAM carve-out "
            f"{vram / 2**30:.1f} GiB, GTT {gtt / 2**30:.1f} GiB")
    measured = {"torch_total": total, "vram_total": vram, "gtt_total": gtt}
    if total <= vram * 1.05 and gtt > 2 * vram:
        return verdict(True, text + ": only the carve-out is usable", **measured)
    if total > vram * 1.5:
        return verdict(False, text + ": torch sees more than the carve-out", **measured)
    return inconclusive(text, **measured)


def _node_free_kib() -> Dict[int, int]:
    free = {}
    for path in glob.glob("/sys/devices/system/node/node[0-9]*/meminfo"):
        match = re.search(r"MemFree:\s+(\d+) kB", _read(path) or "")
        if match:
            free[int(path.split("/node")[-1].split("/")[0])] = int(match.group(1))
    return free


def _device_numa_node(dev: torch.device) -> Optional[int]:
    props = torch.cuda.get_device_properties(dev)
    bus, slot, domain = (getattr(props, name, None) for name in ("pci_bus_id", "pci_device_id", "pci_domain_id"))
    if bus is None or slot is None:
        return None
    text = _read(f"/sys/bus/pci/devices/{int(domain or 0):04x}:{int(bus):02x}:{int(slot):02x}.0/numa_node")
    return int(text) if text and text.strip().lstrip("-").isdigit() and int(text) >= 0 else None


@probe
def numa_spill(device: str = "cuda") -> Dict[str, Any]:
    """Per-NUMA-node MemFree around a 1 GiB allocation: did it land on this APU's node?"""
    dev = _device(device)
    if (skip := _needs_gpu(dev)):
        return skip
    before = _node_free_kib()
    if not before:
        return inconclusive("no NUMA node meminfo in sysfs")
    block = torch.empty(2 ** 28, dtype=torch.float32, device=dev).fill_(1.0)
    _sync(dev)
    after = _node_free_kib()
    del block
    torch.cuda.empty_cache()
    drops = {node: (before[node] - after.get(node, before[node])) * 1024 for node in before}
    local = _device_numa_node(dev)
    total_drop = sum(max(0, d) for d in drops.values())
    text = ", ".join(f"node {node}: {drop / 2**20:+.0f} MiB" for node, drop in sorted(drops.items()))
    measured = {"drops_bytes": {str(k): v for k, v in drops.items()}, "local_node": local}
    if local is None or total_drop < 2 ** 29:
        return inconclusive(f"1 GiB allocation; MemFree drop per node: {text}; the device's node "
                            f"{'unknown' if local is None else local}", **measured)
    remote = sum(max(0, d) for node, d in drops.items() if node != local)
    if remote > total_drop / 2:
        return verdict(True, f"most of a 1 GiB allocation landed off the device's node {local}: {text}", **measured)
    return inconclusive(f"a 1 GiB allocation landed on the device's node {local} ({text}); spills happen under "
                        "memory pressure, which this probe does not create", **measured)
