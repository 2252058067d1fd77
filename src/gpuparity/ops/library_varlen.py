"""`gpuparity::attention_varlen`: the torch.library op that gpuparity.attention_varlen becomes
under torch.compile / torch.export (a fake implementation, a registered autograd formula through
`::attention_varlen_backward`, the backend chosen in the body when it runs, as ops/library.py's
dense ops), and the argument checks the public function shares with it."""
# The Triton backend's forward saves its log-sum-exp and its backward is the fused dq / dk-dv
# kernels (_FUSED); other backends (the composition) recompute their forward under autograd in
# the backward op, as ops/library.py does for the dense ops.
from __future__ import annotations

import numbers
from typing import List, Optional, Tuple

import torch
from torch import Tensor

from ..backends.masks import attention_kind
from ..backends.registry import Problem
from ..backends.triton_attention.varlen import triton_attention_varlen, varlen_backward_from, varlen_forward_saving
from ..validation import FLOAT_DTYPES, describe, expect_same_device, expect_same_dtype, expect_tensor
from ..contracts.attention import check_window
from ..contracts.base import INDEX_DTYPES, capturing, check_softcap, checked_once
from .library import _like, _recomputed_grads, _serve, _served

__all__ = ["attention_varlen", "attention_varlen_problem"]

OP = "attention_varlen"


def _check_max(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        raise TypeError(f"{name}: expected an int >= 0 (the longest sequence), got {describe(value)}")
    return int(value)


def _cu_values(cu: torch.Tensor) -> Tuple[int, int, int, int]:
    """(first, last, number of decreasing steps, longest sequence) of a cu_seqlens: one host sync."""
    cu64 = cu.long()
    lengths = cu64[1:] - cu64[:-1]
    longest = lengths.max() if lengths.numel() else cu64.new_zeros(())
    first, last, decreasing, longest = (int(x) for x in torch.stack([
        cu64[0], cu64[-1], (lengths < 0).sum(), longest]).tolist())
    return first, last, decreasing, longest


def _check_cu_values(name: str, cu: torch.Tensor, total: int, total_name: str, max_name: str, max_seqlen: int):
    """The values of one cu_seqlens: from 0, non-decreasing, ending at the total number of
    tokens, no sequence longer than max_seqlen (one host sync, once per tensor and version: a
    model's layers share their cu_seqlens, contracts.base.checked_once)."""
    checked_once((cu,), ("varlen", total, max_seqlen),
                 lambda: _check_cu(name, cu, total, total_name, max_name, max_seqlen))


def _check_cu(name: str, cu: torch.Tensor, total: int, total_name: str, max_name: str, max_seqlen: int) -> None:
    first, last, decreasing, longest = _cu_values(cu)
    if first != 0:
        raise ValueError(f"{name}: expected cumulative lengths starting at 0, got first value {first}")
    if decreasing:
        raise ValueError(f"{name}: expected a non-decreasing (sorted) sequence of cumulative lengths, got "
                         f"{decreasing} decreasing step(s) in {cu.tolist() if cu.numel() <= 16 else describe(cu)}")
    if last != total:
        raise ValueError(f"{name}: expected the last value to be {total_name} = {total}, got {last}")
    if max_seqlen < longest:
        raise ValueError(f"{max_name}: expected >= the longest sequence ({longest}), got {max_seqlen}")


def attention_varlen_problem(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, causal=False,
                             window=None, softcap=None, scale=None, check_values: bool = True) -> Problem:
    """Validate the inputs of `attention_varlen` and describe the call for the dispatcher.
    Raises TypeError/ValueError naming the argument, what it got and what it needs. The checks
    of cu_seqlens' values (one host sync) are skipped while a graph is captured or traced (the
    torch.library op runs them when it runs) and with check_values=False (its backward: the
    forward checked the same tensors)."""
    expect_tensor("q", q, ndim=(3,), dtypes=FLOAT_DTYPES)
    expect_tensor("k", k, ndim=(3,), dtypes=FLOAT_DTYPES)
    expect_tensor("v", v, ndim=(3,), dtypes=FLOAT_DTYPES)
    expect_same_dtype("q", q, k=k, v=v)
    expect_same_device("q", q, k=k, v=v)
    _, heads, head_dim = q.shape
    if k.shape[2] != head_dim:
        raise ValueError(f"k: expected shape (total_k, Hkv, D={head_dim}) to match q (total_q, H, D), got {describe(k)}")
    kv_heads = k.shape[1]
    if tuple(v.shape) != tuple(k.shape):
        raise ValueError(f"v: expected the shape of k {tuple(k.shape)}, got {describe(v)}")
    if kv_heads == 0 or heads % kv_heads:
        raise ValueError(f"k: expected a number of heads Hkv that divides q's H={heads} (GQA/MQA), "
                         f"got Hkv={kv_heads} in {describe(k)}")
    for name, cu in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        expect_tensor(name, cu, ndim=(1,), dtypes=INDEX_DTYPES)
        if cu.numel() < 1:
            raise ValueError(f"{name}: expected B + 1 >= 1 cumulative lengths, got {describe(cu)}")
        expect_same_device("q", q, **{name: cu})
    if cu_seqlens_k.numel() != cu_seqlens_q.numel():
        raise ValueError(f"cu_seqlens_k: expected as many sequences as cu_seqlens_q (B + 1 = {cu_seqlens_q.numel()} "
                         f"values), got {describe(cu_seqlens_k)}")
    max_q = _check_max("max_seqlen_q", max_seqlen_q)
    max_k = _check_max("max_seqlen_k", max_seqlen_k)
    if not isinstance(causal, bool):
        raise TypeError(f"causal: expected a bool, got {describe(causal)}")
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, numbers.Real)):
        raise TypeError(f"scale: expected None or a real number, got {describe(scale)}")
    window = check_window(window, max_q, max_k)
    softcap = check_softcap(softcap)
    if check_values and not capturing(q.device):
        _check_cu_values("cu_seqlens_q", cu_seqlens_q, q.shape[0], "q.shape[0]", "max_seqlen_q", max_q)
        _check_cu_values("cu_seqlens_k", cu_seqlens_k, k.shape[0], "k.shape[0]", "max_seqlen_k", max_k)
    features = (("head_dim", int(head_dim)), ("gqa", kv_heads != heads), ("is_causal", causal),
                ("q_len", max_q), ("k_len", max_k))
    if window is not None:
        features += (("window", window),)
    if softcap is not None:
        features += (("softcap", softcap),)
    return Problem(op=OP, device=q.device, dtype=q.dtype, kind=attention_kind(None, None, causal, window, softcap),
                   features=features)


# ----------------------------------------------------------------------------- the torch.library ops
# backend function -> (forward_saving, backward_from) where the registry entry does not carry them
_FUSED = {triton_attention_varlen: (varlen_forward_saving, varlen_backward_from)}


def _split(chosen):
    if chosen.forward_saving is not None:
        return chosen.forward_saving, chosen.backward_from
    return _FUSED.get(chosen.fn, (None, None))


def _problem(q, k, v, cu_q, cu_k, max_q, max_k, causal, window, softcap, scale, check_values=True) -> Problem:
    return attention_varlen_problem(q, k, v, cu_q, cu_k, max_q, max_k, causal=causal,
                                    window=None if window is None else tuple(window), softcap=softcap, scale=scale,
                                    check_values=check_values)


def _lse_like(q: Tensor) -> Tensor:
    return q.new_zeros((q.shape[1], q.shape[0]), dtype=torch.float32)


@torch.library.custom_op("gpuparity::attention_varlen", mutates_args=())
def attention_varlen_op(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor,
                        max_seqlen_q: int, max_seqlen_k: int, causal: bool, window: Optional[List[int]],
                        softcap: Optional[float], scale: Optional[float], backend: str) -> Tuple[Tensor, Tensor]:
    """(out, lse): lse (H, total_q) float32 is what the Triton backward reads (zeros otherwise)."""
    # the checks of cu_seqlens' values were skipped while tracing; they run here, on real tensors
    problem = _problem(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, window, softcap,
                       scale)
    chosen = _serve(problem, backend)
    forward_saving, _ = _split(chosen)
    args = (q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    flags = dict(causal=causal, window=problem.feature("window"), softcap=problem.feature("softcap"), scale=scale)
    if forward_saving is not None:
        out, (lse,) = forward_saving(*args, **flags)
    else:
        out, lse = chosen.fn(*args, **flags), _lse_like(q)
    return _like(out, q), lse


@attention_varlen_op.register_fake
def _attention_varlen_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, window, softcap,
                           scale, backend):
    return torch.empty_like(q), q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32)


@torch.library.custom_op("gpuparity::attention_varlen_backward", mutates_args=())
def attention_varlen_backward_op(grad: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                                 cu_seqlens_q: Tensor, cu_seqlens_k: Tensor, max_seqlen_q: int, max_seqlen_k: int,
                                 causal: bool, window: Optional[List[int]], softcap: Optional[float],
                                 scale: Optional[float], backend: str) -> Tuple[Tensor, Tensor, Tensor]:
    """(dq, dk, dv) with the backend the forward served this call with."""
    problem = _problem(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, window, softcap,
                       scale, check_values=False)
    chosen = _served(problem, backend)
    _, backward_from = _split(chosen)
    args = (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    flags = dict(causal=causal, window=problem.feature("window"), softcap=problem.feature("softcap"), scale=scale)
    if backward_from is not None:
        dq, dk, dv = backward_from(grad, (out, lse), q, k, v, *args, **flags)
    else:
        dq, dk, dv = _recomputed_grads(lambda q_, k_, v_: chosen.fn(q_, k_, v_, *args, **flags), [q, k, v],
                                       [True, True, True], grad)
    return _like(dq, q), _like(dk, k), _like(dv, v)


@attention_varlen_backward_op.register_fake
def _attention_varlen_backward_fake(grad, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                    causal, window, softcap, scale, backend):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup(ctx, inputs, output):
    q, k, v, cu_q, cu_k, max_q, max_k, causal, window, softcap, scale, backend = inputs
    ctx.save_for_backward(q, k, v, output[0], output[1], cu_q, cu_k)
    ctx.spec = (max_q, max_k, causal, window, softcap, scale, backend)


def _backward(ctx, grad, _grad_lse):
    q, k, v, out, lse, cu_q, cu_k = ctx.saved_tensors
    max_q, max_k, causal, window, softcap, scale, backend = ctx.spec
    dq, dk, dv = torch.ops.gpuparity.attention_varlen_backward(grad.contiguous(), q, k, v, out, lse, cu_q, cu_k,
                                                               max_q, max_k, causal, window, softcap, scale, backend)
    return dq, dk, dv, None, None, None, None, None, None, None, None, None


attention_varlen_op.register_autograd(_backward, setup_context=_setup)


def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int, max_seqlen_k: int, causal: bool,
                     window, softcap, scale, backend: str) -> Tensor:
    """The op's output, for gpuparity.attention_varlen while torch.compile or torch.export traces it."""
    return torch.ops.gpuparity.attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                                bool(causal), None if window is None else [int(w) for w in window],
                                                None if softcap is None else float(softcap),
                                                None if scale is None else float(scale), backend)[0]
