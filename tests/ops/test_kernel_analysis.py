"""The memo of torch.compile's per-call-site analysis of gpuparity's Triton kernels
(ops/kernel_analysis.py): one analysis per kernel and signature, a copy per hit, and everything
it cannot key (other kernels, concrete tensors, TMA metadata) passed to torch unchanged."""
from __future__ import annotations

import types

import pytest
import torch

from gpuparity import caches
from gpuparity.ops import kernel_analysis

triton = pytest.importorskip("triton")
triton_norms = pytest.importorskip("gpuparity.backends.triton_norms")
OURS = triton_norms._norm_fwd_fused_kernel


@triton.jit
def _foreign_kernel(x_ptr, n):
    pass


def fake_tensors(*specs):
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        return [torch.empty(shape, dtype=dtype) for shape, dtype in specs]


@pytest.fixture
def analysis():
    """A stand-in for torch's triton_kernel_wrap: its analysis counts calls and answers with a
    fresh mutable object naming the written arguments."""
    caches.clear_all()
    calls = []

    def identify_accessed_tensors(kernel, kwargs, tma_descriptor_metadata):
        calls.append((kernel, dict(kwargs)))
        return {"writes": [name for name in kwargs if name.startswith("out")]}

    module = types.SimpleNamespace(identify_accessed_tensors=identify_accessed_tensors)
    assert kernel_analysis.install(module)
    yield module, calls
    caches.clear_all()


def test_one_analysis_per_kernel_and_signature_whatever_the_shapes(analysis):
    module, calls = analysis
    x1, out1 = fake_tensors(((4, 64), torch.bfloat16), ((4, 64), torch.bfloat16))
    x2, out2 = fake_tensors(((4096, 2048), torch.bfloat16), ((4096, 2048), torch.bfloat16))
    first = module.identify_accessed_tensors(OURS, {"x": x1, "out": out1, "n": 64, "BLOCK": 128}, {})
    second = module.identify_accessed_tensors(OURS, {"x": x2, "out": out2, "n": 64, "BLOCK": 128}, {})
    assert len(calls) == 1
    assert first == second == {"writes": ["out"]}
    assert first is not second, "a hit must hand out a copy: callers may change what they get"
    first["writes"].append("x")
    assert module.identify_accessed_tensors(OURS, {"x": x1, "out": out1, "n": 64, "BLOCK": 128}, {}) == {"writes": ["out"]}
    counts = kernel_analysis.stats()
    assert (counts["hits"], counts["misses"], counts["passed"]) == (2, 1, 0)
    assert kernel_analysis.signatures() == [
        "_norm_fwd_fused_kernel(BLOCK=int:128, n=int:64, out=torch.bfloat16, x=torch.bfloat16)"]


def test_copies_of_a_kernel_share_its_analysis(analysis):
    """torch analyses a copy of the kernel object per call site (found on an H100: 35 analyses of
    3 kernels in an 8-layer model, one per layer); the copies compile the same source."""
    import copy
    module, calls = analysis
    x, out = fake_tensors(((4, 64), torch.bfloat16), ((4, 64), torch.bfloat16))
    for kernel in (OURS, copy.copy(OURS), copy.copy(OURS)):
        module.identify_accessed_tensors(kernel, {"x": x, "out": out, "n": 64}, {})
    assert len(calls) == 1


@pytest.mark.parametrize("change", ["dtype", "int value", "constexpr", "symbolic"])
def test_anything_the_ir_generation_sees_is_in_the_key(analysis, change):
    module, calls = analysis
    x, out, x16 = fake_tensors(((8, 8), torch.float32), ((8, 8), torch.float32), ((8, 8), torch.float16))
    base = {"x": x, "out": out, "n": 64, "BLOCK": 128}
    other = dict(base)
    if change == "dtype":
        other["x"] = x16
    elif change == "int value":
        other["n"] = 1            # Triton specializes 1 and multiples of 16
    elif change == "constexpr":
        other["BLOCK"] = 256
    else:
        from torch.fx.experimental.symbolic_shapes import ShapeEnv
        other["n"] = ShapeEnv().create_unbacked_symint()
    module.identify_accessed_tensors(OURS, base, {})
    module.identify_accessed_tensors(OURS, other, {})
    assert len(calls) == 2


def test_an_autotuner_is_keyed_by_its_function_and_first_config(analysis):
    """torch wraps every launch that passes num_warps / num_stages in a one-config Autotuner, a new
    one per call site, and analyses its function with config 0's values merged in (H100: with such
    launches sent to torch unmemoized, 56 of 80 analyses, 13-15 s of a cold compile)."""
    module, calls = analysis
    x, out = fake_tensors(((4, 64), torch.bfloat16), ((4, 64), torch.bfloat16))
    args = {"x": x, "out": out, "n": 64}

    def tuned(**values):
        return triton.autotune(configs=[triton.Config(values, num_warps=4, num_stages=2)], key=[])(OURS)

    for kernel in (tuned(), tuned(), tuned()):          # one per call site, same function and config
        module.identify_accessed_tensors(kernel, args, {})
    assert len(calls) == 1
    module.identify_accessed_tensors(tuned(BLOCK=128), args, {})
    module.identify_accessed_tensors(tuned(BLOCK=256), args, {})
    module.identify_accessed_tensors(tuned(BLOCK=256), args, {})
    assert len(calls) == 3, "a config value torch merges into the arguments must be in the key"
    assert kernel_analysis.stats()["passed"] == 0


def test_what_it_cannot_key_goes_to_torch_every_time(analysis):
    module, calls = analysis
    (x,) = fake_tensors(((8, 8), torch.float32))
    for _ in range(2):
        module.identify_accessed_tensors(_foreign_kernel, {"x_ptr": x, "n": 8}, {})       # not ours
        module.identify_accessed_tensors(OURS, {"x": torch.zeros(8), "n": 8}, {})        # concrete tensor
        module.identify_accessed_tensors(OURS, {"x": x, "n": 8}, {"x": ("stable", ())})   # TMA metadata
        module.identify_accessed_tensors(OURS, {"x": x, "n": [8]}, {})                    # unhashable
    assert len(calls) == 8
    counts = kernel_analysis.stats()
    assert (counts["hits"], counts["misses"], counts["passed"]) == (0, 0, 8)


def test_install_is_idempotent_and_tolerates_another_torch():
    def identify_mutated_tensors(kernel, kwargs):
        return ["out"]

    module = types.SimpleNamespace(identify_mutated_tensors=identify_mutated_tensors)
    assert kernel_analysis.install(module)
    wrapped = module.identify_mutated_tensors
    assert wrapped is not identify_mutated_tensors
    assert kernel_analysis.install(module)
    assert module.identify_mutated_tensors is wrapped, "installed twice wraps twice"
    assert not kernel_analysis.install(types.SimpleNamespace())


def test_installs_on_this_torch():
    """The function names it wraps are the ones this torch has (a torch that renamed them would
    silently lose the memo)."""
    wrap = pytest.importorskip("torch._higher_order_ops.triton_kernel_wrap")
    saved = {name: getattr(wrap, name) for name in kernel_analysis._ANALYSES if hasattr(wrap, name)}
    assert saved, "torch's triton_kernel_wrap has neither analysis function"
    try:
        assert kernel_analysis.install()
        assert all(hasattr(getattr(wrap, name), "_gpuparity_memoized") for name in saved)
    finally:
        for name, fn in saved.items():
            setattr(wrap, name, fn)
