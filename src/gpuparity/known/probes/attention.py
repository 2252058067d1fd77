"""Probes of torch's SDPA backends (math, efficient, flash, cuDNN) forced one at a time against
float64: masks, NaN rows, GQA, strides, mask gradients and launch failures."""
from __future__ import annotations

import warnings
from typing import Any, Dict

import torch
import torch.nn.functional as F

from ...contracts.attention import attention as reference_attention
from .base import finding, first_line, half_dtype, inconclusive, judge, probe, randn, randns, summarize, sync, upcast


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
                raise NoKernel(first_line(exc, 200)) from None
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


def attention_vs_fp64(backend: str, q, k, v, *, attn_mask=None, is_causal=False, grads=True,
                      enable_gqa=False, label: str = ""):
    """Raw SDPA forced to `backend` against the float64 reference under the tolerance policy:
    the output and, with grads, dq, dk, dv. Returns the list of Comparisons (NoKernel if refused)."""
    dtype = q.dtype
    qs, ks, vs = (t.detach().clone().requires_grad_(grads) for t in (q, k, v))
    kwargs: Dict[str, Any] = {"attn_mask": attn_mask, "is_causal": is_causal}
    if enable_gqa:
        kwargs["enable_gqa"] = True
    out = run_sdpa(backend, qs, ks, vs, **kwargs)

    q64, k64, v64 = (upcast(t, grads) for t in (q, k, v))
    mask64 = None
    if attn_mask is not None:
        mask64 = attn_mask.detach().cpu() if attn_mask.dtype == torch.bool else attn_mask.detach().to("cpu", torch.float64)
    ref = reference_attention(q64, k64, v64, attn_mask=mask64, is_causal=is_causal)
    qb, kb, vb = (t.detach().clone().requires_grad_(grads) for t in (q, k, v))
    base = _composition(qb, kb, vb, attn_mask=attn_mask, is_causal=is_causal)

    name = f"{backend}{' ' + label if label else ''}"
    comparisons = [judge(f"{name} out", out, ref, base, dtype)]
    if grads:
        generator = torch.Generator().manual_seed(1)
        grad_out = torch.randn(ref.shape, generator=generator, dtype=torch.float64)
        ref.backward(grad_out)
        out.backward(grad_out.to(q.device, dtype))
        base.backward(grad_out.to(q.device, dtype))
        for label_grad, mine, theirs, baseline in (("dq", qs, q64, qb), ("dk", ks, k64, kb), ("dv", vs, v64, vb)):
            comparisons.append(judge(f"{name} {label_grad}", mine.grad, theirs.grad, baseline.grad, dtype))
    return comparisons


@probe(default="cpu")
def sdpa_mask_rocm(dev: torch.device) -> Dict[str, Any]:
    """EFFICIENT SDPA with a key-padding mask (user story 1's shape) against float64."""
    dtype = half_dtype(dev)
    batch, heads, seq, dim = 4, 4, 150, 32
    lengths = torch.tensor([150, 120, 77, 1])
    key_padding = torch.arange(seq)[None, :] >= lengths[:, None]          # True = padding
    attn_mask = (~key_padding)[:, None, None, :].to(dev)                   # True = attend
    q, k, v = randns((batch, heads, seq, dim), dev, dtype, 1, 2, 3)
    try:
        comparisons = attention_vs_fp64("efficient", q, k, v, attn_mask=attn_mask, label="key-padding mask")
    except NoKernel as exc:
        return inconclusive(f"the efficient backend has no kernel here ({exc})")
    return summarize(comparisons, f"efficient SDPA with a key-padding mask, {str(dtype)[6:]} B{batch} H{heads} "
                                  f"S{seq} D{dim}")


@probe(default="cpu")
def sdpa_fullmask_nan(dev: torch.device) -> Dict[str, Any]:
    """Every SDPA backend with one fully masked query row, forward and backward: NaN anywhere?"""
    dtype = half_dtype(dev)
    batch, heads, q_len, k_len, dim = 2, 2, 8, 16, 32
    mask = torch.ones(batch, 1, q_len, k_len, dtype=torch.bool)
    mask[0, 0, 3, :] = False
    mask = mask.to(dev)
    findings, ran, skipped = [], [], []
    for backend in SDPA_MEMBERS:
        q, k, v = (randn(shape, dev, dtype, seed).requires_grad_(True) for shape, seed in
                   (((batch, heads, q_len, dim), 1), ((batch, heads, k_len, dim), 2), ((batch, heads, k_len, dim), 3)))
        try:
            out = run_sdpa(backend, q, k, v, attn_mask=mask)
        except NoKernel as exc:
            skipped.append(f"{backend} ({exc})")
            continue
        out.backward(torch.ones_like(out))
        sync(dev)
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
    return finding(bool(findings), detail, backends_run=ran, backends_with_nan=len(findings))


@probe(gpu=True)
def sdpa_mask_dtype(dev: torch.device) -> Dict[str, Any]:
    """fp16 q/k/v with an fp32 additive mask through the efficient backend: NaN or wrong?"""
    batch, heads, seq, dim = 2, 4, 128, 64
    q, k, v = randns((batch, heads, seq, dim), dev, torch.float16, 1, 2, 3)
    bias = randn((batch, 1, seq, seq), dev, torch.float32, 4, scale=0.5)
    bias[..., 100:] = float("-inf")
    try:
        comparisons = attention_vs_fp64("efficient", q, k, v, attn_mask=bias, grads=False, label="fp32 additive mask")
    except NoKernel as exc:
        return inconclusive(f"the efficient backend has no kernel here ({exc})")
    except RuntimeError as exc:
        return finding(False, f"efficient SDPA refuses the mixed-dtype mask with an error, not NaN: {first_line(exc)}")
    return summarize(comparisons, "efficient SDPA, fp16 q/k/v with an fp32 additive mask")


@probe(gpu=True)
def sdpa_cudnn(dev: torch.device) -> Dict[str, Any]:
    """cuDNN SDPA against float64, bf16, L=1000 (not a multiple of 128) and Lq=1, fwd+bwd."""
    comparisons = []
    try:
        for q_len, k_len in ((1000, 1000), (1, 1000)):
            q = randn((2, 4, q_len, 64), dev, torch.bfloat16, 1)
            k, v = randns((2, 4, k_len, 64), dev, torch.bfloat16, 2, 3)
            comparisons += attention_vs_fp64("cudnn", q, k, v, label=f"Lq={q_len} Lk={k_len}")
    except NoKernel as exc:
        return inconclusive(f"cuDNN SDPA has no kernel here ({exc})")
    result = summarize(comparisons, "cuDNN SDPA bf16, L=1000 and Lq=1, fwd+bwd")
    result["cudnn_version"] = torch.backends.cudnn.version()
    return result


def massive_activation_qkv(seq: int, dim: int, dev, dtype, heads: int = 2):
    """q, k, v (1, heads, seq, dim) whose every logit is about -120 (q[..., 0] = 1, k[..., 0] =
    -120 * sqrt(dim)): each query row's logsumexp is near -120 + ln(seq), far below -88.7 =
    ln(FLT_MAX), as in a "massive activation" head (pytorch/pytorch#196678)."""
    q = randn((1, heads, seq, dim), dev, torch.float32, 1, scale=0.1)
    k = randn((1, heads, seq, dim), dev, torch.float32, 2, scale=0.1)
    v = randn((1, heads, seq, dim), dev, torch.float32, 3)
    q[..., 0], k[..., 0] = 1.0, -120.0 * dim ** 0.5
    return q.to(dtype), k.to(dtype), v.to(dtype)


def nonfinite_grad_q(backend: str, q, k, v, attn_mask) -> int:
    """Non-finite values in grad_q of SDPA forced to `backend` (NoKernel if it refuses)."""
    leaf = q.detach().clone().requires_grad_(True)
    out = run_sdpa(backend, leaf, k.detach().requires_grad_(True), v.detach().requires_grad_(True),
                   attn_mask=attn_mask)
    out.backward(randn(tuple(out.shape), out.device, out.dtype, 5))
    sync(out.device)
    return int((~torch.isfinite(leaf.grad)).sum())


@probe(gpu=True)
def sdpa_cudnn_mask_lse(dev: torch.device) -> Dict[str, Any]:
    """cuDNN SDPA backward with an attn_mask (bool causal, float zeros; and no mask at D64),
    Sq = Sk = 192 (% 128 == 64), head dim 64 and 128, bf16, every row's logsumexp below -88.7:
    non-finite grad_q? The efficient backend on the same inputs is the control (0 expected)."""
    seq = 192
    counts: Dict[str, Any] = {}
    refused = []
    for dim in (64, 128):
        q, k, v = massive_activation_qkv(seq, dim, dev, torch.bfloat16)
        masks = {"bool causal": torch.ones(seq, seq, dtype=torch.bool, device=dev).tril()[None, None],
                 "float zeros": torch.zeros(1, 1, seq, seq, dtype=torch.bfloat16, device=dev)}
        if dim == 64:   # no mask, not causal: failed too on an H200 (cuDNN 9.19)
            masks["no mask"] = None
        for label, mask in masks.items():
            for backend in ("cudnn", "efficient"):
                try:
                    counts[f"{backend} D{dim} {label}"] = nonfinite_grad_q(backend, q, k, v, mask)
                except NoKernel as exc:
                    refused.append(f"{backend} D{dim} {label}: {exc}")
    cudnn = {key: n for key, n in counts.items() if key.startswith("cudnn")}
    if not cudnn:
        return inconclusive(f"cuDNN SDPA has no kernel for these calls here ({refused[0] if refused else 'none ran'})",
                            refused=refused)
    bad = {key: n for key, n in cudnn.items() if n}
    control = {key: n for key, n in counts.items() if key.startswith("efficient")}
    where = f"bf16 Sq=Sk={seq}, rows with logsumexp < -88.7"
    measured = {"nonfinite_grad_q": counts, "cudnn_version": torch.backends.cudnn.version(), "refused": refused}
    if bad:
        worst = max(bad, key=bad.get)
        return finding(True, f"cuDNN SDPA returned non-finite grad_q in {len(bad)}/{len(cudnn)} calls "
                             f"({where}; worst {worst}: {bad[worst]} of {q.numel()}); the efficient "
                             f"backend: {sum(control.values()) if control else 'not run'} non-finite", **measured)
    return finding(False, f"cuDNN SDPA grad_q finite in {len(cudnn)} calls ({where})", **measured)


@probe(gpu=True)
def sdpa_cudnn_sq1_lse(dev: torch.device) -> Dict[str, Any]:
    """cuDNN SDPA backward with Sq = 1, Sk = 128 and every logit near -128 (a strongly negative
    logsumexp), bf16, no mask: non-finite dK / dV (NVIDIA/cudnn-frontend#1072)?"""
    dim = 64
    q = randn((1, 2, 1, dim), dev, torch.float32, 1, scale=0.1)
    k = randn((1, 2, 128, dim), dev, torch.float32, 2, scale=0.1)
    v = randn((1, 2, 128, dim), dev, torch.float32, 3)
    q[..., 0], k[..., 0] = 1.0, -128.0 * dim ** 0.5
    q, k, v = (t.to(torch.bfloat16).requires_grad_(True) for t in (q, k, v))
    try:
        out = run_sdpa("cudnn", q, k, v)
    except NoKernel as exc:
        return inconclusive(f"cuDNN SDPA has no kernel for Sq=1 here ({exc})")
    out.backward(randn(tuple(out.shape), dev, out.dtype, 5))
    sync(dev)
    counts = {name: int((~torch.isfinite(t.grad)).sum()) for name, t in (("dq", q), ("dk", k), ("dv", v))}
    bad = sum(counts.values())
    return finding(bad > 0, f"cuDNN SDPA bf16 Sq=1 Sk=128, logits ~ -128: non-finite gradients {counts}",
                   nonfinite=counts, cudnn_version=torch.backends.cudnn.version())


@probe(gpu=True)
def sdpa_noncontig_v(dev: torch.device) -> Dict[str, Any]:
    """FLASH and EFFICIENT with q, k contiguous and v a transposed view of (B, L, H*D), bf16
    B1 H16 L62 D128, against float64 (ROCm/pytorch#3230: max error ~2-3 on ROCm 7.0, MI300X)."""
    batch, heads, seq, dim = 1, 16, 62, 128
    q, k = randns((batch, heads, seq, dim), dev, torch.bfloat16, 1, 2)
    v = randn((batch, seq, heads * dim), dev, torch.bfloat16, 3).view(batch, seq, heads, dim).transpose(1, 2)
    ref = reference_attention(upcast(q, False), upcast(k, False), upcast(v, False))
    comparisons, skipped = [], []
    for backend in ("flash", "efficient"):
        try:
            out = run_sdpa(backend, q, k, v)
        except NoKernel as exc:
            skipped.append(f"{backend}: {exc}")
            continue
        comparisons.append(judge(f"{backend} non-contiguous v out", out, ref,
                                   _composition(q, k, v.contiguous()), torch.bfloat16))
    if not comparisons:
        return inconclusive("no fused backend has a kernel here: " + "; ".join(skipped))
    return summarize(comparisons, "FLASH/EFFICIENT with a non-contiguous v, bf16 B1 H16 L62 D128")


@probe(gpu=True)
def sdpa_fp32_lse_race(dev: torch.device) -> Dict[str, Any]:
    """FLASH and EFFICIENT fp32, head dim 80, is_causal, (3, 5, 256) queries over 32 keys,
    forward+backward 20 times: a NaN in the saved logsumexp shows as non-finite gradients
    (ROCm/aotriton#183: about half the calls on gfx1150)."""
    q = randn((3, 5, 256, 80), dev, torch.float32, 1)
    k, v = randns((3, 5, 32, 80), dev, torch.float32, 2, 3)
    bad_runs, ran, skipped = {}, [], []
    for backend in ("flash", "efficient"):
        try:
            for _ in range(20):
                leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
                out = run_sdpa(backend, *leaves, is_causal=True)
                out.sum().backward()
                finite = all(bool(torch.isfinite(t.grad).all()) for t in leaves) and bool(torch.isfinite(out).all())
                bad_runs[backend] = bad_runs.get(backend, 0) + (not finite)
            ran.append(backend)
        except NoKernel as exc:
            skipped.append(f"{backend}: {exc}")
    if not ran:
        return inconclusive("no fused fp32 kernel here: " + "; ".join(skipped))
    bad = {name: n for name, n in bad_runs.items() if n}
    return finding(bool(bad), f"fp32 D80 causal fwd+bwd, 20 runs per backend: non-finite in {bad or 'none'} "
                              f"({', '.join(ran)} ran)", bad_runs=bad_runs)


@probe(gpu=True)
def sdpa_cudnn_gqa(dev: torch.device) -> Dict[str, Any]:
    """cuDNN SDPA with Hq=32, Hkv=4 (GQA) against float64, bf16, fwd+bwd."""
    q = randn((2, 32, 256, 64), dev, torch.bfloat16, 1)
    k, v = randns((2, 4, 256, 64), dev, torch.bfloat16, 2, 3)
    try:
        comparisons = attention_vs_fp64("cudnn", q, k, v, enable_gqa=True, label="Hq=32 Hkv=4")
    except NoKernel as exc:
        return inconclusive(f"cuDNN SDPA has no GQA kernel here ({exc})")
    except TypeError as exc:
        return inconclusive(f"this torch has no enable_gqa in SDPA ({first_line(exc)})")
    return summarize(comparisons, "cuDNN SDPA GQA (Hq=32, Hkv=4), bf16")


@probe(gpu=True)
def sdpa_eff_stride0(dev: torch.device) -> Dict[str, Any]:
    """Efficient SDPA with expand()ed (stride-0) k/v, bf16, 4-D bool mask, kv_len 33."""
    batch, heads, q_len, k_len, dim = 4, 8, 64, 33, 64
    q = randn((batch, heads, q_len, dim), dev, torch.bfloat16, 1)
    k_one, v_one = randns((1, heads, k_len, dim), dev, torch.bfloat16, 2, 3)
    k, v = k_one.expand(batch, -1, -1, -1), v_one.expand(batch, -1, -1, -1)
    generator = torch.Generator().manual_seed(4)
    mask = torch.rand((batch, heads, q_len, k_len), generator=generator) > 0.3
    mask[..., 0] = True
    mask = mask.to(dev)
    try:
        out = run_sdpa("efficient", q, k, v, attn_mask=mask)
    except NoKernel as exc:
        return inconclusive(f"the efficient backend has no kernel here ({exc})")
    ref = reference_attention(upcast(q, False), upcast(k, False), upcast(v, False), attn_mask=mask.cpu())
    base = _composition(q, k.contiguous(), v.contiguous(), attn_mask=mask)
    return summarize([judge("efficient stride-0 k/v out", out, ref, base, torch.bfloat16)],
                     "efficient SDPA with stride-0 k/v, bf16, 4-D bool mask, kv_len 33")


@probe(gpu=True)
def sdpa_maskgrad(dev: torch.device) -> Dict[str, Any]:
    """SDPA backward when only a float attn_mask requires grad (an illegal access crashes the probe)."""
    q, k, v = randns((2, 4, 128, 64), dev, torch.float16, 1, 2, 3)
    bias = randn((2, 4, 128, 128), dev, torch.float16, 4, scale=0.5).requires_grad_(True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    grad_out = randn(out.shape, dev, torch.float16, 5)
    try:
        out.backward(grad_out)
        sync(dev)
    except RuntimeError as exc:
        if "LSE" not in str(exc) and "logsumexp" not in str(exc).lower():
            raise
        # Same root cause as the illegal access (the forward skipped the logsumexp because no q/k/v
        # needs a gradient); later torch releases check the logsumexp and refuse instead of reading
        # through a null pointer. Loud, not silent, but the backward still does not run.
        return finding(True, f"the backward refused: {type(exc).__name__}: {str(exc).splitlines()[0][:160]} "
                             "(the forward saved no logsumexp because only the mask needs a gradient)")
    bias64 = upcast(bias, True)
    ref = reference_attention(upcast(q, False), upcast(k, False), upcast(v, False), attn_mask=bias64)
    ref.backward(grad_out.detach().to("cpu", torch.float64))
    got = bias.grad.detach().to("cpu", torch.float64)
    if not torch.isfinite(got).all():
        return finding(True, "the mask gradient has NaN/Inf")
    err = float(torch.linalg.vector_norm(got - bias64.grad) / torch.linalg.vector_norm(bias64.grad))
    # fp16 end to end: an error near 1 means garbage, not rounding.
    failed = err > 0.05
    return finding(failed, f"backward with only the float mask requiring grad ran; mask-gradient relative error "
                           f"{err:.3g} vs float64" + (" (wrong)" if failed else ""), err=err)


@probe(gpu=True)
def sdpa_fused_vs_fp64(dev: torch.device) -> Dict[str, Any]:
    """FLASH and EFFICIENT SDPA against float64: no mask, causal, and (efficient) a key-padding mask."""
    q, k, v = randns((2, 4, 256, 64), dev, torch.float16, 1, 2, 3)
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


@probe(gpu=True)
def sdpa_aotriton_rdna35(dev: torch.device) -> Dict[str, Any]:
    """The reported RDNA3.5 shapes: fp16 (B4,H8,N4096,D72) forward; fp32 hdim 80 causal fwd+bwd."""
    findings, ran, comparisons = [], [], []
    q, k, v = randns((4, 8, 4096, 72), dev, torch.float16, 1, 2, 3)
    rows = torch.cat([torch.arange(64), torch.arange(4096 - 64, 4096)])
    # Query rows are independent without a mask, so a slice of rows keeps the reference small.
    ref = reference_attention(upcast(q[:, :, rows], False), upcast(k, False), upcast(v, False))
    base = _composition(q[:, :, rows.to(dev)], k, v)
    for backend in ("flash", "efficient"):
        try:
            out = run_sdpa(backend, q, k, v)
        except NoKernel:
            continue
        sync(dev)
        ran.append(f"{backend} fp16 D72")
        if torch.isnan(out).any():
            findings.append(f"{backend}: NaN in the fp16 (4,8,4096,72) forward")
        comparisons.append(judge(f"{backend} fp16 D72 out", out[:, :, rows.to(dev)], ref, base, torch.float16))
    q, k, v = randns((1, 4, 1024, 80), dev, torch.float32, 4, 5, 6)
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
        return finding(True, "; ".join(findings), cases_run=ran)
    result = summarize(comparisons, "RDNA3.5 shapes")
    result["cases_run"] = ran
    return result


@probe(gpu=True)
def sdpa_fused_launch(dev: torch.device) -> Dict[str, Any]:
    """FLASH and EFFICIENT in this fresh process, then `x + 1; synchronize()`: a launch failure
    that only surfaces at a later op shows up here (or crashes the probe)."""
    q, k, v = randns((2, 4, 128, 64), dev, torch.float16, 1, 2, 3)
    findings, ran, skipped = [], [], []
    for backend in ("flash", "efficient"):
        try:
            out = run_sdpa(backend, q, k, v)
            after = torch.ones(16, device=dev) + 1
            sync(dev)
            total = float(after.sum().item())
            ran.append(backend)
            if not torch.isfinite(out).all() or total != 32.0:
                findings.append(f"{backend}: wrong results after the launch (later op gave {total}, expected 32)")
            elif float(out.abs().max()) == 0.0:   # a kernel image that never ran leaves zeros (ROCm/aotriton#210)
                findings.append(f"{backend}: all-zero output (the kernel did not run)")
        except NoKernel as exc:
            skipped.append(f"{backend}: {exc}")
        except RuntimeError as exc:
            findings.append(f"{backend}: {first_line(exc)}")
    if not ran and not findings:
        return inconclusive("no fused backend has a kernel here: " + "; ".join(skipped))
    if findings:
        return finding(True, "; ".join(findings))
    return finding(False, f"{', '.join(ran)} launched and a later op ran cleanly")


@probe(gpu=True)
def sdpa_flash_alone(dev: torch.device) -> Dict[str, Any]:
    """FLASH forced alone (fp16, D64), and EFFICIENT with head_dim 288: which have kernels?"""
    q, k, v = randns((2, 4, 128, 64), dev, torch.float16, 1, 2, 3)
    try:
        run_sdpa("flash", q, k, v)
        sync(dev)
        flash = "flash ran (fp16, head_dim 64)"
        failed = False
    except NoKernel as exc:
        flash = f"flash has no kernel: {exc}"
        failed = True
    wide = randns((1, 2, 64, 288), dev, torch.float16, 4, 5, 6)
    try:
        run_sdpa("efficient", *wide)
        efficient = "efficient ran with head_dim 288"
    except NoKernel as exc:
        efficient = f"efficient has no kernel for head_dim 288 ({exc})"
    return finding(failed, f"{flash}; {efficient}")
