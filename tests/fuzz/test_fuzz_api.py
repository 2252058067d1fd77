"""Property-based tests of the public ops: any input either gives a result close to the float64
reference or raises TypeError/ValueError whose message names the argument at fault."""
from __future__ import annotations

import torch
from hypothesis import example, given
from hypothesis import strategies as st

import gpuparity
from gpuparity import reference


# relative L2 error allowed against float64, per dtype (the battery's floors with headroom:
# the fuzz inputs are not the battery's well-conditioned ones)
TOL = {torch.float32: 1e-4, torch.bfloat16: 4e-2, torch.float16: 8e-3}
DTYPES = st.sampled_from(list(TOL))
SPECIALS = st.sampled_from([None, float("nan"), float("inf"), float("-inf"), 1e4])


def _rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    finite = torch.isfinite(ref)
    got, want = out.to(torch.float64)[finite], ref[finite]
    assert torch.isfinite(got).all(), "a finite reference element came out non-finite"
    norm = float(want.norm())
    return float((got - want).norm()) / norm if norm > 0 else float((got - want).norm())


def _names_an_argument(exc: Exception, names) -> None:
    message = str(exc)
    assert any(name in message for name in names), f"{type(exc).__name__} names no argument: {message!r}"


def _tensor(draw, shape, dtype, special=None, non_contiguous=False):
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    swapped = non_contiguous and len(shape) >= 2
    raw = torch.randn(*(shape[:-2] + [shape[-1], shape[-2]] if swapped else shape), generator=gen)
    if special is not None and raw.numel():
        raw.view(-1)[draw(st.integers(0, raw.numel() - 1))] = special
    return (raw.transpose(-1, -2) if swapped else raw).to(dtype)  # .to keeps the strides


@st.composite
def norm_case(draw):
    rows = draw(st.lists(st.integers(0, 5), min_size=0, max_size=2))
    hidden = draw(st.sampled_from([1, 2, 7, 16, 33]))
    dtype = draw(DTYPES)
    x = _tensor(draw, rows + [hidden], dtype, draw(SPECIALS), draw(st.booleans()))
    weight = _tensor(draw, [hidden], dtype) if draw(st.booleans()) else None
    return x, hidden, weight


@given(norm_case(), st.sampled_from(["torch", "composition"]), st.sampled_from([None, 1e-6, 1e-5]))
def test_rms_norm_matches_float64(case, backend, eps):
    x, hidden, weight = case
    out = gpuparity.rms_norm(x, (hidden,), weight, eps, backend=backend)
    assert out.shape == x.shape and out.dtype == x.dtype
    ref = reference.rms_norm(x.to(torch.float64), (hidden,), None if weight is None else weight.to(torch.float64),
                             eps, eps_dtype=x.dtype)
    assert _rel_err(out, ref) <= TOL[x.dtype]


@given(norm_case(), st.sampled_from(["torch", "composition"]))
def test_layer_norm_matches_float64(case, backend):
    x, hidden, weight = case
    bias = torch.zeros(hidden, dtype=x.dtype) if weight is not None else None
    out = gpuparity.layer_norm(x, (hidden,), weight, bias, 1e-5, backend=backend)
    assert out.shape == x.shape and out.dtype == x.dtype
    ref = reference.layer_norm(x.to(torch.float64), (hidden,), None if weight is None else weight.to(torch.float64),
                               None if bias is None else bias.to(torch.float64), 1e-5)
    # a constant row (hidden == 1) is 0/sqrt(eps): exact in every dtype
    assert _rel_err(out, ref) <= TOL[x.dtype] * (1 if hidden > 1 else 10)


@st.composite
def attention_case(draw):
    batch, kv_heads, group = draw(st.integers(0, 2)), draw(st.integers(1, 2)), draw(st.sampled_from([1, 2]))
    q_len, k_len = draw(st.integers(0, 6)), draw(st.integers(0, 6))
    head_dim = draw(st.sampled_from([1, 8, 16]))
    dtype = draw(DTYPES)
    nc = draw(st.booleans())
    q = _tensor(draw, [batch, kv_heads * group, q_len, head_dim], dtype, draw(SPECIALS), nc)
    k = _tensor(draw, [batch, kv_heads, k_len, head_dim], dtype, None, nc)
    v = _tensor(draw, [batch, kv_heads, k_len, head_dim], dtype)
    mask_kind = draw(st.sampled_from(["none", "bool", "float", "padding", "causal"]))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    masks = {}
    if mask_kind == "bool":
        masks["attn_mask"] = torch.rand(q_len, k_len, generator=gen) > 0.3
    elif mask_kind == "float":
        masks["attn_mask"] = torch.randn(q_len, k_len, generator=gen).to(dtype)
    elif mask_kind == "padding":
        masks["key_padding_mask"] = torch.rand(batch, k_len, generator=gen) > 0.6
    elif mask_kind == "causal":
        masks["is_causal"] = True
    return q, k, v, masks


_NO_KEYS = torch.zeros(1, 1, 0, 1)


# Found by this suite: no keys with a padding mask raised IndexError in sdpa_arguments, and no
# keys with a NaN in q gave NaN rows from SDPA (every row without keys is zero).
@example(case=(torch.zeros(1, 1, 0, 1), _NO_KEYS, _NO_KEYS,
               {"key_padding_mask": torch.zeros(1, 0, dtype=torch.bool)}), backend="sdpa_math")
@example(case=(torch.tensor([[[[float("nan")], [1.0]]]]), _NO_KEYS, _NO_KEYS, {}), backend="sdpa_math")
@given(attention_case(), st.sampled_from(["sdpa_math", "composition"]))
def test_attention_matches_float64(case, backend):
    q, k, v, masks = case
    out = gpuparity.attention(q, k, v, backend=backend, **masks)
    assert out.shape == q.shape and out.dtype == q.dtype
    ref64 = {key: (m.to(torch.float64) if isinstance(m, torch.Tensor) and m.is_floating_point() else m)
             for key, m in masks.items()}
    ref = reference.attention(q.to(torch.float64), k.to(torch.float64), v.to(torch.float64), **ref64)
    # Specials go into q only. A row of q with an inf or NaN has no defined answer (the reference
    # reads a -inf score as masked, SDPA as a -inf logit); every other row must match.
    rows = torch.isfinite(q).all(-1)
    # scores of low-precision inputs are rounded before the softmax: allow the dtype's error twice
    assert _rel_err(out[rows], ref[rows]) <= 2 * TOL[q.dtype]


@st.composite
def rotary_case(draw):
    batch, seqlen, heads = draw(st.integers(0, 2)), draw(st.integers(0, 5)), draw(st.integers(1, 3))
    half = draw(st.sampled_from([1, 2, 4]))
    head_dim = 2 * half + draw(st.sampled_from([0, 2]))
    offset = draw(st.integers(0, 3))
    dtype = draw(DTYPES)
    x = _tensor(draw, [batch, seqlen, heads, head_dim], dtype, draw(SPECIALS), draw(st.booleans()))
    angles = torch.arange(seqlen + offset, dtype=torch.float64)[:, None] * torch.linspace(0.1, 1.0, half,
                                                                                         dtype=torch.float64)
    return x, angles.cos(), angles.sin(), offset, draw(st.booleans())


@given(rotary_case())
def test_apply_rotary_matches_float64(case):
    x, cos64, sin64, offset, interleaved = case
    cos, sin = cos64.to(x.dtype), sin64.to(x.dtype)
    out = gpuparity.apply_rotary(x, cos, sin, interleaved=interleaved, seqlen_offsets=offset, backend="composition")
    assert out.shape == x.shape and out.dtype == x.dtype
    ref = reference.apply_rotary(x.to(torch.float64), cos.to(torch.float64), sin.to(torch.float64),
                                 interleaved=interleaved, seqlen_offsets=offset)
    assert _rel_err(out, ref) <= TOL[x.dtype]


JUNK = st.one_of(st.none(), st.integers(-3, 3), st.floats(allow_nan=True), st.text(max_size=3),
                 st.lists(st.integers(0, 3), max_size=3), st.just(torch.zeros(2, 3, dtype=torch.int64)),
                 st.just(torch.zeros(3)), st.just(torch.zeros(0)))


@given(st.data())
def test_wrong_inputs_raise_errors_that_name_the_argument(data):
    good_x = torch.randn(2, 4)
    op = data.draw(st.sampled_from(["rms_norm", "layer_norm", "attention", "apply_rotary"]))
    junk = data.draw(JUNK)
    if op in ("rms_norm", "layer_norm"):
        slot = data.draw(st.sampled_from(["x", "normalized_shape", "weight", "eps"]))
        kwargs = {"x": good_x, "normalized_shape": (4,), "weight": None, "eps": 1e-5}
        kwargs[slot] = junk
        fn = getattr(gpuparity, op)
        call = lambda: fn(kwargs["x"], kwargs["normalized_shape"], kwargs["weight"], eps=kwargs["eps"],  # noqa: E731
                          backend="composition")
        names = ["x", "normalized_shape", "weight", "eps", "bias"]
    elif op == "attention":
        slot = data.draw(st.sampled_from(["q", "k", "v", "attn_mask", "key_padding_mask", "scale", "is_causal"]))
        t = torch.randn(1, 2, 3, 8)
        kwargs = {"q": t, "k": t, "v": t, "attn_mask": None, "key_padding_mask": None, "scale": None,
                  "is_causal": False}
        kwargs[slot] = junk
        call = lambda: gpuparity.attention(backend="composition", **kwargs)  # noqa: E731
        names = list(kwargs)
    else:
        slot = data.draw(st.sampled_from(["x", "cos", "sin", "seqlen_offsets", "interleaved"]))
        kwargs = {"x": torch.randn(1, 3, 2, 4), "cos": torch.ones(3, 2), "sin": torch.zeros(3, 2),
                  "seqlen_offsets": 0, "interleaved": False}
        kwargs[slot] = junk
        call = lambda: gpuparity.apply_rotary(backend="composition", **kwargs)  # noqa: E731
        names = list(kwargs) + ["cu_seqlens", "max_seqlen"]
    try:
        out = call()
    except (TypeError, ValueError) as exc:
        _names_an_argument(exc, names)
        return
    assert isinstance(out, torch.Tensor)  # junk that happens to be valid (e.g. eps=1) is fine
