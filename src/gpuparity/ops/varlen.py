"""`gpuparity.attention_varlen`: attention over packed variable-length sequences (the layout of
flash_attn_varlen_func), its argument checks, its Problem for the dispatcher and its float64 reference."""
from __future__ import annotations

import numbers
from typing import Any, Dict

import torch

from . import select
from .calls import INDEX_DTYPES, _capturing, check_softcap, check_window
from ..backends.masks import attention_kind
from ..backends.registry import Problem
from ..backends.varlen_composition import attention_varlen_reference, empty_rows
from ..validation import FLOAT_DTYPES, describe, expect_same_device, expect_same_dtype, expect_tensor

# attention_varlen_reference and empty_rows live with the composition (the battery, below ops,
# uses them); re-exported here, their public path.
__all__ = ["attention_varlen", "attention_varlen_problem", "attention_varlen_reference", "empty_rows",
           "explain_attention_varlen"]

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
    chosen = select.resolve(problem, backend)
    return chosen.fn(q, k, v, cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q), int(max_seqlen_k), causal=causal,
                     window=problem.feature("window"), softcap=problem.feature("softcap"), scale=scale)


_eager = torch.compiler.disable(_call)


def explain_attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, causal=False,
                             window=None, softcap=None, scale=None) -> Dict[str, Any]:
    """Why each backend would or would not serve this call under backend="auto": the reasons in
    words of those that cannot, and the battery's verdict (probed on a miss) of those that can."""
    problem = attention_varlen_problem(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                       causal=causal, window=window, softcap=softcap, scale=scale)
    return select.explain(problem)
