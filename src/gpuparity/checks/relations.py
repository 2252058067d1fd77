"""Equivalence relations: two calls of one implementation that must agree, with no float64 referee.

Attention on a batch equals attention on each item alone; permuting the keys (with their mask
columns) changes nothing; a scale folded into q (by a power of two, exact in every dtype) is the
same call; GQA equals its KV heads repeated; the causal flag equals its band as a bool mask;
contiguous copies equal the views; keys appended and masked out leave every output unchanged.
Each relation is checked forward and backward (the output and the gradients of q, k and v,
mapped back where the relation moves them).

The bar is the 2x rule of the tolerance policy with the baseline composition in the referee's
place: the implementation's disagreement between the two sides must be within
max(2 x the composition's disagreement under the same relation, the dtype's floor). A bug that
is right on the float64 cases at a size but wrong on the other side of a relation (a path only
B = 1 takes, a kernel that assumes key padding is a suffix) is caught here.

`check(op, fn, relation, params, dtype, seed)` runs one relation on one case (its params as the
battery makes them); `RELATIONS` lists them; `applicable(relation, params)` says where each holds."""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

from .. import tolerance
from ..contracts import get_spec
from .results import Status

Outputs = Dict[str, torch.Tensor]   # "out", "grad_q", "grad_k", "grad_v"
Call = Dict[str, Any]               # q, k, v, attn_mask, key_padding_mask, is_causal, scale


@dataclasses.dataclass(frozen=True)
class Relation:
    """`applies(params)`; `other(call, rng)`: the second call, and `back(outputs)` mapping its
    outputs onto the first call's."""
    name: str
    applies: Callable[[Dict[str, Any]], bool]
    other: Callable[[Call, torch.Generator], Tuple[Call, Callable[[Outputs], Outputs]]]
    doc: str = ""


def _same(outputs: Outputs) -> Outputs:
    return outputs


def _positional(p) -> bool:
    """Arguments whose meaning depends on key positions (a relation moving keys does not hold)."""
    return bool(p.get("causal") or p.get("window") is not None or p.get("alibi") or "causal" in p.get("mask", ""))


# --------------------------------------------------------------------------- attention's relations
def _batch_items(call: Call, gen) -> Tuple[Call, Callable]:
    """Each batch item alone (B calls of B = 1), concatenated: run by _batch_run."""
    return {**call, BATCH_ITEMS: True}, _same


BATCH_ITEMS = "__batch_items__"


def _key_permutation(call: Call, gen) -> Tuple[Call, Callable]:
    Sk = call["k"].shape[-2]
    perm = torch.randperm(Sk, generator=gen)
    inverse = torch.argsort(perm)
    mask, kpm = call.get("attn_mask"), call.get("key_padding_mask")
    other = {**call, "k": call["k"][..., perm, :], "v": call["v"][..., perm, :],
             "attn_mask": mask[..., perm] if mask is not None and mask.shape[-1] == Sk else mask,
             "key_padding_mask": None if kpm is None else kpm[:, perm]}

    def back(outputs):
        return {name: (value[..., inverse, :] if name in ("grad_k", "grad_v") else value)
                for name, value in outputs.items()}
    return other, back


def _scale_fold(call: Call, gen) -> Tuple[Call, Callable]:
    """q / 4 with 4x the scale: powers of two, exact in every dtype."""
    scale = call.get("scale")
    scale = call["q"].shape[-1] ** -0.5 if scale is None else scale
    other = {**call, "q": call["q"] / 4, "scale": scale * 4}

    def back(outputs):
        return {name: (value / 4 if name == "grad_q" else value) for name, value in outputs.items()}
    return other, back


def _gqa_repeat(call: Call, gen) -> Tuple[Call, Callable]:
    q, k, v = call["q"], call["k"], call["v"]
    group = q.shape[1] // k.shape[1]
    other = {**call, "k": k.repeat_interleave(group, 1), "v": v.repeat_interleave(group, 1)}

    def back(outputs):
        def fold(g):
            return g.unflatten(1, (k.shape[1], group)).sum(2)
        return {name: (fold(value) if name in ("grad_k", "grad_v") else value) for name, value in outputs.items()}
    return other, back


def _causal_band(call: Call, gen) -> Tuple[Call, Callable]:
    band = torch.ones(call["q"].shape[-2], call["k"].shape[-2], dtype=torch.bool, device=call["q"].device).tril()
    return {**call, "attn_mask": band, "is_causal": False}, _same


def _contiguous(call: Call, gen) -> Tuple[Call, Callable]:
    return {**call, **{name: call[name].contiguous() for name in ("q", "k", "v")}}, _same


PADDING = 5


def _padding_appended(call: Call, gen) -> Tuple[Call, Callable]:
    """PADDING random keys appended, masked out by the key padding mask (made where absent)."""
    q, k, v = call["q"], call["k"], call["v"]
    B, Sk = k.shape[0], k.shape[-2]

    def extra(t):
        noise = torch.randn(*t.shape[:-2], PADDING, t.shape[-1], generator=gen, dtype=torch.float64)
        return torch.cat([t, noise.to(t.device, t.dtype)], -2)
    kpm = call.get("key_padding_mask")
    kpm = torch.zeros(B, Sk, dtype=torch.bool, device=q.device) if kpm is None else kpm
    kpm = torch.cat([kpm, torch.ones(B, PADDING, dtype=torch.bool, device=q.device)], 1)
    mask = call.get("attn_mask")
    if mask is not None and mask.shape[-1] == Sk:
        fill = torch.zeros if mask.dtype == torch.bool else torch.full
        pad = (fill(*mask.shape[:-1], PADDING, dtype=mask.dtype, device=mask.device) if mask.dtype == torch.bool
               else fill((*mask.shape[:-1], PADDING), float("-inf"), dtype=mask.dtype, device=mask.device))
        mask = torch.cat([mask, pad], -1)
    other = {**call, "k": extra(k), "v": extra(v), "attn_mask": mask, "key_padding_mask": kpm}

    def back(outputs):
        return {name: (value[..., :Sk, :] if name in ("grad_k", "grad_v") else value) for name, value in outputs.items()}
    return other, back


RELATIONS: Tuple[Relation, ...] = (
    Relation("batch_items", lambda p: p["B"] >= 2, _batch_items, "the batch equals each item alone"),
    Relation("key_permutation", lambda p: not _positional(p), _key_permutation,
             "keys, values and their mask columns permuted together"),
    Relation("scale_fold", lambda p: not p.get("softcap"), _scale_fold, "q / 4 with 4x the scale"),
    Relation("gqa_repeat", lambda p: p["H"] != p["Hkv"], _gqa_repeat, "GQA equals its KV heads repeated"),
    Relation("causal_band", lambda p: p.get("causal") and p["mask"] == "none" and p.get("window") is None
             and not p.get("alibi"), _causal_band, "is_causal equals its band as a bool mask"),
    Relation("contiguous_copy", lambda p: bool(p.get("views")) or p.get("layout") != "bhsd", _contiguous,
             "contiguous copies equal the views"),
    Relation("padding_appended", lambda p: not p.get("alibi") and p.get("window") is None, _padding_appended,
             "keys appended and masked out change nothing"),
)


def relation(name: str) -> Relation:
    for item in RELATIONS:
        if item.name == name:
            return item
    raise ValueError(f"relation: expected one of {', '.join(r.name for r in RELATIONS)}, got {name!r}")


def applicable(rel: Relation, params: Dict[str, Any]) -> bool:
    return bool(rel.applies(params))


# --------------------------------------------------------------------------- running one
@dataclasses.dataclass
class RelationResult:
    relation: str
    status: Status
    disagreement: Dict[str, float]          # the implementation's, per output
    baseline: Dict[str, float]              # the composition's under the same relation
    allowed: Dict[str, float]
    reason: str = ""


def _call_attention(spec, fn, inputs: Dict[str, Any], params: Dict[str, Any]) -> Call:
    """The battery's call of the case, as arguments (spec.call with a recorder)."""
    seen: Dict[str, Any] = {}

    def record(q, k, v, **kwargs):
        seen.update(q=q, k=k, v=v, **kwargs)
        return q
    spec.call(record, inputs, params)
    return seen


def _apply(fn, call: Call):
    """fn called as the battery calls it: q, k, v by position, the rest by keyword."""
    rest = {name: value for name, value in call.items() if name not in ("q", "k", "v", BATCH_ITEMS)}
    return fn(call["q"], call["k"], call["v"], **rest)


def _run(fn, call: Call, grad_out: torch.Tensor) -> Outputs:
    leaves = {name: call[name].detach().clone().requires_grad_(True) for name in ("q", "k", "v")}
    out = _apply(fn, {**call, **leaves})
    out.backward(grad_out.to(out.dtype))
    return {"out": out.detach(), **{f"grad_{name}": leaf.grad for name, leaf in leaves.items()}}


def _batch_run(fn, call: Call, grad_out: torch.Tensor) -> Outputs:
    """The call item by item (each mask sliced where it has a batch dim), concatenated."""
    leaves = {name: call[name].detach().clone().requires_grad_(True) for name in ("q", "k", "v")}
    mask, kpm = call.get("attn_mask"), call.get("key_padding_mask")
    outs = []
    for b in range(leaves["q"].shape[0]):
        item_mask = mask[b:b + 1] if mask is not None and mask.dim() == 4 and mask.shape[0] > 1 else mask
        outs.append(_apply(fn, {**call, "q": leaves["q"][b:b + 1], "k": leaves["k"][b:b + 1], "v": leaves["v"][b:b + 1],
                                "attn_mask": item_mask, "key_padding_mask": None if kpm is None else kpm[b:b + 1]}))
    out = torch.cat(outs)
    out.backward(grad_out.to(out.dtype))
    return {"out": out.detach(), **{f"grad_{name}": leaf.grad for name, leaf in leaves.items()}}


def _disagreement(a: Outputs, b: Outputs) -> Dict[str, float]:
    found = {}
    for name, value in a.items():
        other = b.get(name)
        if value is None or other is None:
            found[name] = float("inf") if (value is None) != (other is None) else 0.0
            continue
        finite = torch.isfinite(value.double()) & torch.isfinite(other.double())
        if not bool(torch.equal(torch.isfinite(value.double()), torch.isfinite(other.double()))):
            found[name] = float("inf")
            continue
        found[name] = tolerance.relative_error(value.masked_fill(~finite, 0), other.double().masked_fill(~finite, 0))
    return found


def _outputs(fn, rel: Relation, call: Call, gen_seed: int, grad_out: torch.Tensor) -> Tuple[Outputs, Outputs]:
    gen = torch.Generator().manual_seed(gen_seed)
    other, back = rel.other(call, gen)
    first = _run(fn, call, grad_out)
    second = _batch_run(fn, call, grad_out) if other.get(BATCH_ITEMS) else back(_run(fn, other, grad_out))
    return first, second


def check(op: str, fn: Callable, rel: Relation, params: Dict[str, Any], dtype: torch.dtype, seed: int = 0,
          baseline_fn: Optional[Callable] = None) -> RelationResult:
    """One relation on one case: the implementation's disagreement between the two sides
    against max(2 x the baseline composition's, the dtype's floor), per output."""
    from ..dispatch import get as get_backend
    from .execute import _round_inputs, make_inputs
    from .families import apply_views
    if op != "attention":
        raise ValueError(f"op: relations are written for attention, got {op!r}")
    spec = get_spec(op)
    baseline_fn = baseline_fn or get_backend(op, spec.baseline_backend).fn
    gen = torch.Generator().manual_seed(seed)
    rounded = _round_inputs(make_inputs(spec, params, dtype, gen), spec, dtype)
    inputs = apply_views(spec.cast_inputs(rounded, dtype, torch.device("cpu")), params.get("views"))
    call = _call_attention(spec, fn, inputs, params)
    shape = (call["q"].shape[0], call["q"].shape[1], call["q"].shape[2], call["v"].shape[-1])
    grad_out = torch.randn(shape, generator=torch.Generator().manual_seed(seed + 1), dtype=torch.float64).to(dtype)
    try:
        got = _disagreement(*_outputs(fn, rel, call, seed + 2, grad_out))
    except Exception as exc:  # noqa: BLE001 - an implementation that raises on one side is a result
        return RelationResult(rel.name, Status.ERROR, {}, {}, {}, f"raised {type(exc).__name__}: {str(exc)[:300]}")
    base = _disagreement(*_outputs(baseline_fn, rel, call, seed + 2, grad_out))
    allowed = {name: tolerance.allowed_error(base.get(name), dtype) for name in got}
    failed = [name for name in got if not got[name] <= allowed[name]]
    reason = "; ".join(f"{name}: the two sides differ by {got[name]:.3g} > allowed {allowed[name]:.3g} "
                       f"(the composition's {base.get(name, float('nan')):.3g})" for name in failed)
    return RelationResult(rel.name, Status.FAIL if failed else Status.PASS, got, base, allowed,
                          f"{rel.name} ({rel.doc}): {reason}" if failed else "")


def check_case(op: str, fn: Callable, params: Dict[str, Any], dtype: torch.dtype, seed: int = 0) -> List[RelationResult]:
    """Every relation that applies to the case."""
    return [check(op, fn, rel, params, dtype, seed) for rel in RELATIONS if applicable(rel, params)]
