"""Probes of activation checkpointing with a chosen SDPA backend and of run-to-run determinism
(cuBLAS workspace, GEMV/GEMM, compiled FlexAttention)."""
from __future__ import annotations

import os
import warnings
from typing import Any, Dict

import torch
import torch.nn.functional as F

from .base import finding, first_line, grad_leaves, inconclusive, probe, randn, randns, sync
from .compile import _compile_failure


@probe(default="cpu")
def checkpoint_masked_attention(dev: torch.device) -> Dict[str, Any]:
    """Masked math-backend attention under torch.utils.checkpoint, fwd+bwd, three ways: the
    sdpa_kernel context around the forward only (as a training loop writes it), around
    forward and backward, and inside the checkpointed function."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.checkpoint import checkpoint
    batch, heads, seq, dim = 2, 2, 64, 16
    x = randn((batch, seq, heads * dim), dev, torch.float32, 1)
    projection = randn((heads * dim, 3 * heads * dim), dev, torch.float32, 2, scale=0.1)
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
                    outcomes[label] = first_line(exc, 160)
                    continue
                raise
            same = torch.allclose(grad, expected, rtol=1e-4, atol=1e-5)
            outcomes[label] = "" if same else "gradients differ from the run without checkpointing"
    safe_failures = {label: text for label, text in outcomes.items() if text and label != "forward only"}
    if safe_failures:
        return finding(True, "math attention + checkpointing fails even with the backend chosen consistently: "
                       + "; ".join(f"context {label}: {text}" for label, text in safe_failures.items()))
    if outcomes["forward only"]:
        # Torch behaviour on every platform, not a fault of this one: the recompute in backward
        # runs outside the sdpa_kernel context and picks another backend.
        return inconclusive("fine when the backend is chosen inside the checkpointed function or the context "
                            "also covers backward; with sdpa_kernel([MATH]) around the forward only the recompute "
                            f"picks another backend (torch behaviour on every platform): {outcomes['forward only']}")
    return finding(False, "math attention + checkpointing fine in all 3 patterns, "
                          "including the context around the forward only")


@probe(gpu=True)
def det_cublas_workspace(dev: torch.device) -> Dict[str, Any]:
    """Deterministic mode in a fresh CUDA process: does a matmul raise without
    CUBLAS_WORKSPACE_CONFIG, and are two runs bitwise equal?"""
    config = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    torch.use_deterministic_algorithms(True)
    a, b = randn((16, 256, 512), dev, torch.float32, 1), randn((16, 512, 256), dev, torch.float32, 2)
    try:
        first = torch.bmm(a, b)
        second = torch.bmm(a, b)
        sync(dev)
    except RuntimeError as exc:
        if "CUBLAS_WORKSPACE_CONFIG" in str(exc):
            return finding(True, f"deterministic mode raises here with CUBLAS_WORKSPACE_CONFIG={config}: "
                                 f"{first_line(exc, 200)}", workspace_config=config)
        raise
    finally:
        torch.use_deterministic_algorithms(False)
    equal = bool(torch.equal(first, second))
    return finding(not equal, f"deterministic bmm with CUBLAS_WORKSPACE_CONFIG={config}: two runs "
                              f"{'bitwise equal' if equal else 'differ'}", workspace_config=config)


@probe(gpu=True)
def gemv_twice_bitwise(dev: torch.device) -> Dict[str, Any]:
    """The same fp32 GEMV and GEMM ten times: bitwise equal without deterministic mode?"""
    matrix, vector = randn((4096, 4096), dev, torch.float32, 1), randn((4096,), dev, torch.float32, 2)
    a, b = randn((64, 8192), dev, torch.float32, 3), randn((8192, 64), dev, torch.float32, 4)
    gemv = [matrix @ vector for _ in range(10)]
    gemm = [a @ b for _ in range(10)]
    sync(dev)
    gemv_differ = sum(not torch.equal(gemv[0], other) for other in gemv[1:])
    gemm_differ = sum(not torch.equal(gemm[0], other) for other in gemm[1:])
    failed = bool(gemv_differ or gemm_differ)
    return finding(failed, f"10 runs each: GEMV differed {gemv_differ} times, split-K GEMM {gemm_differ} times "
                           f"(deterministic algorithms {torch.are_deterministic_algorithms_enabled()}; "
                           f"ROCBLAS_DEFAULT_ATOMICS_MODE={os.environ.get('ROCBLAS_DEFAULT_ATOMICS_MODE')})",
                   gemv_differ=gemv_differ, gemm_differ=gemm_differ)


@probe(gpu=True)
def flex_attention_twice(dev: torch.device) -> Dict[str, Any]:
    """Compiled FlexAttention with a causal block mask, fwd+bwd twice: bitwise equal?"""
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    except ImportError as exc:
        return inconclusive(f"this torch has no FlexAttention ({exc})")
    q, k, v = randns((2, 4, 512, 64), dev, torch.bfloat16, 1, 2, 3)
    try:
        block_mask = create_block_mask(lambda b, h, qi, ki: qi >= ki, None, None, 512, 512, device=str(dev))
        compiled = torch.compile(flex_attention)
        runs = []
        for _ in range(2):
            leaves = grad_leaves((q, k, v))
            out = compiled(*leaves, block_mask=block_mask)
            out.backward(torch.ones_like(out))
            runs.append([out.detach()] + [t.grad for t in leaves])
        sync(dev)
    except Exception as exc:  # noqa: BLE001
        return _compile_failure(exc, confirms=False)
    names = ("out", "dq", "dk", "dv")
    differ = [name for name, first, second in zip(names, runs[0], runs[1]) if not torch.equal(first, second)]
    return finding(bool(differ), "compiled FlexAttention twice: " + (
        f"{', '.join(differ)} differ bitwise" if differ else "out, dq, dk, dv bitwise equal"))
