"""`gpuparity.attention_varlen`: attention over packed variable-length sequences (the layout of
flash_attn_varlen_func), its argument checks, its Problem for the dispatcher and its float64 reference."""
from __future__ import annotations

import numbers
from typing import Any, Dict, Optional, Tuple

import torch

from .. import dispatch
from . import select
from .calls import INDEX_DTYPES, _capturing, check_softcap, check_window
from ..backends.masks import attention_kind
from ..backends.registry import Backend, Problem
from ..backends.varlen_composition import bottom_right_allowed, packed
from ..validation import FLOAT_DTYPES, describe, expect_same_device, expect_same_dtype, expect_tensor

__all__ = ["attention_varlen", "attention_varlen_problem", "attention_varlen_reference", "explain_attention_varlen"]

OP = "attention_varlen"


def _check_max(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        raise TypeError(f"{name}: expected an int >= 0 (the longest sequence), got {describe(value)}")
    return int(value)


def _check_cu_values(name: str, cu: torch.Tensor, total: int, total_name: str, max_name: str, max_seqlen: int):
    """The values of one cu_seqlens (one host sync): from 0, non-decreasing, ending at the total
    number of tokens, no sequence longer than max_seqlen."""
    cu64 = cu.long()
    lengths = cu64[1:] - cu64[:-1]
    longest = lengths.max() if lengths.numel() else cu64.new_zeros(())
    first, last, decreasing, longest = (int(x) for x in torch.stack([
        cu64[0], cu64[-1], (lengths < 0).sum(), longest]).tolist())
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
                             window=None, softcap=None, scale=None) -> Problem:
    """Validate the inputs of `attention_varlen` and describe the call for the dispatcher.
    Raises TypeError/ValueError naming the argument, what it got and what it needs."""
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
    if not _capturing(q.device):  # values on the device: skipped while a graph is captured or traced
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


def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, causal=False,
                     window=None, softcap=None, scale=None, backend: str = "auto"):
    """Attention over packed sequences, flash_attn_varlen_func's layout: q (total_q, H, D), k and v
    (total_k, Hkv, D) with H % Hkv == 0 (GQA); sequence b is rows cu_seqlens_q[b]:cu_seqlens_q[b+1]
    of q and cu_seqlens_k[b]:cu_seqlens_k[b+1] of k and v (cu_seqlens: int32/int64 (B + 1,), from 0,
    non-decreasing, ending at total_q / total_k; an empty sequence is allowed). max_seqlen_q/k: at
    least the longest sequence (it sizes the launch; checked, with one host sync).

    causal and window=(left, right) are BOTTOM-RIGHT aligned within each sequence, as in
    FlashAttention: query i of a sequence with Sq queries and Sk keys sits at key position
    i + Sk - Sq, so causal lets it see keys j <= i + Sk - Sq and the window keys
    i + Sk - Sq - left <= j <= i + Sk - Sq + right (-1: unbounded). (The dense
    gpuparity.attention aligns is_causal and window top-left, as SDPA.) Rows that see no key
    (Sq > Sk under causal, an empty key sequence) return zeros and zero gradients. softcap=c: scores
    s become c * tanh(s / c) (Gemma-2). Returns (total_q, H, D) in q's dtype. backend: "auto" or a
    name from gpuparity.dispatch.backends("attention_varlen").
    """
    if torch.compiler.is_compiling():
        # no torch.library op yet: a graph break, the call runs eagerly (checks included)
        return _eager(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=causal, window=window,
                      softcap=softcap, scale=scale, backend=backend)
    return _call(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=causal, window=window,
                 softcap=softcap, scale=scale, backend=backend)


def _call(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, causal, window, softcap, scale, backend):
    if not isinstance(backend, str):
        raise TypeError(f"backend: expected a backend name (str) or 'auto', got {describe(backend)}")
    problem = attention_varlen_problem(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                       causal=causal, window=window, softcap=softcap, scale=scale)
    chosen = dispatch.resolve(problem, backend, verdict=verdict)
    return chosen.fn(q, k, v, cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q), int(max_seqlen_k), causal=causal,
                     window=problem.feature("window"), softcap=problem.feature("softcap"), scale=scale)


_eager = torch.compiler.disable(_call)


def explain_attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, causal=False,
                             window=None, softcap=None, scale=None) -> Dict[str, Any]:
    """Why each backend would or would not serve this call under backend="auto" (dispatch.explain)."""
    problem = attention_varlen_problem(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                       causal=causal, window=window, softcap=softcap, scale=scale)
    return dispatch.explain(problem, verdict=verdict)


def attention_varlen_reference(q, k, v, cu_seqlens_q, cu_seqlens_k, *, causal=False,
                               window: Optional[Tuple[int, int]] = None, softcap=None, scale=None):
    """The float64 referee: each sequence through gpuparity.reference.attention (float64 on q's
    device, differentiable) with its bottom-right mask. Inputs are upcast; returns float64."""
    from .. import reference

    def dense(q_i, k_i, v_i, *, attn_mask=None, scale=None, softcap=None):
        return reference.attention(q_i, k_i, v_i, attn_mask=attn_mask, scale=scale, softcap=softcap)

    return packed(dense, q.double(), k.double(), v.double(), cu_seqlens_q, cu_seqlens_k, causal, window, scale,
                  softcap)


def empty_rows(cu_seqlens_q, cu_seqlens_k, *, causal=False, window=None) -> torch.Tensor:
    """Bool (total_q,): the rows that see no key (their output and gradients must be exactly 0)."""
    starts_q, starts_k = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    rows = []
    for b in range(len(starts_q) - 1):
        q_len, k_len = starts_q[b + 1] - starts_q[b], starts_k[b + 1] - starts_k[b]
        allowed = bottom_right_allowed(q_len, k_len, causal, window, "cpu")
        if allowed is None:
            allowed = torch.ones(q_len, k_len, dtype=torch.bool)
        rows.append(~allowed.any(-1))
    return torch.cat(rows) if rows else torch.zeros(0, dtype=torch.bool)


# ----------------------------------------------------------------------------- auto's verdicts
# Until the check battery has an "attention_varlen" spec, backend="auto" verifies a backend with
# a self-check: a small packed batch with this call's flags against float64 under the tolerance
# policy, forward and backward, once per process and (device, dtype, flags, head_dim).
_CHECK_Q_LENS, _CHECK_K_LENS = [1, 17, 0, 5, 40], [4, 17, 3, 2, 70]


def _run(fn, qkv, cu_q, cu_k, grad, flags):
    leaves = [t.clone().requires_grad_() for t in qkv]
    out = fn(*leaves, cu_q, cu_k, max(_CHECK_Q_LENS), max(_CHECK_K_LENS), **flags)
    out.backward(grad)
    return [out.detach().cpu()] + [t.grad.detach().cpu() for t in leaves]


def _self_check(problem: Problem, backend: Backend) -> Dict[str, Any]:
    from ..backends.varlen_composition import composition_varlen
    from ..checks.tolerance import compare
    gen = torch.Generator().manual_seed(0)
    heads, kv_heads, head_dim = 4, (2 if problem.feature("gqa") else 4), problem.feature("head_dim")
    qkv = [torch.randn(sum(lens), h, head_dim, generator=gen).to(problem.device, problem.dtype)
           for lens, h in ((_CHECK_Q_LENS, heads), (_CHECK_K_LENS, kv_heads), (_CHECK_K_LENS, kv_heads))]
    cu_q, cu_k = (torch.tensor([0] + lens).cumsum(0).to(problem.device, torch.int32)
                  for lens in (_CHECK_Q_LENS, _CHECK_K_LENS))
    grad = torch.randn(qkv[0].shape, generator=gen).to(problem.device, problem.dtype)
    flags = dict(causal=bool(problem.feature("is_causal")), window=problem.feature("window"),
                 softcap=problem.feature("softcap"))
    try:
        mine = _run(backend.fn, qkv, cu_q, cu_k, grad, flags)
    except Exception as exc:  # noqa: BLE001 - a crash is a failed check, with its reason
        return {"passed": False, "reason": f"self-check raised {type(exc).__name__}: {str(exc)[:200]}"}
    base = _run(composition_varlen, qkv, cu_q, cu_k, grad, flags)
    leaves = [t.detach().cpu().double().requires_grad_() for t in qkv]
    ref = attention_varlen_reference(*leaves, cu_q.cpu(), cu_k.cpu(), **flags)
    ref.backward(grad.cpu().double())
    empty = empty_rows(cu_q.cpu(), cu_k.cpu(), causal=flags["causal"], window=flags["window"]).view(-1, 1, 1)
    results = [compare("out", mine[0], ref, base[0], problem.dtype, valid=~empty, must_be_zero=empty)]
    results += [compare(name, got, leaf.grad, baseline, problem.dtype)
                for name, got, leaf, baseline in zip(("dq", "dk", "dv"), mine[1:], leaves, base[1:])]
    failed = [r.reason for r in results if not r.passed]
    return {"passed": not failed, "reason": failed[0] if failed else "passed the varlen self-check", "time_ms": None}


# The battery's probe verdict once it has an attention_varlen spec, the self-check until then.
verdict = select.self_checked(_self_check, lambda p: (
    str(p.device), p.dtype, p.kind, p.feature("head_dim"), p.feature("gqa"), p.feature("window"),
    p.feature("softcap")))
