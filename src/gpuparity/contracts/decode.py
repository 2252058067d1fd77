"""Battery cases for attention_decode (new queries against a KV cache, inference only): cache
lengths of 0, 1 and full, fewer keys than new queries, 1 to 16 new queries, GQA/MQA, softcap on
large logits; the forward against the float64 item-by-item reference."""
from __future__ import annotations

from typing import Any, Dict, List

import torch

from ..backends.registry import Problem
from ..backends.triton_decode import decode_reference
from ..numerics import matmul_tf32
from .base import Case, OpSpec, family, randn, tf32_precision, view_members


def _case(name, level="default", **params) -> Case:
    defaults = dict(B=3, H=4, Hkv=2, Sq=1, S_max=40, D=32, lengths=None, softcap=None, scale=None,
                    logit_scale=1.0, seqlens_dtype="int32", layout="bhsd", forward_only=True)
    defaults.update(params)
    if defaults["lengths"] is None:
        defaults["lengths"] = [0, 1, defaults["S_max"]][:defaults["B"]]
    return Case(name, defaults, level)


CASES: List[Case] = [
    # quick: the hostile core (small: the probe runs these under Triton's interpreter on a CPU)
    _case("lengths_0_1_full", "quick"),
    _case("sq4_fewer_keys_than_queries", "quick", Sq=4, lengths=[0, 3, 40]),
    _case("sq16_mqa", "quick", Sq=16, H=4, Hkv=1, lengths=[16, 40, 7]),
    _case("softcap_x30_logits", "quick", Sq=2, logit_scale=30.0, softcap=20.0, lengths=[40, 23, 2]),
    _case("scale_int64_lengths", "quick", Sq=3, scale=0.2, seqlens_dtype="int64", lengths=[5, 0, 33]),
    # default: realistic head dims and longer caches
    _case("d64_gqa_long", B=4, H=8, Hkv=2, D=64, S_max=300, Sq=1, lengths=[300, 1, 0, 157]),
    _case("d128_sq8", B=2, H=4, Hkv=4, D=128, S_max=200, Sq=8, lengths=[200, 64]),
    _case("d256_mqa", B=2, H=4, Hkv=1, D=256, S_max=70, Sq=1, lengths=[70, 35]),
    _case("d80_softcap_sq5", B=2, H=6, Hkv=3, D=80, S_max=90, Sq=5, softcap=30.0, lengths=[90, 4]),
    _case("strided_cache_bshd", B=2, H=4, Hkv=2, D=64, S_max=50, Sq=2, layout="bshd", lengths=[50, 17]),
    # full: a long cache
    _case("long_4096", "full", B=2, H=8, Hkv=1, D=128, S_max=4096, Sq=1, lengths=[4096, 2500]),
]


class DecodeSpec(OpSpec):
    op = "attention_decode"
    signature = "fn(q, k_cache, v_cache, cache_seqlens, *, scale=None, softcap=None)"
    grad_inputs = ()            # inference only: the op refuses tensors that require grad
    reference_fn = staticmethod(decode_reference)

    def cases(self):
        return CASES

    def families(self):
        return FAMILIES

    def make_case(self, name, level="default", **overrides):
        return _case(name, level, **overrides)

    def normalize(self, params):
        params = dict(params)
        if params.get("lengths") is not None:
            lengths = list(params["lengths"])[:params["B"]]
            lengths += [params["S_max"]] * (params["B"] - len(lengths))
            params["lengths"] = [min(length, params["S_max"]) for length in lengths]
        return params

    def work(self, p):
        return p["B"] * p["H"] * p["Sq"] * p["S_max"]

    def kind(self, p):
        return "softcap" if p["softcap"] is not None else "default"

    def problem(self, p, dtype, device):
        # the features ops.decode.decode_problem gives the dispatcher
        features = (("head_dim", p["D"]), ("gqa", p["H"] != p["Hkv"]), ("q_len", p["Sq"]))
        if p["softcap"] is not None:
            features += (("softcap", float(p["softcap"])),)
        return Problem(self.op, device, dtype, self.kind(p), features)

    def make_inputs(self, p, gen) -> Dict[str, Any]:
        B, H, Hkv, Sq, S, D = p["B"], p["H"], p["Hkv"], p["Sq"], p["S_max"], p["D"]
        cache_shape = (B, S, Hkv, D) if p["layout"] == "bshd" else (B, Hkv, S, D)
        return {"q": randn(gen, B, H, Sq, D) * p["logit_scale"], "k_cache": randn(gen, *cache_shape),
                "v_cache": randn(gen, *cache_shape),
                "cache_seqlens": torch.tensor(p["lengths"], dtype=getattr(torch, p["seqlens_dtype"]))}

    def call(self, fn, inputs, p):
        k_cache, v_cache = inputs["k_cache"], inputs["v_cache"]
        if p["layout"] == "bshd":   # a (B, S_max, Hkv, D) cache viewed as (B, Hkv, S_max, D)
            k_cache, v_cache = k_cache.transpose(1, 2), v_cache.transpose(1, 2)
        return fn(inputs["q"], k_cache, v_cache, inputs["cache_seqlens"], scale=p["scale"], softcap=p["softcap"])

    def zero_masks(self, inputs, p):
        lengths = inputs["cache_seqlens"].long().clamp(0, p["S_max"]).view(-1, 1, 1, 1)
        visible = lengths - p["Sq"] + 1 + torch.arange(p["Sq"]).view(1, 1, -1, 1)
        empty = visible <= 0   # (B, 1, Sq, 1): queries that see no key return zeros
        return {"out": empty} if bool(empty.any()) else {}

    def precision(self, dtype, device):
        return tf32_precision(dtype, device, matmul_tf32())


FAMILIES = [
    family("tile", [("cache_192_lengths_64_65", dict(S_max=192, lengths=[192, 64, 65], D=64)),
                        ("cache_129", dict(S_max=129, lengths=[127, 128, 129])),
                        ("cache_320_sq4", dict(S_max=320, Sq=4, lengths=[320, 63, 1])),
                        ("cache_256_sq2", dict(S_max=256, Sq=2, lengths=[255, 256, 2]))]),
    family("batch", [("b5_distinct", dict(B=5, lengths=[40, 0, 17, 1, 33])),
                         ("b8_mqa", dict(B=8, H=4, Hkv=1, S_max=20, lengths=[20, 19, 1, 0, 7, 8, 15, 2]))]),
    family("head_dim", [("d128_sq3", dict(D=128, Sq=3, lengths=[40, 9, 2])),
                            ("d64_sq16", dict(D=64, Sq=16, lengths=[16, 40, 20])), ("d96", dict(D=96))]),
    family("gqa", [("h8_hkv2", dict(H=8, Hkv=2)), ("h6_hkv1", dict(H=6, Hkv=1)), ("h12_hkv4", dict(H=12, Hkv=4))]),
    family("values", [("logits_x30", dict(logit_scale=30.0, lengths=[40, 23, 2])),
                          ("denormal_cache", dict(values={"k_cache": "denormal_mix", "v_cache": "denormal_mix"}))]),
    family("layouts", view_members(("q", "k_cache", "v_cache"), ("offset", "sliced", "transposed"))),
    family("long", [("cache_16448", dict(B=2, H=2, Hkv=1, S_max=16448, lengths=[16448, 4097])),
                        ("cache_131136", dict(B=1, H=2, Hkv=1, S_max=131136, lengths=[131136]))], sized=True),
]


SPEC = DecodeSpec()
