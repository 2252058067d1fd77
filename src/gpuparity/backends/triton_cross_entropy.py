"""Linear cross entropy's row step in Triton, registered as the "triton" backend: per row of an
fp32 logits chunk, an online logsumexp over the vocabulary in blocks, the loss, and the gradient
(softmax - onehot, times the softcap's slope and the row's scale) written in place into the
chunk. The chunking, the GEMMs and autograd are ce_composition's, shared with the torch backend."""
from __future__ import annotations

import torch

from . import ce_composition
from .registry import Backend, register
from .triton_common import availability, launch, next_pow2, problem_reasons

try:
    import triton
    import triton.language as tl
except Exception:  # noqa: BLE001 - no triton: the backend says so through availability()
    triton = None
    tl = None

# Columns per block of the vocabulary loop: 16 per thread over 8 warps on a GPU.
MAX_BLOCK_V = 4096

if triton is not None:

    @triton.jit
    def _capped(z, softcap, HAS_SOFTCAP: tl.constexpr):
        # softcap * tanh(z / softcap), tanh from exp (no portable tl.tanh): exact at +-inf.
        if HAS_SOFTCAP:
            t = tl.exp(-2.0 * tl.abs(z / softcap))
            th = (1.0 - t) / (1.0 + t)
            z = softcap * tl.where(z < 0, -th, th)
        return z

    @triton.jit
    def _ce_rows_kernel(LOGITS, TARGET, LOSS, SCALE, stride_row, scale_stride, n_cols, ignore_index, softcap,
                        HAS_SOFTCAP: tl.constexpr, WRITE_GRAD: tl.constexpr, BLOCK_V: tl.constexpr):
        """One row per program. Pass 1: running max and sum of exp over blocks (the online
        logsumexp); pass 2 (WRITE_GRAD): the gradient into the same row. Ignored rows: loss 0
        and, when writing, a zero row, without reading the logits."""
        row = tl.program_id(0).to(tl.int64)
        base = LOGITS + row * stride_row
        target = tl.load(TARGET + row).to(tl.int64)
        cols = tl.arange(0, BLOCK_V)
        if target != ignore_index:
            run_max = tl.max(tl.full([BLOCK_V], float("-inf"), tl.float32), axis=0)
            run_sum = tl.sum(tl.zeros([BLOCK_V], dtype=tl.float32), axis=0)
            for start in range(0, n_cols, BLOCK_V):
                offs = start + cols
                ok = offs < n_cols
                z = _capped(tl.load(base + offs, mask=ok, other=0.0).to(tl.float32), softcap, HAS_SOFTCAP)
                z = tl.where(ok, z, float("-inf"))
                new_max = tl.maximum(run_max, tl.max(z, axis=0))
                run_sum = run_sum * tl.exp(run_max - new_max) + tl.sum(tl.exp(z - new_max), axis=0)
                run_max = new_max
            lse = run_max + tl.log(run_sum)
            picked = _capped(tl.load(base + target).to(tl.float32), softcap, HAS_SOFTCAP)
            tl.store(LOSS + row, lse - picked)
            if WRITE_GRAD:
                scale = tl.load(SCALE + row * scale_stride).to(tl.float32)
                for start in range(0, n_cols, BLOCK_V):
                    offs = start + cols
                    ok = offs < n_cols
                    z = _capped(tl.load(base + offs, mask=ok, other=0.0).to(tl.float32), softcap, HAS_SOFTCAP)
                    grad = tl.exp(z - lse) - tl.where(offs == target, 1.0, 0.0)
                    if HAS_SOFTCAP:
                        ratio = z / softcap
                        grad = grad * (1.0 - ratio * ratio)
                    tl.store(base + offs, grad * scale, mask=ok)
        else:
            tl.store(LOSS + row, 0.0)
            if WRITE_GRAD:
                for start in range(0, n_cols, BLOCK_V):
                    offs = start + cols
                    tl.store(base + offs, tl.zeros([BLOCK_V], dtype=tl.float32), mask=offs < n_cols)


def triton_rows(logits, target, loss_out, scale, ignore_index, softcap, write_grad) -> None:
    """ce_composition's row step on the Triton kernel (fp32 chunks; float64 goes to torch_rows)."""
    if logits.dtype != torch.float32:
        ce_composition.torch_rows(logits, target, loss_out, scale, ignore_index, softcap, write_grad)
        return
    rows, vocab = logits.shape
    if rows == 0:
        return
    block = min(MAX_BLOCK_V, next_pow2(vocab))
    scale = scale.to(torch.float32)
    launch(_ce_rows_kernel, (rows,), (
        logits, target, loss_out, scale, logits.stride(0), 0 if scale.dim() == 0 else 1, vocab, int(ignore_index),
        float(softcap) if softcap is not None else 1.0),
        num_warps=max(1, min(8, block // 512)), HAS_SOFTCAP=softcap is not None, WRITE_GRAD=bool(write_grad),
        BLOCK_V=block)


def triton_linear_cross_entropy(hidden, weight, target, bias=None, ignore_index=-100, reduction="mean",
                                softcap=None):
    return ce_composition.run(triton_rows, hidden, weight, target, bias, ignore_index, reduction, softcap)


def _saving(hidden, weight, target, bias, ignore_index, reduction, softcap, wanted):
    return ce_composition.forward_saving(triton_rows, hidden, weight, target, bias, ignore_index, reduction,
                                         softcap, wanted)


def _from(grad, saved, hidden, weight, target, bias, ignore_index, reduction, softcap, wanted):
    return ce_composition.backward_from(triton_rows, grad, saved, hidden, weight, target, bias, ignore_index,
                                        reduction, softcap, wanted)


register(Backend(
    name="triton", op="linear_cross_entropy", fn=triton_linear_cross_entropy,
    description="chunked F.linear + a Triton online-logsumexp row kernel writing the gradient in place "
                "(fp32 logits, gradients in the forward)",
    dtypes=(torch.float16, torch.bfloat16, torch.float32), availability=availability, supports=problem_reasons,
    jit=True, forward_saving=_saving, backward_from=_from))
