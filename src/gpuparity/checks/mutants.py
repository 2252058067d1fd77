# long file: the engine (~250 lines) and eight ops' catalogs of triggers and faults (version 1: four ops, version 2: three, version 3: cross_entropy), which read best side by side
"""Planted-bug implementations generated per op, to score the battery (a mutation score).

A mutant is the op's trusted plain composition (contracts/<op>.py) with one fault that acts only
where one trigger fires:

- a trigger is a predicate over the call's arguments, drawn from the op's dimensions (a size
  over a threshold or at a remainder mod a tile of 16/32/64/128, Sq == 1, Sq != Sk, a mask
  form, a dtype, a non-contiguous input, a group size, an argument's presence), with a `force`
  that moves a case's params into the trigger's region (so that its witnesses can be drawn);
- a fault is a kernel bug (a block of keys, rows or features dropped or repeated, an argument
  ignored, the wrong head or batch mapping, a non-contiguous input read as contiguous, a length
  off by one, a precision loss).

Each mutant is a callable with the op's --impl signature, loadable as a target:
`gpuparity check --op rms_norm --impl gpuparity.checks.mutants:rms_norm__width_mod64_eq1__drop_last_features`
(`<op>__<trigger>__<fault>`). `sample(op, seed, count)` draws a seeded set. A mutant whose
fault changes nothing beyond the tolerance on any of its witnesses (seeded random cases of the
op's argument space inside its trigger's region, judged against float64 as the battery judges)
is *ineffective* and counted apart (`effective`); `score` runs the op's battery at a level on
each mutant: killed / effective. The command line: benchmarks/scripts/mutation_score.py."""
from __future__ import annotations

import dataclasses
import inspect
import random
import time
import zlib
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

from .. import caches
from ..contracts import get_spec
from ..numerics import default_rms_eps

TILES = (16, 32, 64, 128)
MODULE = __name__
SEP = "__"


# --------------------------------------------------------------------------- triggers and faults
@dataclasses.dataclass(frozen=True)
class Trigger:
    """`fires(call)`: over the call's summary (OpMutants.summarize); `force(params, rng)`: params
    of a case moved into the trigger's region (None: cannot)."""
    name: str
    fires: Callable[[Dict[str, Any]], bool]
    force: Callable[[Dict[str, Any], random.Random], Optional[Dict[str, Any]]]


@dataclasses.dataclass(frozen=True)
class Fault:
    """`run(base, args)`: the faulty call; `base(args)` is the correct one on the bound arguments."""
    name: str
    run: Callable[[Callable[[Dict[str, Any]], torch.Tensor], Dict[str, Any]], torch.Tensor]


@dataclasses.dataclass(frozen=True)
class OpMutants:
    op: str
    base: Callable                               # the correct plain composition, op signature
    summarize: Callable[[Dict[str, Any]], Dict[str, Any]]
    triggers: Tuple[Trigger, ...]
    faults: Tuple[Fault, ...]
    space: Callable[[random.Random], Dict[str, Any]]   # a random case's params overrides (witnesses)
    settle: Callable[[Dict[str, Any]], Dict[str, Any]] = dict   # params made consistent after a force
    outputs: int = 1                             # tensors the op returns (residual_norm: out, new_residual)

    def trigger(self, name: str) -> Trigger:
        return _named(self.triggers, name, "trigger", self.op)

    def fault(self, name: str) -> Fault:
        return _named(self.faults, name, "fault", self.op)


def _named(items, name, what, op):
    for item in items:
        if item.name == name:
            return item
    raise ValueError(f"{what}: got {name!r}, which {op} does not have; expected one of "
                     f"{', '.join(i.name for i in items)}")


class Mutant:
    """The op's composition, with `fault` where `trigger` fires; counts the calls it fired on."""

    def __init__(self, family: OpMutants, trigger: Trigger, fault: Fault):
        self.family, self.trigger, self.fault = family, trigger, fault
        self.op = family.op
        self.name = f"{family.op}{SEP}{trigger.name}{SEP}{fault.name}"
        self.__name__ = self.name
        self.fired = 0
        self._signature = inspect.signature(family.base)

    @property
    def target(self) -> str:
        return f"{MODULE}:{self.name}"

    def bind(self, args, kwargs) -> Dict[str, Any]:
        bound = self._signature.bind(*args, **kwargs)
        bound.apply_defaults()
        return dict(bound.arguments)

    def fires(self, *args, **kwargs) -> bool:
        return bool(self.trigger.fires(self.family.summarize(self.bind(args, kwargs))))

    def __call__(self, *args, **kwargs):
        call = self.bind(args, kwargs)
        base = (lambda bound: self.family.base(**bound))
        if self.trigger.fires(self.family.summarize(call)):
            self.fired += 1
            return self.fault.run(base, call)
        return base(call)

    def __repr__(self) -> str:
        return f"Mutant({self.name})"


# --------------------------------------------------------------------------- shared pieces
def _contiguous(t: Optional[torch.Tensor]) -> bool:
    return t is None or t.is_contiguous()


def _as_if_contiguous(t: torch.Tensor) -> torch.Tensor:
    """`t` read as a kernel indexing it as contiguous would (the storage from its offset)."""
    if t.is_contiguous():
        return t
    return t.as_strided(t.shape, torch.empty(t.shape).stride(), t.storage_offset())


def _round_to(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return t.to(dtype).to(t.dtype)


def _mod(key: str, tile: int, rest: int):
    def fires(c):
        return c[key] % tile == rest

    def force(p, rng, key=key):
        return {**p, key: tile * rng.choice([1, 2]) + rest if rest else tile * rng.choice([1, 2, 3])}
    return f"{key.lower()}_mod{tile}_eq{rest}", fires, force


def _mods(key: str, remainders=lambda tile: (0, 1, tile - 1, tile // 2)):
    return [_mod(key, tile, rest) for tile in TILES for rest in sorted(set(remainders(tile)))]


def _over(key: str, limit: int, small: Dict[str, Any]):
    def fires(c):
        return c[key] > limit

    def force(p, rng):
        return {**p, **small, key: limit + rng.choice([1, 17, 64])}
    return f"{key.lower()}_gt{limit}", fires, force


def _triggers(specs) -> Tuple[Trigger, ...]:
    return tuple(Trigger(name, fires, force) for name, fires, force in specs)


# --------------------------------------------------------------------------- norms
def _norm_summary(op):
    def summarize(a):
        x, shape = a["x"], tuple(a["normalized_shape"]) if not isinstance(a["normalized_shape"], int) else (
            a["normalized_shape"],)
        width = 1
        for size in shape:
            width *= size
        weight, bias = a.get("weight"), a.get("bias")
        return dict(W=width, rows=x.numel() // max(width, 1), norm_dims=len(shape), dim=x.dim(), dtype=x.dtype,
                    x_contig=x.is_contiguous(), x_offset=x.storage_offset() != 0,
                    x_stride0=0 in x.stride(), weight=weight is not None, bias=bias is not None,
                    weight_contig=_contiguous(weight), eps=a.get("eps"),
                    spread=float(x.detach().float().std(dim=-1, unbiased=False).min())
                    if x.numel() and x.shape[-1] > 1 else 1.0,
                    mean=float(x.detach().float().mean(dim=-1).abs().max()) if x.numel() else 0.0)
    return summarize


def _set_width(p, width):
    shape = list(p["shape"])
    if p.get("norm_dims", 1) == 2 and len(shape) >= 2:
        shape[-2:] = [1, width]
    shape[-1] = width
    return {**p, "shape": tuple(shape)}


def _set_rows(p, rows):
    return {**p, "shape": (rows, p["shape"][-1]), "norm_dims": 1,
            "layout": "contiguous" if p.get("layout") == "transposed" else p.get("layout", "contiguous")}


def _norm_triggers(op):
    specs = []
    for name, fires, force in _mods("W", lambda tile: (0, 1, tile - 1, tile // 2)):
        specs.append((name, fires, (lambda p, rng, force=force: _set_width(p, force({"W": 0}, rng)["W"]))))
    for limit in (1024, 2048, 4096):
        specs.append((f"w_gt{limit}", (lambda c, limit=limit: c["W"] > limit),
                      (lambda p, rng, limit=limit: _set_rows(_set_width(p, limit + rng.choice([1, 63, 128])), 2))))
    for limit in (64, 128, 256):
        specs.append((f"rows_ge{limit}", (lambda c, limit=limit: c["rows"] >= limit),
                      (lambda p, rng, limit=limit: _set_width(_set_rows(p, limit + rng.choice([0, 1, 31])), 32))))
    specs += [
        ("rows_mod16_eq1", lambda c: c["rows"] % 16 == 1 and c["rows"] > 1,
         lambda p, rng: _set_rows(p, 16 * rng.choice([1, 2]) + 1)),
        ("rows_eq1", lambda c: c["rows"] == 1, lambda p, rng: _set_rows(p, 1)),
        ("w_odd", lambda c: c["W"] % 2 == 1, lambda p, rng: _set_width(p, 2 * rng.randint(2, 60) + 1)),
        ("w_lt16", lambda c: c["W"] < 16, lambda p, rng: _set_width(p, rng.randint(2, 15))),
        ("dtype_bf16", lambda c: c["dtype"] == torch.bfloat16, lambda p, rng: {**p, "_dtype": torch.bfloat16}),
        ("dtype_fp32", lambda c: c["dtype"] == torch.float32, lambda p, rng: {**p, "_dtype": torch.float32}),
        ("x_noncontig", lambda c: not c["x_contig"],
         lambda p, rng: rng.choice([{**p, "layout": "row_stride", "shape": (p["shape"][0], p["shape"][-1]),
                                     "norm_dims": 1},
                                    {**p, "views": {"x": rng.choice(["sliced", "transposed"])}}])),
        ("x_offset", lambda c: c["x_offset"], lambda p, rng: {**p, "views": {"x": "offset"}}),
        ("x_stride0", lambda c: c["x_stride0"], lambda p, rng: {**p, "views": {"x": "expanded"}}),
        ("no_weight", lambda c: not c["weight"], lambda p, rng: {**p, "affine": False}),
        ("weight_noncontig", lambda c: c["weight"] and not c["weight_contig"],
         lambda p, rng: {**p, "affine": True, "views": {"weight": "sliced"}}),
        ("eps_explicit", lambda c: c["eps"] is not None and c["eps"] != 1e-5,
         lambda p, rng: {**p, "eps": rng.choice([1e-3, 1e-2])}),
        ("two_norm_dims", lambda c: c["norm_dims"] >= 2,
         lambda p, rng: {**p, "shape": (rng.randint(1, 5), rng.randint(2, 7), rng.randint(3, 40)), "norm_dims": 2,
                         "layout": "contiguous"}),
        ("x_3d", lambda c: c["dim"] >= 3,
         lambda p, rng: {**p, "shape": (rng.randint(2, 5), rng.randint(2, 9), p["shape"][-1]), "norm_dims": 1,
                         "layout": "contiguous"}),
        ("near_constant_rows", lambda c: c["spread"] < 1e-2 * (c["mean"] + 1e-30),
         lambda p, rng: {**p, "offset": rng.choice([1.0, 5.0, 50.0]), "spread": rng.choice([1e-3, 1e-4])}),
        ("large_mean", lambda c: c["mean"] > 20.0, lambda p, rng: {**p, "offset": rng.choice([30.0, 100.0])}),
    ]
    if op == "layer_norm":
        specs.append(("no_bias", lambda c: not c["bias"], lambda p, rng: {**p, "affine": True, "bias": False}))
    return _triggers(specs)


def _norm_apply(op, a, y):
    """The composition's affine part on normalized y (in x's dtype)."""
    if a.get("weight") is not None:
        y = y * a["weight"]
    if op == "layer_norm" and a.get("bias") is not None:
        y = y + a["bias"]
    return y


def _norm_math(op, a, *, stats_cols=None, divisor_delta=0, stats_dtype=None, shift_rows=False, eps=None):
    """The composition's math with a fault in its statistics: computed over the first
    `stats_cols` features, divided by width + divisor_delta, from x rounded to stats_dtype, or
    taken from the row before (shift_rows)."""
    x = a["x"]
    shape = a["normalized_shape"]
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    width = 1
    for size in shape:
        width *= size
    xf = x.float().reshape(-1, width)
    if stats_dtype is not None:
        xs = _round_to(xf, stats_dtype)
    else:
        xs = xf
    cols = xs[:, :stats_cols] if stats_cols else xs
    n = cols.shape[-1] + divisor_delta
    if eps is None:
        eps = a.get("eps")
        if eps is None:
            eps = default_rms_eps(x.dtype) if op == "rms_norm" else 1e-5
    if op == "rms_norm":
        ms = cols.pow(2).sum(-1, keepdim=True) / n
        inv = torch.rsqrt(ms + eps)
        if shift_rows and inv.shape[0] > 1:
            inv = torch.cat([inv[:1], inv[:-1]])
        y = xf * inv
    else:
        mean = cols.sum(-1, keepdim=True) / n
        var = (cols - mean).pow(2).sum(-1, keepdim=True) / n
        inv = torch.rsqrt(var + eps)
        if shift_rows and inv.shape[0] > 1:
            mean, inv = torch.cat([mean[:1], mean[:-1]]), torch.cat([inv[:1], inv[:-1]])
        y = (xf - mean) * inv
    return _norm_apply(op, a, y.to(x.dtype).reshape(x.shape))


def _rows_op(fn):
    """A fault on the output's rows (the flattened leading dims)."""
    def run(base, a):
        out = base(a)
        return fn(out.reshape(-1, _width(a)), a).reshape(out.shape)
    return run


def _norm_faults(op):
    def with_arg(name, value):
        return lambda base, a: base({**a, name: value})

    def last_row_repeats(flat, a):
        return torch.cat([flat[:-1], flat[-2:-1]]) if flat.shape[0] > 1 else flat

    def last_row_unnormalized(flat, a):
        x = a["x"].reshape(flat.shape)
        return torch.cat([flat[:-1], x[-1:]])

    faults = [
        Fault("drop_last_features", lambda base, a: _norm_math(
            op, a, stats_cols=max(1, _width(a) - max(1, min(16, _width(a) // 4))))),
        Fault("drop_last_feature", lambda base, a: _norm_math(op, a, stats_cols=max(1, _width(a) - 1))),
        Fault("divisor_off_by_one", lambda base, a: _norm_math(op, a, divisor_delta=-1 if _width(a) > 1 else 1)),
        Fault("stats_from_row_before", lambda base, a: _norm_math(op, a, shift_rows=True)),
        Fault("stats_in_bf16", lambda base, a: _norm_math(op, a, stats_dtype=torch.bfloat16)),
        Fault("stats_in_fp16", lambda base, a: _norm_math(op, a, stats_dtype=torch.float16)),
        Fault("output_through_bf16", lambda base, a: _round_to(base(a), torch.bfloat16)),
        Fault("last_row_repeats", _rows_op(last_row_repeats)),
        Fault("last_row_unnormalized", _rows_op(last_row_unnormalized)),
        Fault("ignore_weight", with_arg("weight", None)),
        Fault("ignore_eps", lambda base, a: base({**a, "eps": None if op == "rms_norm" else 1e-5})),
        Fault("eps_squared_default", lambda base, a: _norm_math(op, a, eps=1e-10)),
        Fault("x_as_contiguous", lambda base, a: base({**a, "x": _as_if_contiguous(a["x"])})),
        Fault("weight_as_contiguous", lambda base, a: base(
            {**a, "weight": None if a.get("weight") is None else _as_if_contiguous(a["weight"])})),
    ]
    if op == "layer_norm":
        faults.append(Fault("ignore_bias", with_arg("bias", None)))
    return tuple(faults)


def _width(a) -> int:
    shape = a["normalized_shape"]
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    width = 1
    for size in shape:
        width *= size
    return width


NORM_WIDTHS = (3, 16, 17, 31, 32, 33, 48, 63, 64, 65, 96, 127, 128, 129, 150, 192, 255, 257)


def _norm_space(rng: random.Random) -> Dict[str, Any]:
    rows, width = rng.choice([1, 2, 4, 7, 16, 17, 33]), rng.choice(NORM_WIDTHS)
    p: Dict[str, Any] = dict(shape=(rows, width), norm_dims=1, affine=rng.random() < 0.8, bias=rng.random() < 0.8,
                             eps=rng.choice([None, None, 1e-3]), offset=rng.choice([0.0, 0.0, 3.0]),
                             spread=rng.choice([1.0, 1.0, 0.1]), layout="contiguous")
    shape_kind = rng.random()
    if shape_kind < 0.15:
        p.update(shape=(rng.randint(2, 4), rows, width))
    elif shape_kind < 0.25:
        p.update(shape=(rng.randint(2, 4), rng.randint(2, 6), rng.randint(3, 20)), norm_dims=2)
    elif shape_kind < 0.35:
        p.update(layout=rng.choice(["row_stride", "transposed"]))
    if rng.random() < 0.15:
        p["views"] = {rng.choice(["x", "weight"]): rng.choice(["offset", "sliced", "expanded"])}
    return p


def _composition(op: str) -> Callable:
    """The op's trusted plain composition, through the backend registry (checks/ reaches a
    contract only through the registries)."""
    from ..dispatch import get as get_backend
    return get_backend(op, "composition").fn


def _norm_base(op):
    composition = _composition(op)
    if op == "rms_norm":
        def rms_norm(x, normalized_shape, weight=None, eps=None):
            return composition(x, normalized_shape, weight, eps)
        return rms_norm

    def layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5):
        return composition(x, normalized_shape, weight, bias, eps)
    return layer_norm


# --------------------------------------------------------------------------- rotary
def _rotary_summary(a):
    x, cos, offsets, cu = a["x"], a["cos"], a.get("seqlen_offsets", 0), a.get("cu_seqlens")
    varlen = cu is not None
    S = int(a.get("max_seqlen") or 0) if varlen else x.shape[1]
    return dict(B=(cu.numel() - 1) if varlen else x.shape[0], S=S, H=x.shape[-2], D=x.shape[-1],
                rd=cos.shape[-1] * 2, interleaved=bool(a.get("interleaved")), varlen=varlen,
                offsets_tensor=isinstance(offsets, torch.Tensor),
                offsets_int=not isinstance(offsets, torch.Tensor) and int(offsets) != 0,
                dtype=x.dtype, x_contig=x.is_contiguous(), x_offset=x.storage_offset() != 0,
                x_stride0=0 in x.stride(), cos_contig=cos.is_contiguous() and a["sin"].is_contiguous(),
                bhsd=(not varlen and x.dim() == 4 and x.stride(2) > x.stride(1)))


def _rotary_triggers():
    specs = []
    small = {"varlen": None}
    for name, fires, force in _mods("S"):
        specs.append((name, fires, (lambda p, rng, force=force: {**p, **small, "B": min(p["B"], 2), "H": 1,
                                                                  "S": force({"S": 0}, rng)["S"]})))
    for limit in (64, 128, 1024):
        specs.append(_over("S", limit, {"varlen": None, "B": 1, "H": 1, "D": 16, "rotary_dim": None}))
    specs += [
        ("s_eq1", lambda c: c["S"] == 1, lambda p, rng: {**p, "varlen": None, "S": 1}),
        ("d_eq128", lambda c: c["D"] == 128, lambda p, rng: {**p, "D": 128, "rotary_dim": rng.choice([None, 64])}),
        ("d_ge128", lambda c: c["D"] >= 128, lambda p, rng: {**p, "D": rng.choice([128, 160, 256]), "rotary_dim": None}),
        ("d_mod32_ne0", lambda c: c["D"] % 32 != 0, lambda p, rng: {**p, "D": rng.choice([40, 48, 80, 96 + 16]),
                                                                    "rotary_dim": None}),
        ("partial_rotary", lambda c: c["rd"] < c["D"],
         lambda p, rng: {**p, "D": 64, "rotary_dim": rng.choice([16, 24, 32])}),
        ("rd_mod32_ne0", lambda c: c["rd"] % 32 != 0, lambda p, rng: {**p, "D": 64, "rotary_dim": rng.choice([16, 24, 40])}),
        ("interleaved", lambda c: c["interleaved"], lambda p, rng: {**p, "interleaved": True}),
        ("half_split", lambda c: not c["interleaved"], lambda p, rng: {**p, "interleaved": False}),
        ("offsets_tensor", lambda c: c["offsets_tensor"],
         lambda p, rng: {**p, "offsets": [rng.randint(0, 9) for _ in range(max(p["B"], 2))], "B": max(p["B"], 2)}),
        ("offsets_int", lambda c: c["offsets_int"], lambda p, rng: {**p, "offsets": rng.randint(1, 9)}),
        ("varlen", lambda c: c["varlen"],
         lambda p, rng: {**p, "varlen": [rng.randint(1, 20) for _ in range(rng.randint(2, 5))], "views": None,
                         "layout": "bshd"}),
        ("b_ge3", lambda c: c["B"] >= 3, lambda p, rng: {**p, "B": rng.randint(3, 6)}),
        ("h_ge4", lambda c: c["H"] >= 4, lambda p, rng: {**p, "H": rng.randint(4, 6)}),
        ("h_odd", lambda c: c["H"] % 2 == 1, lambda p, rng: {**p, "H": rng.choice([1, 3, 5])}),
        ("dtype_bf16", lambda c: c["dtype"] == torch.bfloat16, lambda p, rng: {**p, "_dtype": torch.bfloat16}),
        ("dtype_fp32", lambda c: c["dtype"] == torch.float32, lambda p, rng: {**p, "_dtype": torch.float32}),
        ("x_noncontig", lambda c: not c["x_contig"],
         lambda p, rng: rng.choice([{**p, "varlen": None, "layout": "bhsd"},
                                    {**p, "views": {"x": rng.choice(["sliced", "transposed"])}}])),
        ("x_bhsd", lambda c: c["bhsd"], lambda p, rng: {**p, "varlen": None, "layout": "bhsd"}),
        ("x_offset", lambda c: c["x_offset"], lambda p, rng: {**p, "views": {"x": "offset"}}),
        ("cos_noncontig", lambda c: not c["cos_contig"],
         lambda p, rng: {**p, "views": {rng.choice(["cos", "sin"]): "sliced"}}),
    ]
    return _triggers(specs)


def _rotary_faults():
    def with_arg(name, fn):
        return lambda base, a: base({**a, name: fn(a)})

    def last_position_unrotated(base, a):
        out, x = base(a), a["x"]
        if a.get("cu_seqlens") is not None or x.shape[1] < 2:
            return torch.cat([out[:-1], x[-1:]]) if out.shape[0] > 1 else out
        return torch.cat([out[:, :-1], x[:, -1:]], dim=1)

    def last_head_reads_head0(base, a):
        x = a["x"]
        if x.shape[-2] < 2:
            return base(a)
        return base({**a, "x": torch.cat([x[..., :-1, :], x[..., :1, :]], dim=-2)})

    def table_shift(t):
        return torch.cat([t[1:], t[-1:]]) if t.shape[0] > 1 else t

    def last_freq_unrotated(base, a):
        cos, sin = a["cos"], a["sin"]
        return base({**a, "cos": torch.cat([cos[:, :-1], torch.ones_like(cos[:, -1:])], -1),
                     "sin": torch.cat([sin[:, :-1], torch.zeros_like(sin[:, -1:])], -1)})

    def passthrough_zeroed(base, a):
        out = base(a)
        rd = a["cos"].shape[-1] * 2
        return torch.cat([out[..., :rd], torch.zeros_like(out[..., rd:])], -1)

    def batch0_offsets(a):
        offsets = a.get("seqlen_offsets", 0)
        return offsets[:1].expand_as(offsets).contiguous() if isinstance(offsets, torch.Tensor) else offsets

    def cu_off_by_one(a):
        cu = a.get("cu_seqlens")
        if cu is None or cu.numel() < 3:
            return cu
        moved = cu.clone()
        moved[1:-1] = torch.minimum(moved[1:-1] + 1, moved[2:])
        return moved

    def precision(base, a):
        return base({**a, **{name: _round_to(a[name], torch.bfloat16) for name in ("x", "cos", "sin")}})

    return (
        Fault("ignore_offsets", with_arg("seqlen_offsets", lambda a: 0)),
        Fault("batch0_offsets", with_arg("seqlen_offsets", batch0_offsets)),
        Fault("positions_off_by_one", lambda base, a: base({**a, "cos": table_shift(a["cos"]),
                                                            "sin": table_shift(a["sin"])})),
        Fault("last_position_unrotated", last_position_unrotated),
        Fault("last_head_reads_head0", last_head_reads_head0),
        Fault("last_freq_unrotated", last_freq_unrotated),
        Fault("flip_interleaved", with_arg("interleaved", lambda a: not a.get("interleaved"))),
        Fault("passthrough_zeroed", passthrough_zeroed),
        Fault("x_as_contiguous", with_arg("x", lambda a: _as_if_contiguous(a["x"]))),
        Fault("cos_as_contiguous", lambda base, a: base({**a, "cos": _as_if_contiguous(a["cos"]),
                                                         "sin": _as_if_contiguous(a["sin"])})),
        Fault("cu_seqlens_off_by_one", with_arg("cu_seqlens", cu_off_by_one)),
        Fault("inputs_through_bf16", precision),
        Fault("output_through_bf16", lambda base, a: _round_to(base(a), torch.bfloat16)),
    )


def _rotary_space(rng: random.Random) -> Dict[str, Any]:
    B = rng.choice([1, 2, 3])
    D = rng.choice([16, 32, 40, 64, 128])
    p: Dict[str, Any] = dict(B=B, S=rng.choice([1, 7, 16, 17, 33, 64, 65]), H=rng.choice([1, 2, 3, 4]), D=D,
                             rotary_dim=rng.choice([None, None, D // 2 if (D // 2) % 2 == 0 else None]),
                             interleaved=rng.random() < 0.5,
                             offsets=rng.choice([0, 0, 3, [rng.randint(0, 9) for _ in range(B)]]),
                             varlen=None, layout=rng.choice(["bshd", "bshd", "bhsd"]))
    if rng.random() < 0.2:
        p.update(varlen=[rng.randint(1, 20) for _ in range(rng.randint(2, 4))], layout="bshd")
    if rng.random() < 0.15:
        p["views"] = {rng.choice(["x", "cos", "sin"]): rng.choice(["offset", "sliced"])}
    return p


def _rotary_settle(p: Dict[str, Any]) -> Dict[str, Any]:
    """Offsets per sequence: as many as the packed sequences (varlen) or the batch."""
    p = dict(p)
    count = len(p["varlen"]) if p.get("varlen") else p["B"]
    if isinstance(p.get("offsets"), list):
        p["offsets"] = (list(p["offsets"]) + [1] * count)[:count]
    if p.get("varlen"):
        p["B"] = count
    return p


def _rotary_base():
    rotary_composition = _composition("rotary")

    def rotary(x, cos, sin, *, interleaved=False, seqlen_offsets=0, cu_seqlens=None, max_seqlen=None):
        return rotary_composition(x, cos, sin, interleaved=interleaved, seqlen_offsets=seqlen_offsets,
                                  cu_seqlens=cu_seqlens, max_seqlen=max_seqlen)
    return rotary


# --------------------------------------------------------------------------- attention
def _attention_summary(a):
    q, k, v, mask, kpm = a["q"], a["k"], a["v"], a.get("attn_mask"), a.get("key_padding_mask")
    B, H, Sq, D = q.shape
    Hkv, Sk = k.shape[1], k.shape[-2]
    scale = a.get("scale")
    scale = D ** -0.5 if scale is None else scale
    with torch.no_grad():
        peak = float(q.detach().float().norm(dim=-1).max() * k.detach().float().norm(dim=-1).max()) * abs(scale) \
            if q.numel() and k.numel() else 0.0
    mask_bool = mask is not None and mask.dtype == torch.bool
    return dict(B=B, H=H, Hkv=Hkv, group=H // max(Hkv, 1), Sq=Sq, Sk=Sk, D=D, dtype=q.dtype,
                mask=("none" if mask is None else "bool" if mask_bool else "float"), kpm=kpm is not None,
                mask_heads_bcast=mask is not None and (mask.dim() < 3 or mask.shape[-3] == 1),
                mask_batch=mask is not None and mask.dim() == 4 and mask.shape[0] > 1,
                all_true=mask_bool and bool(mask.all()),
                empty_row=(mask_bool and bool((~mask.any(-1)).any())) or (kpm is not None and bool(kpm.all(-1).any())),
                causal=bool(a.get("is_causal")), scale_given=a.get("scale") is not None,
                window=a.get("window") is not None, softcap=a.get("softcap") is not None,
                alibi=a.get("alibi_slopes") is not None, peak=peak,
                q_contig=q.is_contiguous(), k_contig=k.is_contiguous(), v_contig=v.is_contiguous(),
                bshd=q.dim() == 4 and q.stride(1) < q.stride(2))


def _attention_triggers():
    specs = []
    for key in ("Sk", "Sq"):
        for name, fires, force in _mods(key):
            specs.append((name, fires, (lambda p, rng, force=force, key=key: _attn_small(
                {**p, key: force({key: 0}, rng)[key]}, rng, keep=key))))
    for limit in (512, 1024, 4096):
        specs.append(("sk_gt%d" % limit, lambda c, limit=limit: c["Sk"] > limit,
                      lambda p, rng, limit=limit: {**p, "Sk": limit + rng.choice([1, 64, 100]),
                                                   "Sq": rng.choice([1, 8, 16]), "B": 1, "H": 1, "Hkv": 1,
                                                   "mask": rng.choice(["none", "key_padding"]), "lengths": None,
                                                   "alibi": None}))
    for limit in (256, 1024):
        specs.append(("sq_gt%d" % limit, lambda c, limit=limit: c["Sq"] > limit,
                      lambda p, rng, limit=limit: {**p, "Sq": limit + rng.choice([1, 64, 100]),
                                                   "Sk": rng.choice([16, 33, 64]), "B": 1, "H": 1, "Hkv": 1,
                                                   "alibi": None}))

    def heads(H, Hkv):
        return lambda p, rng: {**p, "H": H, "Hkv": Hkv}
    specs += [
        ("sq_eq1", lambda c: c["Sq"] == 1, lambda p, rng: {**p, "Sq": 1, "Sk": p["Sk"] if p["Sk"] > 1 else 37,
                                                            "window": None}),
        ("sq_lt_sk", lambda c: c["Sq"] < c["Sk"], lambda p, rng: {**p, "Sq": rng.randint(1, 20), "Sk": rng.randint(21, 90)}),
        ("sq_gt_sk", lambda c: c["Sq"] > c["Sk"], lambda p, rng: {**p, "Sq": rng.randint(21, 90), "Sk": rng.randint(2, 20)}),
        ("sq_eq_sk", lambda c: c["Sq"] == c["Sk"], lambda p, rng: {**p, "Sk": p["Sq"]}),
        ("gqa", lambda c: c["H"] != c["Hkv"], lambda p, rng: {**p, **rng.choice([dict(H=4, Hkv=2), dict(H=6, Hkv=2),
                                                                                  dict(H=4, Hkv=1)])}),
        ("group_eq2", lambda c: c["group"] == 2, heads(4, 2)),
        ("group_ge3", lambda c: c["group"] >= 3, lambda p, rng: {**p, **rng.choice([dict(H=6, Hkv=2), dict(H=4, Hkv=1),
                                                                                     dict(H=3, Hkv=1)])}),
        ("mqa", lambda c: c["Hkv"] == 1 and c["H"] > 1, heads(4, 1)),
        ("b_ge3", lambda c: c["B"] >= 3, lambda p, rng: {**p, "B": rng.randint(3, 5)}),
        ("b_eq1", lambda c: c["B"] == 1, lambda p, rng: {**p, "B": 1}),
        ("h_ge4", lambda c: c["H"] >= 4, lambda p, rng: {**p, "H": 4, "Hkv": rng.choice([4, 2, 1])}),
        ("d_eq64", lambda c: c["D"] == 64, lambda p, rng: {**p, "D": 64}),
        ("d_eq128", lambda c: c["D"] == 128, lambda p, rng: {**p, "D": 128}),
        ("d_ge128", lambda c: c["D"] >= 128, lambda p, rng: {**p, "D": rng.choice([128, 160, 256])}),
        ("d_not_pow2", lambda c: c["D"] & (c["D"] - 1) != 0, lambda p, rng: {**p, "D": rng.choice([40, 48, 80, 96])}),
        ("d_lt32", lambda c: c["D"] < 32, lambda p, rng: {**p, "D": rng.choice([8, 16])}),
        ("dtype_bf16", lambda c: c["dtype"] == torch.bfloat16, lambda p, rng: {**p, "_dtype": torch.bfloat16}),
        ("dtype_fp32", lambda c: c["dtype"] == torch.float32, lambda p, rng: {**p, "_dtype": torch.float32}),
        ("bool_mask", lambda c: c["mask"] == "bool", lambda p, rng: {**p, "mask": rng.choice(["bool", "bool+key_padding"])}),
        ("float_mask", lambda c: c["mask"] == "float", lambda p, rng: {**p, "mask": "float"}),
        ("key_padding", lambda c: c["kpm"], lambda p, rng: {**p, "mask": rng.choice(["key_padding", "bool+key_padding"])}),
        ("any_mask", lambda c: c["kpm"] or c["mask"] != "none",
         lambda p, rng: {**p, "mask": rng.choice(["key_padding", "bool", "float"])}),
        ("no_mask", lambda c: not c["kpm"] and c["mask"] == "none", lambda p, rng: {**p, "mask": "none"}),
        ("mask_heads_bcast", lambda c: c["mask_heads_bcast"],
         lambda p, rng: {**p, "mask": rng.choice(["bool", "float"]), "mask_shape": rng.choice(["b1qk", "qk", "11qk"])}),
        ("mask_per_batch", lambda c: c["mask_batch"],
         lambda p, rng: {**p, "B": max(p["B"], 2), "mask": rng.choice(["bool", "float"]),
                         "mask_shape": rng.choice(["b1qk", "bhqk"])}),
        ("all_true_mask", lambda c: c["all_true"], lambda p, rng: {**p, "mask": "bool", "mask_fill": "all_true"}),
        ("empty_row", lambda c: c["empty_row"],
         lambda p, rng: rng.choice([{**p, "mask": "bool", "empty_rows": 1, "mask_fill": "random"},
                                    {**p, "mask": "key_padding", "B": 2, "lengths": [p["Sk"], 0]}])),
        ("causal", lambda c: c["causal"], lambda p, rng: {**p, "causal": True}),
        ("causal_sq_ne_sk", lambda c: c["causal"] and c["Sq"] != c["Sk"],
         lambda p, rng: {**p, "causal": True, "Sq": rng.randint(2, 30), "Sk": rng.randint(31, 70)}),
        ("causal_with_mask", lambda c: c["causal"] and (c["kpm"] or c["mask"] != "none"),
         lambda p, rng: {**p, "causal": True, "mask": rng.choice(["key_padding", "bool", "float"])}),
        ("scale_given", lambda c: c["scale_given"], lambda p, rng: {**p, "scale": rng.choice([0.3, 0.05, 1.5])}),
        ("window", lambda c: c["window"], lambda p, rng: {**p, "window": rng.choice([(7, 3), (4, 0), (0, 5)])}),
        ("softcap", lambda c: c["softcap"], lambda p, rng: {**p, "softcap": rng.choice([5.0, 20.0])}),
        ("alibi", lambda c: c["alibi"], lambda p, rng: {**p, "alibi": rng.choice(["head", "batch"])}),
        ("large_logits", lambda c: c["peak"] > 40.0, lambda p, rng: {**p, "logit_scale": 30.0}),
        ("q_noncontig", lambda c: not c["q_contig"],
         lambda p, rng: rng.choice([{**p, "layout": rng.choice(["bshd", "sliced"])}, {**p, "views": {"q": "sliced"}}])),
        ("k_noncontig", lambda c: not c["k_contig"],
         lambda p, rng: rng.choice([{**p, "layout": "bshd"}, {**p, "views": {"k": rng.choice(["sliced", "transposed"])}}])),
        ("v_noncontig", lambda c: not c["v_contig"],
         lambda p, rng: rng.choice([{**p, "layout": "sliced"}, {**p, "views": {"v": rng.choice(["sliced", "transposed",
                                                                                                  "expanded"])}}])),
        ("bshd_layout", lambda c: c["bshd"], lambda p, rng: {**p, "layout": "bshd"}),
    ]
    return _triggers(specs)


def _attn_small(p, rng, keep):
    """A size-trigger's witness: the other length small, few heads (cheap on a CPU)."""
    other = "Sq" if keep == "Sk" else "Sk"
    return {**p, other: rng.choice([1, 7, 16, 33]) if other == "Sq" else rng.choice([16, 33, 64]), "H": 2,
            "Hkv": rng.choice([1, 2])}


def _fold_alibi(a):
    contract = get_spec("attention")._contract()   # its ALiBi bias, as the battery folds it for the composition
    alibi_bias, with_alibi = contract.alibi_bias, contract.with_alibi
    slopes = a.get("alibi_slopes")
    if slopes is None:
        return a
    dtype = torch.float64 if a["q"].dtype == torch.float64 else torch.float32
    bias = alibi_bias(slopes, a["q"].shape[-2], a["k"].shape[-2], dtype)
    return {**a, "attn_mask": with_alibi(a.get("attn_mask"), bias), "alibi_slopes": None}


def _attention_faults():
    def with_arg(name, fn=lambda a: None):
        return lambda base, a: base({**a, name: fn(a)})

    def drop_last_keys(base, a):
        a = _fold_alibi(a)
        Sk = a["k"].shape[-2]
        if Sk < 2:
            return base(a)
        keep = Sk - min(16, Sk - 1)
        mask, kpm = a.get("attn_mask"), a.get("key_padding_mask")
        if mask is not None and mask.shape[-1] > 1:
            mask = mask[..., :keep]
        if kpm is not None:
            kpm = kpm[:, :keep]
        return base({**a, "k": a["k"][..., :keep, :], "v": a["v"][..., :keep, :], "attn_mask": mask,
                     "key_padding_mask": kpm})

    def last_key_repeats(base, a):
        k, v = a["k"], a["v"]
        if k.shape[-2] < 2:
            return base(a)
        return base({**a, "k": torch.cat([k[..., :-1, :], k[..., -2:-1, :]], -2),
                     "v": torch.cat([v[..., :-1, :], v[..., -2:-1, :]], -2)})

    def last_query_repeats(base, a):
        out = base(a)
        if out.shape[-2] < 2:
            return out
        return torch.cat([out[..., :-1, :], out[..., -2:-1, :]], -2)

    def last_features_zeroed(base, a):
        out = base(a)
        cut = max(1, min(8, out.shape[-1] // 4))
        return torch.cat([out[..., :-cut], torch.zeros_like(out[..., -cut:])], -1)

    def gqa_modulo(base, a):
        q, k, v = a["q"], a["k"], a["v"]
        group = q.shape[1] // k.shape[1]
        if group == 1:
            return base(a)
        return base({**a, "k": k.repeat(1, group, 1, 1), "v": v.repeat(1, group, 1, 1)})

    def item2_reads_item1(base, a):
        k, v = a["k"], a["v"]
        if k.shape[0] < 3:
            return base(a)
        return base({**a, "k": torch.cat([k[:2], k[1:2].expand_as(k[2:])]),
                     "v": torch.cat([v[:2], v[1:2].expand_as(v[2:])])})

    def mask_batch0(base, a):
        mask, kpm = a.get("attn_mask"), a.get("key_padding_mask")
        if mask is not None and mask.dim() == 4 and mask.shape[0] > 1:
            mask = mask[:1].expand_as(mask)
        if kpm is not None and kpm.shape[0] > 1:
            kpm = kpm[:1].expand_as(kpm)
        return base({**a, "attn_mask": mask, "key_padding_mask": kpm})

    def causal_off_by_one(base, a):
        if not a.get("is_causal"):
            return base(a)
        Sq, Sk = a["q"].shape[-2], a["k"].shape[-2]
        band = torch.ones(Sq, Sk, dtype=torch.bool, device=a["q"].device).tril(diagonal=1)
        a = _fold_alibi(a)
        mask = a.get("attn_mask")
        if mask is None:
            mask = band
        elif mask.dtype == torch.bool:
            mask = mask & band
        else:
            mask = mask.masked_fill(~band, float("-inf"))
        return base({**a, "attn_mask": mask, "is_causal": False})

    def padding_off_by_one(a):
        kpm = a.get("key_padding_mask")
        if kpm is None:
            return None
        first = (~kpm).sum(-1).clamp(max=kpm.shape[-1] - 1)  # the first padded key becomes valid
        return kpm & (torch.arange(kpm.shape[-1], device=kpm.device).view(1, -1) != first.view(-1, 1))

    def window_off_by_one(a):
        window = a.get("window")
        return None if window is None else (window[0] + 1, window[1])

    def precision(base, a):
        return base({**a, **{name: _round_to(a[name], torch.bfloat16) for name in ("q", "k", "v")}})

    return (
        Fault("drop_last_keys", drop_last_keys),
        Fault("last_key_repeats", last_key_repeats),
        Fault("last_query_repeats", last_query_repeats),
        Fault("last_features_zeroed", last_features_zeroed),
        Fault("ignore_attn_mask", with_arg("attn_mask")),
        Fault("ignore_key_padding", with_arg("key_padding_mask")),
        Fault("ignore_causal", with_arg("is_causal", lambda a: False)),
        Fault("ignore_scale", with_arg("scale")),
        Fault("ignore_window", with_arg("window")),
        Fault("ignore_softcap", with_arg("softcap")),
        Fault("ignore_alibi", with_arg("alibi_slopes")),
        Fault("gqa_modulo_heads", gqa_modulo),
        Fault("item2_reads_item1", item2_reads_item1),
        Fault("mask_of_item0", mask_batch0),
        Fault("causal_off_by_one", causal_off_by_one),
        Fault("padding_off_by_one", with_arg("key_padding_mask", padding_off_by_one)),
        Fault("window_off_by_one", with_arg("window", window_off_by_one)),
        Fault("v_as_contiguous", with_arg("v", lambda a: _as_if_contiguous(a["v"]))),
        Fault("qk_as_contiguous", lambda base, a: base({**a, "q": _as_if_contiguous(a["q"]),
                                                        "k": _as_if_contiguous(a["k"])})),
        Fault("inputs_through_bf16", precision),
        Fault("output_through_bf16", lambda base, a: _round_to(base(a), torch.bfloat16)),
        Fault("scale_one_over_d", lambda base, a: base({**a, "scale": a["q"].shape[-1] ** -1.0
                                                        if a.get("scale") is None else a["scale"]})),
    )


ATTN_SIZES = (1, 7, 15, 16, 17, 31, 32, 33, 48, 63, 64, 65, 96, 127, 128, 129)


def _attention_space(rng: random.Random) -> Dict[str, Any]:
    H, Hkv = rng.choice([(1, 1), (2, 2), (2, 1), (4, 2), (4, 1), (3, 3)])
    B = rng.choice([1, 2, 3])
    Sq, Sk = rng.choice(ATTN_SIZES), rng.choice(ATTN_SIZES[1:])
    p: Dict[str, Any] = dict(B=B, H=H, Hkv=Hkv, Sq=Sq, Sk=Sk, D=rng.choice([16, 32, 40, 64, 128]),
                             mask=rng.choice(["none", "none", "key_padding", "bool", "float", "bool+key_padding"]),
                             mask_shape=rng.choice(["b1qk", "bhqk", "qk", "11qk", "1h1k"]),
                             causal=rng.random() < 0.3, scale=rng.choice([None, None, 0.3]),
                             layout=rng.choice(["bhsd", "bhsd", "bshd", "sliced"]),
                             window=rng.choice([None, None, None, (7, 3)]), softcap=rng.choice([None, None, 20.0]),
                             alibi=rng.choice([None, None, None, "head"]), empty_rows=rng.choice([0, 1]),
                             logit_scale=rng.choice([1.0, 1.0, 1.0, 30.0]))
    p["lengths"] = [rng.randint(0, Sk) for _ in range(B)] if "key_padding" in p["mask"] else None
    if rng.random() < 0.15:
        p["views"] = {rng.choice(["q", "k", "v"]): rng.choice(["offset", "sliced", "transposed"])}
    return p


def _attention_base():
    composition = _composition("attention")

    def attention(q, k, v, *, attn_mask=None, key_padding_mask=None, is_causal=False, scale=None, window=None,
                  softcap=None, alibi_slopes=None):
        a = _fold_alibi(dict(q=q, k=k, v=v, attn_mask=attn_mask, alibi_slopes=alibi_slopes))
        return composition(q, k, v, attn_mask=a["attn_mask"], key_padding_mask=key_padding_mask,
                           is_causal=is_causal, scale=scale, window=window, softcap=softcap)
    return attention


# --------------------------------------------------------------------------- the catalog
_CATALOG: Dict[str, OpMutants] = caches.register("checks.mutants.catalog", {})
FROZEN_OPS = ("rms_norm", "layer_norm", "rotary", "attention")          # version 1: frozen at 496617f
V2_OPS = ("attention_varlen", "attention_decode", "residual_norm")      # version 2: frozen at c2beead
V3_OPS = ("cross_entropy",)                                              # version 3 (below)
OPS = FROZEN_OPS + V2_OPS + V3_OPS


def catalog(op: str) -> OpMutants:
    """Every trigger and fault of `op`."""
    if op not in OPS:
        raise ValueError(f"op: expected one of {', '.join(OPS)} (mutants exist for these), got {op!r}")
    if op not in _CATALOG:
        if op in ("rms_norm", "layer_norm"):
            family = OpMutants(op, _norm_base(op), _norm_summary(op), _norm_triggers(op), _norm_faults(op),
                               _norm_space)
        elif op == "rotary":
            family = OpMutants(op, _rotary_base(), _rotary_summary, _rotary_triggers(), _rotary_faults(),
                               _rotary_space, _rotary_settle)
        elif op == "attention":
            family = OpMutants(op, _attention_base(), _attention_summary, _attention_triggers(), _attention_faults(),
                               _attention_space)
        elif op in V2_OPS:
            family = _v2_family(op)
        else:
            family = _v3_family(op)
        _CATALOG[op] = family
    return _CATALOG[op]


def mutant(name: str) -> Mutant:
    """The mutant named `<op>__<trigger>__<fault>`."""
    parts = name.split(SEP)
    if len(parts) != 3:
        raise ValueError(f"mutant: expected '<op>{SEP}<trigger>{SEP}<fault>', got {name!r}")
    family = catalog(parts[0])
    return Mutant(family, family.trigger(parts[1]), family.fault(parts[2]))


def sample(op: str, seed: int, count: int) -> List[Mutant]:
    """`count` distinct (trigger, fault) mutants of `op`, drawn by `seed` (the same seed, the same set)."""
    family = catalog(op)
    pairs = [(t, f) for t in family.triggers for f in family.faults]
    rng = random.Random(zlib.crc32(f"mutants/{op}/{seed}".encode()))
    chosen = rng.sample(pairs, min(count, len(pairs)))
    return [Mutant(family, t, f) for t, f in chosen]


def __getattr__(name: str):
    """`gpuparity.checks.mutants:<op>__<trigger>__<fault>` as an --impl target."""
    if SEP in name and name.split(SEP)[0] in OPS:
        try:
            return mutant(name)
        except ValueError as exc:
            raise AttributeError(str(exc)) from None
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# --------------------------------------------------------------------------- effectiveness and score
@dataclasses.dataclass
class Judged:
    name: str
    effective: bool
    killed: Optional[bool] = None        # None: the battery was not run on it
    witnesses: int = 0                   # witnesses on which the trigger fired
    detail: str = ""                     # a witness that exposed it, or the check that killed it
    seconds: float = 0.0
    by_witness: bool = False             # effective by its witnesses (else only by the battery's kill)


def witnesses(m: Mutant, count: int, seed: int = 0, tries: int = 60) -> List[Tuple[Dict[str, Any], torch.dtype]]:
    """Up to `count` (params, dtype) cases of the op's argument space, forced into the mutant's
    trigger region, on which the trigger fires."""
    spec = get_spec(m.op)
    rng = random.Random(zlib.crc32(f"witness/{m.name}/{seed}".encode()))
    found = []
    for _ in range(tries):
        if len(found) >= count:
            break
        forced = m.trigger.force(m.family.space(rng), rng)
        if forced is None:
            continue
        forced = dict(forced)
        dtype = forced.pop("_dtype", None) or rng.choice([torch.float32, torch.float32, torch.bfloat16])
        params = spec.normalize(m.family.settle(spec.make_case("witness", **forced).params))
        if params is None:
            continue
        calls = call_summaries(m.family, spec, params, dtype, rng.randrange(2 ** 31))
        if calls and any(m.trigger.fires(call) for call in calls):
            found.append((params, dtype))
    return found


def _inputs_and_call(spec, fn, params, dtype, seed):
    """Call fn on the case's inputs as the battery would (values, rounding, cast, views)."""
    from .execute import _round_inputs, make_inputs
    from .families import apply_views
    gen = torch.Generator().manual_seed(seed)
    rounded = _round_inputs(make_inputs(spec, params, dtype, gen), spec, dtype)
    inputs = apply_views(spec.cast_inputs(rounded, dtype, torch.device("cpu")), params.get("views"))
    return spec.call(fn, inputs, params)


def call_summaries(family: OpMutants, spec, params, dtype, seed) -> Optional[List[Dict[str, Any]]]:
    """The summaries (OpMutants.summarize) of the calls a check of `params` makes to the
    implementation (None: the op's contract rejects the case)."""
    signature = inspect.signature(family.base)
    calls = []

    def probe(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        calls.append(family.summarize(dict(bound.arguments)))
        return args[0] if family.outputs == 1 else (args[0],) * family.outputs
    try:
        _inputs_and_call(spec, probe, params, dtype, seed)
    except Exception:  # noqa: BLE001 - a case the op's contract rejects is no witness
        return None
    return calls


def effective(m: Mutant, count: int = 8, seed: int = 0) -> Tuple[bool, int, str]:
    """(whether the fault changes a result beyond the tolerance on some witness, witnesses run,
    what the first such witness failed with). Stops at the first witness that exposes it."""
    from .execute import run_case
    from .results import Status
    from ..dispatch import get as get_backend
    spec = get_spec(m.op)
    baseline = get_backend(m.op, spec.baseline_backend).fn
    cases = witnesses(m, count, seed)
    for number, (params, dtype) in enumerate(cases):
        try:
            status, _, reason = run_case(m.op, m, params, dtype, torch.device("cpu"), 1000 + number, baseline)
        except Exception:  # noqa: BLE001 - the referee rejected the case: no witness
            continue
        if status not in (Status.PASS, Status.SKIP):
            return True, number + 1, f"{status.value} {reason[:160]}"
    return False, len(cases), ""


@dataclasses.dataclass
class BatteryCalls:
    """The battery's plan of `--impl` checks of an op at a level and seed, and the summaries of
    the calls each check makes (computed once per op: a trigger is a function of them)."""
    op: str
    level: str
    seed: int
    tasks: list
    calls: Dict[int, List[Dict[str, Any]]]

    @classmethod
    def plan(cls, op: str, level: str = "default", seed: int = 0) -> "BatteryCalls":
        from .execute import dtype_from_name
        from .plan import plan
        family = catalog(op)
        placeholder = f"{MODULE}:{op}{SEP}{family.triggers[0].name}{SEP}{family.faults[0].name}"
        tasks, _ = plan([op], level, "cpu", impl=placeholder, seed=seed)
        spec = get_spec(op)
        calls = {task.id: call_summaries(family, spec, task.params, dtype_from_name(task.dtype), task.seed) or []
                 for task in tasks}
        return cls(op, level, seed, tasks, calls)

    def fired(self, m: Mutant) -> list:
        """The tasks on whose calls the mutant's trigger fires, as checks of the mutant (on the
        others it computes the op's composition, the battery's baseline, exactly: they pass)."""
        return [dataclasses.replace(task, impl=m.target, backend=f"impl:{m.target}") for task in self.tasks
                if any(m.trigger.fires(call) for call in self.calls[task.id])]


def killed_by_battery(m: Mutant, battery: BatteryCalls) -> Tuple[bool, str, int]:
    """(whether the op's battery fails the mutant, the first check that did, checks run). The
    checks are the battery's plan for `--impl <mutant>` (plan.plan, pool.run_tasks in-process),
    smallest first, stopping at the first failure; checks where the trigger does not fire are
    not run (the mutant computes the baseline composition there, bit for bit)."""
    from .pool import run_tasks
    spec = get_spec(m.op)
    tasks = sorted(battery.fired(m), key=lambda t: (spec.work(t.params) or 0, t.id))
    for number, task in enumerate(tasks):
        result = run_tasks([task], isolate=False)[0]
        if result.status.bad:
            return True, f"{result.case}/{result.dtype}: {result.status.value} {result.reason[:120]}", number + 1
    return False, "", len(tasks)


def judge(m: Mutant, battery: BatteryCalls, witness_count: int = 8) -> Judged:
    """Whether the battery kills the mutant, and whether it is effective: the battery failed it
    (a battery case is an input where its trigger fires and the fault shows), or else one of
    `witness_count` witnesses exposes it."""
    started = time.monotonic()
    killed, where, _ = killed_by_battery(m, battery)
    exposed, count, detail = (False, 0, "") if killed else effective(m, witness_count, battery.seed)
    judged = Judged(m.name, exposed or killed, killed=killed, witnesses=count, detail=where or detail,
                    by_witness=exposed)
    judged.seconds = time.monotonic() - started
    return judged


def score(judged: Sequence[Judged]) -> Dict[str, Any]:
    eff = [j for j in judged if j.effective]
    return dict(mutants=len(judged), effective=len(eff), ineffective=len(judged) - len(eff),
                killed=sum(1 for j in eff if j.killed), killed_ineffective=sum(1 for j in judged
                                                                                 if not j.effective and j.killed),
                survivors=[j.name for j in eff if not j.killed], seconds=sum(j.seconds for j in judged))


# =========================================================================== version 2
# attention_varlen, attention_decode and residual_norm (added after the first four ops' part
# above was frozen at 496617f; this part was frozen before anything was tuned on it: the commit
# is recorded in benchmarks/records/cpu/mutation-score-2026-12-06.md). The same engine:
# triggers over the call's arguments drawn from the op's dimensions (cu_seqlens' lengths at tile
# remainders, a sequence of length 1 or 0, Sq vs Sk per sequence, the number of sequences, cache
# lengths at tile and page remainders, Sq == 1, the page size, the residual's dtype,
# residual_in_fp32, rowscale, ...) x faults (a block of keys, rows or features dropped or
# repeated, a length or boundary off by one, the wrong page or slot, an argument ignored, a
# precision loss).


def _lens(cu: torch.Tensor) -> List[int]:
    bounds = cu.tolist()
    return [end - start for start, end in zip(bounds, bounds[1:])]


def _any_mod(lens, tile, rest):
    return any(n > 0 and n % tile == rest for n in lens)


def _size_mods(prefix: str, key: str, force_one):
    """Triggers "<prefix>_mod<tile>_eq<rest>": some length in summary[key] (a list) at that remainder."""
    specs = []
    for tile in TILES:
        for rest in sorted({0, 1, tile - 1, tile // 2}):
            size_of = (lambda rng, tile=tile, rest=rest: tile * rng.choice([1, 2]) + rest if rest
                       else tile * rng.choice([1, 2, 3]))
            specs.append((f"{prefix}_mod{tile}_eq{rest}",
                          (lambda c, tile=tile, rest=rest: _any_mod(c[key], tile, rest)),
                          (lambda p, rng, size_of=size_of: force_one(p, size_of(rng), rng))))
    return specs


def _heads_triggers():
    return [
        ("gqa", lambda c: c["H"] != c["Hkv"], lambda p, rng: {**p, **rng.choice([dict(H=4, Hkv=2), dict(H=6, Hkv=2),
                                                                                  dict(H=4, Hkv=1)])}),
        ("group_ge3", lambda c: c["group"] >= 3, lambda p, rng: {**p, **rng.choice([dict(H=6, Hkv=2), dict(H=3, Hkv=1)])}),
        ("mqa", lambda c: c["Hkv"] == 1 and c["H"] > 1, lambda p, rng: {**p, "H": 4, "Hkv": 1}),
        ("h_ge4", lambda c: c["H"] >= 4, lambda p, rng: {**p, "H": 4, "Hkv": rng.choice([4, 2, 1])}),
        ("scale_given", lambda c: c["scale_given"], lambda p, rng: {**p, "scale": rng.choice([0.3, 0.05, 1.5])}),
        ("softcap", lambda c: c["softcap"], lambda p, rng: {**p, "softcap": rng.choice([5.0, 20.0])}),
        ("alibi", lambda c: c["alibi"], lambda p, rng: {**p, "alibi": rng.choice(["head", "batch"])}),
        ("large_logits", lambda c: c["peak"] > 40.0, lambda p, rng: {**p, "logit_scale": 30.0}),
    ] + [(name, (lambda c, test=test: test(c["D"])), (lambda p, rng, sizes=sizes: {**p, "D": rng.choice(sizes)}))
         for name, test, sizes in HEAD_DIM_TRIGGERS] + [
        (f"dtype_{label}", (lambda c, dtype=dtype: c["dtype"] == dtype), (lambda p, rng, dtype=dtype: {**p, "_dtype": dtype}))
        for label, dtype in (("bf16", torch.bfloat16), ("fp32", torch.float32))]


HEAD_DIM_TRIGGERS = (("d_eq128", lambda D: D == 128, [128]), ("d_ge128", lambda D: D >= 128, [128, 160, 256]),
                     ("d_not_pow2", lambda D: D & (D - 1) != 0, [40, 48, 80, 96]), ("d_lt32", lambda D: D < 32, [8, 16]))


def _peak(q, k, scale):
    if not q.numel() or not k.numel():
        return 0.0
    with torch.no_grad():
        return float(q.detach().float().norm(dim=-1).max() * k.detach().float().norm(dim=-1).max()) * abs(scale)


# --------------------------------------------------------------------------- attention_varlen
def _varlen_summary(a):
    q, k, v = a["q"], a["k"], a["v"]
    q_lens, k_lens = _lens(a["cu_seqlens_q"]), _lens(a["cu_seqlens_k"])
    H, D, Hkv = q.shape[1], q.shape[2], k.shape[1]
    scale = a.get("scale")
    pairs = list(zip(q_lens, k_lens))
    return dict(n=len(q_lens), q_lens=q_lens, k_lens=k_lens, max_q=max(q_lens, default=0),
                max_k=max(k_lens, default=0), H=H, Hkv=Hkv, group=H // max(Hkv, 1), D=D, dtype=q.dtype,
                causal=bool(a.get("causal")), window=a.get("window") is not None, softcap=a.get("softcap") is not None,
                scale_given=scale is not None, alibi=a.get("alibi_slopes") is not None,
                cu64=a["cu_seqlens_q"].dtype == torch.int64,
                peak=_peak(q, k, D ** -0.5 if scale is None else scale),
                q_contig=q.is_contiguous(), k_contig=k.is_contiguous(), v_contig=v.is_contiguous(),
                sq_lt_sk=any(0 < m < n for m, n in pairs), sq_gt_sk=any(m > n > 0 for m, n in pairs),
                empty_q=any(m == 0 for m in q_lens), empty_k=any(n == 0 < m for m, n in pairs),
                len1=any(m == 1 for m in q_lens), all_q1=bool(q_lens) and all(m == 1 for m in q_lens),
                longest_not_first=bool(q_lens) and q_lens[0] < max(q_lens))


def _varlen_set(p, side, value, rng):
    """Sequence 0 of `side` ("q" or "k") given `value` tokens; the other side of it small or equal."""
    q_lens, k_lens = list(p["q_lens"]), list(p["k_lens"])
    other = rng.choice([value, rng.choice([1, 7, 16, 33])])
    if side == "q":
        q_lens[0], k_lens[0] = value, other
    else:
        k_lens[0], q_lens[0] = value, rng.choice([1, 7, 16, 33])
    return {**p, "q_lens": q_lens, "k_lens": k_lens, "H": min(p["H"], 2), "Hkv": min(p["Hkv"], p["H"], 2)
            if p["H"] % min(p["Hkv"], 2) == 0 else 1, "layout": "packed"}


def _varlen_triggers():
    specs = _size_mods("q_len", "q_lens", lambda p, v, rng: _varlen_set(p, "q", v, rng))
    specs += _size_mods("k_len", "k_lens", lambda p, v, rng: _varlen_set(p, "k", v, rng))
    for limit in (256, 1024):
        specs.append((f"max_k_gt{limit}", (lambda c, limit=limit: c["max_k"] > limit),
                      (lambda p, rng, limit=limit: {**p, "q_lens": [rng.choice([1, 8, 16]), 3],
                                                    "k_lens": [limit + rng.choice([1, 64, 100]), 5], "H": 1, "Hkv": 1,
                                                    "layout": "packed", "alibi": None})))
    specs.append(("max_q_gt256", lambda c: c["max_q"] > 256,
                  lambda p, rng: {**p, "q_lens": [256 + rng.choice([1, 64, 100]), 3], "k_lens": [rng.choice([16, 64]), 5],
                                  "H": 1, "Hkv": 1, "layout": "packed", "alibi": None}))
    specs += [
        ("one_sequence", lambda c: c["n"] == 1,
         lambda p, rng: {**p, "q_lens": p["q_lens"][:1], "k_lens": p["k_lens"][:1]}),
        ("sequences_ge3", lambda c: c["n"] >= 3,
         lambda p, rng: {**p, "q_lens": [rng.randint(1, 40) for _ in range(4)], "k_lens": [rng.randint(1, 40) for _ in range(4)]}),
        ("sequences_ge6", lambda c: c["n"] >= 6,
         lambda p, rng: {**p, "q_lens": [rng.randint(0, 12) for _ in range(7)], "k_lens": [rng.randint(1, 12) for _ in range(7)]}),
        ("seq_len1", lambda c: c["len1"],
         lambda p, rng: {**p, "q_lens": [1] + list(p["q_lens"][1:]) if len(p["q_lens"]) > 1 else [1, 9],
                         "k_lens": list(p["k_lens"]) if len(p["k_lens"]) > 1 else [p["k_lens"][0], 9]}),
        ("all_q_len1", lambda c: c["all_q1"], lambda p, rng: {**p, "q_lens": [1] * len(p["q_lens"]), "layout": "packed"}),
        ("empty_q_seq", lambda c: c["empty_q"],
         lambda p, rng: {**p, "q_lens": list(p["q_lens"]) + [0], "k_lens": list(p["k_lens"]) + [rng.randint(1, 9)],
                         "layout": "packed"}),
        ("empty_k_seq", lambda c: c["empty_k"],
         lambda p, rng: {**p, "q_lens": [rng.randint(1, 9)] + list(p["q_lens"]), "k_lens": [0] + list(p["k_lens"]),
                         "layout": "packed"}),
        ("sq_lt_sk", lambda c: c["sq_lt_sk"],
         lambda p, rng: {**p, "q_lens": [rng.randint(1, 20), 9], "k_lens": [rng.randint(21, 90), 9], "layout": "packed"}),
        ("sq_gt_sk", lambda c: c["sq_gt_sk"],
         lambda p, rng: {**p, "q_lens": [rng.randint(21, 90), 9], "k_lens": [rng.randint(1, 20), 9], "layout": "packed"}),
        ("longest_not_first", lambda c: c["longest_not_first"],
         lambda p, rng: {**p, "q_lens": [5, rng.randint(20, 70)], "k_lens": [rng.randint(3, 30), rng.randint(20, 70)]}),
        ("causal", lambda c: c["causal"], lambda p, rng: {**p, "causal": True}),
        ("causal_sq_ne_sk", lambda c: c["causal"] and (c["sq_lt_sk"] or c["sq_gt_sk"]),
         lambda p, rng: {**p, "causal": True, "q_lens": [rng.randint(2, 30), 9], "k_lens": [rng.randint(31, 70), 4],
                         "layout": "packed"}),
        ("window", lambda c: c["window"], lambda p, rng: {**p, "window": rng.choice([[7, 3], [4, 0], [0, 5]])}),
        ("cu_int64", lambda c: c["cu64"], lambda p, rng: {**p, "cu_dtype": "int64"}),
        ("q_noncontig", lambda c: not c["q_contig"],
         lambda p, rng: rng.choice([{**p, "layout": "qkv_view"}, {**p, "views": {"q": rng.choice(["sliced", "transposed"])}}])),
        ("k_noncontig", lambda c: not c["k_contig"],
         lambda p, rng: rng.choice([{**p, "layout": "qkv_view"}, {**p, "views": {"k": rng.choice(["sliced", "transposed"])}}])),
        ("v_noncontig", lambda c: not c["v_contig"],
         lambda p, rng: rng.choice([{**p, "layout": "qkv_view"}, {**p, "views": {"v": rng.choice(["sliced", "transposed"])}}])),
    ]
    specs += _heads_triggers()
    return _triggers(specs)


def _varlen_with_keys(a, keep):
    """The call with each sequence b's keys cut to its first keep(b, q_len, k_len) (cu_seqlens_k rebuilt)."""
    q_lens, k_lens = _lens(a["cu_seqlens_q"]), _lens(a["cu_seqlens_k"])
    starts = a["cu_seqlens_k"].tolist()
    index, kept = [], []
    for b, (m, n) in enumerate(zip(q_lens, k_lens)):
        count = max(0, min(n, keep(b, m, n)))
        index += range(starts[b], starts[b] + count)
        kept.append(count)
    index = torch.tensor(index, dtype=torch.long, device=a["k"].device)
    cu = torch.tensor([0] + kept, dtype=torch.long).cumsum(0).to(a["cu_seqlens_k"].dtype)
    return {**a, "k": a["k"].index_select(0, index), "v": a["v"].index_select(0, index), "cu_seqlens_k": cu,
            "max_seqlen_k": max(kept, default=0)}


def _varlen_rows(a, out, fn):
    """out with fn(rows, b) applied to each sequence b's rows (q_len, H, D)."""
    starts = a["cu_seqlens_q"].tolist()
    pieces = [fn(out[s:e], b) for b, (s, e) in enumerate(zip(starts, starts[1:]))]
    return torch.cat(pieces) if pieces else out


def _varlen_each(a, base, replace):
    """Sequence by sequence: replace(b, call of that sequence alone) -> its rows, or None: the composition's."""
    cq, ck = a["cu_seqlens_q"].tolist(), a["cu_seqlens_k"].tolist()
    slopes = a.get("alibi_slopes")
    pieces = []
    for b in range(len(cq) - 1):
        (qs, qe), (ks, ke) = cq[b:b + 2], ck[b:b + 2]
        one = {**a, "q": a["q"][qs:qe], "k": a["k"][ks:ke], "v": a["v"][ks:ke],
               "cu_seqlens_q": a["cu_seqlens_q"].new_tensor([0, qe - qs]),
               "cu_seqlens_k": a["cu_seqlens_k"].new_tensor([0, ke - ks]), "max_seqlen_q": qe - qs,
               "max_seqlen_k": ke - ks}
        if slopes is not None and slopes.dim() == 2 and slopes.shape[0] > 1:
            one["alibi_slopes"] = slopes[b:b + 1]
        rows = replace(b, one) if qe > qs else None
        pieces.append(base(one) if rows is None else rows)
    return torch.cat(pieces) if pieces else base(a)


def _varlen_faults():
    def with_arg(name, fn=lambda a: None):
        return lambda base, a: base({**a, name: fn(a)})

    def cu_shift(cu):
        if cu.numel() < 3:
            return cu
        moved = cu.clone()
        moved[1:-1] = torch.minimum(moved[1:-1] + 1, moved[2:])
        return moved

    def last_row_repeats(base, a):
        return _varlen_rows(a, base(a), lambda rows, b: torch.cat([rows[:-1], rows[-2:-1]]) if rows.shape[0] > 1
                            else rows)

    def last_sequence_unwritten(base, a):
        n = a["cu_seqlens_q"].numel() - 1
        return _varlen_rows(a, base(a), lambda rows, b: torch.zeros_like(rows) if b == n - 1 and n > 1 else rows)

    def longest_row_unwritten(base, a):   # the grid sized from max_seqlen_q - 1
        longest = int(a["max_seqlen_q"])
        return _varlen_rows(a, base(a), lambda rows, b: torch.cat([rows[:-1], torch.zeros_like(rows[-1:])])
                            if rows.shape[0] == longest and longest > 0 else rows)

    def causal_top_left(base, a):
        if not a.get("causal") or a.get("window") is not None or a.get("alibi_slopes") is not None:
            return base(a)
        dense = _composition("attention")

        def top_left(b, one):
            m, n = one["q"].shape[0], one["k"].shape[0]
            if m == n or n == 0:
                return None
            q, k, v = (t.transpose(0, 1).unsqueeze(0) for t in (one["q"], one["k"], one["v"]))
            if q.shape[1] != k.shape[1]:
                group = q.shape[1] // k.shape[1]
                k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
            mask = torch.ones(m, n, dtype=torch.bool, device=q.device).tril()
            kwargs = {"softcap": one["softcap"]} if one.get("softcap") is not None else {}
            return dense(q, k, v, attn_mask=mask, scale=one.get("scale"), **kwargs)[0].transpose(0, 1)
        return _varlen_each(a, base, top_left)

    def empty_keys_read_next(base, a):
        k_lens = _lens(a["cu_seqlens_k"])
        ck = a["cu_seqlens_k"].tolist()

        def read_next(b, one):
            if k_lens[b] or b + 1 >= len(k_lens) or not k_lens[b + 1]:
                return None
            ks, ke = ck[b + 1], ck[b + 2]
            return base({**one, "k": a["k"][ks:ke], "v": a["v"][ks:ke],
                         "cu_seqlens_k": one["cu_seqlens_k"].new_tensor([0, ke - ks]), "max_seqlen_k": ke - ks})
        return _varlen_each(a, base, read_next)

    def gqa_modulo(base, a):
        group = a["q"].shape[1] // a["k"].shape[1]
        if group == 1:
            return base(a)
        return base({**a, "k": a["k"].repeat(1, group, 1), "v": a["v"].repeat(1, group, 1)})

    def window_off_by_one(a):
        window = a.get("window")
        return None if window is None else (window[0] + 1, window[1])

    def precision(base, a):
        return base({**a, **{name: _round_to(a[name], torch.bfloat16) for name in ("q", "k", "v")}})

    def last_features_zeroed(base, a):
        out = base(a)
        cut = max(1, min(8, out.shape[-1] // 4))
        return torch.cat([out[..., :-cut], torch.zeros_like(out[..., -cut:])], -1)

    return (
        Fault("drop_last_keys", lambda base, a: base(_varlen_with_keys(a, lambda b, m, n: n - min(16, n - 1)))),
        Fault("partial_key_tile_dropped", lambda base, a: base(_varlen_with_keys(
            a, lambda b, m, n: n - n % 16 if n > 16 else n))),
        Fault("key_length_off_by_one", lambda base, a: base(_varlen_with_keys(a, lambda b, m, n: n - 1 if n > 1 else n))),
        Fault("keys_capped_at_max_seqlen_q", lambda base, a: base(_varlen_with_keys(
            a, lambda b, m, n: min(n, max(1, int(a["max_seqlen_q"])))))),
        Fault("cu_k_off_by_one", with_arg("cu_seqlens_k", lambda a: cu_shift(a["cu_seqlens_k"]))),
        Fault("cu_q_off_by_one", with_arg("cu_seqlens_q", lambda a: cu_shift(a["cu_seqlens_q"]))),
        Fault("last_row_repeats", last_row_repeats),
        Fault("last_sequence_unwritten", last_sequence_unwritten),
        Fault("longest_row_unwritten", longest_row_unwritten),
        Fault("causal_top_left", causal_top_left),
        Fault("empty_keys_read_next", empty_keys_read_next),
        Fault("ignore_causal", with_arg("causal", lambda a: False)),
        Fault("ignore_scale", with_arg("scale")),
        Fault("ignore_window", with_arg("window")),
        Fault("window_off_by_one", with_arg("window", window_off_by_one)),
        Fault("ignore_softcap", with_arg("softcap")),
        Fault("ignore_alibi", with_arg("alibi_slopes")),
        Fault("gqa_modulo_heads", gqa_modulo),
        Fault("v_as_contiguous", with_arg("v", lambda a: _as_if_contiguous(a["v"]))),
        Fault("qk_as_contiguous", lambda base, a: base({**a, "q": _as_if_contiguous(a["q"]),
                                                        "k": _as_if_contiguous(a["k"])})),
        Fault("inputs_through_bf16", precision),
        Fault("output_through_bf16", lambda base, a: _round_to(base(a), torch.bfloat16)),
        Fault("last_features_zeroed", last_features_zeroed),
        Fault("scale_one_over_d", lambda base, a: base({**a, "scale": a["q"].shape[-1] ** -1.0
                                                        if a.get("scale") is None else a["scale"]})),
    )


VARLEN_SIZES = (0, 1, 1, 5, 7, 16, 17, 31, 32, 33, 48, 63, 64, 65, 96, 127, 128, 129)


def _varlen_space(rng: random.Random) -> Dict[str, Any]:
    n = rng.choice([1, 2, 2, 3, 5])
    H, Hkv = rng.choice([(1, 1), (2, 2), (2, 1), (4, 2), (4, 1), (3, 3)])
    q_lens = [rng.choice(VARLEN_SIZES[1:]) if i == 0 else rng.choice(VARLEN_SIZES) for i in range(n)]
    k_lens = [m if rng.random() < 0.5 else rng.choice(VARLEN_SIZES[1:]) for m in q_lens]
    p: Dict[str, Any] = dict(q_lens=q_lens, k_lens=k_lens, H=H, Hkv=Hkv, D=rng.choice([16, 32, 40, 64, 128]),
                             causal=rng.random() < 0.4, window=rng.choice([None, None, None, [7, 3], [16, 0]]),
                             softcap=rng.choice([None, None, 20.0]), scale=rng.choice([None, None, 0.3]),
                             logit_scale=rng.choice([1.0, 1.0, 1.0, 30.0]), cu_dtype=rng.choice(["int32", "int64"]),
                             layout=rng.choice(["packed"] * 6 + ["qkv_view"]), alibi=rng.choice([None, None, None, "head"]))
    if rng.random() < 0.15:
        p["views"] = {rng.choice(["q", "k", "v"]): rng.choice(["offset", "sliced", "transposed"])}
    return p


def _varlen_settle(p: Dict[str, Any]) -> Dict[str, Any]:
    """k_lens as many as q_lens; the one-buffer layout's k and v are q's tokens and heads; a
    window no wider than the longest sequence; a first sequence with tokens."""
    p = dict(p)
    q_lens, k_lens = list(p["q_lens"]), list(p["k_lens"])
    k_lens = (k_lens + q_lens[len(k_lens):])[:len(q_lens)]
    if p.get("layout") == "qkv_view":
        k_lens, p["Hkv"] = list(q_lens), p["H"]
    if p["H"] % p["Hkv"]:
        p["Hkv"] = 1
    if max(q_lens + [0]) == 0:
        q_lens[0] = 1
    p["q_lens"], p["k_lens"] = q_lens, k_lens
    if p.get("window") is not None:
        longest = max(q_lens + k_lens)
        p["window"] = [min(int(w), longest) for w in p["window"]]
    return p


def _varlen_base():
    composition = _composition("attention_varlen")

    def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, causal=False,
                         window=None, softcap=None, scale=None, alibi_slopes=None):
        return composition(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=causal,
                           window=window, softcap=softcap, scale=scale, alibi_slopes=alibi_slopes)
    return attention_varlen


# --------------------------------------------------------------------------- attention_decode
def _decode_summary(a):
    q, k_cache, table = a["q"], a["k_cache"], a.get("block_table")
    B, H, Sq, D = q.shape
    paged = table is not None
    page = k_cache.shape[2] if paged else None
    s_max = table.shape[1] * page if paged else k_cache.shape[2]
    lengths = [min(max(int(n), 0), s_max) for n in a["cache_seqlens"].tolist()]
    scale = a.get("scale")
    return dict(B=B, H=H, Hkv=k_cache.shape[1], group=H // max(k_cache.shape[1], 1), Sq=Sq, D=D, S_max=s_max,
                lengths=lengths, max_len=max(lengths, default=0), dtype=q.dtype, paged=paged, page=page,
                softcap=a.get("softcap") is not None, scale_given=scale is not None,
                alibi=a.get("alibi_slopes") is not None, seqlens64=a["cache_seqlens"].dtype == torch.int64,
                peak=_peak(q, k_cache, D ** -0.5 if scale is None else scale),
                q_contig=q.is_contiguous(), cache_contig=k_cache.is_contiguous() and a["v_cache"].is_contiguous(),
                len0=0 in lengths, len_lt_sq=any(0 < n < Sq for n in lengths), len_full=s_max in lengths,
                page_edge=paged and any(n > 0 and n % page == 0 for n in lengths),
                page_partial=paged and any(n > page and n % page for n in lengths))


def _decode_set(p, value, rng):
    lengths = list(p.get("lengths") or [p["S_max"]])[:max(1, min(p["B"], 3))]
    lengths[0] = value
    return {**p, "B": len(lengths), "lengths": lengths, "S_max": max(value, max(lengths)) + rng.choice([0, 0, 7]),
            "H": min(p["H"], 4), "Hkv": min(p["Hkv"], p["H"], 4) if min(p["H"], 4) % min(p["Hkv"], 4) == 0 else 1}


def _decode_triggers():
    specs = _size_mods("len", "lengths", _decode_set)
    for limit in (512, 2048):
        specs.append((f"len_gt{limit}", (lambda c, limit=limit: c["max_len"] > limit),
                      (lambda p, rng, limit=limit: _decode_set({**p, "B": 1, "H": 2, "Hkv": 1},
                                                               limit + rng.choice([1, 64, 100]), rng))))

    def paged(p, rng, page=None):
        page = page or rng.choice([1, 5, 16, 64])
        return {**p, "page": page, "S_max": max(p["S_max"], 2 * page + 3)}
    specs += [
        ("sq_eq1", lambda c: c["Sq"] == 1, lambda p, rng: {**p, "Sq": 1}),
        ("sq_ge2", lambda c: c["Sq"] >= 2, lambda p, rng: {**p, "Sq": rng.randint(2, 8)}),
        ("sq_ge8", lambda c: c["Sq"] >= 8, lambda p, rng: {**p, "Sq": rng.randint(8, 16)}),
        ("len_zero", lambda c: c["len0"], lambda p, rng: {**p, "B": max(p["B"], 2), "lengths": [p["S_max"], 0]}),
        ("len_lt_sq", lambda c: c["len_lt_sq"],
         lambda p, rng: {**p, "Sq": rng.randint(3, 8), "B": max(p["B"], 2), "lengths": [p["S_max"], rng.randint(1, 2)]}),
        ("len_full", lambda c: c["len_full"], lambda p, rng: {**p, "lengths": [p["S_max"]] + list(p.get("lengths") or [])[1:]}),
        ("b_ge3", lambda c: c["B"] >= 3, lambda p, rng: {**p, "B": rng.randint(3, 5), "lengths": None}),
        ("b_eq1", lambda c: c["B"] == 1, lambda p, rng: {**p, "B": 1, "lengths": [rng.randint(1, p["S_max"])]}),
        ("paged", lambda c: c["paged"], paged),
        ("page_lt16", lambda c: c["paged"] and c["page"] < 16, lambda p, rng: paged(p, rng, rng.choice([1, 5, 7]))),
        ("page_ge64", lambda c: c["paged"] and c["page"] >= 64, lambda p, rng: paged(p, rng, rng.choice([64, 128]))),
        ("page_not_pow2", lambda c: c["paged"] and c["page"] & (c["page"] - 1) != 0,
         lambda p, rng: paged(p, rng, rng.choice([5, 7, 24]))),
        ("len_on_page_edge", lambda c: c["page_edge"],
         lambda p, rng: (lambda q: {**q, "lengths": [2 * q["page"]] + list(q.get("lengths") or [])[1:]})(
             paged({**p, "S_max": max(p["S_max"], 40)}, rng, rng.choice([5, 16])))),
        ("len_partial_page", lambda c: c["page_partial"],
         lambda p, rng: (lambda q: {**q, "lengths": [q["page"] + 1 + rng.randint(0, q["page"] - 2 if q["page"] > 2 else 0)]
                                    + list(q.get("lengths") or [])[1:]})(paged({**p, "S_max": max(p["S_max"], 40)},
                                                                                rng, rng.choice([5, 16])))),
        ("seqlens_int64", lambda c: c["seqlens64"], lambda p, rng: {**p, "seqlens_dtype": "int64"}),
        ("q_noncontig", lambda c: not c["q_contig"], lambda p, rng: {**p, "views": {"q": rng.choice(["sliced", "transposed"])}}),
        ("cache_noncontig", lambda c: not c["cache_contig"],
         lambda p, rng: rng.choice([{**p, "layout": "bshd"},
                                    {**p, "page": None, "views": {rng.choice(["k_cache", "v_cache"]): "sliced"}}])),
    ]
    specs += _heads_triggers()
    return _triggers(specs)


def _decode_faults():
    def with_arg(name, fn=lambda a: None):
        return lambda base, a: base({**a, name: fn(a)})

    def s_max(a):
        table = a.get("block_table")
        return table.shape[1] * a["k_cache"].shape[2] if table is not None else a["k_cache"].shape[2]

    def lengths(fn):
        def moved(a):
            n = a["cache_seqlens"].long().clamp(0, s_max(a))
            return fn(n, a).clamp(0, s_max(a)).to(a["cache_seqlens"].dtype)
        return with_arg("cache_seqlens", moved)

    def per_query(visible):
        """Query i of each item sees visible(L, Sq, i) keys (the correct count: L - Sq + 1 + i)."""
        def run(base, a):
            q, n = a["q"], a["cache_seqlens"].long()
            rows = []
            for i in range(q.shape[2]):
                seen = visible(n, q.shape[2], i).clamp(0, s_max(a)).to(a["cache_seqlens"].dtype)
                rows.append(base({**a, "q": q[:, :, i:i + 1], "cache_seqlens": seen}))
            return torch.cat(rows, dim=2)
        return run

    def paged_only(fn):
        return lambda base, a: base(a) if a.get("block_table") is None else fn(base, a)

    def table_shift(base, a):
        table = a["block_table"]
        return base({**a, "block_table": torch.roll(table, -1, dims=1) if table.shape[1] > 1 else table})

    def slot_shift(base, a):
        return base({**a, "k_cache": torch.roll(a["k_cache"], -1, dims=2), "v_cache": torch.roll(a["v_cache"], -1, dims=2)})

    def ignore_table(base, a):
        table = a["block_table"]
        flat = torch.arange(table.numel(), device=table.device).clamp(max=a["k_cache"].shape[0] - 1)
        return base({**a, "block_table": flat.view(table.shape).to(table.dtype)})

    def item2_reads_item1(base, a):
        if a["q"].shape[0] < 3:
            return base(a)
        table = a.get("block_table")
        if table is not None:
            return base({**a, "block_table": torch.cat([table[:2], table[1:2].expand_as(table[2:])])})
        k, v = a["k_cache"], a["v_cache"]
        return base({**a, "k_cache": torch.cat([k[:2], k[1:2].expand_as(k[2:])]),
                     "v_cache": torch.cat([v[:2], v[1:2].expand_as(v[2:])])})

    def gqa_modulo(base, a):
        group = a["q"].shape[1] // a["k_cache"].shape[1]
        if group == 1:
            return base(a)
        return base({**a, "k_cache": a["k_cache"].repeat(1, group, 1, 1), "v_cache": a["v_cache"].repeat(1, group, 1, 1)})

    def precision(base, a):
        return base({**a, **{name: _round_to(a[name], torch.bfloat16) for name in ("q", "k_cache", "v_cache")}})

    def last_query_repeats(base, a):
        out = base(a)
        return torch.cat([out[..., :-1, :], out[..., -2:-1, :]], -2) if out.shape[-2] > 1 else out

    def last_features_zeroed(base, a):
        out = base(a)
        cut = max(1, min(8, out.shape[-1] // 4))
        return torch.cat([out[..., :-cut], torch.zeros_like(out[..., -cut:])], -1)

    return (
        Fault("length_minus_one", lengths(lambda n, a: n - 1)),
        Fault("length_plus_one", lengths(lambda n, a: n + 1)),
        Fault("partial_tile_dropped", lengths(lambda n, a: torch.where(n > 16, n - n % 16, n))),
        Fault("partial_page_dropped", lengths(lambda n, a: n if a.get("block_table") is None else torch.where(
            n > a["k_cache"].shape[2], n - n % a["k_cache"].shape[2], n))),
        Fault("lengths_of_item0", lengths(lambda n, a: n[:1].expand_as(n))),
        Fault("empty_cache_reads_key0", lengths(lambda n, a: n.clamp(min=1))),
        Fault("new_queries_see_all_keys", per_query(lambda n, sq, i: n)),
        Fault("query_position_off_by_one", per_query(lambda n, sq, i: n - sq + 2 + i)),
        Fault("page_table_off_by_one", paged_only(table_shift)),
        Fault("page_slot_off_by_one", paged_only(slot_shift)),
        Fault("ignore_block_table", paged_only(ignore_table)),
        Fault("item2_reads_item1", item2_reads_item1),
        Fault("ignore_scale", with_arg("scale")),
        Fault("ignore_softcap", with_arg("softcap")),
        Fault("ignore_alibi", with_arg("alibi_slopes")),
        Fault("scale_one_over_d", lambda base, a: base({**a, "scale": a["q"].shape[-1] ** -1.0
                                                        if a.get("scale") is None else a["scale"]})),
        Fault("gqa_modulo_heads", gqa_modulo),
        Fault("cache_as_contiguous", lambda base, a: base({**a, "k_cache": _as_if_contiguous(a["k_cache"]),
                                                           "v_cache": _as_if_contiguous(a["v_cache"])})),
        Fault("q_as_contiguous", with_arg("q", lambda a: _as_if_contiguous(a["q"]))),
        Fault("inputs_through_bf16", precision),
        Fault("output_through_bf16", lambda base, a: _round_to(base(a), torch.bfloat16)),
        Fault("last_query_repeats", last_query_repeats),
        Fault("last_features_zeroed", last_features_zeroed),
    )


DECODE_LENGTHS = (0, 1, 2, 7, 16, 17, 31, 32, 33, 63, 64, 65, 100, 127, 128, 129)


def _decode_space(rng: random.Random) -> Dict[str, Any]:
    B = rng.choice([1, 2, 3, 4])
    H, Hkv = rng.choice([(1, 1), (2, 2), (2, 1), (4, 2), (4, 1), (6, 3), (8, 2)])
    lengths = [rng.choice(DECODE_LENGTHS) for _ in range(B)]
    lengths[0] = max(lengths[0], 1)
    p: Dict[str, Any] = dict(B=B, H=H, Hkv=Hkv, Sq=rng.choice([1, 1, 2, 3, 5, 8, 16]), D=rng.choice([16, 32, 40, 64, 128]),
                             S_max=max(lengths) + rng.choice([0, 0, 9]), lengths=lengths,
                             softcap=rng.choice([None, None, 20.0]), scale=rng.choice([None, None, 0.2]),
                             logit_scale=rng.choice([1.0, 1.0, 1.0, 30.0]), seqlens_dtype=rng.choice(["int32", "int64"]),
                             layout=rng.choice(["bhsd", "bhsd", "bshd"]), page=rng.choice([None, None, 1, 5, 16, 64]),
                             alibi=rng.choice([None, None, None, "head", "batch"]))
    if rng.random() < 0.15:
        p["views"] = {rng.choice(["q", "k_cache", "v_cache"]): rng.choice(["offset", "sliced"])}
    return p


def _decode_settle(p: Dict[str, Any]) -> Dict[str, Any]:
    """Lengths as many as the batch items, within the cache; a view of the cache only when it is not paged."""
    p = dict(p)
    if p.get("lengths") is not None:
        lengths = list(p["lengths"])[:p["B"]]
        p["lengths"] = lengths + [min(p["S_max"], 5)] * (p["B"] - len(lengths))
        p["S_max"] = max([p["S_max"]] + p["lengths"])
    if p["H"] % p["Hkv"]:
        p["Hkv"] = 1
    if p.get("page") is not None and p.get("views") and set(p["views"]) & {"k_cache", "v_cache"}:
        p["views"] = None
    return p


def _decode_base():
    composition = _composition("attention_decode")

    def attention_decode(q, k_cache, v_cache, cache_seqlens, *, scale=None, softcap=None, block_table=None,
                         alibi_slopes=None):
        return composition(q, k_cache, v_cache, cache_seqlens, scale=scale, softcap=softcap, block_table=block_table,
                           alibi_slopes=alibi_slopes)
    return attention_decode


# --------------------------------------------------------------------------- residual_norm
def _rn_summary(a):
    x, residual, weight, rowscale = a["x"], a.get("residual"), a["weight"], a.get("rowscale")
    W = x.shape[-1] if x.dim() else 1
    s = x.detach().float() + (residual.detach().float() if residual is not None else 0.0)
    return dict(W=W, rows=x.numel() // max(W, 1), dim=x.dim(), dtype=x.dtype, norm=a.get("norm", "rms"),
                residual=residual is not None, fp32_stream=residual is not None and residual.dtype != x.dtype,
                in_fp32=bool(a.get("residual_in_fp32")), bias=a.get("bias") is not None,
                eps=a.get("eps") is not None, rowscale=rowscale is not None,
                rowscale_zeros=rowscale is not None and bool((rowscale == 0).any()),
                zero_centered=bool(a.get("zero_centered_weight")), out_dtype=a.get("out_dtype") is not None,
                x_contig=x.is_contiguous(), x_offset=x.storage_offset() != 0, x_stride0=0 in x.stride(),
                residual_contig=_contiguous(residual), weight_contig=_contiguous(weight),
                mean=float(s.mean(dim=-1).abs().max()) if s.numel() else 0.0)


def _rn_width(p, width):
    return {**p, "shape": tuple(p["shape"][:-1]) + (width,)}


def _rn_triggers():
    specs = []
    for name, fires, force in _mods("W"):
        specs.append((name, fires, (lambda p, rng, force=force: _rn_width(p, force({"W": 0}, rng)["W"]))))
    specs += [
        ("w_gt1024", lambda c: c["W"] > 1024,
         lambda p, rng: {**p, "shape": (2, 1024 + rng.choice([1, 63, 128])), "layout": "contiguous"}),
        ("rows_ge64", lambda c: c["rows"] >= 64,
         lambda p, rng: {**p, "shape": (64 + rng.choice([0, 1, 31]), 32), "layout": "contiguous"}),
        ("rows_eq1", lambda c: c["rows"] == 1, lambda p, rng: {**p, "shape": (1, p["shape"][-1]), "layout": "contiguous"}),
        ("rows_mod16_eq1", lambda c: c["rows"] % 16 == 1 and c["rows"] > 1,
         lambda p, rng: {**p, "shape": (16 * rng.choice([1, 2]) + 1, p["shape"][-1])}),
        ("w_odd", lambda c: c["W"] % 2 == 1, lambda p, rng: _rn_width(p, 2 * rng.randint(2, 60) + 1)),
        ("w_lt16", lambda c: c["W"] < 16, lambda p, rng: _rn_width(p, rng.randint(2, 15))),
        ("x_3d", lambda c: c["dim"] >= 3,
         lambda p, rng: {**p, "shape": (rng.randint(2, 4), rng.randint(2, 9), p["shape"][-1]), "layout": "contiguous"}),
        ("norm_rms", lambda c: c["norm"] == "rms", lambda p, rng: {**p, "norm": "rms"}),
        ("norm_layer", lambda c: c["norm"] == "layer", lambda p, rng: {**p, "norm": "layer"}),
        ("no_residual", lambda c: not c["residual"], lambda p, rng: {**p, "residual": False, "residual_fp32": False}),
        ("with_residual", lambda c: c["residual"], lambda p, rng: {**p, "residual": True}),
        ("fp32_residual_stream", lambda c: c["fp32_stream"],
         lambda p, rng: {**p, "residual": True, "residual_fp32": True, "_dtype": torch.bfloat16}),
        ("residual_in_fp32", lambda c: c["in_fp32"], lambda p, rng: {**p, "residual_in_fp32": True}),
        ("in_fp32_16bit", lambda c: c["in_fp32"] and c["dtype"] != torch.float32,
         lambda p, rng: {**p, "residual_in_fp32": True, "_dtype": torch.bfloat16}),
        ("dtype_bf16", lambda c: c["dtype"] == torch.bfloat16, lambda p, rng: {**p, "_dtype": torch.bfloat16}),
        ("dtype_fp32", lambda c: c["dtype"] == torch.float32, lambda p, rng: {**p, "_dtype": torch.float32}),
        ("bias", lambda c: c["bias"], lambda p, rng: {**p, "bias": True}),
        ("no_bias", lambda c: not c["bias"], lambda p, rng: {**p, "bias": False}),
        ("eps_explicit", lambda c: c["eps"], lambda p, rng: {**p, "eps": rng.choice([1e-3, 1e-2])}),
        ("rowscale", lambda c: c["rowscale"], lambda p, rng: {**p, "rowscale": rng.choice(["random", "zeros"])}),
        ("rowscale_zero_rows", lambda c: c["rowscale_zeros"],
         lambda p, rng: {**p, "rowscale": "zeros", "shape": (max(2, p["shape"][0]),) + tuple(p["shape"][1:])}),
        ("zero_centered", lambda c: c["zero_centered"], lambda p, rng: {**p, "zero_centered": True}),
        ("out_dtype", lambda c: c["out_dtype"], lambda p, rng: {**p, "out_fp32": True}),
        ("x_noncontig", lambda c: not c["x_contig"],
         lambda p, rng: rng.choice([{**p, "layout": rng.choice(["row_stride", "transposed"]),
                                     "shape": (p["shape"][0], p["shape"][-1])},
                                    {**p, "views": {"x": "sliced"}}])),
        ("x_offset", lambda c: c["x_offset"], lambda p, rng: {**p, "views": {"x": "offset"}}),
        ("x_stride0", lambda c: c["x_stride0"], lambda p, rng: {**p, "views": {"x": "expanded"}}),
        ("residual_noncontig", lambda c: not c["residual_contig"],
         lambda p, rng: {**p, "residual": True, "views": {"residual": rng.choice(["sliced", "transposed"])}}),
        ("weight_noncontig", lambda c: not c["weight_contig"], lambda p, rng: {**p, "views": {"weight": "sliced"}}),
        ("large_mean", lambda c: c["mean"] > 20.0, lambda p, rng: {**p, "offset": rng.choice([30.0, 100.0])}),
    ]
    return _triggers(specs)


def _rn_math(a, *, stats_cols=None, divisor_delta=0, stats_dtype=None, shift_rows=False, eps=None, norm=None,
             sum_dtype=None, norm_of_x=False, rowscale_on_sum=False, centered=None, new_residual_x=False):
    """residual_norm's composition with a fault: the statistics over the first `stats_cols`
    features, divided by width + divisor_delta, from values rounded to stats_dtype, or from the row
    before; another eps or norm; the sum in sum_dtype; the norm of x alone (norm_of_x); rowscale
    applied to the sum; the weight's +1 of zero_centered_weight forced (centered); x returned as
    new_residual."""
    x, residual, weight, bias, rowscale = a["x"], a.get("residual"), a["weight"], a.get("bias"), a.get("rowscale")
    if sum_dtype is None:
        sum_dtype = torch.float32 if a.get("residual_in_fp32") else (x.dtype if residual is None else residual.dtype)
    out_dtype = a.get("out_dtype") or x.dtype
    xs = x
    if rowscale is not None and not rowscale_on_sum:
        xs = x.float() * rowscale.detach().float()[..., None]
    s = xs.to(sum_dtype) if residual is None else xs.to(sum_dtype) + residual.to(sum_dtype)
    if rowscale is not None and rowscale_on_sum:
        s = (s.float() * rowscale.detach().float()[..., None]).to(sum_dtype)
    norm = norm or a.get("norm", "rms")
    if eps is None:
        eps = a.get("eps")
        if eps is None:
            eps = default_rms_eps(x.dtype) if norm == "rms" else 1e-5
    W = x.shape[-1]
    f = (x.float() if norm_of_x else s.float()).reshape(-1, W)
    fs = _round_to(f, stats_dtype) if stats_dtype is not None else f
    cols = fs[:, :stats_cols] if stats_cols else fs
    n = cols.shape[-1] + divisor_delta
    if norm == "rms":
        inv = torch.rsqrt(cols.pow(2).sum(-1, keepdim=True) / n + eps)
        mean = torch.zeros_like(inv)
    else:
        mean = cols.sum(-1, keepdim=True) / n
        inv = torch.rsqrt((cols - mean).pow(2).sum(-1, keepdim=True) / n + eps)
    if shift_rows and inv.shape[0] > 1:
        mean, inv = torch.cat([mean[:1], mean[:-1]]), torch.cat([inv[:1], inv[:-1]])
    y = ((f - mean) * inv).reshape(x.shape)
    plus_one = bool(a.get("zero_centered_weight")) if centered is None else centered
    y = y * (weight.float() + 1.0 if plus_one else weight.float())
    if bias is not None:
        y = y + bias.float()
    return y.to(out_dtype), (x.to(s.dtype) if new_residual_x else s)


def _rn_faults():
    def with_arg(name, fn=lambda a: None):
        return lambda base, a: base({**a, name: fn(a)})

    def on_out(fn):
        def run(base, a):
            out, new_residual = base(a)
            return fn(out, a), new_residual
        return run

    def rows(fn):
        return on_out(lambda out, a: fn(out.reshape(-1, out.shape[-1]), a).reshape(out.shape))

    def last_row_repeats(flat, a):
        return torch.cat([flat[:-1], flat[-2:-1]]) if flat.shape[0] > 1 else flat

    def residual_rounded(base, a):
        residual = a.get("residual")
        if residual is None or residual.dtype == a["x"].dtype:
            return base(a)
        return base({**a, "residual": _round_to(residual, a["x"].dtype)})

    def width(a):
        return a["x"].shape[-1]

    return (
        Fault("residual_not_in_norm", lambda base, a: _rn_math(a, norm_of_x=True)),
        Fault("new_residual_is_x", lambda base, a: _rn_math(a, new_residual_x=True)),
        Fault("ignore_residual", with_arg("residual")),
        Fault("ignore_residual_in_fp32", lambda base, a: _rn_math(
            a, sum_dtype=a["x"].dtype if a.get("residual") is None else a["residual"].dtype)),
        Fault("sum_in_x_dtype", lambda base, a: _rn_math(a, sum_dtype=a["x"].dtype)),
        Fault("fp32_residual_read_as_x_dtype", residual_rounded),
        Fault("drop_last_features", lambda base, a: _rn_math(a, stats_cols=max(1, width(a) - max(1, min(16, width(a) // 4))))),
        Fault("divisor_off_by_one", lambda base, a: _rn_math(a, divisor_delta=-1 if width(a) > 1 else 1)),
        Fault("stats_in_bf16", lambda base, a: _rn_math(a, stats_dtype=torch.bfloat16)),
        Fault("stats_from_row_before", lambda base, a: _rn_math(a, shift_rows=True)),
        Fault("ignore_eps", lambda base, a: _rn_math(a, eps=default_rms_eps(a["x"].dtype) if a.get("norm") == "rms" else 1e-5)),
        Fault("eps_squared_default", lambda base, a: _rn_math(a, eps=1e-10)),
        Fault("norm_swapped", lambda base, a: _rn_math(a, norm="layer" if a.get("norm", "rms") == "rms" else "rms")),
        Fault("ignore_weight", with_arg("weight", lambda a: torch.ones_like(a["weight"]) - (
            1.0 if a.get("zero_centered_weight") else 0.0))),
        Fault("ignore_bias", with_arg("bias")),
        Fault("ignore_zero_centered", lambda base, a: _rn_math(a, centered=False)),
        Fault("ignore_rowscale", with_arg("rowscale")),
        Fault("rowscale_on_sum", lambda base, a: _rn_math(a, rowscale_on_sum=True)),
        Fault("output_through_bf16", on_out(lambda out, a: _round_to(out, torch.bfloat16))),
        Fault("last_row_repeats", rows(last_row_repeats)),
        Fault("x_as_contiguous", with_arg("x", lambda a: _as_if_contiguous(a["x"]))),
        Fault("residual_as_contiguous", with_arg("residual", lambda a: None if a.get("residual") is None
                                                 else _as_if_contiguous(a["residual"]))),
        Fault("weight_as_contiguous", with_arg("weight", lambda a: _as_if_contiguous(a["weight"]))),
    )


def _rn_space(rng: random.Random) -> Dict[str, Any]:
    rows, width = rng.choice([1, 2, 4, 7, 16, 17, 33]), rng.choice(NORM_WIDTHS)
    p: Dict[str, Any] = dict(shape=(rows, width), norm=rng.choice(["rms", "layer"]), residual=rng.random() < 0.85,
                             residual_fp32=rng.random() < 0.25, residual_in_fp32=rng.random() < 0.3,
                             bias=rng.random() < 0.7, eps=rng.choice([None, None, 1e-3]), offset=rng.choice([0.0, 0.0, 3.0]),
                             layout="contiguous", rowscale=rng.choice([None, None, None, "random", "zeros"]),
                             zero_centered=rng.random() < 0.2, out_fp32=rng.random() < 0.15)
    shape_kind = rng.random()
    if shape_kind < 0.15:
        p.update(shape=(rng.randint(2, 4), rows, width))
    elif shape_kind < 0.3:
        p.update(layout=rng.choice(["row_stride", "transposed"]))
    if rng.random() < 0.15:
        p["views"] = {rng.choice(["x", "residual", "weight"]): rng.choice(["offset", "sliced", "expanded"])}
    return p


def _rn_settle(p: Dict[str, Any]) -> Dict[str, Any]:
    """A float32 residual stream needs a residual; row_stride and transposed x are 2-D."""
    p = dict(p)
    if not p.get("residual"):
        p["residual_fp32"] = False
        if p.get("views") and "residual" in p["views"]:
            p["views"] = None
    if p.get("layout") in ("row_stride", "transposed") and len(p["shape"]) != 2:
        p["layout"] = "contiguous"
    return p


def _rn_base():
    composition = _composition("residual_norm")

    def residual_norm(x, residual, weight, bias=None, eps=None, norm="rms", residual_in_fp32=False, rowscale=None,
                      zero_centered_weight=False, out_dtype=None):
        return composition(x, residual, weight, bias, eps=eps, norm=norm, residual_in_fp32=residual_in_fp32,
                           rowscale=rowscale, zero_centered_weight=zero_centered_weight, out_dtype=out_dtype)
    return residual_norm


def _v2_family(op: str) -> OpMutants:
    if op == "attention_varlen":
        return OpMutants(op, _varlen_base(), _varlen_summary, _varlen_triggers(), _varlen_faults(), _varlen_space,
                         _varlen_settle)
    if op == "attention_decode":
        return OpMutants(op, _decode_base(), _decode_summary, _decode_triggers(), _decode_faults(), _decode_space,
                         _decode_settle)
    return OpMutants(op, _rn_base(), _rn_summary, _rn_triggers(), _rn_faults(), _rn_space, _rn_settle, outputs=2)


# =========================================================================== version 3
# cross_entropy (added after version 2 was frozen; frozen itself before anything was tuned on it:
# the commit is recorded in benchmarks/records/cpu/mutation-score-cross-entropy-2026-12-06.md).
# Triggers from its dimensions (the vocabulary at a remainder mod a tile or past the triton
# backend's 4096-column block, the rows, ignored rows and a custom ignore_index, label smoothing,
# each reduction, the logits' and the target's layout, the dtype, large logits) x faults (a block
# of classes dropped or repeated in the logsumexp, the vocabulary off by one, smoothing or
# ignore_index ignored, the mean over every row, the logsumexp in the input dtype or without its
# max, the wrong row, a gradient without its smoothing term or its mean's count...).
CE_BLOCK = 4096


def _ce_summary(a):
    logits, target = a["logits"], a["target"]
    ignore = a.get("ignore_index", -100)
    valid = target != ignore
    c = logits.shape[-1] if logits.dim() else 1
    return dict(C=c, N=logits.shape[0] if logits.dim() else 1, dtype=logits.dtype, ignore_index=ignore,
                ignored=bool((~valid).any()), all_ignored=not bool(valid.any()),
                smoothing=float(a.get("label_smoothing", 0.0)), reduction=a.get("reduction", "mean"),
                logits_contig=logits.is_contiguous(), logits_offset=logits.storage_offset() != 0,
                logits_stride0=0 in logits.stride(), row_stride=logits.dim() == 2 and logits.stride(-1) == 1
                and logits.shape[0] > 1 and logits.stride(0) != c,
                target_contig=target.is_contiguous() or target.numel() <= 1,
                target_offset=target.storage_offset() != 0,
                last_class=bool((target == c - 1).any()), class0=bool((target == 0).any()),
                peak=float(logits.detach().float().abs().max()) if logits.numel() else 0.0)


def _ce_set_c(p, c):
    return {**p, "c": max(1, c), "n": min(p["n"], 64) if c > 1024 else p["n"]}


def _ce_triggers():
    specs = []
    for name, fires, force in _mods("C"):
        specs.append((name, fires, (lambda p, rng, force=force: _ce_set_c(p, force({"C": 0}, rng)["C"]))))
    for limit in (1024, CE_BLOCK):
        specs.append((f"c_gt{limit}", (lambda c, limit=limit: c["C"] > limit),
                      (lambda p, rng, limit=limit: _ce_set_c(p, limit + rng.choice([1, 63, limit // 2])))))
    for limit in (128, 256):
        specs.append((f"n_ge{limit}", (lambda c, limit=limit: c["N"] >= limit),
                      (lambda p, rng, limit=limit: {**p, "n": limit + rng.choice([0, 1, 44]), "c": min(p["c"], 300)})))
    ignored = {"target": "some_ignored"}
    specs += [
        ("n_eq1", lambda c: c["N"] == 1, lambda p, rng: {**p, "n": 1}),
        ("n_mod16_eq1", lambda c: c["N"] % 16 == 1 and c["N"] > 1, lambda p, rng: {**p, "n": 16 * rng.choice([1, 2]) + 1}),
        ("c_lt16", lambda c: c["C"] < 16, lambda p, rng: _ce_set_c(p, rng.randint(2, 15))),
        ("c_odd", lambda c: c["C"] % 2 == 1, lambda p, rng: _ce_set_c(p, 2 * rng.randint(1, 80) + 1)),
        ("ignored_rows", lambda c: c["ignored"] and not c["all_ignored"], lambda p, rng: {**p, **ignored}),
        ("custom_ignore_index", lambda c: c["ignore_index"] != -100,
         lambda p, rng: {**p, "ignore_index": rng.choice(["minus_one", "valid_class"])}),
        ("ignore_index_a_class", lambda c: 0 <= c["ignore_index"] < c["C"],
         lambda p, rng: {**p, "ignore_index": "valid_class", "target": rng.choice(["plain", "some_ignored"])}),
        ("custom_ignored_rows", lambda c: c["ignore_index"] != -100 and c["ignored"] and not c["all_ignored"],
         lambda p, rng: {**p, **ignored, "ignore_index": rng.choice(["minus_one", "valid_class"])}),
        ("smoothing", lambda c: c["smoothing"] > 0, lambda p, rng: {**p, "smoothing": rng.choice([0.1, 0.3])}),
        ("smoothing_ignored_rows", lambda c: c["smoothing"] > 0 and c["ignored"] and not c["all_ignored"],
         lambda p, rng: {**p, **ignored, "smoothing": 0.1}),
        ("reduction_mean", lambda c: c["reduction"] == "mean", lambda p, rng: {**p, "reduction": "mean"}),
        ("reduction_sum", lambda c: c["reduction"] == "sum", lambda p, rng: {**p, "reduction": "sum"}),
        ("reduction_none", lambda c: c["reduction"] == "none", lambda p, rng: {**p, "reduction": "none"}),
        ("mean_ignored_rows", lambda c: c["reduction"] == "mean" and c["ignored"] and not c["all_ignored"],
         lambda p, rng: {**p, **ignored, "reduction": "mean"}),
        ("logits_noncontig", lambda c: not c["logits_contig"],
         lambda p, rng: {**p, "views": {"logits": rng.choice(["sliced", "transposed"])}}),
        ("logits_offset", lambda c: c["logits_offset"], lambda p, rng: {**p, "views": {"logits": "offset"}}),
        ("logits_stride0", lambda c: c["logits_stride0"], lambda p, rng: {**p, "n": max(2, p["n"]),
                                                                          "views": {"logits": "expanded"}}),
        ("logits_row_stride", lambda c: c["row_stride"], lambda p, rng: {**p, "n": max(2, p["n"]), "layout": "row_stride"}),
        ("target_noncontig", lambda c: not c["target_contig"],
         lambda p, rng: {**p, "n": max(2, p["n"]), "views": {"target": "sliced"}}),
        ("target_offset", lambda c: c["target_offset"], lambda p, rng: {**p, "views": {"target": "offset"}}),
        ("target_last_class", lambda c: c["last_class"], lambda p, rng: {**p, "target": "last_class"}),
        ("dtype_bf16", lambda c: c["dtype"] == torch.bfloat16, lambda p, rng: {**p, "_dtype": torch.bfloat16}),
        ("dtype_fp32", lambda c: c["dtype"] == torch.float32, lambda p, rng: {**p, "_dtype": torch.float32}),
        ("large_logits", lambda c: c["peak"] > 40.0, lambda p, rng: {**p, "scale": rng.choice([30.0, 3000.0])}),
        ("huge_logits", lambda c: c["peak"] > 1000.0, lambda p, rng: {**p, "scale": 3000.0}),
    ]
    return _triggers(specs)


def _ce_math(a, *, cols=None, repeat=0, smoothing=None, ignore_index=None, count_all=False, lse_dtype=None,
             no_max=False, target_shift=False, last_wraps=False, smooth_cols=None, sum_dtype=None, rows_repeat=False):
    """The composition's math with a fault: the logsumexp over the first `cols` classes (plus
    the first `repeat` again), smoothing or ignore_index replaced, the mean over every row, the
    logsumexp in lse_dtype or without its max, the target of the row before, the last class read
    as class 0, the smoothing mean over smooth_cols, the sum in sum_dtype, the last row's loss
    the one before's."""
    logits, target = a["logits"], a["target"]
    eps = a.get("label_smoothing", 0.0) if smoothing is None else smoothing
    ignore = a.get("ignore_index", -100) if ignore_index is None else ignore_index
    reduction = a.get("reduction", "mean")
    c = logits.shape[-1]
    z = logits.float()
    kept = z[:, :cols] if cols else z
    if repeat:
        kept = torch.cat([kept, z[:, :repeat]], -1)
    if lse_dtype is not None:   # the exps and the logsumexp rounded to the input dtype
        top = kept.amax(-1, keepdim=True).detach()
        lse = _round_to(top.squeeze(-1) + _round_to((kept - top).exp(), lse_dtype).sum(-1).log(), lse_dtype)
    elif no_max:
        lse = kept.exp().sum(-1).log()
    else:
        lse = torch.logsumexp(kept, -1)
    if target_shift and target.shape[0] > 1:
        target = torch.cat([target[:1], target[:-1]])
    valid = target != ignore
    safe = target.masked_fill(~valid, 0)
    if last_wraps:
        safe = torch.where(safe == c - 1, torch.zeros_like(safe), safe)
    safe = safe.clamp(0, c - 1)
    picked = z.gather(-1, safe.unsqueeze(-1)).squeeze(-1)
    mean_z = z.sum(-1) / (smooth_cols or c)
    loss = (1 - eps) * (lse - picked) + eps * (lse - mean_z)
    loss = loss.masked_fill(~valid, 0.0)
    if rows_repeat and loss.shape[0] > 1:
        loss = torch.cat([loss[:-1], loss[-2:-1]])
    if reduction == "none":
        return loss.to(logits.dtype)
    total = loss.to(sum_dtype).sum() if sum_dtype is not None else loss.sum()
    if reduction == "sum":
        return total.to(logits.dtype)
    return (total.float() / (loss.shape[0] if count_all else valid.sum())).to(logits.dtype)


def _straight_through(value, grad_from):
    """value's numbers, grad_from's gradient (a forward that is right, a backward that is not)."""
    return value.detach() + (grad_from - grad_from.detach())


def _ce_faults():
    def c_of(a):
        return a["logits"].shape[-1]

    def block(a):
        return max(1, min(16, c_of(a) // 4))

    return (
        Fault("drop_last_class_block", lambda base, a: _ce_math(a, cols=max(1, c_of(a) - block(a)))
              if c_of(a) > 1 else base(a)),
        Fault("repeat_first_class_block", lambda base, a: _ce_math(a, repeat=block(a))),
        Fault("vocab_off_by_one", lambda base, a: _ce_math(a, cols=c_of(a) - 1) if c_of(a) > 1 else base(a)),
        Fault("smoothing_mean_off_by_one", lambda base, a: _ce_math(a, smooth_cols=c_of(a) + 1)),
        Fault("ignore_label_smoothing", lambda base, a: base({**a, "label_smoothing": 0.0})),
        Fault("ignore_ignore_index", lambda base, a: _ce_math(a, ignore_index=-(2 ** 40))),
        Fault("custom_ignore_as_default", lambda base, a: _ce_math(a, ignore_index=-100)),
        Fault("mean_over_every_row", lambda base, a: _ce_math(a, count_all=True)),
        Fault("lse_in_input_dtype", lambda base, a: _ce_math(a, lse_dtype=a["logits"].dtype)),
        Fault("lse_without_max", lambda base, a: _ce_math(a, no_max=True)),
        Fault("sum_in_input_dtype", lambda base, a: _ce_math(a, sum_dtype=a["logits"].dtype)),
        Fault("target_of_row_before", lambda base, a: _ce_math(a, target_shift=True)),
        Fault("last_class_read_as_first", lambda base, a: _ce_math(a, last_wraps=True)),
        Fault("last_row_repeats", lambda base, a: _ce_math(a, rows_repeat=True)),
        Fault("output_through_bf16", lambda base, a: _round_to(base(a), torch.bfloat16)),
        Fault("logits_as_contiguous", lambda base, a: base({**a, "logits": _as_if_contiguous(a["logits"])})),
        Fault("target_as_contiguous", lambda base, a: base({**a, "target": _as_if_contiguous(a["target"])})),
        Fault("grad_without_smoothing", lambda base, a: _straight_through(base(a), base({**a, "label_smoothing": 0.0}))),
        Fault("grad_mean_over_every_row", lambda base, a: _straight_through(base(a), _ce_math(a, count_all=True))),
        Fault("grad_of_ignored_rows", lambda base, a: _straight_through(base(a), _ce_math(a, ignore_index=-(2 ** 40)))),
        Fault("grad_of_row_before", lambda base, a: _straight_through(base(a), _ce_math(a, target_shift=True))),
    )


CE_SIZES = (1, 2, 3, 10, 16, 17, 31, 32, 33, 48, 63, 64, 65, 96, 127, 128, 129, 255, 257, 1000, 4097)


def _ce_space(rng: random.Random) -> Dict[str, Any]:
    c = rng.choice(CE_SIZES)
    p: Dict[str, Any] = dict(n=rng.choice([1, 2, 5, 17, 33, 64] if c > 1024 else [1, 2, 5, 17, 33, 64, 129, 200]), c=c,
                             target=rng.choice(["plain", "plain", "some_ignored", "class0", "last_class"]),
                             ignore_index=rng.choice(["default", "default", "minus_one", "valid_class"]),
                             smoothing=rng.choice([0.0, 0.0, 0.1]), reduction=rng.choice(["mean", "sum", "none"]),
                             scale=rng.choice([2.0, 2.0, 2.0, 0.5, 30.0]))
    kind = rng.random()
    if kind < 0.1:
        p["layout"] = "row_stride"
    elif kind < 0.25:
        p["views"] = {rng.choice(["logits", "target"]): rng.choice(["offset", "sliced", "transposed", "expanded"])}
    return p


def _ce_settle(p: Dict[str, Any]) -> Dict[str, Any]:
    """row_stride is a layout of its own (no logits view beside it); a transposed target is no view."""
    p = dict(p)
    views = dict(p.get("views") or {})
    if p.get("layout") == "row_stride":
        views.pop("logits", None)
    if views.get("target") == "transposed":
        views.pop("target")
    p["views"] = views or None
    return p


def _ce_base():
    composition = _composition("cross_entropy")

    def cross_entropy(logits, target, *, ignore_index=-100, label_smoothing=0.0, reduction="mean"):
        return composition(logits, target, ignore_index=ignore_index, label_smoothing=label_smoothing,
                           reduction=reduction)
    return cross_entropy


def _v3_family(op: str) -> OpMutants:
    return OpMutants(op, _ce_base(), _ce_summary, _ce_triggers(), _ce_faults(), _ce_space, _ce_settle)
