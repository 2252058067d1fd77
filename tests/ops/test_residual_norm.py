"""gpuparity.residual_norm (residual add fused with RMSNorm / LayerNorm): the Triton backend and
the composition pass the battery spec against float64 (out, new_residual and the gradients of
x, residual, weight and bias through both), a planted kernel bug fails it, the dtype rules of
new_residual, the argument checks, and the torch.library op (opcheck, fullgraph compile)."""
from __future__ import annotations

import os

import pytest
import torch

import gpuparity
import gpuparity.ops.residual_norm  # noqa: F401 - registers gpuparity::residual_norm (opcheck)
from gpuparity.checks import execute, families
from gpuparity.checks.battery import run_battery
from gpuparity.checks.results import Status
from gpuparity.contracts import get_spec
from gpuparity.contracts.residual_norm import reference_residual_norm
from gpuparity import dispatch
from gpuparity.dispatch import get as get_backend
from gpuparity.tolerance import judge

from device_env import ON_GPU, TEST_DEVICE
from test_first_call import checks_run, empty_cache  # noqa: F401 - fixtures: an empty verdict store, the checks run

DEVICE = torch.device(TEST_DEVICE)
OP = "residual_norm"
pytestmark = pytest.mark.usefixtures("triton_interpreter_is_live")
QUICK = [c.name for c in get_spec(OP).cases() if c.level == "quick"]
DEFAULT = [c.name for c in get_spec(OP).cases() if c.level == "default"]
PLANTED = os.path.join(os.path.dirname(__file__), "residual_norm_planted.py")


def _index_of_one_element(self):
    return int(self.handle.data.reshape(()))    # raises, as the interpreter's own, unless one element


@pytest.fixture(autouse=True)
def _interpreter_indexes_one_element_arrays(monkeypatch):
    """Triton's interpreter before 3.9 (3.6 on the H100 test machine) indexes with a kernel scalar
    as `int(self.handle.data)`, a 1-element array, which numpy >= 2.4 refuses ("only
    0-dimensional arrays can be converted to Python scalars"): every loop of a kernel over a
    runtime bound (the backward's `range(0, tiles_per_program)`) fails there. The interpreter
    only runs on the CPU runs (device_env sets TRITON_INTERPRET=1 unless GPUPARITY_TEST_DEVICE=cuda;
    a pytest without it on a GPU machine runs the interpreter too); the index is taken as 3.9's
    interpreter takes it, for each test only."""
    if ON_GPU:
        return
    try:
        from triton.runtime import interpreter
    except ImportError:
        return
    plain = getattr(interpreter, "_patch_lang_tensor", None)
    if plain is None:
        return

    def patched(tensor, *args, **kwargs):
        result = plain(tensor, *args, **kwargs)
        tensor.__index__ = _index_of_one_element   # put back (3.9) or replaced again by the next launch
        return result

    patched.plain = plain
    monkeypatch.setattr(interpreter, "_patch_lang_tensor", patched)


@pytest.fixture(autouse=True)
def _interpreter_rounds_bf16_to_nearest(monkeypatch):
    """Triton's interpreter (3.9) casts fp32 to bf16 by truncation where compiled kernels round
    to nearest even (the cast's documented default): the new_residual a bf16 stream stores
    would be biased by up to an ulp (4 at a mean of 1000). Rounded as on a GPU here (the CPU
    runs only: a GPU run's kernels are compiled)."""
    if ON_GPU:
        return
    try:
        from triton.runtime import interpreter
        import triton.language as tl
        import numpy as np
    except ImportError:
        return
    plain = interpreter.InterpreterBuilder.create_fp_trunc

    def nearest(self, src, dst_type):
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            rounded = torch.from_numpy(np.ascontiguousarray(src.data)).to(torch.bfloat16)
            return interpreter.TensorHandle(rounded.view(torch.int16).numpy().view(np.uint16), tl.bfloat16)
        return plain(self, src, dst_type)

    monkeypatch.setattr(interpreter.InterpreterBuilder, "create_fp_trunc", nearest)


def test_interpreter_rounding_matches_torch():
    from gpuparity.backends.triton_residual_norm import residual_norm_forward
    x, r = torch.randn(4, 256).bfloat16().to(DEVICE), (1000 + torch.randn(4, 256)).bfloat16().to(DEVICE)
    _, new_residual, _ = residual_norm_forward(x, r, torch.ones(256, dtype=torch.bfloat16, device=DEVICE), None, 1e-5,
                                               True, torch.bfloat16)
    assert torch.equal(new_residual, (x.float() + r.float()).bfloat16())


def _numpy_refuses_one_element_int() -> bool:
    import numpy as np
    try:
        int(np.array([1]))
    except TypeError:
        return True
    return False


@pytest.mark.skipif(ON_GPU or not _numpy_refuses_one_element_int(),
                    reason="the interpreter runs on the CPU runs only; this numpy converts 1-element arrays")
def test_old_interpreter_index_fails_and_the_fixture_serves_it(monkeypatch):
    """Triton 3.6's interpreter index (int of a 1-element array) planted: the backward's
    runtime-bounded loop fails as on the H100 machine's pytest without GPUPARITY_TEST_DEVICE=cuda;
    the fixture's index, set after it, serves the same call."""
    from triton.runtime import interpreter
    plain = interpreter._patch_lang_tensor.plain

    def index_as_in_3_6(tensor, *args, **kwargs):
        result = plain(tensor, *args, **kwargs)
        tensor.__index__ = lambda self: int(self.handle.data)
        return result

    def index_fixed(tensor, *args, **kwargs):
        result = index_as_in_3_6(tensor, *args, **kwargs)
        tensor.__index__ = _index_of_one_element
        return result

    def run():
        x, res = torch.randn(3, 64, device=DEVICE), torch.randn(3, 64, device=DEVICE)
        weight = torch.randn(64, device=DEVICE, requires_grad=True)
        out, _ = get_backend(OP, "triton").fn(x, res, weight)
        return torch.autograd.grad(out.sum(), weight)[0]

    monkeypatch.setattr(interpreter, "_patch_lang_tensor", index_as_in_3_6)
    with pytest.raises(Exception, match="only 0-dimensional arrays"):
        run()
    monkeypatch.setattr(interpreter, "_patch_lang_tensor", index_fixed)
    assert torch.isfinite(run()).all()


def run_case(fn, case_name, dtype, seed=0):
    spec = get_spec(OP)
    case = next(c for c in spec.cases() if c.name == case_name)
    return execute.run_case(OP, fn, case.params, dtype, DEVICE, seed, get_backend(OP, spec.baseline_backend).fn)


@pytest.mark.parametrize("backend", ["triton", "composition"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("case", QUICK)
def test_battery_quick_cases_pass(backend, dtype, case):
    status, comparisons, reason = run_case(get_backend(OP, backend).fn, case, dtype)
    assert status == Status.PASS, reason
    names = {c.name for c in comparisons}
    assert {"out", "grad_x", "grad_weight"} <= names
    if get_spec(OP).make_case(case).params["residual"] and "no_residual" not in case:
        assert "grad_residual" in names


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", DEFAULT)
def test_battery_default_cases_pass(case, dtype):
    status, _, reason = run_case(get_backend(OP, "triton").fn, case, dtype)
    assert status == Status.PASS, reason


def test_regime_families_pass_on_triton():
    """Every member of every regime family (tile boundaries, rows, residual modes, values, layouts)."""
    members = list(families.pool(get_spec(OP)).values())
    battery = run_battery([OP], "default", str(DEVICE), dtypes=["bfloat16"], backends=["triton"], isolate=False,
                          case_lists={OP: members})
    assert len(battery.results) == len(members) >= 50
    bad = [(r.case, r.reason) for r in battery.results if r.status != Status.PASS]
    assert not bad, bad


def test_planted_dropped_residual_is_caught_by_the_battery():
    """The kernel launched without the residual when hidden % 64 == 1: the battery's quick cases
    and its tile-boundary family catch it, and only there."""
    spec = get_spec(OP)
    cases = [c for c in spec.cases() if c.level == "quick"] + [
        case for name, case in families.pool(spec).items() if name.startswith("sizes.hidden_6")]
    battery = run_battery([OP], "default", str(DEVICE), dtypes=["float32"], isolate=False, case_lists={OP: cases},
                          impl=f"{PLANTED}:residual_dropped_at_64k_plus_1")
    by_case = {r.case: r for r in battery.results}
    assert set(by_case) == {c.name for c in cases}
    for case in cases:
        hit = case.params["shape"][-1] % 64 == 1 and case.params["residual"]
        result = by_case[case.name]
        assert result.status == (Status.FAIL if hit else Status.PASS), (case.name, result.reason)
    assert {"hidden_1_rms", "sizes.hidden_65_rms", "sizes.hidden_65_layer"} <= {
        name for name, r in by_case.items() if r.status == Status.FAIL}
    failing = {c.name for c in by_case["sizes.hidden_65_layer"].comparisons if not c.passed}
    assert {"out", "grad_residual"} <= failing, failing


def _inputs(shape=(3, 5, 48), dtype=torch.float32, residual_dtype=None, bias=True, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=gen).to(DEVICE, dtype).requires_grad_()
    residual = torch.randn(shape, generator=gen).to(DEVICE, residual_dtype or dtype).requires_grad_()
    weight = (1 + 0.5 * torch.randn(shape[-1], generator=gen)).to(DEVICE, dtype).requires_grad_()
    b = (0.5 * torch.randn(shape[-1], generator=gen)).to(DEVICE, dtype).requires_grad_() if bias else None
    return x, residual, weight, b


@pytest.mark.parametrize("norm", ["rms", "layer"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("residual_in_fp32", [False, True])
def test_new_residual_dtype_and_float32_accuracy(norm, dtype, residual_in_fp32):
    """new_residual is float32 under residual_in_fp32 (exact sum of the 16-bit inputs, judged at
    float32's floor, which the battery's x-dtype view of it cannot), else x's dtype; out is x's."""
    x, residual, weight, bias = _inputs(dtype=dtype)
    out, new_residual = gpuparity.residual_norm(x, residual, weight, bias, norm=norm,
                                                residual_in_fp32=residual_in_fp32, backend="triton")
    assert out.dtype == dtype
    assert new_residual.dtype == (torch.float32 if residual_in_fp32 else dtype)
    ref_out, ref_res = reference_residual_norm(*(t.detach().cpu().double() for t in (x, residual, weight, bias)),
                                               norm=norm)
    judged = torch.float32 if residual_in_fp32 else dtype
    assert judge("new_residual", new_residual, ref_res, None, judged).passed
    assert judge("out", out, ref_out, None, dtype).passed


@pytest.mark.parametrize("norm", ["rms", "layer"])
def test_float32_residual_stream_beside_bf16_x(norm):
    """FlashAttention's stream: a float32 residual kept float32, its gradient float32 too."""
    x, residual, weight, bias = _inputs(dtype=torch.bfloat16, residual_dtype=torch.float32)
    out, new_residual = gpuparity.residual_norm(x, residual, weight, bias, norm=norm, backend="triton")
    assert (out.dtype, new_residual.dtype) == (torch.bfloat16, torch.float32)
    (out.float().square().sum() + new_residual.sum()).backward()
    assert (x.grad.dtype, residual.grad.dtype, weight.grad.dtype) == (torch.bfloat16, torch.float32, torch.bfloat16)
    x64, r64, w64, b64 = (t.detach().cpu().double().requires_grad_() for t in (x, residual, weight, bias))
    ref_out, ref_res = reference_residual_norm(x64, r64, w64, b64, norm=norm)
    (ref_out.square().sum() + ref_res.sum()).backward()
    assert judge("grad_residual", residual.grad, r64.grad, None, torch.bfloat16).passed
    assert judge("grad_weight", weight.grad, w64.grad, None, torch.bfloat16).passed


@pytest.mark.parametrize("backend", ["triton", "composition"])
def test_gradient_through_out_alone_and_new_residual_alone(backend):
    x, residual, weight, bias = _inputs(bias=False)
    out, new_residual = gpuparity.residual_norm(x, residual, weight, norm="rms", backend=backend)
    gx, gr = torch.autograd.grad(new_residual.sum(), (x, residual), retain_graph=True)
    torch.testing.assert_close(gx, torch.ones_like(x))
    torch.testing.assert_close(gr, torch.ones_like(residual))
    gx, gw = torch.autograd.grad(out.sum(), (x, weight))
    x64, r64, w64 = (t.detach().cpu().double().requires_grad_() for t in (x, residual, weight))
    ref_x, ref_w = torch.autograd.grad(reference_residual_norm(x64, r64, w64)[0].sum(), (x64, w64))
    torch.testing.assert_close(gx.cpu().double(), ref_x, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(gw.cpu().double(), ref_w, rtol=1e-4, atol=1e-5)


def test_no_residual_and_eps_defaults():
    """residual=None: new_residual is x (a new tensor from the kernel); eps=None is
    gpuparity.rms_norm's / gpuparity.layer_norm's default."""
    x, _, weight, bias = _inputs(shape=(4, 33))
    for norm, plain in (("rms", lambda: gpuparity.rms_norm(x, (33,), weight, backend="torch") + bias),
                        ("layer", lambda: gpuparity.layer_norm(x, (33,), weight, bias, backend="torch"))):
        out, new_residual = gpuparity.residual_norm(x, None, weight, bias, norm=norm, backend="triton")
        assert new_residual.data_ptr() != x.data_ptr()
        torch.testing.assert_close(new_residual, x.detach())
        torch.testing.assert_close(out, plain(), rtol=1e-5, atol=1e-5)


def test_strided_rows_are_read_in_place_and_weight_gradient_is_deterministic():
    from gpuparity.backends import triton_residual_norm as kernels
    wide = torch.randn(6, 7, 64, device=DEVICE)
    x = wide[:, :5, :40]                      # two leading strides, rows not contiguous
    residual = torch.randn(5, 6, 40, device=DEVICE).transpose(0, 1)
    weight = torch.randn(40, device=DEVICE)
    copies = []
    real = kernels.row_layout

    def watched(t, *args):
        layout = real(t, *args)
        copies.append(layout.tensor.data_ptr() != t.data_ptr())
        return layout
    kernels.row_layout = watched
    try:
        out, new_residual, _ = kernels.residual_norm_forward(x, residual, weight, None, 1e-6, True, torch.float32)
    finally:
        kernels.row_layout = real
    assert copies == [False, False]
    ref_out, ref_res = reference_residual_norm(x.cpu().double(), residual.cpu().double(), weight.cpu().double(),
                                               eps=1e-6)
    torch.testing.assert_close(out.cpu().double(), ref_out, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(new_residual.cpu().double(), ref_res)
    x, residual, weight, bias = _inputs(shape=(37, 24))
    runs = [torch.autograd.grad(gpuparity.residual_norm(x, residual, weight, bias, norm="layer", backend="triton")[0]
                                .sum(), (weight, bias)) for _ in range(2)]
    assert all(torch.equal(a, b) for a, b in zip(*runs))


@pytest.mark.parametrize("shape", [(0, 8), (3, 0)], ids=["no_rows", "no_cols"])
def test_empty_inputs(shape):
    x, residual, weight, bias = _inputs(shape=shape)
    out, new_residual = gpuparity.residual_norm(x, residual, weight, bias, norm="layer", backend="triton")
    assert out.shape == new_residual.shape == x.shape
    (out.sum() + new_residual.sum()).backward()
    assert weight.grad.shape == weight.shape and torch.count_nonzero(weight.grad) == 0


def test_tile_configs_are_portable():
    """Every family's tiles: warps a power of two within its limit (wave64 CDNA: 16), rows x
    columns within the tile; an AOT spec for every family's configs."""
    from gpuparity.backends import triton_residual_norm as kernels
    for fam, limits in kernels.FAMILIES.items():
        for n in (1, 3, 127, 128, 129, 1000, 4096, kernels.MAX_N):
            block, rows, warps = kernels.tile(n, fam)
            assert block >= n and warps & (warps - 1) == 0 and 1 <= warps <= limits["max_warps"]
            assert rows * block <= max(kernels.TILE_ELEMS, block)
    names = [spec.name for spec in kernels.aot_specs()]
    assert len(names) == 2 * len(kernels.FAMILIES) * len(kernels.AOT_CASES) == len(set(names))


def test_rows_wider_than_the_kernel_go_to_the_composition():
    from gpuparity.backends import triton_residual_norm as kernels
    from gpuparity.contracts.residual_norm import residual_norm_problem
    x = torch.empty(1, kernels.MAX_N + 1, device=DEVICE)
    problem = residual_norm_problem(x, None, torch.empty(kernels.MAX_N + 1, device=DEVICE), None, "rms", False)
    assert any("hidden size 16385 > 16384" in reason for reason in kernels._supports(problem))


@pytest.mark.parametrize("call, match", [
    (lambda x, r, w: (x, r[:, :3], w), r"residual: expected the shape of x \(4, 8\)"),
    (lambda x, r, w: (x, r.double(), w), r"residual: expected the dtype of x \(float32\) or float32"),
    (lambda x, r, w: (x, r, w[:3]), r"weight: expected shape \(8,\)"),
    (lambda x, r, w: (x, r, None), r"weight: expected a torch.Tensor, got NoneType"),
    (lambda x, r, w: (x, r, w, w[:2]), r"bias: expected shape \(8,\)"),
    (lambda x, r, w: (x, r, w, None, {"norm": "batch"}), r"norm: expected one of \('rms', 'layer'\), got str 'batch'"),
    (lambda x, r, w: (x, r, w, None, {"eps": -1.0}), r"eps: expected a float >= 0 or None, got float -1.0"),
    (lambda x, r, w: (x, r, w, None, {"residual_in_fp32": 1}), r"residual_in_fp32: expected a bool, got int 1"),
    (lambda x, r, w: (x.long(), r, w), r"x: expected dtype in"),
    (lambda x, r, w: (x[0, 0], None, w), r"x: expected at least 1 dimension"),
    (lambda x, r, w: (x, r, w, None, {"rowscale": x[:, 0:2]}), r"rowscale: expected shape \(4,\) \(x's shape"),
    (lambda x, r, w: (x, r, w, None, {"rowscale": x[:, 0].long()}), r"rowscale: expected dtype in"),
    (lambda x, r, w: (x, r, w, None, {"zero_centered_weight": 1}), r"zero_centered_weight: expected a bool, got int"),
    (lambda x, r, w: (x, r, w, None, {"out_dtype": torch.int8}), r"out_dtype: expected None or one of"),
])
def test_arguments_are_checked(call, match):
    args = call(torch.randn(4, 8), torch.randn(4, 8), torch.randn(8))
    kwargs = args[-1] if isinstance(args[-1], dict) else {}
    with pytest.raises((TypeError, ValueError), match=match):
        gpuparity.residual_norm(*(args[:-1] if kwargs else args), **kwargs)


@pytest.mark.parametrize("backend", ["composition", "triton"])
@pytest.mark.parametrize("norm", ["rms", "layer"])
def test_opcheck(backend, norm):
    x, residual, weight, bias = _inputs(shape=(3, 5, 16))
    torch.library.opcheck(torch.ops.gpuparity.residual_norm, (x, residual, weight, bias, None, norm, False, backend))
    torch.library.opcheck(torch.ops.gpuparity.residual_norm, (x, None, weight, None, 1e-5, norm, True, backend))


@pytest.mark.parametrize("compiler", ["aot_eager"] + (["inductor"] if ON_GPU else []))
@pytest.mark.parametrize("backend", ["triton", "composition"])
def test_compiled_fullgraph_matches_eager(backend, compiler):
    x, residual, weight, bias = _inputs(shape=(4, 24))

    def step(x, residual, weight, bias):
        out, new_residual = gpuparity.residual_norm(x, residual, weight, bias, norm="layer", residual_in_fp32=True,
                                                    backend=backend)
        return out.square().sum() + (new_residual * 0.5).sum()

    results = []
    torch._dynamo.reset()
    for run in (step, torch.compile(step, fullgraph=True, backend=compiler)):
        loss = run(x, residual, weight, bias)
        results.append((loss.detach(), *torch.autograd.grad(loss, (x, residual, weight, bias))))
    for eager, compiled in zip(*results):
        torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-5)
    torch._dynamo.reset()
    assert torch._dynamo.explain(step)(x, residual, weight, bias).graph_break_count == 0


def test_shared_gradient_of_x_and_residual_lands_in_separate_grads():
    """The eager backward hands one tensor to x and residual (same dtype: one write fewer);
    autograd still gives each leaf its own .grad."""
    x, residual, weight, _ = _inputs(shape=(4, 16), bias=False)
    out, new_residual = gpuparity.residual_norm(x, residual, weight, backend="triton")
    (out.sum() + 2 * new_residual.sum()).backward()
    torch.testing.assert_close(x.grad, residual.grad)
    before = residual.grad.clone()
    x.grad.add_(1.0)
    torch.testing.assert_close(residual.grad, before)


@pytest.mark.parametrize("wrong", [False, True], ids=["kernel", "planted_wrong_kernel"])
def test_auto_verifies_triton_on_the_calls_kind_before_using_it(empty_cache, checks_run, monkeypatch, wrong):
    """backend="auto" goes through verified selection: with triton first in the prior, a first
    call checks it on the quick cases of its norm kind; a kernel that fails them (the planted
    dropped residual) gives way to the composition."""
    import residual_norm_planted
    from gpuparity.checks import priors, selection
    from gpuparity.contracts.residual_norm import residual_norm_problem
    from gpuparity.ops import select
    monkeypatch.setitem(priors.PRIORS[priors.family(DEVICE)], OP, ["triton", "composition"])
    if wrong:
        monkeypatch.setattr(dispatch.get(OP, "triton"), "fn", residual_norm_planted.residual_dropped_at_64k_plus_1)
    x, residual, weight, _ = _inputs(shape=(4, 64), bias=False)
    gpuparity.residual_norm(x, residual, weight, norm="layer")
    problem = residual_norm_problem(x, residual, weight, None, "layer", False)
    names = selection.first_call_cases(OP, "layer")
    listed = {case.name: case for case in get_spec(OP).cases()}
    assert names and all(listed[name].params["norm"] == "layer" for name in names)
    assert {t.case for t in checks_run if t.backend == "triton"} == set(names)
    assert select.resolve(problem).name == ("composition" if wrong else "triton")


@pytest.mark.parametrize("used", ["out", "new_residual"])
def test_compiled_with_one_output_used(used):
    """The backward op gets no gradient for the output the graph drops (None, not zeros)."""
    x, residual, weight, _ = _inputs(shape=(4, 24), bias=False)

    def step(x, residual, weight):
        out, new_residual = gpuparity.residual_norm(x, residual, weight, norm="layer", backend="triton")
        return (out if used == "out" else new_residual).square().sum()

    torch._dynamo.reset()
    grads = [torch.autograd.grad(run(x, residual, weight), (x, residual, weight), allow_unused=True)
             for run in (step, torch.compile(step, fullgraph=True, backend="aot_eager"))]
    for eager, compiled in zip(*grads):
        if eager is None:   # the weight, when only new_residual is used
            assert compiled is None or not compiled.any()
        else:
            torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-5)
    torch._dynamo.reset()


@pytest.mark.parametrize("backend", ["triton", "composition"])
def test_rowscale_zero_centered_out_dtype(backend):
    """FlashAttention's fused arguments: x * rowscale before the add (zero rows: new_residual is
    the residual alone), weight + 1, an fp32 out beside bf16 x (more accurate than bf16's
    rounding, which the battery's x-dtype view cannot show); rowscale gets no gradient, x's
    gradient is scaled by it."""
    x, residual, weight, bias = _inputs(shape=(4, 40), dtype=torch.bfloat16, residual_dtype=torch.float32)
    rowscale = torch.tensor([0.5, 0.0, -2.0, 1.0], device=DEVICE, requires_grad=True)
    out, new_residual = gpuparity.residual_norm(x, residual, weight, bias, norm="layer", rowscale=rowscale,
                                                zero_centered_weight=True, out_dtype=torch.float32, backend=backend)
    leaves = [t.detach().clone().requires_grad_() for t in (x, residual, weight, bias)]
    ref_out, ref_res = reference_residual_norm(*leaves, norm="layer", rowscale=rowscale, zero_centered_weight=True,
                                               eps=1e-5)
    assert out.dtype == torch.float32 and new_residual.dtype == torch.float32
    torch.testing.assert_close(new_residual[1], residual[1].detach())
    err = (out.double() - ref_out).abs().max()
    assert err < 1e-4 < (out.bfloat16().double() - ref_out).abs().max()
    torch.testing.assert_close(new_residual.double(), ref_res, rtol=1e-6, atol=1e-6)
    g = torch.randn_like(out)
    ref_grads = torch.autograd.grad(ref_out, leaves, g.double())
    out.backward(g)
    assert rowscale.grad is None
    assert not x.grad[1].any()
    for got, want in zip((x.grad, residual.grad, weight.grad, bias.grad), ref_grads):
        torch.testing.assert_close(got.double(), want.double(), rtol=1e-2, atol=2e-2)


@pytest.mark.parametrize("backend", ["composition", "triton"])
def test_opcheck_fused_arguments(backend):
    x, residual, weight, bias = _inputs(shape=(3, 5, 16))
    rowscale = torch.rand(3, 5, device=DEVICE)
    torch.library.opcheck(torch.ops.gpuparity.residual_norm,
                          (x, residual, weight, bias, None, "layer", False, backend, rowscale, True, torch.float64))


@pytest.mark.parametrize("backend", ["triton", "composition"])
def test_compiled_fullgraph_fused_arguments(backend):
    x, residual, weight, bias = _inputs(shape=(4, 24))
    rowscale = torch.rand(4, device=DEVICE)

    def step(x, residual, weight, bias):
        out, new_residual = gpuparity.residual_norm(x, residual, weight, bias, norm="rms", rowscale=rowscale,
                                                    zero_centered_weight=True, out_dtype=torch.float64,
                                                    backend=backend)
        return out.square().sum() + (new_residual * 0.5).sum()

    results = []
    torch._dynamo.reset()
    for run in (step, torch.compile(step, fullgraph=True, backend="aot_eager")):
        loss = run(x, residual, weight, bias)
        results.append((loss.detach(), *torch.autograd.grad(loss, (x, residual, weight, bias))))
    for eager, compiled in zip(*results):
        torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-5)
    torch._dynamo.reset()
