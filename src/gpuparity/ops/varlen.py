"""`gpuparity.attention_varlen`: attention over packed variable-length sequences (the layout of
flash_attn_varlen_func), dispatched eagerly or, while torch.compile traces, through its torch.library op."""
from __future__ import annotations

from typing import Any, Dict

import torch

from . import library_varlen, select
from ..contracts.varlen import attention_varlen_problem, attention_varlen_reference, empty_rows
from ..validation import describe

# attention_varlen_problem, attention_varlen_reference and empty_rows live in the op's contract;
# re-exported here, their public path.
__all__ = ["attention_varlen", "attention_varlen_problem", "attention_varlen_reference", "empty_rows",
           "explain_attention_varlen"]

def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, causal=False,
                     window=None, softcap=None, scale=None, backend: str = "auto", return_lse: bool = False):
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
    name from gpuparity.dispatch.backends("attention_varlen"). return_lse=True: returns (out, lse),
    lse the fp32 (H, total_q) log-sum-exp of each row's scores over the keys it sees (FlashAttention's
    varlen layout; -inf for a row with no key; a separate pass per sequence, no gradient).
    """
    if not isinstance(backend, str):
        raise TypeError(f"backend: expected a backend name (str) or 'auto', got {describe(backend)}")
    if not isinstance(return_lse, bool):
        raise TypeError(f"return_lse: expected a bool, got {describe(return_lse)}")
    if return_lse:
        out = attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=causal,
                               window=window, softcap=softcap, scale=scale, backend=backend)
        return out, _varlen_lse(q, k, cu_seqlens_q, cu_seqlens_k, causal, window, softcap, scale)
    problem = attention_varlen_problem(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                       causal=causal, window=window, softcap=softcap, scale=scale)
    if torch.compiler.is_compiling():  # traced: one torch.library op that chooses its backend when it runs
        window, softcap = problem.feature("window"), problem.feature("softcap")
        return torch.ops.gpuparity.attention_varlen(
            q, k, v, cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q), int(max_seqlen_k), bool(causal),
            None if window is None else [int(w) for w in window], None if softcap is None else float(softcap),
            None if scale is None else float(scale), backend)[0]
    chosen = select.resolve(problem, backend)
    return chosen.fn(q, k, v, cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q), int(max_seqlen_k), causal=causal,
                     window=problem.feature("window"), softcap=problem.feature("softcap"), scale=scale)


def _varlen_lse(q, k, cu_seqlens_q, cu_seqlens_k, causal, window, softcap, scale):
    """fp32 (H, total_q): each sequence's rows through attention_lse with its bottom-right mask."""
    from ..contracts.varlen import bottom_right_allowed
    from .attention import attention_lse
    lse = torch.full((q.shape[1], q.shape[0]), float("-inf"), dtype=torch.float32, device=q.device)
    starts_q, starts_k = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    for b in range(len(starts_q) - 1):
        qs, qe, ks, ke = starts_q[b], starts_q[b + 1], starts_k[b], starts_k[b + 1]
        if qe > qs and ke > ks:
            mask = bottom_right_allowed(qe - qs, ke - ks, bool(causal), window, q.device)
            lse[:, qs:qe] = attention_lse(q[qs:qe].transpose(0, 1).unsqueeze(0), k[ks:ke].transpose(0, 1).unsqueeze(0),
                                          attn_mask=mask, scale=scale, softcap=softcap)[0]
    return lse


def explain_attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, causal=False,
                             window=None, softcap=None, scale=None) -> Dict[str, Any]:
    """Why each backend would or would not serve this call under backend="auto": the reasons in
    words of those that cannot, and the battery's verdict (probed on a miss) of those that can."""
    problem = attention_varlen_problem(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                       causal=causal, window=window, softcap=softcap, scale=scale)
    return select.explain(problem)
