"""gpuparity.flash_attn.ops.triton.layer_norm (FlashAttention's layer_norm_fn, rms_norm_fn, RMSNorm,
layer_norm_linear_fn, layer_norm_ref, rms_norm_ref) on the residual_norm op's Triton kernels and
its composition: FlashAttention's own test criterion (|ours - ref32| <= 2 |ref16 - ref32| + atol)
over its argument grid at small shapes, forward and backward; a float64 check; the dropout mask's
semantics (True = kept, the rate, x1's own mask, the backward through it); rowscale with zero rows;
out / residual_out; FlashAttention-shaped errors; RMSNorm's state_dict; install(); torch.compile."""
from __future__ import annotations

import itertools
import os
import sys

import pytest
import torch
import torch.nn.functional as F
from device_env import ON_GPU, TEST_DEVICE, require_device  # sets TRITON_INTERPRET=1 on the CPU

import gpuparity.flash_attn as flash_attn
from gpuparity.flash_attn import FlashAttnArgumentError
from gpuparity.flash_attn.flash_attn_interface import _BACKENDS
from gpuparity.flash_attn.ops.triton import layer_norm as ln
from gpuparity.flash_attn.ops.triton.layer_norm import (RMSNorm, layer_norm_fn, layer_norm_linear_fn, layer_norm_ref,
                                                        rms_norm_fn, rms_norm_ref)

sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir, "ops"))
# autouse: Triton's interpreter casts fp32 to bf16 by truncation, a GPU rounds to nearest even;
# rounded as on a GPU here (else half the bf16 outputs sit an ulp off FlashAttention's reference)
from test_residual_norm import _interpreter_rounds_bf16_to_nearest  # noqa: E402,F401

require_device()
DEVICE = torch.device(TEST_DEVICE)
pytestmark = pytest.mark.usefixtures("triton_interpreter_is_live")


@pytest.fixture(params=["triton", "composition"])
def backend(request, monkeypatch):
    """The residual_norm backend layer_norm_fn runs on (the module reads _BACKENDS["residual_norm"])."""
    monkeypatch.setitem(_BACKENDS, "residual_norm", request.param)
    return request.param


def _allclose(x, x_pt, x_ref, atol):
    """FlashAttention's criterion: within twice the low-precision reference's error, plus atol;
    positions where that reference is NaN are left out of its error (a 16-bit backward through a
    zero row overflows there), ours must still be finite there."""
    x, x_pt, x_ref = (t.float() for t in (x, x_pt, x_ref))
    ok = ~x_pt.isnan()
    return bool(x.isfinite().all() and (x - x_ref).abs().max() <= 2 * (x_pt[ok] - x_ref[ok]).abs().max() + atol)


def _leaf(t):
    return None if t is None else t.detach().clone().requires_grad_()


def _fa_check(*, input_dtype, residual_dtype, has_residual, is_rms_norm, prenorm, dropout_p, has_rowscale, has_x1,
              has_weight1, zero_centered_weight=False, hidden=65, fn=None):
    """FlashAttention's test_layer_norm at (2, 3, hidden): [] when every comparison passes, else
    the names of those that fail."""
    torch.manual_seed(0)
    atol = 5e-2 if torch.bfloat16 in (input_dtype, residual_dtype) else 1e-2
    shape = (2, 3, hidden)
    x = torch.randn(shape, dtype=input_dtype, device=DEVICE)
    res = torch.randn(shape, dtype=residual_dtype, device=DEVICE) if has_residual else None
    w = torch.randn(hidden, device=DEVICE)
    b = None if is_rms_norm else torch.randn(hidden, device=DEVICE)
    x1 = torch.randn(shape, dtype=input_dtype, device=DEVICE) if has_x1 else None
    w1 = torch.randn(hidden, device=DEVICE) if has_weight1 else None
    b1 = torch.randn(hidden, device=DEVICE) if has_weight1 and not is_rms_norm else None
    rowscale = torch.randn(shape[:-1], dtype=input_dtype, device=DEVICE) if has_rowscale else None
    if rowscale is not None:
        rowscale[0, 1] = 0.0
    copies = [[_leaf(t) for t in (x, res, w, b, x1, w1, b1)] for _ in range(3)]
    residual_in_fp32 = not has_residual and residual_dtype == torch.float32
    xa, ra, wa, ba, x1a, w1a, b1a = copies[0]
    got = list((fn or layer_norm_fn)(xa, wa, ba, residual=ra, x1=x1a, weight1=w1a, bias1=b1a, eps=1e-6,
                                     dropout_p=dropout_p, rowscale=rowscale, prenorm=prenorm,
                                     residual_in_fp32=residual_in_fp32, zero_centered_weight=zero_centered_weight,
                                     is_rms_norm=is_rms_norm, return_dropout_mask=True))
    mask = got[-2] if dropout_p > 0 else None
    mask1 = got[-1] if dropout_p > 0 and has_x1 else None
    ref_fn = rms_norm_ref if is_rms_norm else layer_norm_ref
    refs = []
    for (xc, rc, wc, bc, x1c, w1c, b1c), upcast in zip(copies[1:], (False, True)):
        r = ref_fn(xc, wc, bc, residual=rc, x1=x1c, weight1=w1c, bias1=b1c, eps=1e-6, dropout_p=dropout_p,
                   rowscale=rowscale, prenorm=prenorm, zero_centered_weight=zero_centered_weight,
                   dropout_mask=mask, dropout_mask1=mask1, upcast=upcast)
        refs.append(list(r) if isinstance(r, tuple) else [r])
    ours = got[:1 + has_weight1 + prenorm]
    names = ["out"] + (["out1"] if has_weight1 else []) + (["residual"] if prenorm else [])
    bad = [n for n, a, p, r in zip(names, ours, *refs) if not _allclose(a, p, r, atol)]
    if ours[0].dtype != input_dtype:
        bad.append("out.dtype")
    if prenorm and ours[-1].dtype != (residual_dtype if has_residual or residual_in_fp32 else input_dtype):
        bad.append("residual.dtype")
    g = torch.randn_like(ours[0]) / 2
    for outs, upcast in zip((ours, refs[0], refs[1]), (False, False, True)):
        y = outs[0] * F.gelu(outs[1]) if has_weight1 else outs[0]
        if prenorm:
            y = y * torch.sigmoid(outs[-1].to(residual_dtype) if upcast else outs[-1])
        y.backward(g)
    for i, name in enumerate(("grad_x", "grad_residual", "grad_weight", "grad_bias", "grad_x1", "grad_weight1",
                              "grad_bias1")):
        if copies[0][i] is not None and not _allclose(*(c[i].grad for c in copies), atol):
            bad.append(name)
    return bad


GRID = [dict(zip(("has_residual", "is_rms_norm", "prenorm", "dropout_p", "has_rowscale", "has_x1", "has_weight1"), v))
        for v in itertools.product((True, False), (False, True), (True, False), (0.0, 0.27), (False, True),
                                   (False, True), (False, True)) if not (v[4] and v[5])]


def _pairwise(rows):
    """A subset of rows covering every pair of two factors' values that rows cover (greedy)."""
    def pairs(row):
        items = sorted(row.items())
        return {(a, b) for i, a in enumerate(items) for b in items[i + 1:]}
    todo, chosen = set().union(*map(pairs, rows)), []
    while todo:
        best = max(rows, key=lambda row: len(pairs(row) & todo))
        chosen.append(best)
        todo -= pairs(best)
    return chosen


PAIRS = GRID if ON_GPU else _pairwise(GRID)   # the CPU's interpreter: every pair of values (7 rows of 96)
DTYPES = [(torch.float16, torch.float16), (torch.bfloat16, torch.float32), (torch.float32, torch.float32)]


@pytest.mark.parametrize("dtypes", DTYPES, ids=lambda d: f"{d[0]}-{d[1]}".replace("torch.", ""))
def test_flash_attention_grid(backend, dtypes):
    """FlashAttention's test_layer_norm grid (residual, norm, prenorm, dropout, rowscale, x1,
    weight1; every combination on a GPU, every pair of their values on the CPU) at hidden 65,
    forward and backward."""
    failures = {}
    for params in PAIRS:
        bad = _fa_check(input_dtype=dtypes[0], residual_dtype=dtypes[1], **params)
        if bad:
            failures[tuple(sorted(params.items()))] = bad
    assert not failures, failures


@pytest.mark.parametrize("hidden", [1, 17, 129])
@pytest.mark.parametrize("zero_centered_weight", [False, True])
def test_odd_hidden_sizes_and_zero_centered_weight(backend, hidden, zero_centered_weight):
    for rms, prenorm in ((True, True), (False, False)):
        assert not _fa_check(input_dtype=torch.bfloat16, residual_dtype=torch.bfloat16, has_residual=True,
                             is_rms_norm=rms, prenorm=prenorm, dropout_p=0.0, has_rowscale=True, has_x1=False,
                             has_weight1=True, zero_centered_weight=zero_centered_weight, hidden=hidden)


def test_planted_ignored_rowscale_fails_the_criterion(monkeypatch):
    """The check above catches an implementation that drops rowscale (it is not vacuous)."""
    real = ln.layer_norm_fn

    def planted(*args, rowscale=None, **kwargs):
        return real(*args, **kwargs)

    assert "out" in _fa_check(input_dtype=torch.float32, residual_dtype=torch.float32, has_residual=True,
                              is_rms_norm=True, prenorm=False, dropout_p=0.0, has_rowscale=True, has_x1=False,
                              has_weight1=False, fn=planted)


def test_float64_against_the_reference(backend):
    """In float32 with every fused argument: out, out1 and the stream within 1e-5 of float64."""
    torch.manual_seed(1)
    x, res, x1 = (torch.randn(3, 4, 40, device=DEVICE) for _ in range(3))
    w, b, w1 = (torch.randn(40, device=DEVICE) for _ in range(3))
    args = dict(residual=res, eps=1e-5, prenorm=True, zero_centered_weight=True)
    for extra in (dict(rowscale=torch.rand(3, 4, device=DEVICE)), dict(x1=x1, weight1=w1)):
        got = layer_norm_fn(x, w, b, **args, **extra)
        want = layer_norm_ref(*(t.double() for t in (x, w, b)), **{k: v.double() for k, v in args.items()
                                                                   if isinstance(v, torch.Tensor)},
                              **{k: v for k, v in args.items() if not isinstance(v, torch.Tensor)},
                              **{k: v.double() for k, v in extra.items()})
        for a, r in zip(got, want):
            torch.testing.assert_close(a.double(), r, rtol=1e-5, atol=1e-5)


def test_dropout_mask_semantics(backend):
    """True = kept; the rate within 0.01; x1 draws its own mask; dropped positions get no gradient;
    the output equals the reference replaying the returned masks."""
    x = torch.randn(64, 257, device=DEVICE, requires_grad=True)
    x1 = torch.randn(64, 257, device=DEVICE, requires_grad=True)
    w = torch.ones(257, device=DEVICE)
    torch.manual_seed(0)
    out, mask, mask1 = rms_norm_fn(x, w, None, x1=x1, dropout_p=0.27, return_dropout_mask=True)
    assert mask.dtype == torch.bool and mask.shape == x.shape
    assert abs((1 - mask.float().mean()).item() - 0.27) < 0.01
    assert abs((1 - mask1.float().mean()).item() - 0.27) < 0.01
    assert not torch.equal(mask, mask1)
    out.sum().backward()
    assert not x.grad[~mask].any() and x.grad[mask].abs().min() > 0
    want = rms_norm_ref(x.detach(), w, None, x1=x1.detach(), dropout_p=0.27, dropout_mask=mask, dropout_mask1=mask1)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
    torch.manual_seed(0)
    again = rms_norm_fn(x.detach(), w, None, x1=x1.detach(), dropout_p=0.27, return_dropout_mask=True)
    assert torch.equal(again[1], mask)   # torch's generator: reproducible under manual_seed


def test_return_conventions():
    x, w = torch.randn(2, 8, device=DEVICE), torch.randn(8, device=DEVICE)
    assert isinstance(layer_norm_fn(x, w, None), torch.Tensor)
    assert len(layer_norm_fn(x, w, None, prenorm=True)) == 2
    assert len(layer_norm_fn(x, w, None, weight1=w)) == 2
    assert len(layer_norm_fn(x, w, None, weight1=w, prenorm=True)) == 3
    y, m, m1 = layer_norm_fn(x, w, None, return_dropout_mask=True)
    assert m is None and m1 is None
    assert len(layer_norm_fn(x, w, None, weight1=w, prenorm=True, dropout_p=0.1, return_dropout_mask=True)) == 5
    assert layer_norm_fn(x, w, None, out_dtype=torch.float64).dtype == torch.float64
    assert layer_norm_fn(x.half(), w, None, prenorm=True, residual_in_fp32=True)[1].dtype == torch.float32


def test_out_and_residual_out_are_filled(backend):
    x, res, w = torch.randn(2, 3, 16, device=DEVICE), torch.randn(2, 3, 16, device=DEVICE), torch.randn(16)
    out, stream = torch.empty_like(x), torch.empty_like(x)
    y, s = layer_norm_fn(x, w, None, residual=res, prenorm=True, out=out, residual_out=stream)
    assert y.data_ptr() == out.data_ptr() and s.data_ptr() == stream.data_ptr()
    want_y, want_s = layer_norm_ref(x, w, None, residual=res, prenorm=True)
    torch.testing.assert_close(out, want_y, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(stream, want_s)


def test_out_dtype_float32_beats_bf16_rounding(backend):
    """out_dtype=float32 is the fused op's fp32 output, not a bf16 result cast up."""
    torch.manual_seed(0)
    x, res = torch.randn(4, 64, dtype=torch.bfloat16), torch.randn(4, 64, dtype=torch.float32)
    w = torch.randn(64)
    y = layer_norm_fn(x, w, None, residual=res, is_rms_norm=True, out_dtype=torch.float32)
    want = rms_norm_ref(x.double(), w.double(), None, residual=res.double())
    assert y.dtype == torch.float32
    assert (y.double() - want).abs().max() < 1e-4 < (y.bfloat16().double() - want).abs().max()


@pytest.mark.parametrize("call, match", [
    (lambda x, w: layer_norm_fn(x, w[:7], None), r"weight: expected shape \(8,\)"),
    (lambda x, w: layer_norm_fn(x, w, None, residual=x[:1]), r"residual: expected the shape of x"),
    (lambda x, w: layer_norm_fn(x, w, None, x1=x[:, :4]), r"x1: expected the shape of x"),
    (lambda x, w: layer_norm_fn(x, w, None, x1=x, rowscale=x[:, 0]), r"rowscale: not supported with parallel"),
    (lambda x, w: layer_norm_fn(x, w, None, rowscale=x[:, :2]), r"rowscale: expected 4 values"),
    (lambda x, w: layer_norm_fn(x, w, None, dropout_p=1.0), r"dropout_p: expected a float in \[0, 1\)"),
    (lambda x, w: layer_norm_fn(x, w, None, bias1=w), r"bias1: given without weight1"),
    (lambda x, w: layer_norm_fn(x, w, None, weight1=w[:3]), r"weight: expected shape \(8,\)"),
    (lambda x, w: layer_norm_fn(x, w, None, out=x[:2]), r"out: expected a floating tensor"),
    (lambda x, w: layer_norm_fn(x.half(), w, None, residual=x.bfloat16()), r"residual: expected the dtype of x"),
    (lambda x, w: layer_norm_fn(x, w, None, out_dtype=torch.int32), r"out_dtype: expected None or one of"),
])
def test_errors_are_flash_attention_shaped(call, match):
    """FlashAttnArgumentError (a ValueError and a RuntimeError, as FlashAttention raises) naming the argument."""
    with pytest.raises(FlashAttnArgumentError, match=match):
        call(torch.randn(4, 8, device=DEVICE), torch.randn(8, device=DEVICE))


def test_rms_norm_module_matches_flash_attention():
    norm = RMSNorm(24, eps=1e-5, dropout_p=0.1, device=DEVICE)
    assert list(norm.state_dict()) == ["weight"] and norm.bias is None
    assert torch.equal(norm.weight, torch.ones(24))
    assert not RMSNorm(24, zero_centered_weight=True).weight.any()
    x, res = torch.randn(2, 5, 24, device=DEVICE), torch.randn(2, 5, 24, device=DEVICE)
    norm.eval()   # no dropout outside training
    y, s = norm(x, residual=res, prenorm=True, residual_in_fp32=True)
    want_y, want_s = rms_norm_ref(x, norm.weight.detach(), None, residual=res, eps=1e-5, prenorm=True)
    torch.testing.assert_close(y, want_y, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(s, want_s)
    norm.train()
    assert not torch.equal(norm(x), norm.eval()(x))   # training draws dropout_p=0.1


@pytest.mark.parametrize("prenorm", [False, True])
def test_layer_norm_linear_fn(backend, prenorm):
    torch.manual_seed(0)
    x, res = torch.randn(2, 3, 32, requires_grad=True), torch.randn(2, 3, 32, requires_grad=True)
    nw, nb = torch.randn(32, requires_grad=True), torch.randn(32, requires_grad=True)
    lw, lb = torch.randn(64, 32, requires_grad=True), torch.randn(64, requires_grad=True)
    leaves = (x, res, nw, nb, lw, lb)
    got = layer_norm_linear_fn(x, nw, nb, lw, lb, residual=res, prenorm=prenorm)
    normed = layer_norm_ref(x, nw, nb, residual=res, prenorm=prenorm)
    want = (F.linear(normed[0], lw, lb), normed[1]) if prenorm else F.linear(normed, lw, lb)
    got, want = (got, want) if prenorm else ((got,), (want,))
    for a, r in zip(got, want):
        torch.testing.assert_close(a, r, rtol=1e-4, atol=1e-4)
    grads = [torch.autograd.grad(sum(t.sum() for t in outs), leaves) for outs in (got, want)]
    for a, r in zip(*grads):
        torch.testing.assert_close(a, r, rtol=1e-4, atol=1e-4)


def test_install_registers_and_uninstall_removes():
    flash_attn.install(force=True)
    try:
        import flash_attn.ops.triton.layer_norm as installed  # noqa: F811 - gpuparity's, registered
        from flash_attn.ops.triton.layer_norm import layer_norm_fn as fn
        assert installed is ln and fn is layer_norm_fn
    finally:
        flash_attn.uninstall()
    assert "flash_attn.ops.triton.layer_norm" not in sys.modules


def test_compiled_fullgraph_matches_eager(backend):
    """torch.compile(fullgraph=True, backend="aot_eager") over layer_norm_fn with the fused
    arguments and weight1 (inductor is slow on this CPU runner: the GPU run uses it)."""
    torch.manual_seed(0)
    x, res = torch.randn(2, 3, 24, requires_grad=True), torch.randn(2, 3, 24, requires_grad=True)
    w, b, w1 = (torch.randn(24, requires_grad=True) for _ in range(3))
    rowscale = torch.rand(2, 3)

    def step(x, res, w, b, w1):
        y, y1, s = layer_norm_fn(x, w, b, residual=res, weight1=w1, rowscale=rowscale, prenorm=True,
                                 residual_in_fp32=True, zero_centered_weight=True)
        return (y * y1).sum() + s.square().sum()

    torch._dynamo.reset()
    results = []
    for run in (step, torch.compile(step, fullgraph=True, backend="aot_eager")):
        loss = run(x, res, w, b, w1)
        results.append((loss.detach(), *torch.autograd.grad(loss, (x, res, w, b, w1))))
    for eager, compiled in zip(*results):
        torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-5)
    torch._dynamo.reset()


def test_compiled_fullgraph_with_dropout_keeps_mask_semantics():
    """Dropout and x1 compile into one graph; the output equals the reference replaying its masks."""
    x, x1, w = torch.randn(4, 32), torch.randn(4, 32), torch.randn(32)

    def step(x, x1, w):
        return rms_norm_fn(x, w, None, x1=x1, dropout_p=0.3, return_dropout_mask=True)

    torch._dynamo.reset()
    y, m, m1 = torch.compile(step, fullgraph=True, backend="aot_eager")(x, x1, w)
    torch.testing.assert_close(y, rms_norm_ref(x, w, None, x1=x1, dropout_p=0.3, dropout_mask=m, dropout_mask1=m1),
                               rtol=1e-5, atol=1e-5)
    torch._dynamo.reset()
