"""Probes of SDPA on inputs whose data pointer is off 16-byte alignment (a view at an odd storage
offset: q sliced out of a fused projection, a KV cache's page): the loud fault ("CUDA error:
misaligned address", which poisons the CUDA context) and the silent one (wrong numbers). Each
call runs on aligned inputs first, the control."""
from __future__ import annotations

from typing import Any, Dict

import torch
import torch.nn.functional as F

from ...contracts.attention import attention as reference_attention
from .attention import NoKernel, _composition, run_sdpa
from .base import finding, first_line, inconclusive, judge, probe, randn, randns, summarize, sync, upcast


def at_offset(value: torch.Tensor, offset: int) -> torch.Tensor:
    """`value` stored `offset` elements into a buffer of its own: the same values and strides, a
    data pointer offset * itemsize bytes past the (aligned) start of the allocation."""
    flat = torch.zeros(value.numel() + offset, dtype=value.dtype, device=value.device)
    flat[offset:] = value.reshape(-1)
    return flat[offset:].view(value.shape)


MISALIGNED_MARKERS = ("misaligned address", "cudaErrorMisalignedAddress", "mha_graph.execute")


@probe(gpu=True)
def sdpa_misaligned(dev: torch.device) -> Dict[str, Any]:
    """SDPA (torch's own choice, then the efficient, flash and cuDNN backends pinned) with q at a
    storage offset of 3 elements (bf16: a data pointer 6 bytes past 16-byte alignment), k and v
    aligned, the decode call where the doctor met the error (B3 H4 Hkv2 Sq1 Sk40 D32, a bool mask,
    GQA): "CUDA error: misaligned address", or a wrong output? Each call runs on aligned inputs
    first (the control); the error poisons the CUDA context, so the probe stops at the first one
    (it runs in a process of its own)."""
    batch, heads, kv_heads, q_len, k_len, dim = 3, 4, 2, 1, 40, 32
    q = randn((batch, heads, q_len, dim), dev, torch.bfloat16, 1)
    k, v = randns((batch, kv_heads, k_len, dim), dev, torch.bfloat16, 2, 3)
    lengths = torch.tensor([k_len, 1, k_len // 2]).view(batch, 1, 1, 1)
    mask = (torch.arange(k_len).view(1, 1, 1, k_len) < lengths).expand(batch, 1, q_len, k_len).to(dev)
    shifted = at_offset(q, 3)
    k_rep, v_rep = k.repeat_interleave(heads // kv_heads, 1), v.repeat_interleave(heads // kv_heads, 1)
    ref = reference_attention(upcast(q, False), upcast(k_rep, False), upcast(v_rep, False), attn_mask=mask.cpu())
    base = _composition(q, k_rep, v_rep, attn_mask=mask)
    ran, skipped, comparisons = [], [], []
    for backend in ("default", "efficient", "flash", "cudnn"):
        label = f"{backend} (torch picks {_choice(q, k, v, mask)})" if backend == "default" else backend
        try:
            _sdpa_call(backend, q, k, v, mask)          # the control: the same call, aligned
        except NoKernel as exc:
            skipped.append(f"{backend}: {exc}")
            continue
        try:
            out = _sdpa_call(backend, shifted, k, v, mask)
            sync(dev)
        except RuntimeError as exc:
            if any(marker in str(exc) for marker in MISALIGNED_MARKERS):
                return finding(True, f"{label}: {first_line(exc, 120)} with q's data pointer "
                                     f"{shifted.data_ptr() % 16} bytes past 16-byte alignment (bf16 B{batch} H{heads} "
                                     f"Hkv{kv_heads} Sq{q_len} Sk{k_len} D{dim}, bool mask, GQA); the aligned control "
                                     f"ran", backend=backend, backends_run=ran + [backend])
            raise
        ran.append(backend)
        comparisons.append(judge(f"{label} out, q misaligned", out, ref, base, torch.bfloat16))
    if not comparisons:
        return inconclusive("no SDPA backend ran these calls here: " + "; ".join(skipped))
    result = summarize(comparisons, f"SDPA with q 6 bytes past 16-byte alignment ({', '.join(ran)})")
    result["backends_run"] = ran
    return result


# (dtype, which input sits off alignment, its storage offset in elements): the H100 (torch 2.11) faults on both
EFFICIENT_MISALIGNED_CALLS = (("float32", "q", 1), ("float16", "v", 1))
REFUSED_MISALIGNED = ("is not correctly aligned",)   # torch's own check, where it has one: an error, not a fault


@probe(gpu=True)
def sdpa_efficient_misaligned(dev: torch.device) -> Dict[str, Any]:
    """SDPA's memory-efficient backend pinned, one input a view whose data pointer is off 16-byte
    alignment: fp32 q 4 bytes past it, fp16 v 2 bytes past it (torch refuses an fp16 q or k at 2 or 4
    bytes with "is not correctly aligned", but checks neither fp32 nor v). "CUDA error: misaligned
    address", or a wrong output? Each dtype runs aligned first (the control); the error poisons the CUDA context,
    so the probe stops at the first (it runs in a process of its own)."""
    batch, heads, q_len, k_len, dim = 2, 2, 16, 24, 16
    ran, comparisons = [], []
    for dtype_name, which, offset in EFFICIENT_MISALIGNED_CALLS:
        dtype = getattr(torch, dtype_name)
        q = randn((batch, heads, q_len, dim), dev, dtype, 1)
        k, v = randns((batch, heads, k_len, dim), dev, dtype, 2, 3)
        try:
            run_sdpa("efficient", q, k, v)            # the control: aligned
            sync(dev)
        except NoKernel as exc:
            return inconclusive(f"the efficient backend has no {dtype_name} kernel here ({exc})")
        inputs = {"q": q, "k": k, "v": v}
        inputs[which] = at_offset(inputs[which], offset)
        label = f"{dtype_name} {which} {inputs[which].data_ptr() % 16} bytes past 16-byte alignment"
        try:
            out = run_sdpa("efficient", inputs["q"], inputs["k"], inputs["v"])
            sync(dev)
        except NoKernel:
            ran.append(f"{label}: refused with an error (no fault)")
            continue
        except RuntimeError as exc:
            if any(marker in str(exc) for marker in REFUSED_MISALIGNED):
                ran.append(f"{label}: refused with an error (no fault)")
                continue
            if any(marker in str(exc) for marker in MISALIGNED_MARKERS):
                return finding(True, f"efficient SDPA with {label}: {first_line(exc, 120)} (B{batch} H{heads} "
                                     f"Sq{q_len} Sk{k_len} D{dim}, no mask); the aligned control ran",
                               call=label, calls_before=ran)
            raise
        ran.append(label)
        ref = reference_attention(upcast(q, False), upcast(k, False), upcast(v, False))
        comparisons.append(judge(f"efficient out, {label}", out, ref, _composition(q, k, v), dtype))
    if not comparisons:
        return finding(False, "efficient SDPA refused every misaligned call with an error (no fault): " + "; ".join(ran),
                       calls=ran)
    return summarize(comparisons, "efficient SDPA on inputs off 16-byte alignment")


# which input sits off 16-byte alignment (a storage offset of one bf16 element: 2 bytes), in
# turn; v first: on the H100 a v view off alignment gave wrong numbers without an error
SILENT_MISALIGNED = ("v", "k", "q")


@probe(gpu=True)
def sdpa_misaligned_silent(dev: torch.device) -> Dict[str, Any]:
    """SDPA in bf16 (torch's own choice, then the efficient, flash and cuDNN backends pinned) with
    v, then k, then q a view 2 bytes past 16-byte alignment, the others aligned, in the shape of
    the H100 battery row that failed this way (B1 H4 Hkv2 Sq40 Sk64 D80, a float mask with masked
    keys, GQA): wrong numbers without an error? Each call runs aligned first; a misaligned
    output is judged against float64 only where that aligned control passed (a control that
    fails is another bug). A "misaligned address" error (SDPA-CUDNN-MISALIGNED's fault) poisons
    the CUDA context: the probe stops there, failed if a silent wrong output came before, else
    it cannot tell."""
    batch, heads, kv_heads, q_len, k_len, dim = 1, 4, 2, 40, 64, 80
    q = randn((batch, heads, q_len, dim), dev, torch.bfloat16, 1)
    k, v = randns((batch, kv_heads, k_len, dim), dev, torch.bfloat16, 2, 3)
    keep = randn((batch, 1, q_len, k_len), dev, torch.float32, 4) > -0.8
    keep[..., 0] = True   # every query row keeps a key
    mask = torch.zeros(keep.shape, dtype=torch.bfloat16, device=dev).masked_fill(~keep, float("-inf"))
    k_rep, v_rep = k.repeat_interleave(heads // kv_heads, 1), v.repeat_interleave(heads // kv_heads, 1)
    ref = reference_attention(upcast(q, False), upcast(k_rep, False), upcast(v_rep, False), attn_mask=mask.cpu())
    base = _composition(q, k_rep, v_rep, attn_mask=mask)
    comparisons, notes = [], []
    for which in SILENT_MISALIGNED:
        for backend in ("default", "efficient", "flash", "cudnn"):
            label = f"{backend} (torch picks {_choice(q, k, v, mask)})" if backend == "default" else backend
            try:
                control = _sdpa_call(backend, q, k, v, mask)
                sync(dev)
            except NoKernel:
                continue
            if not judge(f"{label} aligned", control, ref, base, torch.bfloat16).passed:
                notes.append(f"{label}: wrong already on aligned inputs (not this issue)")
                continue
            inputs = {"q": q, "k": k, "v": v}
            inputs[which] = at_offset(inputs[which], 1)
            try:
                out = _sdpa_call(backend, inputs["q"], inputs["k"], inputs["v"], mask)
                sync(dev)
            except RuntimeError as exc:
                if not any(marker in str(exc) for marker in MISALIGNED_MARKERS):
                    raise
                if any(not c.passed for c in comparisons):   # the silent case showed before the fault
                    return _silent_summary(comparisons, notes)
                return inconclusive(f"{label} with {which} off alignment raised {first_line(exc, 100)} "
                                    f"(SDPA-CUDNN-MISALIGNED's fault) before a silent case showed; the CUDA "
                                    f"context is unusable after it")
            comparisons.append(judge(f"{label} out, {which} 2 bytes past 16-byte alignment", out, ref, base,
                                     torch.bfloat16))
    if not comparisons:
        return inconclusive("no SDPA backend ran these calls here" + (": " + "; ".join(notes) if notes else ""))
    return _silent_summary(comparisons, notes)


def _silent_summary(comparisons, notes) -> Dict[str, Any]:
    result = summarize(comparisons, "bf16 SDPA with one input 2 bytes past 16-byte alignment (B1 H4 Hkv2 Sq40 "
                                    "Sk64 D80, float mask, GQA)")
    if notes:
        result["notes"] = notes
    return result


def _sdpa_call(backend: str, q, k, v, mask):
    if backend == "default":
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    return run_sdpa(backend, q, k, v, attn_mask=mask, enable_gqa=True)


def _choice(q, k, v, mask) -> str:
    """The backend torch's own selection picks for this call ("?" where it cannot say)."""
    try:
        from torch.nn.attention import SDPBackend
        index = torch._fused_sdp_choice(q, k, v, mask, 0.0, False, scale=None, enable_gqa=True)
        return SDPBackend(index).name.lower()
    except Exception:  # noqa: BLE001 - a torch whose selection function takes other arguments
        return "?"
