"""Battery cases for attention: every mask kind and their combinations, GQA, Sq != Sk,
custom scale, hostile values and layouts (docs/design.md)."""
from __future__ import annotations

import inspect
from typing import Any, Dict, List

import torch

from ... import reference
from ...backends.masks import attention_kind
from ...backends.registry import BackendUnavailable, Problem
from ...numerics import matmul_tf32
from .base import Case, OpSpec, randn, tf32_precision


def _case(name, level="default", **params) -> Case:
    defaults = dict(B=2, H=2, Hkv=None, Sq=16, Sk=None, D=32, mask="none", causal=False, scale=None,
                    layout="bhsd", logit_scale=1.0, lengths=None, empty_rows=0, mask_shape="b1qk",
                    window=None, softcap=None)
    defaults.update(params)
    defaults["Hkv"] = defaults["Hkv"] or defaults["H"]
    defaults["Sk"] = defaults["Sk"] or defaults["Sq"]
    return Case(name, defaults, level)


CASES: List[Case] = [
    # quick: the hostile core, small enough for every level
    _case("plain", "quick"),
    _case("key_padding_varlen", "quick", B=3, Sq=17, mask="key_padding", lengths=[17, 5, 1]),
    _case("key_padding_empty_batch", "quick", B=2, Sq=9, mask="key_padding", lengths=[9, 0]),
    _case("bool_mask_sq_ne_sk", "quick", Sq=13, Sk=29, mask="bool", empty_rows=1),
    _case("float_mask_broadcast", "quick", Sq=12, Sk=20, mask="float", mask_shape="qk", empty_rows=1),
    _case("causal_key_padding", "quick", B=2, Sq=33, mask="key_padding+causal", causal=True, lengths=[33, 20]),
    _case("gqa_key_padding", "quick", H=4, Hkv=2, Sq=24, mask="key_padding", lengths=[24, 7]),
    _case("large_logits_x30", "quick", Sq=32, logit_scale=30.0, mask="key_padding", lengths=[32, 11]),
    _case("strided_bshd_d40", "quick", D=40, Sq=19, layout="bshd", mask="key_padding", lengths=[19, 6]),
    _case("causal_scale_sq_lt_sk", "quick", Sq=7, Sk=19, causal=True, scale=0.3),
    # sliding window (FlashAttention's window_size, top-left aligned) and Gemma-2's softcap
    _case("window_local", "quick", Sq=40, window=(7, 3)),
    _case("softcap_x30_logits", "quick", Sq=32, logit_scale=30.0, softcap=20.0, mask="key_padding", lengths=[32, 11]),
    _case("window_softcap_causal_padding", "quick", H=4, Hkv=2, Sq=45, window=(9, 0), softcap=30.0, causal=True,
          mask="key_padding", lengths=[45, 17]),
    _case("window_sq_ne_sk_empty_rows", Sq=50, Sk=20, window=(0, 2), mask="key_padding", lengths=[20, 8]),
    _case("window_bool_mask", Sq=33, window=(4, 4), mask="bool", empty_rows=1),
    _case("softcap_float_mask_d64", D=64, Sq=24, softcap=5.0, mask="float", mask_shape="qk"),
    # default: sizes and shapes a kernel author must survive
    _case("one_valid_key", B=3, Sq=10, Sk=40, mask="key_padding", lengths=[1, 1, 40]),
    _case("odd_150_aam", B=2, H=4, Sq=150, D=32, mask="key_padding", lengths=[150, 97]),
    _case("long_1000", B=1, H=2, Sq=1000, D=64, mask="key_padding", lengths=[613]),
    _case("decode_sq1", B=2, H=4, Hkv=1, Sq=1, Sk=77, D=64, mask="key_padding", lengths=[77, 30]),
    _case("mqa_causal", B=2, H=6, Hkv=1, Sq=40, D=64, causal=True),
    _case("d80_bool_full_shape", D=80, Sq=21, Sk=35, mask="bool", mask_shape="bhqk", empty_rows=1),
    _case("d96_float_b1qk", D=96, Sq=17, mask="float", mask_shape="b1qk"),
    _case("d160_key_padding", D=160, Sq=33, mask="key_padding", lengths=[33, 2]),
    _case("d256_causal", D=256, Sq=18, causal=True, B=1),
    _case("d16_bool_keys_only", D=16, Sq=40, mask="bool", mask_shape="11_k"),
    _case("bool_plus_key_padding", Sq=25, mask="bool+key_padding", lengths=[25, 13], empty_rows=1),
    _case("float_mask_causal", Sq=20, mask="float+causal", causal=True, mask_shape="qk"),
    _case("sliced_noncontiguous", D=48, Sq=23, layout="sliced", mask="key_padding", lengths=[23, 4]),
    _case("all_padded_but_gqa", H=4, Hkv=2, Sq=15, mask="key_padding", lengths=[0, 0]),
    # full: longer sequences
    _case("long_4097", "full", B=1, H=2, Sq=4097, D=64, mask="key_padding", lengths=[3001]),
    _case("batch8_varlen_150", "full", B=8, H=4, Sq=150, D=32, mask="key_padding",
          lengths=[150, 149, 120, 64, 33, 17, 2, 1]),
]


class AttentionSpec(OpSpec):
    # keywords of cases that need a feature an implementation may lack (checks/signature.py, call)
    optional_keywords = ("window", "softcap")

    op = "attention"
    signature = "fn(q, k, v, *, attn_mask=None, key_padding_mask=None, is_causal=False, scale=None)"
    grad_inputs = ("q", "k", "v")
    reference_fn = staticmethod(reference.attention)

    def cases(self):
        return CASES

    def kind(self, params):
        masks = self._mask_tensors_meta(params)
        return attention_kind(*masks, params["causal"], params.get("window"), params.get("softcap"))

    @staticmethod
    def _mask_tensors_meta(params):
        """Placeholders with the right dtype only, for mask_kind()."""
        kinds = params["mask"].split("+")
        attn = None
        if "bool" in kinds:
            attn = torch.zeros((), dtype=torch.bool)
        elif "float" in kinds:
            attn = torch.zeros(())
        kpm = torch.zeros((), dtype=torch.bool) if "key_padding" in kinds else None
        return attn, kpm

    def problem(self, params, dtype, device):
        attn, kpm = self._mask_tensors_meta(params)
        features = (("head_dim", params["D"]), ("has_mask", attn is not None or kpm is not None),
                    ("gqa", params["H"] != params["Hkv"]), ("mask_requires_grad", False),
                    ("seq_q", params["Sq"]), ("seq_k", params["Sk"]))
        for name in ("window", "softcap"):
            if params.get(name) is not None:
                features += ((name, params[name]),)
        return Problem("attention", device, dtype, self.kind(params), features)

    def make_inputs(self, p, gen):
        B, H, Hkv, Sq, Sk, D = p["B"], p["H"], p["Hkv"], p["Sq"], p["Sk"], p["D"]
        width = 2 * D if p["layout"] == "sliced" else D
        if p["layout"] == "bshd":  # stored (B, S, H, D), viewed as (B, H, S, D)
            q = randn(gen, B, Sq, H, width)
            k = randn(gen, B, Sk, Hkv, width)
            v = randn(gen, B, Sk, Hkv, width)
        else:
            q = randn(gen, B, H, Sq, width)
            k = randn(gen, B, Hkv, Sk, width)
            v = randn(gen, B, Hkv, Sk, width)
        q = q * p["logit_scale"]
        inputs: Dict[str, Any] = {"q": q, "k": k, "v": v}
        kinds = p["mask"].split("+")
        if "key_padding" in kinds:
            lengths = p["lengths"]
            inputs["key_padding_mask"] = torch.arange(Sk).view(1, Sk) >= torch.tensor(lengths).view(B, 1)
        if "bool" in kinds or "float" in kinds:
            shape = {"b1qk": (B, 1, Sq, Sk), "bhqk": (B, H, Sq, Sk), "qk": (Sq, Sk), "11_k": (1, 1, 1, Sk)}[p["mask_shape"]]
            keep = torch.rand(*shape, generator=gen) > 0.3
            if p["empty_rows"] and shape[-2] > 1:
                keep.view(-1, shape[-2], Sk)[0, shape[-2] // 2, :] = False  # one row with nothing to attend to
            if p["mask_shape"] == "11_k":
                keep[..., 0] = True
            if "bool" in kinds:
                inputs["attn_mask"] = keep
            else:
                additive = randn(gen, *shape, scale=2.0)
                inputs["attn_mask"] = additive.masked_fill(~keep, float("-inf"))
        return inputs

    def _views(self, inputs, p):
        q, k, v = inputs["q"], inputs["k"], inputs["v"]
        if p["layout"] == "bshd":
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        elif p["layout"] == "sliced":
            q, k, v = q[..., ::2], k[..., ::2], v[..., ::2]
        return q, k, v

    def call(self, fn, inputs, p):
        q, k, v = self._views(inputs, p)
        # window/softcap only when set: backends that know neither keep their old signature, and
        # a user's --impl without them gets those cases as SKIP with the reason, not as errors
        extras = {name: p[name] for name in self.optional_keywords if p.get(name) is not None}
        missing = [name for name in extras if not _takes(fn, name)]
        if missing:
            raise BackendUnavailable(f"{getattr(fn, '__name__', 'the implementation')}: takes no "
                                     f"{' or '.join(missing)} argument, which this case needs")
        return fn(q, k, v, attn_mask=inputs.get("attn_mask"), key_padding_mask=inputs.get("key_padding_mask"),
                  is_causal=p["causal"], scale=p["scale"], **extras)

    def zero_masks(self, inputs, p):
        empty = reference.empty_query_rows(p["Sq"], p["Sk"], p["B"], p["H"], attn_mask=inputs.get("attn_mask"),
                                           key_padding_mask=inputs.get("key_padding_mask"),
                                           is_causal=p["causal"], window=p.get("window"))
        if not bool(empty.any()):
            return {}
        masks = {"out": empty}
        # dq is zero on those rows; in storage layout for strided cases
        masks["grad_q"] = empty.transpose(1, 2) if p["layout"] == "bshd" else empty
        return masks

    def precision(self, dtype, device):
        return tf32_precision(dtype, device, matmul_tf32())

    def timing_params(self):
        return _case("timing", B=4, H=4, Sq=256, D=64, mask="key_padding", lengths=[256, 200, 131, 64]).params

    def large_timing_params(self):
        return _case("timing-large", B=2, H=8, Sq=2048, D=64, mask="key_padding", lengths=[2048, 1536]).params

    def is_large(self, problem):
        # at 1024 x 1024 keys per head the kernels' time outweighs the host's
        return problem.feature("q_len", 0) * problem.feature("k_len", 0) >= 1024 * 1024


SPEC = AttentionSpec()


def _takes(fn, name: str) -> bool:
    """Whether fn accepts keyword `name` (or **kwargs); True when Python cannot tell."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return True
    try:
        signature.bind_partial(**{name: None})
    except TypeError:
        return False
    return True
