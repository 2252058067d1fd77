"""tests/interpreter_speedups.py (installed by tests/conftest.py for CPU runs) against the
interpreter's own code. The tree reduce with a kernel's own combine function gives what the
element-by-element loop gives: the same values for exact (integer) sums and for an order-sensitive
combine (ties go left), float sums within rounding, both axes, keep_dims and a length of 1. Helper
calls inside a kernel that skip re-patching triton.language give the same bits as patching on
every call, and a call outside a kernel still patches."""
from __future__ import annotations

import pytest
import torch
from device_env import ON_GPU

pytest.importorskip("triton")
if ON_GPU:
    pytest.skip("the interpreter is for CPU runs", allow_module_level=True)

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.runtime import interpreter  # noqa: E402

import interpreter_speedups  # noqa: E402

pytestmark = pytest.mark.usefixtures("triton_interpreter_is_live")


@triton.jit
def _add_pair(a0, b0, a1, b1):
    return a0 + a1, b0 + b1


@triton.jit
def _max_first_index(v0, i0, v1, i1):
    # associative, not commutative on ties: the left operand's index wins
    take = v1 > v0
    return tl.where(take, v1, v0), tl.where(take, i1, i0)


@triton.jit
def _reduce_kernel(X, Y, OUT_A, OUT_B, M: tl.constexpr, N: tl.constexpr, AXIS: tl.constexpr,
                   KEEP: tl.constexpr, ARGMAX: tl.constexpr):
    rows = tl.arange(0, M)
    cols = tl.arange(0, N)
    offs = rows[:, None] * N + cols[None, :]
    x = tl.load(X + offs)
    y = tl.load(Y + offs)
    if ARGMAX:
        a, b = tl.reduce((x, y), AXIS, _max_first_index, keep_dims=KEEP)
    else:
        a, b = tl.reduce((x, y), AXIS, _add_pair, keep_dims=KEEP)
    if AXIS == 0:
        out = tl.arange(0, N)
        if KEEP:
            out = out[None, :]
    else:
        out = tl.arange(0, M)
        if KEEP:
            out = out[:, None]
    tl.store(OUT_A + out, a)
    tl.store(OUT_B + out, b)


def _run(x, y, axis, keep, argmax, tree):
    m, n = x.shape
    out_a = torch.full((max(m, n),), -1, dtype=x.dtype)
    out_b = torch.full((max(m, n),), -1, dtype=y.dtype)
    installed = interpreter.ReduceOps.generic_reduce
    loop = getattr(installed, "elementwise", installed)
    try:
        interpreter.ReduceOps.generic_reduce = installed if tree else loop
        _reduce_kernel[(1,)](x, y, out_a, out_b, M=m, N=n, AXIS=axis, KEEP=keep, ARGMAX=argmax)
    finally:
        interpreter.ReduceOps.generic_reduce = installed
    size = n if axis == 0 else m
    return out_a[:size], out_b[:size]


def test_both_are_installed_on_cpu_runs():
    assert getattr(interpreter.ReduceOps.generic_reduce, "_gpuparity_tree", False)
    assert getattr(interpreter._patch_lang, "_gpuparity_once", False)
    before = (interpreter.ReduceOps.generic_reduce, interpreter._patch_lang)
    assert interpreter_speedups.install() == {"tree_reduce": True, "patch_once": True}
    assert (interpreter.ReduceOps.generic_reduce, interpreter._patch_lang) == before   # not wrapped twice


@pytest.mark.parametrize("shape", [(4, 8), (2, 16), (8, 2), (1, 4), (4, 1)])
@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("keep", [False, True])
def test_tree_matches_the_loop(shape, axis, keep):
    gen = torch.Generator().manual_seed(sum(shape) * 7 + axis)
    ints = torch.randint(-1000, 1000, shape, generator=gen, dtype=torch.int32)
    more = torch.randint(-1000, 1000, shape, generator=gen, dtype=torch.int32)
    for tree_out, loop_out in zip(_run(ints, more, axis, keep, False, True), _run(ints, more, axis, keep, False, False)):
        assert torch.equal(tree_out, loop_out)          # integer sums: exact, any order
    floats = torch.randn(shape, generator=gen)
    others = torch.randn(shape, generator=gen)
    for tree_out, loop_out in zip(_run(floats, others, axis, keep, False, True),
                                  _run(floats, others, axis, keep, False, False)):
        torch.testing.assert_close(tree_out, loop_out, rtol=1e-6, atol=1e-6)
    values = torch.randint(0, 3, shape, generator=gen).float()    # many ties
    index = torch.arange(shape[0] * shape[1], dtype=torch.int32).reshape(shape)
    tree = _run(values, index, axis, keep, True, True)
    loop = _run(values, index, axis, keep, True, False)
    assert torch.equal(tree[0], loop[0]) and torch.equal(tree[1], loop[1])
    # the loop's answer is the first maximum: the tree kept the operands' order
    want = values.argmax(dim=axis)   # torch returns the first maximal index
    picked = index.gather(axis, want.unsqueeze(axis)).squeeze(axis)
    assert torch.equal(tree[1], picked.to(torch.int32))


def test_order_sensitive_combine_outside_a_kernel():
    """The reduce object called directly, with a combine function on the arrays: `a` sums, `b`
    keeps the right operand (the last element: associative, order-sensitive)."""
    import numpy as np

    def combine(a0, b0, a1, b1):
        return ops.to_tensor(a0.handle.data + a1.handle.data, tl.int32), b1
    ops = interpreter.ReduceOps(1, type("Fn", (), {"fn": staticmethod(combine)})(), False)
    data = np.arange(32, dtype=np.int32).reshape(4, 8) * 3 - 40
    inputs = (ops.to_tensor(data, tl.int32), ops.to_tensor(data[:, ::-1].copy(), tl.int32))
    tree = interpreter.ReduceOps.generic_reduce(ops, inputs)
    loop = interpreter.ReduceOps.generic_reduce.elementwise(ops, inputs)
    for a, b in zip(tree, loop):
        assert np.array_equal(a.handle.data, b.handle.data)
    assert np.array_equal(tree[0].handle.data, data.sum(axis=1))
    assert np.array_equal(tree[1].handle.data, data[:, 0])    # the reversed rows' last element


@triton.jit
def _scaled(x, s):
    return x * s


@triton.jit
def _twice_scaled_plus(x, s, y):
    return _scaled(_scaled(x, s), s) + y      # a helper calling a helper


@triton.jit
def _helpers_kernel(X, OUT, N: tl.constexpr, STEPS: tl.constexpr):
    offs = tl.arange(0, N)
    x = tl.load(X + offs)
    acc = tl.zeros([N], dtype=tl.float32)
    for step in range(STEPS):
        acc = _twice_scaled_plus(x, 0.5 + step, acc)
    tl.store(OUT + offs, tl.exp(acc * 0.01) + tl.sum(acc, axis=0))


def test_helper_calls_skip_the_repatch_and_give_the_same_bits(monkeypatch):
    installed = interpreter._patch_lang
    full = installed.every_call
    patched = []

    def counting(fn):
        patched.append(fn.__name__)
        return full(fn)
    monkeypatch.setattr(installed, "every_call", counting)
    x = torch.randn(16, generator=torch.Generator().manual_seed(3))
    out, names = {}, {}
    for mode, patch_lang in (("once", installed), ("every call", counting)):
        monkeypatch.setattr(interpreter, "_patch_lang", patch_lang)
        patched.clear()
        out[mode] = torch.empty(16)
        _helpers_kernel[(1,)](x, out[mode], N=16, STEPS=3)
        names[mode] = list(patched)
    assert torch.equal(out["once"], out["every call"])
    # the interpreter's own way: the launch and every helper call patch (3 + 6 helper calls)
    assert names["every call"][0] == "_helpers_kernel", names
    assert (names["every call"].count("_twice_scaled_plus"), names["every call"].count("_scaled")) == (3, 6), names
    # here: the launch patches; the helpers, seeing only modules it patched, do not
    assert names["once"][0] == "_helpers_kernel" and not {"_twice_scaled_plus", "_scaled"} & set(names["once"]), names
    # the launch put triton.language back: a helper called outside a kernel patches again
    patched.clear()
    installed(_scaled.fn).restore()
    assert patched == ["_scaled"]
