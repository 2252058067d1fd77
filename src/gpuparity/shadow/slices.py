"""Large attention calls, checked on one slice: one batch item and one KV head with the query
heads that read it. The slice is an attention of its own (its output, grad_q, grad_k and grad_v
depend on nothing outside it), so its float64 check is exact for those elements, at
1 / (B x Hkv) of the cost; the slice rotates with the call number, and the whole of every output
and gradient is still scanned for NaN/Inf."""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import torch

from ..checks.results import Comparison


def count(kind, args: Dict[str, Any]) -> int:
    q, k = args[kind.tensors[0]], args[kind.tensors[1]]
    return int(q.shape[0] * k.shape[1])


def _mask4(mask, batch: slice, heads: slice):
    if mask is None:
        return None
    while mask.dim() < 4:
        mask = mask.unsqueeze(0)
    if mask.shape[0] > 1:
        mask = mask[batch]
    if mask.shape[1] > 1:
        mask = mask[:, heads]
    return mask


def take(kind, args: Dict[str, Any], out, grad_out, grads: Dict[str, torch.Tensor], pick: int
         ) -> Tuple[Dict[str, Any], torch.Tensor, Optional[torch.Tensor], Dict[str, torch.Tensor], str]:
    """(args, out, grad_out, grads) of slice number `pick` (modulo the count), and its label."""
    qn, kn, vn = kind.tensors
    q, k = args[qn], args[kn]
    group = q.shape[1] // k.shape[1]
    b, j = divmod(pick % count(kind, args), k.shape[1])
    batch, q_heads, kv_heads = slice(b, b + 1), slice(j * group, (j + 1) * group), slice(j, j + 1)
    sliced = dict(args)
    sliced[qn], sliced[kn], sliced[vn] = q[batch, q_heads], k[batch, kv_heads], args[vn][batch, kv_heads]
    if args.get("attn_mask") is not None:
        sliced["attn_mask"] = _mask4(args["attn_mask"], batch, q_heads)
    if args.get("key_padding_mask") is not None:
        sliced["key_padding_mask"] = args["key_padding_mask"][batch]
    grads = {name: (g[batch, q_heads] if name == "grad_" + qn else g[batch, kv_heads]) for name, g in grads.items()}
    label = f"batch item {b}, query heads {j * group}-{(j + 1) * group - 1}"
    return sliced, out[batch, q_heads], None if grad_out is None else grad_out[batch, q_heads], grads, label


def scan_nonfinite(named: List[Tuple[str, torch.Tensor]], valid: Dict[str, torch.Tensor]) -> List[Comparison]:
    """Failed comparisons for outputs that hold NaN/Inf in meaningful elements (the inputs being
    finite, the float64 reference is finite there)."""
    failed = []
    for name, tensor in named:
        bad = ~torch.isfinite(tensor)
        if name in valid:
            bad &= valid[name].expand_as(bad)
        if bad.any():
            idx = [int(i) for i in bad.nonzero()[0].tolist()]
            failed.append(Comparison(name, False, reason=(
                f"{name}: {int(bad.sum())} NaN/Inf values where the reference is finite, first at {idx} "
                f"(every batch item and head scanned)"), worst_index=idx))
    return failed
