"""Large calls, checked on a slice: float64 only where a judged element needs it.

Row-wise ops (the norms, softmax, rotary): an output row and its input gradient depend on that
input row alone (and on the weight, cos / sin), so a float64 check of some rows is exact for
those elements. The rows are strided across the whole tensor (rows o, o + s, o + 2s, ... with
s = ceil(rows / budget)), so one check sees every batch item and every position band, and the
offset o is the call's sample number modulo s: s consecutive samples of an op check every row
once. Rows of a norm are its leading dims flattened; of softmax, every position of its other dims;
of rotary, its heads (positions are not independent there: each has its own angle); of
cross-entropy, its (N, C) logits' rows (the loss itself against a float64 loss over every row,
computed in chunks: below). A norm's
weight and bias gradients sum over every row: they are judged whole, in a second float64 pass
with only the weight and bias as leaves (no grad_x at full size).

Attention: one batch item and one KV head with the query heads that read it. The slice is an
attention of its own (its output, grad_q, grad_k and grad_v depend on nothing outside it), so
its float64 check is exact for those elements, at 1 / (B x Hkv) of the cost; the slice rotates
with the sample number.

Every output and gradient of a sliced call is still scanned whole for NaN/Inf."""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Dict, List, Optional, Tuple

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
    """(args, out, grad_out, grads) of attention slice number `pick` (modulo the count), and its label."""
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


# --------------------------------------------------------------------------- row-wise ops
@dataclasses.dataclass
class Rows:
    """How a row-wise call splits into rows: `rows` of them, `view(t)` puts them on dim 0 (or
    dim -2 for rotary's heads: `select`), `args` the call's other arguments for a slice."""
    rows: int
    width: int                                     # elements per row
    select: Callable[[torch.Tensor, slice], torch.Tensor]
    args: Dict[str, Any]                           # argument changes for a slice (softmax: dim=-1)
    unit: str                                      # "rows" or "heads", for reports


def _norm_rows(kind, args) -> Optional[Rows]:
    x, shape = args.get(kind.tensors[0]), args.get("normalized_shape")
    dims = 1 if isinstance(shape, int) else len(tuple(shape or ()))
    if not isinstance(x, torch.Tensor) or dims < 1 or x.dim() <= dims:
        return None
    trailing = tuple(x.shape[x.dim() - dims:])
    width = math.prod(trailing)
    return Rows(x.numel() // max(width, 1), width, lambda t, rows: t.reshape(-1, *trailing)[rows], {}, "rows")


def _softmax_rows(kind, args) -> Optional[Rows]:
    x, dim = args.get(kind.tensors[0]), args.get("dim")
    if not isinstance(x, torch.Tensor) or not isinstance(dim, int) or x.dim() < 2:
        return None
    dim = dim % x.dim()
    width = x.shape[dim]
    return Rows(x.numel() // max(width, 1), width,
                lambda t, rows: t.movedim(dim, -1).reshape(-1, width)[rows], {"dim": -1}, "rows")


def _rotary_rows(kind, args) -> Optional[Rows]:
    x = args.get(kind.tensors[0])
    if not isinstance(x, torch.Tensor) or x.dim() < 3:
        return None
    heads = x.shape[-2]
    return Rows(heads, x.numel() // max(heads, 1), lambda t, rows: t[..., rows, :], {}, "heads")


def _loss_rows(kind, args) -> Optional[Rows]:
    x, target = args.get("input"), args.get("target")
    if not isinstance(x, torch.Tensor) or not isinstance(target, torch.Tensor) or x.dim() != 2 \
            or target.dim() != 1 or target.is_floating_point():
        return None
    return Rows(x.shape[0], x.shape[1], lambda t, rows: t[rows], {}, "rows")


ROW_WISE = {"norm": _norm_rows, "softmax": _softmax_rows, "rotary": _rotary_rows, "loss": _loss_rows}


def rows_of(kind, args: Dict[str, Any]) -> Optional[Rows]:
    """The call's rows when its op is row-wise (ROW_WISE by family), else None."""
    layout = ROW_WISE.get(kind.family)
    return layout(kind, args) if layout is not None else None


def row_stride(layout: Rows, budget: Optional[int]) -> int:
    """s such that every s-th row makes about `budget` elements (1: the whole call)."""
    if budget is None or layout.rows * layout.width <= budget:
        return 1
    keep = max(1, budget // max(layout.width, 1))
    return max(1, math.ceil(layout.rows / keep))


def strided_rows(rows: int, stride: int, pick: int) -> slice:
    """Rows pick % stride, + stride, ...: spread over the whole call; `stride` consecutive picks
    cover every row exactly once."""
    return slice(pick % stride, rows, stride)


def row_label(layout: Rows, rows: slice) -> str:
    checked = len(range(rows.start, layout.rows, rows.step))
    return (f"{checked} of {layout.rows} {layout.unit}: {rows.start}, {rows.start + rows.step}, ... "
            f"(one in {rows.step})")


# --------------------------------------------------------------------------- cross-entropy
# F.cross_entropy of (N, C) logits: a row's loss and its grad_input row depend on that row alone,
# but "mean" and "sum" add every row's loss into one number. So grad_input is judged on strided
# rows (the rows' "sum" loss, its upstream gradient divided by the call's denominator for
# "mean"), and the loss itself against a float64 loss summed over every row in chunks
# (LOSS_CHUNK elements of float64 at a time, no autograd), never a whole float64 copy of the
# logits with its log-softmax and gradient (6 GB for 4096 tokens x 32000 classes).
LOSS_CHUNK = 2 ** 24


def loss_denominator(args: Dict[str, Any]) -> torch.Tensor:
    """What F.cross_entropy's "mean" divides by (float64): the weights of the targets that are
    not ignore_index (their count without weights); 1 for "sum"."""
    target = args["target"]
    if args.get("reduction") != "mean":
        return torch.ones((), dtype=torch.float64, device=target.device)
    keep = target != args.get("ignore_index", -100)
    weight = args.get("weight")
    if weight is None:
        return keep.sum().to(torch.float64)
    picked = weight.to(target.device, torch.float64)[target.clamp(0, weight.numel() - 1)]
    return (picked * keep).sum()


def loss_in_chunks(args: Dict[str, Any]) -> torch.Tensor:
    """The call's float64 loss (its reduction, "mean" or "sum"), over row chunks."""
    x, target = args["input"], args["target"]
    weight = args.get("weight")
    weight = None if weight is None else weight.to(x.device, torch.float64)
    rows = max(1, LOSS_CHUNK // max(x.shape[1], 1))
    total = torch.zeros((), dtype=torch.float64, device=x.device)
    for start in range(0, x.shape[0], rows):
        total = total + torch.nn.functional.cross_entropy(
            x[start:start + rows].to(torch.float64), target[start:start + rows], weight=weight,
            ignore_index=args.get("ignore_index", -100), reduction="sum",
            label_smoothing=args.get("label_smoothing", 0.0))
    return total / loss_denominator(args) if args.get("reduction") == "mean" else total


# --------------------------------------------------------------------------- NaN/Inf over whole tensors
def nonfinite_sums(tensors: List[torch.Tensor], masks: Optional[List[Optional[torch.Tensor]]] = None
                   ) -> Optional[torch.Tensor]:
    """One sum per tensor (where its mask, if any, is True), stacked: NaN/Inf anywhere make a
    sum non-finite (a sum that overflows is a false alarm that `nonfinite_count` settles); 0 for
    a tensor that is not floating point. One reduction per tensor and one stack, not read here:
    the caller reads them with the rest of its small results in one host sync (None: no tensors)."""
    if not tensors:
        return None
    masks = masks or [None] * len(tensors)
    sums = []
    for tensor, mask in zip(tensors, masks):
        if not tensor.is_floating_point():
            sums.append(torch.zeros((), dtype=torch.float32, device=tensors[0].device))
            continue
        if mask is not None:
            tensor = torch.where(mask.to(tensor.device).expand_as(tensor), tensor, 0)
        sums.append(tensor.sum(dtype=torch.float64 if tensor.dtype == torch.float64 else torch.float32))
    return torch.stack([t.to(tensors[0].device) for t in sums]) if len({t.device for t in sums}) > 1 \
        else torch.stack(sums)


def nonfinite_any(tensors: List[torch.Tensor], masks: Optional[List[Optional[torch.Tensor]]] = None
                  ) -> Optional[torch.Tensor]:
    """A bool tensor: for each tensor, whether it may hold NaN/Inf (where its mask, if any, is
    True): `nonfinite_sums` that are not finite (None: no tensors)."""
    sums = nonfinite_sums(tensors, masks)
    return None if sums is None else ~torch.isfinite(sums)


def flagged(sums: Optional[List[float]]) -> List[bool]:
    """nonfinite_sums read on the host: whether each tensor may hold NaN/Inf."""
    return [not math.isfinite(value) for value in (sums or [])]


def nonfinite_count(tensor: torch.Tensor, mask: Optional[torch.Tensor] = None) -> Tuple[int, List[int]]:
    """(how many NaN/Inf elements where mask is True, the first one's index)."""
    bad = ~torch.isfinite(tensor)
    if mask is not None:
        bad &= mask.to(bad.device).expand_as(bad)
    count = int(bad.sum())
    return count, ([int(i) for i in bad.nonzero()[0].tolist()] if count else [])


def scan_nonfinite(named: List[Tuple[str, torch.Tensor]], valid: Dict[str, torch.Tensor],
                   flags: Optional[torch.Tensor] = None) -> List[Comparison]:
    """Failed comparisons for outputs that hold NaN/Inf in meaningful elements (the inputs being
    finite, the float64 reference is finite there). flags: nonfinite_any's of the same tensors
    (a bool tensor, or a list of bools already read)."""
    if not named:
        return []
    if flags is None:
        flags = nonfinite_any([t for _, t in named], [valid.get(name) for name, _ in named])
    failed = []
    for (name, tensor), flag in zip(named, flags.tolist() if isinstance(flags, torch.Tensor) else flags):
        if not flag:
            continue
        count, idx = nonfinite_count(tensor, valid.get(name))
        if count:
            failed.append(Comparison(name, False, reason=(
                f"{name}: {count} NaN/Inf values where the reference is finite, first at {idx} "
                f"(every element scanned, not only the checked slice)"), worst_index=idx))
    return failed
