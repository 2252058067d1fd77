"""The attention_varlen contract (packed sequences, flash_attn_varlen_func's layout): its argument
checks and `Problem`, float64 reference, plain composition and the battery's cases: empty
and length-1 sequences, Sq != Sk per sequence under bottom-right causal and window, GQA/MQA,
softcap on large logits, forward and backward against the float64 per-sequence reference."""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import torch

from .masks import attention_kind
from ..registry import Backend, BackendUnavailable, Problem
from ..numerics import matmul_tf32
from .attention import alibi_bias, alibi_slopes, attention as reference_attention, attention_condition_sums
from .attention import attention_logit_peak, near_one_hot_terms
from .attention import BACKWARD_ARGS, check_window, composition, with_alibi
from .base import (INDEX_DTYPES, TILE_OFFSETS, TILES, Case, Covering, OpSpec, capturing, takes, check_softcap, checked_once,
                   family, randn, tf32_precision, tile_size, view_members)
import numbers
from ..validation import FLOAT_DTYPES, describe, expect_same_device, expect_same_dtype, expect_tensor
from .signature import Arg, Signature

# gpuparity.attention_varlen's signature, its torch.library op's (outputs: out and the fp32 lse the
# Triton backward reads) and the backends' (contracts/signature.py)
ATTENTION_VARLEN = Signature("attention_varlen", (
    Arg("q", "Tensor", grad=True),
    Arg("k", "Tensor", grad=True),
    Arg("v", "Tensor", grad=True),
    Arg("cu_seqlens_q", "Tensor"),
    Arg("cu_seqlens_k", "Tensor"),
    Arg("max_seqlen_q", "SymInt"),
    Arg("max_seqlen_k", "SymInt"),
    Arg("causal", "bool", False, keyword=True),
    Arg("window", "SymInt[]?", None, keyword=True),
    Arg("softcap", "float?", None, keyword=True),
    Arg("scale", "float?", None, keyword=True),
    Arg("backend", "str", "auto", keyword=True, backend=False),
    Arg("return_lse", "bool", False, keyword=True, library=False, backend=False),
), outputs=("out", "lse"))
# gpuparity::attention_varlen_backward, the backward op attention_varlen's autograd formula calls
ATTENTION_VARLEN_BACKWARD = Signature("attention_varlen_backward", (
    *BACKWARD_ARGS,
    Arg("cu_seqlens_q", "Tensor"),
    Arg("cu_seqlens_k", "Tensor"),
    Arg("max_seqlen_q", "SymInt"),
    Arg("max_seqlen_k", "SymInt"),
    Arg("causal", "bool"),
    Arg("window", "SymInt[]?"),
    Arg("softcap", "float?"),
    Arg("scale", "float?"),
    Arg("backend", "str"),
), outputs=("dq", "dk", "dv"), public=False)


# --------------------------------------------------------------------------- the call: arguments checked, and the Problem the dispatcher gets
def _check_max(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        raise TypeError(f"{name}: expected an int >= 0 (the longest sequence), got {describe(value)}")
    return int(value)


def _cu_values(cu: torch.Tensor) -> Tuple[int, int, int, int]:
    """(first, last, number of decreasing steps, longest sequence) of a cu_seqlens: one host sync."""
    cu64 = cu.long()
    lengths = cu64[1:] - cu64[:-1]
    longest = lengths.max() if lengths.numel() else cu64.new_zeros(())
    first, last, decreasing, longest = (int(x) for x in torch.stack([
        cu64[0], cu64[-1], (lengths < 0).sum(), longest]).tolist())
    return first, last, decreasing, longest


def _check_cu_values(name: str, cu: torch.Tensor, total: int, total_name: str, max_name: str, max_seqlen: int):
    """The values of one cu_seqlens: from 0, non-decreasing, ending at the total number of
    tokens, no sequence longer than max_seqlen (one host sync, once per tensor and version: a
    model's layers share their cu_seqlens, contracts.base.checked_once)."""
    checked_once((cu,), ("varlen", total, max_seqlen),
                 lambda: _check_cu(name, cu, total, total_name, max_name, max_seqlen))


def _check_cu(name: str, cu: torch.Tensor, total: int, total_name: str, max_name: str, max_seqlen: int) -> None:
    first, last, decreasing, longest = _cu_values(cu)
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
                             window=None, softcap=None, scale=None, check_values: bool = True) -> Problem:
    """Validate the inputs of `attention_varlen` and describe the call for the dispatcher.
    Raises TypeError/ValueError naming the argument, what it got and what it needs. The checks
    of cu_seqlens' values (one host sync) are skipped while a graph is captured or traced (the
    torch.library op runs them when it runs) and with check_values=False (its backward: the
    forward checked the same tensors)."""
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
    if check_values and not capturing(q.device):
        _check_cu_values("cu_seqlens_q", cu_seqlens_q, q.shape[0], "q.shape[0]", "max_seqlen_q", max_q)
        _check_cu_values("cu_seqlens_k", cu_seqlens_k, k.shape[0], "k.shape[0]", "max_seqlen_k", max_k)
    features = (("head_dim", int(head_dim)), ("gqa", kv_heads != heads), ("is_causal", causal),
                ("q_len", max_q), ("k_len", max_k))
    if window is not None:
        features += (("window", window),)
    if softcap is not None:
        features += (("softcap", softcap),)
    return Problem(op="attention_varlen", device=q.device, dtype=q.dtype, kind=attention_kind(None, None, causal, window, softcap),
                   features=features)


# --------------------------------------------------------------------------- the trusted composition (the op's "composition" backend)
# Bottom-right aligned as FlashAttention's varlen; the float64 reference packs its sequences the same way.
def bottom_right_allowed(q_len: int, k_len: int, causal: bool, window, device) -> Optional[torch.Tensor]:
    """Bool (Sq, Sk), True = attend, or None when nothing is masked. Bottom-right aligned as
    FlashAttention's varlen: query i sits at key position i + Sk - Sq, so with causal it sees keys
    j <= i + Sk - Sq and with window (left, right) keys i + Sk - Sq - left <= j <= i + Sk - Sq + right
    (-1: that side unbounded)."""
    if not causal and window is None:
        return None
    # key position relative to the query's own position on the diagonal
    offset = (torch.arange(k_len, device=device).view(1, k_len)
              - torch.arange(q_len, device=device).view(q_len, 1) - (k_len - q_len))
    keep = torch.ones(q_len, k_len, dtype=torch.bool, device=device)
    if causal:
        keep &= offset <= 0
    if window is not None:
        left, right = window
        if left >= 0:
            keep &= offset >= -left
        if right >= 0:
            keep &= offset <= right
    return keep


def packed(dense, q, k, v, cu_seqlens_q, cu_seqlens_k, causal, window, scale, softcap, alibi_slopes=None):
    """Run `dense` (q, k, v as (1, H, S, D), attn_mask=, scale=, softcap=) on each sequence and
    pack the outputs back into (total_q, H, D); an empty sequence contributes nothing.
    alibi_slopes (H,) or (B, H): FlashAttention's bias on each sequence's own lengths (bottom-right),
    as a float mask (float64 beside float64 inputs, else fp32, as the dense composition adds masks)."""
    starts_q = cu_seqlens_q.tolist()
    starts_k = cu_seqlens_k.tolist()
    pieces = []
    for b in range(len(starts_q) - 1):
        qs, qe, ks, ke = starts_q[b], starts_q[b + 1], starts_k[b], starts_k[b + 1]
        if qe == qs:
            continue
        q_i, k_i, v_i = (t.transpose(0, 1).unsqueeze(0) for t in (q[qs:qe], k[ks:ke], v[ks:ke]))
        if ke == ks:  # no key: the rows are empty, zero
            pieces.append(torch.zeros_like(q[qs:qe]))
            continue
        mask = bottom_right_allowed(qe - qs, ke - ks, causal, window, q.device)
        if alibi_slopes is not None:
            row = alibi_slopes[b] if alibi_slopes.dim() == 2 and alibi_slopes.shape[0] > 1 else alibi_slopes.reshape(-1)
            bias_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
            mask = with_alibi(mask, alibi_bias(row.to(q.device), qe - qs, ke - ks, bias_dtype))
        kwargs = {"softcap": softcap} if softcap is not None else {}
        pieces.append(dense(q_i, k_i, v_i, attn_mask=mask, scale=scale, **kwargs)[0].transpose(0, 1))
    if not pieces:
        return torch.zeros_like(q)
    return torch.cat(pieces, dim=0)


def composition_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, causal=False,
                       window=None, softcap=None, scale=None, alibi_slopes=None):
    """Matmul-softmax-matmul per sequence in q's dtype (softmax in fp32); max_seqlen_* unused."""
    return packed(composition, q, k, v, cu_seqlens_q, cu_seqlens_k, causal, window, scale, softcap, alibi_slopes)


def empty_rows(cu_seqlens_q, cu_seqlens_k, *, causal=False, window=None) -> torch.Tensor:
    """Bool (total_q,): the rows that see no key (their output and gradients must be exactly 0)."""
    starts_q, starts_k = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    rows = []
    for b in range(len(starts_q) - 1):
        q_len, k_len = starts_q[b + 1] - starts_q[b], starts_k[b + 1] - starts_k[b]
        allowed = bottom_right_allowed(q_len, k_len, causal, window, "cpu")
        if allowed is None:
            allowed = torch.ones(q_len, k_len, dtype=torch.bool)
        rows.append(~allowed.any(-1))
    return torch.cat(rows) if rows else torch.zeros(0, dtype=torch.bool)


# registered by backends.load in the order its line of gpuparity.manifest gives (after the varlen kernel)
COMPOSITIONS = (Backend("composition", "attention_varlen", composition_varlen,
                 "each packed sequence through the dense matmul-softmax-matmul composition (one host sync)",
                 fallback=True),)


# --------------------------------------------------------------------------- the float64 reference
def attention_varlen_reference(q, k, v, cu_seqlens_q, cu_seqlens_k, *, causal=False,
                               window: Optional[Tuple[int, int]] = None, softcap=None, scale=None,
                               alibi_slopes=None):
    """The float64 referee: each sequence through the attention contract's reference (float64 on q's
    device, differentiable) with its bottom-right mask. Inputs are upcast; returns float64."""
    def dense(q_i, k_i, v_i, *, attn_mask=None, scale=None, softcap=None):
        return reference_attention(q_i, k_i, v_i, attn_mask=attn_mask, scale=scale, softcap=softcap)

    return packed(dense, q.double(), k.double(), v.double(), cu_seqlens_q, cu_seqlens_k, causal, window, scale,
                  softcap, alibi_slopes)


# --------------------------------------------------------------------------- the battery's cases
def _case(name, level="default", **params) -> Case:
    # params travel to the workers as JSON: lists, not tuples
    defaults = dict(q_lens=[5, 9], k_lens=None, H=2, Hkv=None, D=16, causal=False, window=None, softcap=None,
                    scale=None, logit_scale=1.0, cu_dtype="int32", layout="packed", alibi=None)
    defaults.update(params)
    defaults["Hkv"] = defaults["Hkv"] or defaults["H"]
    defaults["k_lens"] = defaults["k_lens"] or list(defaults["q_lens"])
    return Case(name, defaults, level)


CASES: List[Case] = [
    # quick: the hostile core (small: the probe runs these under Triton's interpreter on a CPU)
    _case("empty_and_single_sequences", "quick", q_lens=[1, 17, 0, 5, 3], k_lens=[4, 17, 3, 2, 0], H=4, Hkv=2),
    _case("length_1_everywhere", "quick", q_lens=[1, 1, 1], k_lens=[1, 1, 1], causal=True),
    _case("causal_sq_ne_sk_bottom_right", "quick", q_lens=[7, 3, 12], k_lens=[19, 3, 5], causal=True),
    _case("gqa_window", "quick", q_lens=[9, 20], k_lens=[20, 9], H=4, Hkv=2, window=[3, 2]),
    _case("causal_window_scale", "quick", q_lens=[6, 15], k_lens=[10, 15], causal=True, window=[6, -1], scale=0.3),
    _case("softcap_x30_logits", "quick", q_lens=[8, 13], k_lens=[13, 8], logit_scale=30.0, softcap=20.0, D=32),
    _case("mqa_causal_softcap_int64", "quick", q_lens=[4, 11], k_lens=[11, 11], H=3, Hkv=1, causal=True,
          softcap=5.0, cu_dtype="int64"),
    # default: head dims and lengths a kernel author must survive
    _case("strided_packed_qkv_d40", q_lens=[13, 6], D=40, layout="qkv_view", causal=True),
    _case("window_sq_gt_sk_empty_rows", q_lens=[30, 4], k_lens=[8, 4], window=[0, 2], causal=True),
    _case("odd_150_d64_gqa", q_lens=[150, 97, 1], k_lens=[150, 120, 33], H=4, Hkv=2, D=64, causal=True),
    _case("d128_mixed", q_lens=[65, 0, 31], k_lens=[65, 7, 40], H=2, D=128),
    _case("d256_window_softcap", q_lens=[33, 18], D=256, window=[8, 8], softcap=30.0, H=1),
    _case("many_short_sequences", q_lens=[1, 2, 3, 4, 5, 6, 7, 8, 0, 9], H=2, Hkv=1, causal=True),
    # ALiBi (gpuparity.flash_attn's alibi_slopes; "head": (H,), "batch": (B, H)), on each sequence's own
    # lengths: only implementations taking alibi_slopes run them (the kernels opt in to "alibi")
    _case("alibi_causal_gqa_per_batch", q_lens=[7, 13, 1], k_lens=[19, 13, 6], H=4, Hkv=2, causal=True,
          alibi="batch"),
    _case("alibi_window_softcap_empty", q_lens=[9, 0, 20], k_lens=[20, 3, 9], window=[3, 2], softcap=20.0,
          alibi="head"),
    # full: longer sequences
    _case("long_2049_causal", "full", q_lens=[2049, 700], k_lens=[2049, 1500], H=2, D=64, causal=True),
    _case("long_window_gqa", "full", q_lens=[1000, 513], H=4, Hkv=1, D=64, window=[128, 0], causal=True),
]


def _cumulative(lengths, dtype: str) -> torch.Tensor:
    return torch.tensor([0] + list(lengths), dtype=torch.int64).cumsum(0).to(getattr(torch, dtype))


def _window(p):
    return None if p["window"] is None else tuple(p["window"])


def _reference(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, causal=False, window=None,
               softcap=None, scale=None, alibi_slopes=None):
    return attention_varlen_reference(q, k, v, cu_seqlens_q, cu_seqlens_k, causal=causal, window=window,
                                      softcap=softcap, scale=scale, alibi_slopes=alibi_slopes)


def _case_slopes(p: Dict[str, Any], device) -> torch.Tensor:
    """An ALiBi case's slopes, (H,) or per sequence (B, H), B being the number of sequences."""
    return alibi_slopes({"H": p["H"], "B": len(p["q_lens"]), "alibi": p["alibi"]}, device)


class VarlenSpec(OpSpec):
    op = "attention_varlen"
    # speed priors per device family, fastest first (priors.py: what they mean, the records)
    priors = {"cuda": ["triton"], "cpu": ["composition"]}
    signature = ATTENTION_VARLEN.call_line()
    grad_inputs = ("q", "k", "v", "qkv")   # qkv: the one buffer of the strided-view case
    optional_keywords = ("alibi_slopes",)  # an implementation without it gets the ALiBi cases as SKIP

    def keywords_needed(self, p):
        return ("alibi_slopes",) if p.get("alibi") else ()
    reference_fn = staticmethod(_reference)

    def work(self, p):
        return p["H"] * sum(q * k for q, k in zip(p["q_lens"], p["k_lens"]))

    def error_terms(self, inputs, p):
        """As attention's, per sequence: out and grad_q sum over a sequence's keys, grad_k and
        grad_v over its query rows (times the heads sharing a KV head), grad_qkv both; the logit
        peak is the largest over the sequences, each under its bottom-right mask; with the output's
        gradient in inputs["grad_out"], grad_q's, grad_k's and grad_qkv's logit_condition and
        delta_condition (as attention's: near one-hot rows) from attention_condition_sums added over the sequences."""
        if p["layout"] == "qkv_view":
            q, k, v = inputs["qkv"][:, 0], inputs["qkv"][:, 1], inputs["qkv"][:, 2]
        else:
            q, k, v = inputs["q"], inputs["k"], inputs.get("v")
        grad_out = inputs.get("grad_out")
        sums = None   # attention_condition_sums over the sequences (near one-hot rows)
        bounds_q, bounds_k = inputs["cu_seqlens_q"].tolist(), inputs["cu_seqlens_k"].tolist()
        slopes = None
        if p.get("alibi"):   # each sequence's ALiBi bias on its own lengths, as the referee adds it
            slopes = _case_slopes(p, q.device).expand(len(p["q_lens"]), p["H"])
        peak = 0.0
        for b in range(len(bounds_q) - 1):
            (qs, qe), (ks, ke) = bounds_q[b:b + 2], bounds_k[b:b + 2]
            if qe > qs and ke > ks:
                mask = bottom_right_allowed(qe - qs, ke - ks, p["causal"], _window(p), q.device)
                if slopes is not None:
                    mask = with_alibi(mask, alibi_bias(slopes[b], qe - qs, ke - ks))
                q_i, k_i = (t.transpose(0, 1).unsqueeze(0) for t in (q[qs:qe], k[ks:ke]))
                peak = max(peak, attention_logit_peak(q_i, k_i, attn_mask=mask, scale=p["scale"],
                                                      softcap=p["softcap"]))
                if isinstance(grad_out, torch.Tensor) and v is not None:
                    v_i, dout_i = v[ks:ke].transpose(0, 1).unsqueeze(0), grad_out[qs:qe].transpose(0, 1).unsqueeze(0)
                    part = attention_condition_sums(q_i, k_i, v_i, dout_i, attn_mask=mask, scale=p["scale"],
                                                    softcap=p["softcap"])
                    sums = part if sums is None else {name: {key: sums[name][key] + value for key, value in parts.items()}
                                                      for name, parts in part.items()}
        keys = {"reduction": max(p["k_lens"], default=0), "logit_peak": peak}
        rows = {"reduction": max(p["q_lens"], default=0) * (p["H"] // p["Hkv"]), "logit_peak": peak}
        both = {"reduction": max(keys["reduction"], rows["reduction"]), "logit_peak": peak}
        terms = {"out": keys, "grad_q": dict(keys), "grad_k": dict(rows), "grad_v": rows, "grad_qkv": dict(both)}
        if sums is not None:
            # grad_qkv holds grad_q and grad_k: their shifts and sizes add
            sums["grad_qkv"] = {key: sums["grad_q"][key] + sums["grad_k"][key] for key in sums["grad_q"]}
            for name, extra in near_one_hot_terms(sums).items():
                terms[name].update(extra)
        return terms

    def kind(self, p):
        kind = attention_kind(None, None, p["causal"], p["window"], p["softcap"])
        return kind + "+alibi" if p.get("alibi") else kind   # verdicts of their own, as gpuparity.flash_attn asks

    def problem(self, p, dtype, device):
        # the features ops.varlen.attention_varlen_problem gives the dispatcher
        features = (("head_dim", p["D"]), ("gqa", p["H"] != p["Hkv"]), ("is_causal", p["causal"]),
                    ("q_len", max(p["q_lens"])), ("k_len", max(p["k_lens"])))
        if p["window"] is not None:
            features += (("window", _window(p)),)
        if p["softcap"] is not None:
            features += (("softcap", float(p["softcap"])),)
        if p.get("alibi"):
            features += (("alibi", True),)   # an OPT_IN feature: backends that do not opt in SKIP
        return Problem(self.op, device, dtype, self.kind(p), features)

    def make_inputs(self, p, gen) -> Dict[str, Any]:
        H, Hkv, D = p["H"], p["Hkv"], p["D"]
        total_q, total_k = sum(p["q_lens"]), sum(p["k_lens"])
        inputs: Dict[str, Any] = {"cu_seqlens_q": _cumulative(p["q_lens"], p["cu_dtype"]),
                                  "cu_seqlens_k": _cumulative(p["k_lens"], p["cu_dtype"])}
        if p["layout"] == "qkv_view":  # one (total, 3, H, D) buffer, as a fused qkv projection leaves it
            inputs["qkv"] = randn(gen, total_q, 3, H, D)
            inputs["qkv"][:, 0] *= p["logit_scale"]
            return inputs
        inputs["q"] = randn(gen, total_q, H, D) * p["logit_scale"]
        inputs["k"] = randn(gen, total_k, Hkv, D)
        inputs["v"] = randn(gen, total_k, Hkv, D)
        return inputs

    def call(self, fn, inputs, p):
        if p["layout"] == "qkv_view":
            qkv = inputs["qkv"]
            q, k, v = qkv[:, 0], qkv[:, 1], qkv[:, 2]
        else:
            q, k, v = inputs["q"], inputs["k"], inputs["v"]
        extras = {}
        if p.get("alibi"):
            if not takes(fn, "alibi_slopes"):
                raise BackendUnavailable(f"{getattr(fn, '__name__', 'the implementation')}: takes no alibi_slopes "
                                         "argument, which this case needs")
            extras["alibi_slopes"] = _case_slopes(p, q.device)
        return fn(q, k, v, inputs["cu_seqlens_q"], inputs["cu_seqlens_k"], max(p["q_lens"]), max(p["k_lens"]),
                  causal=p["causal"], window=_window(p), softcap=p["softcap"], scale=p["scale"], **extras)

    def zero_masks(self, inputs, p):
        empty = empty_rows(inputs["cu_seqlens_q"], inputs["cu_seqlens_k"], causal=p["causal"], window=_window(p))
        if not bool(empty.any()) or p["layout"] == "qkv_view":
            return {}
        rows = empty.view(-1, 1, 1)
        return {"out": rows, "grad_q": rows}   # rows that see no key: zero output, zero dq

    def precision(self, dtype, device):
        return tf32_precision(dtype, device, matmul_tf32())


FAMILIES = [
    family("tile", [("lens_192_65_127", dict(q_lens=[192, 65, 127], k_lens=[192, 129, 63], H=1, D=32)),
                        ("lens_64_63_causal", dict(q_lens=[64, 63, 1], k_lens=[64, 65, 1], causal=True)),
                        ("lens_320_gqa", dict(q_lens=[320, 31], k_lens=[320, 33], H=4, Hkv=2)),
                        ("lens_128_129_window", dict(q_lens=[128, 129], window=[64, 0], causal=True))]),
    family("seq_ratio", [("sq_gt_sk_causal", dict(q_lens=[40, 9], k_lens=[12, 3], causal=True)),
                             ("sq_lt_sk", dict(q_lens=[3, 9], k_lens=[80, 30])),
                             ("decode_like", dict(q_lens=[1, 1, 1, 1], k_lens=[100, 1, 64, 65]))]),
    family("batch", [("seqs_7_distinct", dict(q_lens=[5, 1, 33, 17, 0, 2, 9], causal=True)),
                         ("seqs_5_gqa", dict(q_lens=[20, 3, 8, 11, 6], H=4, Hkv=1))]),
    family("head_dim", [("d128_sq_ne_sk", dict(q_lens=[40, 9], k_lens=[72, 30], D=128)),
                            ("d128_causal_sq_ne_sk", dict(q_lens=[72, 9], k_lens=[40, 30], D=128, causal=True)),
                            ("d64", dict(q_lens=[33, 17], D=64)), ("d96", dict(q_lens=[20, 5], D=96))]),
    family("values", [("logits_x30", dict(q_lens=[20, 9], logit_scale=30.0, causal=True)),
                          ("denormal_kv", dict(q_lens=[17, 5], values={"k": "denormal_mix", "v": "denormal_mix"})),
                          ("v_large", dict(q_lens=[17, 5], values={"v": {"peak": 3e3, "max_frac": 0.05}}))]),
    family("layouts", view_members(("q", "k", "v"), ("offset", "sliced", "transposed"),
                                           base=dict(q_lens=[13, 6], D=32))),
    family("long", [("one_4160", dict(q_lens=[4160], H=1, D=32, causal=True)),
                        ("sk_16448", dict(q_lens=[64, 8], k_lens=[16448, 100], H=1, D=32))], sized=True),
]


# The argument space as dimensions: the `cover` family is a covering array over them
# (checks/covering.py). The first sequence's lengths sit on and off every tile of 16/32/64/128;
# `ratio` sets its Sq against its Sk (a long key length, ~2048 + the offset, pairs with few query
# rows); `others` the sequences packed after it (none, one of length 1, empty ones, many short
# distinct ones, a copy). window and softcap are in every implementation's signature; ALiBi,
# an optional keyword, is left to the listed cases. A window's -1 ("unbounded on that side",
# FlashAttention's window_size) is a value of its own on each side, without causal (which would
# hide an open right side): the listed cases had it only as (6, -1) under causal.
VARLEN_HEADS = {"h1": (1, 1), "h2": (2, 2), "h4_kv2": (4, 2), "h4_kv1": (4, 1), "h6_kv3": (6, 3)}
VARLEN_MODIFIERS = {"plain": {}, "causal": dict(causal=True), "scale": dict(scale=0.3),
                    "causal_scale": dict(causal=True, scale=1.5), "window": dict(window=[7, 3]),
                    "causal_window": dict(causal=True, window=[16, 0]),
                    "window_open_left": dict(window=[-1, 3]), "window_open_right": dict(window=[7, -1]),
                    "softcap": dict(softcap=20.0),
                    "causal_softcap_x30": dict(causal=True, softcap=5.0, logit_scale=30.0)}
VARLEN_VALUES = {"normal": {}, "x30": dict(logit_scale=30.0),
                 "denormal_kv": dict(values={"k": "denormal_mix", "v": "denormal_mix"}),
                 "v_large": dict(values={"v": {"peak": 3e3, "max_frac": 0.05}})}
VARLEN_LAYOUTS = {"packed": {}, "qkv_view": dict(layout="qkv_view"), "q_offset": dict(views={"q": "offset"}),
                  "q_sliced": dict(views={"q": "sliced"}), "k_sliced": dict(views={"k": "sliced"}),
                  "v_transposed": dict(views={"v": "transposed"})}
VARLEN_DIMENSIONS = (
    ("len_tile", TILES), ("len_offset", TILE_OFFSETS),
    ("ratio", ("equal", "sq_lt_sk", "sq_gt_sk", "q_one", "long_k")),
    ("others", ("none", "len1", "empty", "many", "same")),
    ("heads", tuple(VARLEN_HEADS)), ("head_dim", (16, 40, 64, 80, 128)), ("modifier", tuple(VARLEN_MODIFIERS)),
    ("cu_dtype", ("int32", "int64")), ("layout", tuple(VARLEN_LAYOUTS)), ("values", tuple(VARLEN_VALUES)))


def _varlen_allowed(row):
    if row.get("layout") == "qkv_view":
        # one (total, 3, H, D) buffer: k and v have q's tokens and heads
        if row.get("ratio", "equal") != "equal" or row.get("heads", "h1") not in ("h1", "h2"):
            return False
    if row.get("ratio") == "long_k":
        # few query rows, few sequences and heads, ordinary logits
        if row.get("others", "none") in ("many", "same") or row.get("heads", "h1") not in ("h1", "h2", "h4_kv1"):
            return False
        if row.get("values") in ("x30", "v_large") or row.get("modifier") == "causal_softcap_x30":
            return False
    return True


def _varlen_cover_params(row):
    length = tile_size(row["len_tile"], row["len_offset"], 1 + (row["len_tile"] < 64))
    third = max(1, length // 3)
    q0, k0 = {"equal": (length, length), "sq_lt_sk": (third, length), "sq_gt_sk": (length, third),
              "q_one": (1, length),
              "long_k": (min(17, third), tile_size(row["len_tile"], row["len_offset"], 2048 // row["len_tile"]))
              }[row["ratio"]]
    q_lens, k_lens = {"none": ([q0], [k0]), "len1": ([q0, 1], [k0, 9]), "empty": ([q0, 0, 5], [k0, 3, 0]),
                      "many": ([q0, 1, 17, 2, 0, 9], [k0, 33, 17, 1, 4, 9]), "same": ([q0, q0], [k0, k0])}[row["others"]]
    if row["ratio"] == "q_one":
        q_lens = [min(n, 1) for n in q_lens]
    H, Hkv = VARLEN_HEADS[row["heads"]]
    p = {**dict(q_lens=q_lens, k_lens=k_lens, H=H, Hkv=Hkv, D=row["head_dim"], cu_dtype=row["cu_dtype"]),
         **VARLEN_VALUES[row["values"]], **VARLEN_MODIFIERS[row["modifier"]], **VARLEN_LAYOUTS[row["layout"]]}
    if p.get("layout") == "qkv_view":
        p["k_lens"] = list(q_lens)
    return p


# A second array for ALiBi (an optional keyword: its rows SKIP for an implementation without
# alibi_slopes, and only they do): per-head and per-sequence slopes paired with the lengths,
# Sq against Sk, the packed sequences, heads, causal/window/softcap, cu dtype and layouts.
VARLEN_ALIBI_DIMENSIONS = (
    ("alibi", ("head", "batch")), ("len_tile", TILES), ("len_offset", TILE_OFFSETS),
    ("ratio", ("equal", "sq_lt_sk", "sq_gt_sk", "q_one")), ("others", ("none", "len1", "empty", "many")),
    ("heads", ("h2", "h4_kv2", "h4_kv1")), ("modifier", ("plain", "causal", "window", "softcap", "causal_scale")),
    ("cu_dtype", ("int32", "int64")), ("layout", ("packed", "q_sliced", "k_sliced")))


def _varlen_alibi_params(row):
    p = _varlen_cover_params({**row, "head_dim": 64, "values": "normal"})
    p["alibi"] = row["alibi"]
    return p


COVERING = {"attention_varlen": {
    "cover": Covering(VARLEN_DIMENSIONS, _varlen_cover_params, _varlen_allowed, seed=45),
    "cover_alibi": Covering(VARLEN_ALIBI_DIMENSIONS, _varlen_alibi_params, seed=45)}}


SPEC = VarlenSpec()

# what `gpuparity.reference` (contracts/reference.py) exports from this contract
REFERENCES = ("attention_varlen_reference",)
