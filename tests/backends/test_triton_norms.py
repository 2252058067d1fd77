"""The fused Triton RMSNorm / LayerNorm kernels against the float64 referee: out, dx, dweight and
dbias; odd and long hidden sizes, all three dtypes, strided rows, near-constant rows,
deterministic weight gradients. On a CPU-only machine they run under TRITON_INTERPRET=1 on
small shapes; with GPUPARITY_TEST_DEVICE=cuda they run compiled on the GPU at real sizes."""
from __future__ import annotations

import dataclasses
import sys

import pytest
import torch
from device_env import ON_GPU, TEST_DEVICE as DEVICE, require_device

pytest.importorskip("triton")

from gpuparity import reference  # noqa: E402
from gpuparity.backends import triton_common, triton_norms  # noqa: E402
from gpuparity.contracts import norms as norms_contract  # noqa: E402
from gpuparity.tolerance import judge  # noqa: E402

require_device()

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# (rows, hidden): odd sizes, one packed-rows size, and one past FUSED_MAX_N (the looped kernels).
CPU_SHAPES = [(3, 1), (5, 17), (7, 150), (3, 1000), (33, 128), (2, 16500)]
GPU_SHAPES = [(8192, 128), (4097, 768), (1024, 5120), (512, 8192), (16, 100000)]
SHAPES = GPU_SHAPES if ON_GPU else CPU_SHAPES


pytestmark = pytest.mark.usefixtures("triton_interpreter_is_live")


def _leaf(t):
    return None if t is None else t.detach().requires_grad_()


def run_norm(fn, x, weight, bias, dy):
    """out and the gradients (dx, dweight, dbias) of fn(x, weight, bias)."""
    leaves = [_leaf(x), _leaf(weight), _leaf(bias)]
    out = fn(*leaves)
    wanted = [t for t in leaves if t is not None]
    grads = iter(torch.autograd.grad(out, wanted, dy.to(out.dtype)))
    return [out] + [next(grads) if t is not None else None for t in leaves]


def check_norm(op, x, weight, bias, eps, dy=None, seed=0):
    """Triton vs the float64 referee, with the eager composition in the same dtype as baseline."""
    shape = x.shape[-1:]
    if dy is None:
        gen = torch.Generator().manual_seed(seed + 1)
        dy = torch.randn(x.shape, generator=gen).to(x.device, x.dtype)
    if op == "rms":
        ours = lambda a, w, b: triton_norms.triton_rms_norm(a, shape, w, eps)  # noqa: E731
        base = lambda a, w, b: norms_contract.rms_norm_composition(a, shape, w, eps)  # noqa: E731
        ref = lambda a, w, b: reference.rms_norm(a, shape, w, eps)  # noqa: E731
    else:
        ours = lambda a, w, b: triton_norms.triton_layer_norm(a, shape, w, b, eps)  # noqa: E731
        base = lambda a, w, b: norms_contract.layer_norm_composition(a, shape, w, b, eps)  # noqa: E731
        ref = lambda a, w, b: reference.layer_norm(a, shape, w, b, eps)  # noqa: E731
    up = lambda t: None if t is None else t.detach().to("cpu", torch.float64)  # noqa: E731
    got = run_norm(ours, x, weight, bias, dy)
    baseline = run_norm(base, x, weight, bias, dy)
    expected = run_norm(ref, up(x), up(weight), up(bias), up(dy))
    for name, g, b, e in zip(("out", "dx", "dweight", "dbias"), got, baseline, expected):
        if e is None:
            continue
        assert g.dtype == (x.dtype if name in ("out", "dx") else (weight if name == "dweight" else bias).dtype)
        result = judge(name, g, e, b, x.dtype)
        assert result.passed, f"{op} {tuple(x.shape)} {x.dtype}: {result.reason}"
    return got


def make(rows, hidden, dtype, seed=0, affine=True):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, hidden, generator=gen).to(DEVICE, dtype)
    weight = (1 + 0.5 * torch.randn(hidden, generator=gen)).to(DEVICE, dtype) if affine else None
    bias = (0.5 * torch.randn(hidden, generator=gen)).to(DEVICE, dtype) if affine else None
    return x, weight, bias


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).replace("torch.", ""))
@pytest.mark.parametrize("rows,hidden", SHAPES)
@pytest.mark.parametrize("op", ["rms", "ln"])
def test_matches_float64(op, rows, hidden, dtype):
    x, weight, bias = make(rows, hidden, dtype, seed=rows + hidden)
    check_norm(op, x, weight, bias if op == "ln" else None, 1e-6 if op == "rms" else 1e-5)


@pytest.mark.parametrize("op", ["rms", "ln"])
def test_without_weight_or_bias(op):
    x, _, _ = make(9, 150, torch.float32)
    check_norm(op, x, None, None, 1e-5)


def test_layer_norm_weight_without_bias_and_bias_without_weight():
    x, weight, bias = make(9, 70, torch.float32)
    check_norm("ln", x, weight, None, 1e-5)
    check_norm("ln", x, None, bias, 1e-5)


@pytest.mark.parametrize("op", ["rms", "ln"])
def test_strided_rows_are_read_in_place(op):
    """A row stride larger than the hidden size, a sliced sequence (two leading strides) and a
    transposed (S, B, H) view all give the right answer."""
    hidden = 48 if not ON_GPU else 4096
    gen = torch.Generator().manual_seed(3)
    buffer = torch.randn(10, hidden + 16, generator=gen).to(DEVICE)
    padded_rows = buffer[:, :hidden]
    assert padded_rows.stride(0) == hidden + 16
    layout = triton_norms.row_layout(padded_rows, 1)
    assert layout.tensor.data_ptr() == padded_rows.data_ptr(), "a padded row stride must not be copied"
    weight = torch.randn(hidden, generator=gen).to(DEVICE)
    bias = torch.randn(hidden, generator=gen).to(DEVICE) if op == "ln" else None
    check_norm(op, padded_rows, weight, bias, 1e-5)

    full = torch.randn(3, 11, hidden, generator=gen).to(DEVICE)
    sliced = full[:, 2:9]                          # (B, S, H) with S sliced: two leading strides
    layout = triton_norms.row_layout(sliced, 1)
    assert layout.two_level and layout.tensor.data_ptr() == sliced.data_ptr()
    check_norm(op, sliced, weight, bias, 1e-5)

    transposed = full.transpose(0, 1)              # (S, B, H) view of a (B, S, H) tensor
    check_norm(op, transposed, weight, bias, 1e-5)

    # Strided upstream gradients: every other element (copied), and sliced rows (read in place).
    dy_full = torch.randn(3, 11, 2 * hidden, generator=gen).to(DEVICE)
    check_norm(op, sliced, weight, bias, 1e-5, dy=dy_full[:, 2:9, ::2])
    check_norm(op, sliced, weight, bias, 1e-5, dy=dy_full[:, 2:9, :hidden])


def test_row_layout_reads_three_strides_by_copying():
    t = torch.randn(4, 5, 6, 8)[:, 1:4, 2:5]       # three uneven leading dims: one copy
    layout = triton_norms.row_layout(t, 1)
    assert layout.tensor.is_contiguous() and layout.n_rows == 4 * 3 * 3


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("hidden", [64, 2000, 16500])
def test_layer_norm_near_constant_rows(dtype, hidden):
    """Rows with a large mean and a tiny spread: E[x^2] - E[x]^2 would cancel to noise."""
    gen = torch.Generator().manual_seed(7)
    base = 1000.0 if dtype == torch.float32 else 64.0
    spread = 1e-2 if dtype == torch.float32 else 0.5
    x = (base + spread * torch.randn(4, hidden, generator=gen)).to(DEVICE, dtype)
    weight = torch.randn(hidden, generator=gen).to(DEVICE, dtype)
    bias = torch.randn(hidden, generator=gen).to(DEVICE, dtype)
    check_norm("ln", x, weight, bias, 1e-5)


@pytest.mark.parametrize("op", ["rms", "ln"])
def test_weight_gradient_is_deterministic(op):
    rows = 200 if not ON_GPU else 50000
    x, weight, bias = make(rows, 96, torch.float32, seed=11)
    bias = bias if op == "ln" else None
    dy = torch.randn(x.shape, generator=torch.Generator().manual_seed(5)).to(DEVICE)
    fn = triton_norms.triton_rms_norm if op == "rms" else triton_norms.triton_layer_norm
    runs = []
    for _ in range(2):
        leaves = [_leaf(x), _leaf(weight)] + ([_leaf(bias)] if bias is not None else [])
        out = fn(leaves[0], (96,), *leaves[1:]) if op == "ln" else fn(leaves[0], (96,), leaves[1], 1e-6)
        runs.append(torch.autograd.grad(out, leaves, dy))
    for first, second in zip(*runs):
        assert torch.equal(first, second)


@pytest.mark.parametrize("prefetch", [False, True], ids=["load", "prefetch"])
@pytest.mark.parametrize("op", ["rms", "ln"])
def test_backward_tile_walk_both_ways(op, prefetch):
    """The fused backward with and without prefetching the next tile, on a walk that ends
    mid-program (rows not a multiple of rows x programs) with x and dy read through two
    leading strides each: dx, dweight and dbias against the float64 referee."""
    outer, inner, hidden = (7, 5, 48) if not ON_GPU else (200, 200, 1024)
    gen = torch.Generator().manual_seed(3)
    x_full = torch.randn(outer, inner + 1, hidden, generator=gen).to(DEVICE)
    x = x_full[:, 1:]                                  # (outer, inner) rows, not evenly spaced
    _, weight, bias = make(1, hidden, torch.float32, seed=13)
    bias = bias if op == "ln" else None
    is_rms = op == "rms"
    dy_full = torch.randn(outer, inner + 2, hidden, generator=gen).to(DEVICE)
    dy = dy_full[:, :inner]                            # another split of the same rows
    assert triton_norms.row_layout(x, 1, hidden).two_level and triton_norms.row_layout(dy, 1, hidden).two_level
    cfg = triton_norms.NormConfig(triton_common.next_pow2(hidden), 2, 2 if not ON_GPU else 4, False,
                                  programs_per_sm=1, prefetch=prefetch)
    _, stats = triton_norms.norm_forward(x, 1, weight, bias, 1e-5, is_rms)
    dx, dw, db = triton_norms.norm_backward(dy, x, 1, weight, None if is_rms else bias.dtype, stats, is_rms,
                                            config=cfg)
    up = lambda t: None if t is None else t.detach().to("cpu", torch.float64).requires_grad_()  # noqa: E731
    xs, ws, bs = up(x), up(weight), up(bias)
    ref = (reference.rms_norm(xs, (hidden,), ws, 1e-5) if is_rms
           else reference.layer_norm(xs, (hidden,), ws, bs, 1e-5))
    expected = torch.autograd.grad(ref, [t for t in (xs, ws, bs) if t is not None], dy.double().cpu())
    for name, got, want in zip(("dx", "dweight", "dbias"), (dx, dw, db), expected):
        result = judge(name, got, want, None, torch.float32)
        assert result.passed, f"{op} prefetch={prefetch}: {result.reason}"


@pytest.mark.parametrize("op", ["rms", "ln"])
def test_prepared_launches_follow_strides(op):
    """Launches are prepared once per call signature and reused; x's and dy's strides are part
    of it: the same values contiguous and as strided views give identical results, in any order."""
    gen = torch.Generator().manual_seed(8)
    x_wide = torch.randn(6, 4, 40, generator=gen).to(DEVICE)
    dy_wide = torch.randn(6, 5, 40, generator=gen).to(DEVICE)
    x_strided, dy_strided = x_wide[:, 1:], dy_wide[:, 2:]
    x_dense, dy_dense = x_strided.contiguous(), dy_strided.contiguous()
    views = {"contiguous": (x_dense, dy_dense), "strided": (x_strided, dy_strided),
             "dy strided": (x_dense, dy_strided), "x strided": (x_strided, dy_dense)}
    _, weight, bias = make(1, 40, torch.float32, seed=4)
    bias = bias if op == "ln" else None
    results = {}
    for name in ("contiguous", "dy strided", "strided", "x strided", "contiguous"):
        x, dy = views[name]
        leaves = [_leaf(x), _leaf(weight)] + ([_leaf(bias)] if bias is not None else [])
        out = (triton_norms.triton_rms_norm(leaves[0], (40,), leaves[1], 1e-6) if op == "rms"
               else triton_norms.triton_layer_norm(leaves[0], (40,), *leaves[1:]))
        got = [out] + list(torch.autograd.grad(out, leaves, dy))
        if name in results:
            for a, b in zip(got, results[name]):
                assert torch.equal(a, b), name
        results[name] = got
    for name in ("strided", "dy strided", "x strided"):
        for a, b in zip(results[name], results["contiguous"]):
            assert torch.equal(a, b), name


@pytest.mark.parametrize("op", ["rms", "ln"])
def test_backward_finishing_in_one_launch(op):
    """Short rows on NVIDIA: the fused backward's last program sums dweight / dbias itself.
    Several programs (on the CPU too); a new dy every round, so a last program that read a
    partial row before its program stored it would return the previous round's sums; each
    round against the separate partial-sum launch (the same partial rows, summed in the same
    order but grouped by other warps: equal to fp32 rounding) and the arrival counter back at
    zero; the same dy twice gives identical bits."""
    rows, hidden = (300, 100) if not ON_GPU else (131072, 128)
    is_rms = op == "rms"
    x, weight, bias = make(rows, hidden, torch.float32, seed=21)
    bias = None if is_rms else bias
    cfg = triton_norms.norm_config(hidden, True, fam="nvidia")
    assert cfg.finish and not triton_norms.norm_config(hidden, True, fam="cdna").finish
    n_tiles = -(-rows // cfg.rows)
    assert min(n_tiles, triton_norms._program_count(x.device, cfg.programs_per_sm)) > 1, "needs several programs"
    _, stats = triton_norms.norm_forward(x, 1, weight, bias, 1e-5, is_rms)
    bias_dtype = None if bias is None else bias.dtype
    for seed in range(2 if not ON_GPU else 5):
        dy = torch.randn(x.shape, generator=torch.Generator().manual_seed(30 + seed)).to(DEVICE)
        got = triton_norms.norm_backward(dy, x, 1, weight, bias_dtype, stats, is_rms, config=cfg)
        assert stats[-1].item() == 0, "the arrival counter must be left at zero"
        separate = triton_norms.norm_backward(dy, x, 1, weight, bias_dtype, stats, is_rms,
                                              config=dataclasses.replace(cfg, finish=False))
        assert torch.equal(got[0], separate[0]), "dx does not depend on the reduction"
        for name, a, b in zip(("dweight", "dbias"), got[1:], separate[1:]):
            assert (a is None) == (b is None), name
            if a is not None:
                torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5 * float(b.abs().max()), msg=name)
    again = triton_norms.norm_backward(dy, x, 1, weight, bias_dtype, stats, is_rms, config=cfg)
    for a, b in zip(got, again):
        assert (a is None and b is None) or torch.equal(a, b)
    check_norm(op, x.to(torch.bfloat16), weight.to(torch.bfloat16),
               None if bias is None else bias.to(torch.bfloat16), 1e-5)  # through autograd, vs float64


@pytest.mark.parametrize("op", ["rms", "ln"])
def test_strided_weight_and_bias(op):
    """A weight / bias that is a strided view (a column of a matrix) is read as its values."""
    gen = torch.Generator().manual_seed(12)
    x = torch.randn(20, 48, generator=gen).to(DEVICE)
    params = torch.randn(48, 3, generator=gen).to(DEVICE)
    weight, bias = params[:, 0], (params[:, 1] if op == "ln" else None)
    assert not weight.is_contiguous()
    check_norm(op, x, weight, bias, 1e-5)


def test_multi_dim_normalized_shape():
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(4, 3, 5, 6, generator=gen).to(DEVICE)
    weight = torch.randn(5, 6, generator=gen).to(DEVICE)
    out = triton_norms.triton_layer_norm(x, (5, 6), weight, None, 1e-5)
    expected = reference.layer_norm(x.double().cpu(), (5, 6), weight.double().cpu(), None, 1e-5)
    assert judge("out", out, expected, None, torch.float32).passed
    # backward with a two-dim weight and bias, twice (the second through the kept launches)
    bias = torch.randn(5, 6, generator=gen).to(DEVICE)
    dy = torch.randn(x.shape, generator=gen).to(DEVICE)
    up = lambda t: t.detach().double().cpu().requires_grad_()  # noqa: E731
    xs, ws, bs = up(x), up(weight), up(bias)
    expected = torch.autograd.grad(reference.layer_norm(xs, (5, 6), ws, bs, 1e-5), (xs, ws, bs), dy.double().cpu())
    for _ in range(2):
        leaves = [_leaf(x), _leaf(weight), _leaf(bias)]
        got = torch.autograd.grad(triton_norms.triton_layer_norm(leaves[0], (5, 6), *leaves[1:], 1e-5), leaves, dy)
        for name, g, want in zip(("dx", "dweight", "dbias"), got, expected):
            assert g.shape == want.shape
            assert judge(name, g, want, None, torch.float32).passed, name
    out = triton_norms.triton_rms_norm(x, (5, 6), weight, None)
    expected = reference.rms_norm(x.double().cpu(), (5, 6), weight.double().cpu(), torch.finfo(torch.float32).eps)
    assert judge("out", out, expected, None, torch.float32).passed


def test_empty_input():
    x = torch.randn(0, 32).to(DEVICE).requires_grad_()
    weight = torch.randn(32).to(DEVICE).requires_grad_()
    out = triton_norms.triton_rms_norm(x, (32,), weight)
    assert out.shape == (0, 32)
    out.sum().backward()
    assert torch.equal(weight.grad, torch.zeros_like(weight))


def test_configs_cover_every_family():
    for fam in triton_norms.FAMILIES:
        for n in (1, 128, 1000, 4096, 16384, 16385, 100000):
            for backward in (False, True):
                cfg = triton_norms.norm_config(n, backward, fam)
                assert cfg.num_warps <= triton_norms.FAMILIES[fam]["max_warps"]
                assert cfg.looped == (n > triton_norms.FAMILIES[fam]["fused_max_n"])
                assert cfg.looped or cfg.block_n >= n


def test_shared_kernel_helpers(monkeypatch):
    """triton_common's pieces the norm and rotary backends share: the family row, powers of two,
    and the reasons their supports()/availability() give."""
    assert triton_common.tile_family() in triton_norms.FAMILIES
    assert [triton_common.next_pow2(n) for n in (1, 2, 3, 17, 64)] == [1, 2, 4, 32, 64]
    problem = type("P", (), {"device": torch.device("meta")})()
    monkeypatch.setattr(triton_common, "triton_unavailable_reason", lambda kind: None if kind == "cpu" else kind)
    assert triton_common.problem_reasons(problem) == ["meta"]
    assert triton_common.problem_reasons(type("P", (), {"device": torch.device("cpu")})()) == []
    monkeypatch.undo()
    monkeypatch.setitem(sys.modules, "triton", None)  # `import triton` now fails
    assert triton_common.availability() == "triton: the triton package is not importable here"


@pytest.mark.skipif(not ON_GPU, reason="needs more than 2^31 elements (8 GiB of bf16 x, y, dy, dx) on a GPU")
@pytest.mark.parametrize("op", ["rms", "ln"])
def test_more_than_2_31_elements(op):
    hidden = 4096
    rows = (1 << 31) // hidden + 64
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    x = torch.randn(rows, hidden, device=DEVICE, dtype=torch.bfloat16, generator=gen)
    weight = torch.randn(hidden, device=DEVICE, dtype=torch.bfloat16, generator=gen).requires_grad_()
    xg = x.requires_grad_()
    fn = (lambda a: triton_norms.triton_rms_norm(a, (hidden,), weight, 1e-6)) if op == "rms" else \
        (lambda a: triton_norms.triton_layer_norm(a, (hidden,), weight, None, 1e-5))
    out = fn(xg)
    dy = torch.ones_like(out)
    (dx,) = torch.autograd.grad(out, [xg], dy)
    tail = slice(rows - 64, rows)                  # every element here sits past 2^31
    x_tail = x[tail].detach().double().cpu()
    w64 = weight.detach().double().cpu()
    expected = reference.rms_norm(x_tail, (hidden,), w64, 1e-6) if op == "rms" else \
        reference.layer_norm(x_tail, (hidden,), w64, None, 1e-5)
    result = judge("out", out[tail], expected, None, torch.bfloat16)
    assert result.passed, result.reason
    x_leaf = x_tail.clone().requires_grad_()
    ref_out = reference.rms_norm(x_leaf, (hidden,), w64, 1e-6) if op == "rms" else \
        reference.layer_norm(x_leaf, (hidden,), w64, None, 1e-5)
    (ref_dx,) = torch.autograd.grad(ref_out, [x_leaf], torch.ones_like(ref_out))
    result = judge("dx", dx[tail], ref_dx, None, torch.bfloat16)
    assert result.passed, result.reason
