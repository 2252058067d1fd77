"""The apply_rotary contract: its argument checks and `Problem`, float64 reference, plain
composition and the battery's cases: both layouts, partial rotary_dim, int and per-batch
offsets, packed varlen, and batches > 1 everywhere (where a real port's batch stride broke)."""
from __future__ import annotations

import numbers
from typing import List
from typing import Union

import torch

from ..registry import Backend, Problem
from ..numerics import rotate
from ..validation import FLOAT_DTYPES, describe, expect_same_device, expect_tensor
from .base import (INDEX_DTYPES, TILE_OFFSETS, TILES, Case, Covering, OpSpec, capturing, checked_once, family, randn,
                   named_view, tile_size, view_members)
from .signature import Arg, Signature

# gpuparity.apply_rotary's signature, its torch.library op's and the backends' (contracts/signature.py).
# The op's schema cannot take an int-or-tensor: seqlen_offsets reaches it as `offset` (an int) or
# `offsets` (a tensor); inplace is the public function's (the op returns a new tensor).
APPLY_ROTARY = Signature("apply_rotary", (
    Arg("x", "Tensor", grad=True),
    Arg("cos", "Tensor"),
    Arg("sin", "Tensor"),
    Arg("interleaved", "bool", False, keyword=True),
    Arg("seqlen_offsets", "SymInt|Tensor", 0, keyword=True, library=False),
    Arg("offset", "SymInt", public=False),
    Arg("offsets", "Tensor?", public=False),
    Arg("cu_seqlens", "Tensor?", None, keyword=True),
    Arg("max_seqlen", "SymInt?", None, keyword=True),
    Arg("inplace", "bool", False, keyword=True, library=False),
    Arg("backend", "str", "auto", keyword=True, backend=False),
))
# ops.rotary.apply_rotary_pair: an attention's q and k rotated by one launch (`conjugate`: by -theta,
# the op's own backward)
APPLY_ROTARY_PAIR = Signature("apply_rotary_pair", (
    Arg("q", "Tensor", grad=True),
    Arg("k", "Tensor", grad=True),
    Arg("cos", "Tensor"),
    Arg("sin", "Tensor"),
    Arg("interleaved", "bool", False, keyword=True),
    Arg("conjugate", "bool", public=False),
    Arg("backend", "str", "auto", keyword=True, backend=False),
), outputs=("q_out", "k_out"))


# --------------------------------------------------------------------------- the call: arguments checked, and the Problem the dispatcher gets
def rotary_kind(interleaved: bool, cu_seqlens) -> str:
    """The probe key of a rotary call (as the battery's rotary spec names it): "half",
    "interleaved", "varlen-half" or "varlen-interleaved"."""
    return ("varlen-" if cu_seqlens is not None else "") + ("interleaved" if interleaved else "half")


def rotary_problem(x, cos, interleaved: bool, seqlen_offsets, cu_seqlens) -> Problem:
    """The dispatcher's description of a validated apply_rotary call."""
    return Problem("rotary", x.device, x.dtype, rotary_kind(interleaved, cu_seqlens),
                            (("head_dim", x.shape[-1]), ("rotary_dim", 2 * cos.shape[1]),
                             ("offsets", "tensor" if isinstance(seqlen_offsets, torch.Tensor) else "int")))


def check_rotary_inputs(x, cos, sin, *, interleaved, seqlen_offsets, cu_seqlens, max_seqlen, inplace):
    """Validate apply_rotary's arguments; returns max_seqlen (computed when packed and None).

    Checks that need the values of device tensors (cu_seqlens order, offsets within the cos/sin
    table) cost one synchronisation; they are skipped while a CUDA graph is being captured.
    """
    expect_tensor("x", x, dtypes=FLOAT_DTYPES)
    if not isinstance(interleaved, bool):
        raise TypeError(f"interleaved: expected a bool, got {describe(interleaved)}")
    if not isinstance(inplace, bool):
        raise TypeError(f"inplace: expected a bool, got {describe(inplace)}")
    if cu_seqlens is None:
        expect_tensor("x", x, ndim=(4,))
        batch, seqlen = x.shape[0], x.shape[1]
        if max_seqlen is not None:
            raise ValueError(f"max_seqlen: only meaningful with cu_seqlens (packed input), got {describe(max_seqlen)}")
    else:
        if x.dim() != 3:
            raise ValueError(f"x: expected a packed 3-D tensor (total, H, D) with cu_seqlens, got {describe(x)}")
        expect_tensor("cu_seqlens", cu_seqlens, ndim=(1,), dtypes=INDEX_DTYPES)
        if cu_seqlens.numel() < 1:
            raise ValueError(f"cu_seqlens: expected B + 1 >= 1 cumulative lengths, got {describe(cu_seqlens)}")
        expect_same_device("x", x, cu_seqlens=cu_seqlens)
        batch, seqlen = cu_seqlens.numel() - 1, None
        if max_seqlen is not None and (isinstance(max_seqlen, bool) or not isinstance(max_seqlen, numbers.Integral)
                                       or max_seqlen < 0):
            raise ValueError(f"max_seqlen: expected an int >= 0, got {describe(max_seqlen)}")
    head_dim = x.shape[-1]
    for name, table in (("cos", cos), ("sin", sin)):
        expect_tensor(name, table, ndim=(2,), dtypes=FLOAT_DTYPES)
    if cos.shape != sin.shape:
        raise ValueError(f"sin: expected the shape of cos {tuple(cos.shape)}, got {describe(sin)}")
    if cos.dtype != sin.dtype:
        raise TypeError(f"sin: expected the dtype of cos ({str(cos.dtype).replace('torch.', '')}), got {describe(sin)}")
    expect_same_device("x", x, cos=cos, sin=sin)
    rotary_half = cos.shape[1]
    if rotary_half < 1 or 2 * rotary_half > head_dim:
        raise ValueError(f"cos: expected shape (S_max, rotary_dim / 2) with 1 <= rotary_dim <= head dim {head_dim}, "
                         f"got {describe(cos)} (rotary_dim {2 * rotary_half})")
    if torch.is_grad_enabled() and (cos.requires_grad or sin.requires_grad):
        raise ValueError("cos/sin: gradients with respect to cos and sin are not supported (flash-attn's rotary "
                         "contract); pass cos.detach() and sin.detach()")
    table_len = cos.shape[0]
    if isinstance(seqlen_offsets, torch.Tensor):
        expect_tensor("seqlen_offsets", seqlen_offsets, ndim=(1,), dtypes=INDEX_DTYPES)
        if seqlen_offsets.shape[0] != batch:
            raise ValueError(f"seqlen_offsets: expected one offset per sequence ({batch},), got {describe(seqlen_offsets)}")
        expect_same_device("x", x, seqlen_offsets=seqlen_offsets)
    elif isinstance(seqlen_offsets, bool) or not isinstance(seqlen_offsets, numbers.Integral) or seqlen_offsets < 0:
        raise ValueError(f"seqlen_offsets: expected an int >= 0 or a ({batch},) integer tensor, "
                         f"got {describe(seqlen_offsets)}")
    if inplace and x.requires_grad and x.is_leaf and torch.is_grad_enabled():
        raise ValueError(f"x: inplace=True cannot modify a leaf tensor that requires grad, got {describe(x)}")

    if cu_seqlens is None:
        if isinstance(seqlen_offsets, torch.Tensor):
            if not capturing(x.device) and seqlen_offsets.numel():
                checked_once((seqlen_offsets,), ("rotary-offsets", seqlen, table_len),
                             lambda: _check_offsets(seqlen_offsets, seqlen, table_len))
        else:
            _check_positions(int(seqlen_offsets), int(seqlen_offsets) + seqlen if seqlen else 0, table_len)
        return None
    total = x.shape[0]
    if torch.compiler.is_compiling():
        return max_seqlen   # None: the op computes it when it runs
    if capturing(x.device):
        if max_seqlen is None:
            raise ValueError("max_seqlen: needed with cu_seqlens while a CUDA graph is being captured")
        return int(max_seqlen)
    offsets_tensor = seqlen_offsets if isinstance(seqlen_offsets, torch.Tensor) else None
    return checked_once((cu_seqlens, offsets_tensor),
                        ("rotary", None if offsets_tensor is not None else int(seqlen_offsets), batch, total,
                         table_len, max_seqlen),
                        lambda: _check_rotary_cu_values(cu_seqlens, seqlen_offsets, batch, total, table_len,
                                                        max_seqlen))


def _check_offsets(offsets: torch.Tensor, seqlen: int, table_len: int) -> None:
    low, high = (int(v) for v in torch.stack([offsets.min(), offsets.max()]).tolist())
    _check_positions(low, high + seqlen, table_len)


def _check_rotary_cu_values(cu_seqlens, seqlen_offsets, batch: int, total: int, table_len: int, max_seqlen) -> int:
    """cu_seqlens from 0 to total, non-decreasing, positions within the table (one host sync);
    returns max_seqlen, or the longest sequence when it is None."""
    cu = cu_seqlens.long()
    lengths = cu[1:] - cu[:-1]
    offsets = seqlen_offsets.long() if isinstance(seqlen_offsets, torch.Tensor) else torch.full_like(lengths, int(seqlen_offsets))
    if batch == 0:
        if total != 0 or int(cu[0]) != 0:
            raise ValueError(f"cu_seqlens: expected [0] for an empty batch with x of {total} rows, got {cu_seqlens.tolist()}")
        return 0
    first, last, decreasing, longest, low, end = (int(v) for v in torch.stack([
        cu[0], cu[-1], (lengths < 0).sum(), lengths.max(), offsets.min(), (lengths + offsets).max()]).tolist())
    if first != 0 or last != total or decreasing:
        raise ValueError(f"cu_seqlens: expected a non-decreasing sequence from 0 to x.shape[0] = {total}, "
                         f"got first {first}, last {last}, {decreasing} decreasing step(s)")
    if max_seqlen is not None and int(max_seqlen) < longest:
        raise ValueError(f"max_seqlen: expected >= the longest sequence ({longest}), got {max_seqlen}")
    _check_positions(low, end, table_len)
    return int(max_seqlen) if max_seqlen is not None else longest


def _check_positions(lowest_offset: int, end: int, table_len: int) -> None:
    if lowest_offset < 0:
        raise ValueError(f"seqlen_offsets: expected offsets >= 0, got {lowest_offset}")
    if end > table_len:
        raise ValueError(f"cos: positions reach {end - 1} (sequence length + seqlen_offsets) but the cos/sin table "
                         f"has {table_len} rows; expected cos.shape[0] >= {end}")


# --------------------------------------------------------------------------- the float64 reference
def rotary_positions(batch: int, seqlen: int, seqlen_offsets: Union[int, torch.Tensor]) -> torch.Tensor:
    """(B, S) absolute positions: s + offset[b]."""
    base = torch.arange(seqlen).unsqueeze(0).expand(batch, seqlen)
    if isinstance(seqlen_offsets, torch.Tensor):
        return base + seqlen_offsets.to("cpu", torch.long).view(batch, 1)
    return base + int(seqlen_offsets)


def apply_rotary(x, cos, sin, *, interleaved: bool = False, seqlen_offsets=0, cu_seqlens=None,
                 max_seqlen=None):
    """The flash-attn rotary contract: x (B, S, H, D) or packed (total, H, D) with cu_seqlens;
    cos/sin (S_max, rotary_dim/2); the first rotary_dim features rotate, the rest pass."""
    rotary_dim = cos.shape[-1] * 2
    if cu_seqlens is None:
        batch, seqlen = x.shape[0], x.shape[1]
        pos = rotary_positions(batch, seqlen, seqlen_offsets).to(x.device)
        c = cos[pos].unsqueeze(2)  # (B, S, 1, rd/2)
        s = sin[pos].unsqueeze(2)
    else:
        bounds = cu_seqlens.to("cpu", torch.long).tolist()
        batch = len(bounds) - 1
        pos_parts = []
        for b in range(batch):
            length = bounds[b + 1] - bounds[b]
            offset = int(seqlen_offsets[b]) if isinstance(seqlen_offsets, torch.Tensor) else int(seqlen_offsets)
            pos_parts.append(torch.arange(length) + offset)
        pos = torch.cat(pos_parts).to(x.device) if pos_parts else torch.zeros(0, dtype=torch.long, device=x.device)
        c = cos[pos].unsqueeze(1)  # (total, 1, rd/2)
        s = sin[pos].unsqueeze(1)
    rotated = rotate(x[..., :rotary_dim], c.to(x.dtype), s.to(x.dtype), interleaved)
    return torch.cat((rotated, x[..., rotary_dim:]), dim=-1)


# --------------------------------------------------------------------------- the trusted composition (the op's "composition" backend)
def rotary_composition(x, cos, sin, *, interleaved=False, seqlen_offsets=0, cu_seqlens=None, max_seqlen=None):
    """The eager rotary of most model code, in x's dtype (cos/sin cast to it)."""
    return apply_rotary(x, cos, sin, interleaved=interleaved, seqlen_offsets=seqlen_offsets,
                        cu_seqlens=cu_seqlens, max_seqlen=max_seqlen)


# registered by backends.load in the order its line of gpuparity.manifest gives
COMPOSITIONS = (Backend("composition", "rotary", rotary_composition, "eager rotary in the input dtype", fallback=True),)


# --------------------------------------------------------------------------- the battery's cases
def _case(name, level="default", **params) -> Case:
    defaults = dict(B=2, S=16, H=3, D=32, rotary_dim=None, interleaved=False, offsets=0, varlen=None,
                    layout="bshd", s_max=None)
    defaults.update(params)
    defaults["rotary_dim"] = defaults["rotary_dim"] or defaults["D"]
    return Case(name, defaults, level)


CASES: List[Case] = [
    _case("half_split", "quick"),
    _case("interleaved_batch3_offsets", "quick", B=3, interleaved=True, offsets=[0, 5, 11]),
    _case("half_batch3_offsets", "quick", B=3, offsets=[0, 5, 11]),
    _case("partial_rotary", "quick", D=40, rotary_dim=16),
    _case("varlen_packed", "quick", varlen=[5, 7, 8], interleaved=True),
    _case("int_offset", offsets=3),
    _case("varlen_offsets_half", varlen=[1, 9, 4, 6], offsets=[2, 0, 7, 1]),
    _case("partial_interleaved_offsets", D=64, rotary_dim=24, interleaved=True, B=2, offsets=[4, 1]),
    _case("odd_seq_17_heads_5", S=17, H=5, D=64, B=2, offsets=[0, 9]),
    _case("transposed_bhsd_view", layout="bhsd", B=2, offsets=[1, 2]),
    _case("head_dim_128", D=128, S=33, H=2),
    _case("long_1000", "full", S=1000, H=4, D=64, B=2, offsets=[0, 24]),
]


class RotarySpec(OpSpec):
    op = "rotary"
    # speed priors per device family, fastest first (priors.py: what they mean, the records)
    priors = {"cuda": ["triton", "compile"], "cpu": ["composition"]}
    signature = APPLY_ROTARY.call_line(keywords=("interleaved", "seqlen_offsets", "cu_seqlens", "max_seqlen"))
    grad_inputs = ("x",)
    reference_fn = staticmethod(apply_rotary)

    def normalize(self, params):
        params = dict(params)
        if params.get("rotary_dim", 0) > params.get("D", 0) or params.get("D", 0) % 2 or params.get("rotary_dim", 0) % 2:
            return None
        offsets = params.get("offsets")
        if isinstance(offsets, list):
            params["offsets"] = (offsets + [0] * params["B"])[:params["B"]]
        return params

    def kind(self, p):
        return ("varlen-" if p["varlen"] else "") + ("interleaved" if p["interleaved"] else "half")

    def timing_params(self):
        return _case("timing", B=4, S=256, H=8, D=128).params

    def make_inputs(self, p, gen):
        H, D = p["H"], p["D"]
        offsets = p["offsets"]
        max_offset = max(offsets) if isinstance(offsets, list) else int(offsets)
        if p["varlen"]:
            total = sum(p["varlen"])
            x = randn(gen, total, H, D)
            s_needed = max(p["varlen"]) + max_offset
        else:
            shape = (p["B"], p["S"], H, D) if p["layout"] == "bshd" else (p["B"], H, p["S"], D)
            x = randn(gen, *shape)
            s_needed = p["S"] + max_offset
        s_max = p["s_max"] or s_needed
        inv_freq = 1.0 / (10000 ** (torch.arange(0, p["rotary_dim"], 2, dtype=torch.float64) / p["rotary_dim"]))
        angles = torch.arange(s_max, dtype=torch.float64).unsqueeze(1) * inv_freq.unsqueeze(0)
        # a little noise so an implementation that recomputes angles instead of reading cos/sin is caught
        angles = angles + 0.01 * randn(gen, *angles.shape)
        inputs = {"x": x, "cos": angles.cos(), "sin": angles.sin()}
        if isinstance(offsets, list):
            inputs["seqlen_offsets"] = torch.tensor(offsets, dtype=torch.int32)
        if p["varlen"]:
            bounds = [0]
            for length in p["varlen"]:
                bounds.append(bounds[-1] + length)
            inputs["cu_seqlens"] = torch.tensor(bounds, dtype=torch.int32)
        return inputs

    def call(self, fn, inputs, p):
        x = inputs["x"]
        if p["layout"] == "bhsd" and not p["varlen"]:
            x = x.transpose(1, 2)  # a (B, H, S, D) buffer viewed as (B, S, H, D)
        offsets = inputs.get("seqlen_offsets", p["offsets"] if not isinstance(p["offsets"], list) else 0)
        kwargs = dict(interleaved=p["interleaved"], seqlen_offsets=offsets)
        if p["varlen"]:
            kwargs.update(cu_seqlens=inputs["cu_seqlens"], max_seqlen=max(p["varlen"]))
        return fn(x, inputs["cos"], inputs["sin"], **kwargs)


FAMILIES = [
    family("sizes", [("s65_d128_interleaved", dict(S=65, D=128, interleaved=True, offsets=[0, 3])),
                         ("s129_d64_partial", dict(S=129, D=64, rotary_dim=32, H=2)),
                         ("s64_d96", dict(S=64, D=96, H=2)), ("s127_d80_interleaved", dict(S=127, D=80, interleaved=True)),
                         ("s192_d256", dict(S=192, D=256, H=1)), ("s1_d64", dict(S=1, D=64, offsets=[7, 0]))]),
    family("batch", [("b5_interleaved_offsets", dict(B=5, interleaved=True, offsets=[0, 5, 11, 2, 31])),
                         ("b4_half_offsets", dict(B=4, offsets=[9, 0, 1, 30])),
                         ("b3_varlen_interleaved", dict(varlen=[3, 17, 1, 9, 6], interleaved=True)),
                         ("b8_bhsd", dict(B=8, layout="bhsd", S=9, offsets=[0, 1, 2, 3, 4, 5, 6, 7]))]),
    family("values", [("denormal_x", dict(values={"x": "denormal_mix"}, B=3, offsets=[0, 2, 4])),
                          ("large_x", dict(values={"x": {"peak": 1e30, "max_frac": 0.25}}, interleaved=True))]),
    family("layouts", [("x_offset_interleaved", dict(views={"x": "offset"}, interleaved=True, B=3,
                                                         offsets=[0, 5, 11]))]
               + view_members(("x",), ("sliced", "transposed", "expanded"), base=dict(B=3, offsets=[0, 5, 11]))
               + view_members(("cos", "sin"), ("offset", "sliced"))),
    family("long", [("s4160_offsets", dict(B=2, S=4160, H=1, D=16, offsets=[0, 64])),
                        ("s16448_interleaved", dict(B=1, S=16448, H=1, D=16, interleaved=True))]),
]


# The argument space as dimensions: the `cover` family is a covering array over them (checks/covering.py)
ROTARY_HEAD_DIMS = {"d32": (32, None), "d64": (64, None), "d80": (80, None), "d128": (128, None),
                    "d64_rd32": (64, 32), "d96_rd16": (96, 16), "d40_rd24": (40, 24)}
ROTARY_VALUES = {"normal": {}, "denormal": dict(values={"x": "denormal_mix"}),
                 "large": dict(values={"x": {"peak": 1e30, "max_frac": 0.25}})}
ROTARY_DIMENSIONS = (("s_tile", TILES), ("s_offset", TILE_OFFSETS), ("length", ("tile", "one", "long")),
                     ("head_dim", tuple(ROTARY_HEAD_DIMS)), ("interleaved", (False, True)),
                     ("offsets", ("zero", "int", "tensor")), ("batch", (1, 2, 3, 5)), ("heads", (1, 2, 3, 4)),
                     ("varlen", (False, True)), ("x_layout", ("bshd", "bhsd", "offset", "sliced", "expanded")),
                     ("table_layout", ("contiguous", "cos_offset", "cos_sliced", "sin_sliced")),
                     ("values", tuple(ROTARY_VALUES)))


def _rotary_allowed(row):
    if row.get("varlen") and row.get("x_layout") == "bhsd":
        return False   # a packed x is (total, H, D)
    if row.get("length") == "long" and (row.get("batch", 1) > 2 or row.get("heads", 1) > 2 or row.get("varlen")):
        return False   # long sequences: few of them
    return True


def _rotary_cover_params(row):
    S = {"one": 1, "tile": tile_size(row["s_tile"], row["s_offset"]),
         "long": tile_size(row["s_tile"], row["s_offset"], 1024 // row["s_tile"])}[row["length"]]
    D, rotary_dim = ROTARY_HEAD_DIMS[row["head_dim"]]
    B = row["batch"]
    p = dict(B=B, S=S, H=row["heads"], D=D, rotary_dim=rotary_dim, interleaved=row["interleaved"],
             offsets={"zero": 0, "int": 3, "tensor": [0, 5, 11, 2, 31][:B]}[row["offsets"]],
             layout="bhsd" if row["x_layout"] == "bhsd" else "bshd", **ROTARY_VALUES[row["values"]])
    if row["varlen"]:
        p["varlen"] = [S, max(1, S // 2 - 1), 1, max(1, S - 1), 3][:max(B, 2)]
        if isinstance(p["offsets"], list):
            p["offsets"] = [0, 5, 11, 2, 31][:len(p["varlen"])]
        p["B"] = len(p["varlen"])
    views = {"x": row["x_layout"]} if row["x_layout"] in ("offset", "sliced", "expanded") else {}
    views.update(named_view(row["table_layout"]))
    if views:
        p["views"] = views
    return p


COVERING = {"rotary": Covering(ROTARY_DIMENSIONS, _rotary_cover_params, _rotary_allowed, seed=45)}


SPEC = RotarySpec()

# what `gpuparity.reference` (contracts/reference.py) exports from this contract
REFERENCES = ("apply_rotary", "rotary_positions")
