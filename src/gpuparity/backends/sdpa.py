"""Attention through torch: each SDPA backend forced alone (the plain matmul-softmax-matmul
composition, the trusted baseline and the last resort of "auto", is the attention contract's:
contracts/attention.py).

Every backend here follows gpuparity's contract: a query row with no key left returns zeros
and zero gradients, whatever the SDPA backend itself would do with it.
"""
from __future__ import annotations

import contextlib
from typing import List

import torch
import torch.nn.functional as F

from ..registry import Backend, BackendUnavailable, Problem, register
from ..contracts.masks import expand_kv
from .masks import sdpa_arguments, zero_empty_rows

SDPA_BACKENDS = {
    "sdpa_math": "MATH",
    "sdpa_efficient": "EFFICIENT_ATTENTION",
    "sdpa_flash": "FLASH_ATTENTION",
    "sdpa_cudnn": "CUDNN_ATTENTION",
}


def _sdpa_kernel(name: str):
    if name not in SDPA_BACKENDS:   # "sdpa": torch chooses, as an unpatched model's call has it
        return contextlib.nullcontext()
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:  # torch < 2.3
        return contextlib.nullcontext()
    member = getattr(SDPBackend, SDPA_BACKENDS[name], None)
    if member is None:
        raise BackendUnavailable(f"{name}: this torch build has no SDPBackend.{SDPA_BACKENDS[name]}")
    return sdpa_kernel([member])


SDPA_ALIGNMENT = 16   # bytes: the widest vector load of torch's fused SDPA kernels


def aligned(t: torch.Tensor) -> torch.Tensor:
    """`t`, or a copy of it in a fresh buffer when it sits on a GPU at a data pointer that is not
    16-byte aligned (a view at an odd storage offset, e.g. q sliced out of a fused projection at a
    position that is not a multiple of 8 bf16 elements). torch's cuDNN SDPA raises "CUDA error:
    misaligned address" on such a q or k (known issue SDPA-CUDNN-MISALIGNED; its efficient
    backend has the same fault class, pytorch/pytorch#183484), and the error poisons the
    process's CUDA context. The copy is differentiable; `.contiguous()` would not do, a
    contiguous view keeps its offset."""
    if t.device.type == "cpu" or torch.compiler.is_compiling() or not misaligned(t):
        return t
    return t.clone(memory_format=torch.contiguous_format)


def misaligned(t: torch.Tensor) -> bool:
    """Whether `t`'s data pointer is not 16-byte aligned (False for a tensor without real
    storage, fake or meta: nothing to align)."""
    try:
        return bool(t.data_ptr() % SDPA_ALIGNMENT)
    except RuntimeError:
        return False


def _make_sdpa(name: str):
    def run(q, k, v, *, attn_mask=None, key_padding_mask=None, is_causal=False, scale=None, window=None,
            softcap=None):
        if softcap is not None:  # supports() refuses it; a direct call says so too
            raise BackendUnavailable(f"{name}: SDPA has no logit softcap")
        # a window becomes part of the bool mask SDPA reads (no block skipping)
        mask, causal, empty = sdpa_arguments(q, k, attn_mask, key_padding_mask, is_causal, window)
        k_full, v_full = expand_kv(q, k, v)
        q, k_full, v_full = aligned(q), aligned(k_full), aligned(v_full)
        try:
            with _sdpa_kernel(name):
                out = F.scaled_dot_product_attention(q, k_full, v_full, attn_mask=mask, is_causal=causal,
                                                     scale=scale)
        except RuntimeError as exc:
            if "No available kernel" in str(exc) or "no kernel" in str(exc).lower():
                raise BackendUnavailable(f"{name}: torch found no kernel for this call ({str(exc).splitlines()[0][:160]})") from exc
            raise
        return zero_empty_rows(out, empty)
    run.__name__ = name
    return run


def _no_softcap(name: str, problem: Problem) -> List[str]:
    if problem.feature("softcap") is not None:
        return [f"{name}: SDPA has no logit softcap (softcap={problem.feature('softcap')})"]
    return []


def _math_supports(problem: Problem) -> List[str]:
    return _no_softcap("sdpa_math", problem)


def _flash_supports(problem: Problem) -> List[str]:
    reasons = _no_softcap("sdpa_flash", problem)
    if problem.feature("has_mask"):
        reasons.append("sdpa_flash: no attn_mask / key_padding_mask support")
    if problem.feature("window") is not None:
        reasons.append("sdpa_flash: no sliding window (it would need a mask, which the flash backend cannot read)")
    if problem.feature("head_dim", 64) > 256:
        reasons.append(f"sdpa_flash: head_dim {problem.feature('head_dim')} > 256")
    return reasons


def _cudnn_supports(problem: Problem) -> List[str]:
    reasons = _no_softcap("sdpa_cudnn", problem)
    if problem.feature("head_dim", 64) > 128 or problem.feature("head_dim", 64) % 8:
        reasons.append(f"sdpa_cudnn: head_dim {problem.feature('head_dim')} unsupported (needs a multiple of 8, <= 128)")
    return reasons


def _efficient_supports(problem: Problem) -> List[str]:
    reasons = _no_softcap("sdpa_efficient", problem)
    if problem.device.type == "cuda" and problem.feature("head_dim", 64) > 256:
        reasons.append(f"sdpa_efficient: head_dim {problem.feature('head_dim')} > 256")
    return reasons


def _mask_grad(problem: Problem) -> List[str]:
    return ["no gradient for a float attn_mask"] if problem.feature("mask_requires_grad") else []


def _no_mask_grad(extra):
    def supports(problem: Problem) -> List[str]:
        return _mask_grad(problem) + extra(problem)
    return supports


def _gpu_only_availability(name):
    def availability():
        if not torch.cuda.is_available():
            return f"{name}: needs a CUDA or ROCm GPU"
        return None
    return availability


HALF = (torch.float16, torch.bfloat16)
ALL = (torch.float16, torch.bfloat16, torch.float32, torch.float64)

register(Backend("sdpa_math", "attention", _make_sdpa("sdpa_math"),
                 "torch SDPA, math backend (what ROCm users fall back to)", dtypes=ALL, supports=_math_supports))
register(Backend("sdpa_efficient", "attention", _make_sdpa("sdpa_efficient"),
                 "torch SDPA, memory-efficient backend", device_types=("cuda",), dtypes=(*HALF, torch.float32),
                 availability=_gpu_only_availability("sdpa_efficient"), supports=_no_mask_grad(_efficient_supports)))
register(Backend("sdpa_flash", "attention", _make_sdpa("sdpa_flash"),
                 "torch SDPA, flash backend (no masks)", device_types=("cuda",), dtypes=HALF,
                 availability=_gpu_only_availability("sdpa_flash"), supports=_no_mask_grad(_flash_supports)))
register(Backend("sdpa_cudnn", "attention", _make_sdpa("sdpa_cudnn"),
                 "torch SDPA, cuDNN backend (NVIDIA only)", device_types=("cuda",), dtypes=HALF,
                 availability=lambda: (None if torch.cuda.is_available() and not torch.version.hip
                                       else "sdpa_cudnn: needs an NVIDIA GPU"),
                 supports=_no_mask_grad(_cudnn_supports)))

# Not registered (auto never picks it, a user cannot name it): torch's own SDPA, unpinned, as an
# unpatched model calls it. The selector (ops/select.py `baseline`) serves an attention call with
# it while the verdict of the backend auto would choose is still pending.
BASELINE = Backend("sdpa", "attention", _make_sdpa("sdpa"),
                   "torch SDPA as torch dispatches it (the unpatched model's attention)", dtypes=ALL,
                   supports=_no_mask_grad(lambda problem: _no_softcap("sdpa", problem)), probed=False)
