"""Battery cases for rotary embeddings: both layouts, partial rotary_dim, int and per-batch
offsets, packed varlen, and batches > 1 everywhere (where a real port's batch stride broke)."""
from __future__ import annotations


from typing import List

import torch

from .. import reference
from .base import Case, OpSpec, family, randn, view_members


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
    signature = ("fn(x, cos, sin, *, interleaved=False, seqlen_offsets=0, cu_seqlens=None, "
                 "max_seqlen=None)")
    grad_inputs = ("x",)
    reference_fn = staticmethod(reference.apply_rotary)

    def cases(self):
        return CASES

    def families(self):
        return FAMILIES

    def make_case(self, name, level="default", **overrides):
        return _case(name, level, **overrides)

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


SPEC = RotarySpec()

