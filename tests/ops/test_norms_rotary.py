"""gpuparity.rms_norm / layer_norm / apply_rotary: the public contract (F.rms_norm, F.layer_norm,
flash-attn's rotary), input validation whose errors name the argument, and dispatch (named
backends, reasons when one cannot serve, auto)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from device_env import TEST_DEVICE as DEVICE, require_device

from gpuparity import dispatch, reference
from gpuparity.ops import select
from gpuparity.tolerance import judge
from gpuparity.ops.norms import layer_norm, rms_norm
from gpuparity.ops.rotary import apply_rotary, rotary_kind

require_device()

NAMED = ["triton", "torch", "composition"]


def rand(*shape, dtype=torch.float32, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(DEVICE, dtype)


def tables(length, rotary_dim):
    angles = torch.rand(length, rotary_dim // 2, generator=torch.Generator().manual_seed(1)) * 6.3
    return angles.cos().to(DEVICE), angles.sin().to(DEVICE)


# ----------------------------------------------------------------------------- meaning
@pytest.mark.parametrize("backend", NAMED)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_rms_norm_is_f_rms_norm(backend, dtype):
    x, weight = rand(6, 40, dtype=dtype), rand(40, dtype=dtype, seed=1)
    expected = reference.rms_norm(x.double().cpu(), (40,), weight.double().cpu(), eps_dtype=dtype)
    out = rms_norm(x, 40, weight, backend=backend)
    assert out.dtype == dtype and out.shape == x.shape
    result = judge("out", out, expected, F.rms_norm(x, (40,), weight), dtype)
    assert result.passed, result.reason


def test_rms_norm_default_eps_is_what_f_rms_norm_uses():
    """eps=None: F.rms_norm's kernels use the op-math dtype's eps (float32's for bf16), which
    matters for rows of tiny values."""
    x = rand(4, 16, dtype=torch.bfloat16) * 1e-4
    out = rms_norm(x, (16,), backend="triton")
    expected = F.rms_norm(x.float(), (16,)).to(torch.bfloat16)
    assert judge("out", out, expected.double(), None, torch.bfloat16).passed


@pytest.mark.parametrize("backend", NAMED)
def test_layer_norm_is_f_layer_norm(backend):
    x, weight, bias = rand(5, 3, 24), rand(24, seed=1), rand(24, seed=2)
    expected = reference.layer_norm(x.double().cpu(), (24,), weight.double().cpu(), bias.double().cpu(), 1e-5)
    out = layer_norm(x, [24], weight, bias, backend=backend)
    result = judge("out", out, expected, F.layer_norm(x, (24,), weight, bias), torch.float32)
    assert result.passed, result.reason


@pytest.mark.parametrize("backend", ["triton", "composition"])
@pytest.mark.parametrize("interleaved", [False, True], ids=["half", "interleaved"])
def test_apply_rotary_matches_reference(backend, interleaved):
    x = rand(3, 6, 2, 20)
    cos, sin = tables(12, 16)
    offsets = torch.tensor([0, 2, 5], device=DEVICE)
    expected = reference.apply_rotary(x.double().cpu(), cos.double().cpu(), sin.double().cpu(),
                                      interleaved=interleaved, seqlen_offsets=offsets.cpu())
    out = apply_rotary(x, cos, sin, interleaved=interleaved, seqlen_offsets=offsets, backend=backend)
    assert judge("out", out, expected, None, torch.float32).passed


@pytest.mark.parametrize("backend", ["triton", "composition"])
def test_apply_rotary_inplace(backend):
    x = rand(2, 5, 2, 16)
    cos, sin = tables(8, 16)
    expected = apply_rotary(x, cos, sin, backend=backend)
    work = x.clone()
    out = apply_rotary(work, cos, sin, inplace=True, backend=backend)
    assert out is work and torch.allclose(work, expected)


def test_apply_rotary_varlen_computes_max_seqlen():
    x = rand(10, 2, 8)
    cos, sin = tables(16, 8)
    cu = torch.tensor([0, 4, 10], dtype=torch.int32, device=DEVICE)
    out = apply_rotary(x, cos, sin, cu_seqlens=cu, backend="triton")
    expected = reference.apply_rotary(x.double().cpu(), cos.double().cpu(), sin.double().cpu(), cu_seqlens=cu.cpu())
    assert judge("out", out, expected, None, torch.float32).passed


def test_rotary_varlen_values_are_checked_once_per_tensor_and_version(monkeypatch):
    """A model rotates q and k in every layer with the same cu_seqlens: one host sync for them,
    not one per call; an in-place change is checked again (and a bad value raises)."""
    from gpuparity.contracts import rotary as calls
    reads = []
    real = calls._check_rotary_cu_values
    monkeypatch.setattr(calls, "_check_rotary_cu_values", lambda *a: reads.append(a) or real(*a))
    x = rand(10, 2, 8)
    cos, sin = tables(16, 8)
    cu = torch.tensor([0, 4, 10], dtype=torch.int32, device=DEVICE)
    for _ in range(3):
        apply_rotary(x, cos, sin, cu_seqlens=cu, backend="composition")
    assert len(reads) == 1
    cu[1] = 5
    apply_rotary(x, cos, sin, cu_seqlens=cu, backend="composition")
    assert len(reads) == 2
    cu[1] = 11
    with pytest.raises(ValueError, match="^cu_seqlens: expected a non-decreasing sequence"):
        apply_rotary(x, cos, sin, cu_seqlens=cu, backend="composition")


def test_rotary_kinds_follow_the_battery():
    assert rotary_kind(False, None) == "half"
    assert rotary_kind(True, None) == "interleaved"
    assert rotary_kind(True, torch.zeros(2)) == "varlen-interleaved"


# ----------------------------------------------------------------------------- validation
def _raises(exc, match, fn, *args, **kwargs):
    with pytest.raises(exc, match=match):
        fn(*args, **kwargs)


def test_norm_errors_name_the_argument():
    x = rand(4, 8)
    _raises(TypeError, "x: expected a torch.Tensor", rms_norm, [1.0, 2.0], (2,))
    _raises(TypeError, "x: expected dtype", rms_norm, torch.ones(4, 8, dtype=torch.int64, device=DEVICE), (8,))
    _raises(ValueError, r"normalized_shape: expected the last 1 dimension\(s\) of x", rms_norm, x, (4,))
    _raises(ValueError, "normalized_shape: expected the last 2", layer_norm, x, (2, 8))
    _raises(TypeError, "normalized_shape: expected an int", rms_norm, x, "8")
    _raises(ValueError, r"weight: expected shape \(8,\)", rms_norm, x, (8,), rand(7))
    _raises(ValueError, r"bias: expected shape \(8,\)", layer_norm, x, (8,), rand(8), rand(1))
    _raises(ValueError, "eps: expected a float >= 0", rms_norm, x, (8,), None, -1.0)
    _raises(TypeError, "eps: expected a float >= 0, got None", layer_norm, x, (8,), None, None, None)
    _raises(ValueError, "backend: expected one of", rms_norm, x, (8,), backend="nope")


def test_rotary_errors_name_the_argument():
    x = rand(2, 5, 2, 16)
    cos, sin = tables(8, 16)
    _raises(ValueError, "x: expected a 4-D tensor", apply_rotary, rand(5, 2, 16), cos, sin)
    _raises(ValueError, "x: expected a packed 3-D tensor", apply_rotary, x, cos, sin,
            cu_seqlens=torch.tensor([0, 5], device=DEVICE))
    _raises(ValueError, "cos: expected shape", apply_rotary, x, *tables(8, 18))
    _raises(ValueError, "sin: expected the shape of cos", apply_rotary, x, cos, sin[:, :4])
    _raises(TypeError, "sin: expected the dtype of cos", apply_rotary, x, cos, sin.double())
    _raises(ValueError, r"seqlen_offsets: expected one offset per sequence \(2,\)", apply_rotary, x, cos, sin,
            seqlen_offsets=torch.tensor([1, 2, 3], device=DEVICE))
    _raises(TypeError, "seqlen_offsets: expected dtype", apply_rotary, x, cos, sin,
            seqlen_offsets=torch.tensor([1.0, 2.0], device=DEVICE))
    _raises(ValueError, "seqlen_offsets: expected an int >= 0", apply_rotary, x, cos, sin, seqlen_offsets=-1)
    _raises(ValueError, "cos: positions reach 4 .* expected cos.shape\\[0\\] >= 5", apply_rotary, x, *tables(4, 16))
    _raises(ValueError, "cos: positions reach 9", apply_rotary, x, cos, sin,
            seqlen_offsets=torch.tensor([0, 5], device=DEVICE))
    _raises(ValueError, "max_seqlen: only meaningful with cu_seqlens", apply_rotary, x, cos, sin, max_seqlen=5)
    packed = rand(9, 2, 16)
    _raises(ValueError, "cu_seqlens: expected a non-decreasing sequence from 0 to x.shape\\[0\\] = 9",
            apply_rotary, packed, cos, sin, cu_seqlens=torch.tensor([0, 4, 8], dtype=torch.int32, device=DEVICE))
    _raises(ValueError, "max_seqlen: expected >= the longest sequence", apply_rotary, packed, cos, sin,
            cu_seqlens=torch.tensor([0, 4, 9], dtype=torch.int32, device=DEVICE), max_seqlen=3)
    _raises(ValueError, "cos/sin: gradients", apply_rotary, x, cos.clone().requires_grad_(), sin)
    _raises(ValueError, "x: inplace=True cannot modify a leaf", apply_rotary, x.clone().requires_grad_(), cos, sin,
            inplace=True)
    _raises(TypeError, "interleaved: expected a bool", apply_rotary, x, cos, sin, interleaved=1)


# ----------------------------------------------------------------------------- dispatch
def test_named_backend_that_cannot_serve_says_why():
    x = rand(3, 8, dtype=torch.float64)
    with pytest.raises(dispatch.BackendUnavailable, match="triton: no float64 kernel"):
        rms_norm(x, (8,), backend="triton")
    with pytest.raises(dispatch.BackendUnavailable, match="triton: no float64 kernel"):
        apply_rotary(rand(1, 2, 1, 4, dtype=torch.float64), *[t.double() for t in tables(4, 4)], backend="triton")


def test_auto_serves_and_explains(monkeypatch):
    monkeypatch.setenv("GPUPARITY_TRUST_UNPROBED", "1")
    x, weight = rand(4, 32), rand(32, seed=3)
    expected = reference.rms_norm(x.double().cpu(), (32,), weight.double().cpu(), eps_dtype=torch.float32)
    assert judge("out", rms_norm(x, (32,), weight), expected, None, torch.float32).passed
    problem = dispatch.Problem("rms_norm", x.device, x.dtype, "default")
    explanation = select.explain(problem)
    rows = {row["name"]: row for row in explanation["candidates"]}
    # auto tries the backends in the device family's prior order and takes the first that passes
    # (checks/priors.py); the composition is the last resort or, ranked after that, not asked
    assert rows[explanation["chosen"]]["status"] == "verified"
    assert rows["composition"]["status"] in ("fallback", "unchecked")
    assert {row["status"] for row in rows.values()} <= {"verified", "unchecked", "unsupported", "never-auto", "fallback"}
    cos, sin = tables(8, 8)
    out = apply_rotary(rand(1, 4, 2, 8), cos, sin)
    assert out.shape == (1, 4, 2, 8)


@pytest.mark.slow
def test_compile_backend_serves_all_three_ops():
    from gpuparity.backends import compiled
    reason = compiled.compile_unavailable_reason(DEVICE)
    if reason:
        pytest.skip(reason)
    x, weight, bias = rand(6, 24), rand(24, seed=1), rand(24, seed=2)
    expected = reference.layer_norm(x.double().cpu(), (24,), weight.double().cpu(), bias.double().cpu(), 1e-5)
    assert judge("out", layer_norm(x, (24,), weight, bias, backend="compile"), expected, None, torch.float32).passed
    expected = reference.rms_norm(x.double().cpu(), (24,), weight.double().cpu(), 1e-6)
    assert judge("out", rms_norm(x, (24,), weight, 1e-6, backend="compile"), expected, None, torch.float32).passed
    packed = rand(9, 2, 16)
    cos, sin = tables(8, 12)
    cu = torch.tensor([0, 4, 9], dtype=torch.int32, device=DEVICE)
    offsets = torch.tensor([1, 3], device=DEVICE)
    expected = reference.apply_rotary(packed.double().cpu(), cos.double().cpu(), sin.double().cpu(), interleaved=True,
                                      seqlen_offsets=offsets.cpu(), cu_seqlens=cu.cpu())
    out = apply_rotary(packed, cos, sin, interleaved=True, seqlen_offsets=offsets, cu_seqlens=cu, backend="compile")
    assert judge("out", out, expected, None, torch.float32).passed
