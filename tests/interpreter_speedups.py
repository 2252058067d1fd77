"""Two costs of Triton's interpreter (TRITON_INTERPRET=1, the CPU test runs) that are not the
kernels' own work, removed for the tests by `install()` (tests/conftest.py calls it on CPU runs);
neither changes what a kernel computes. tests/backends/test_interpreter_speedups.py checks both
against the interpreter's own code.

1. A reduction with a kernel's own combine function (`tl.reduce(..., fn)`, e.g. LayerNorm's
   backward summing two rows at once with triton_norms._add_pair) runs one element at a time in
   Python: about 150 us per element, 6 s per backward of a 300 x 100 LayerNorm, where tl.sum
   (numpy) takes milliseconds. Here it reduces in halving steps, calling the same combine function
   on whole arrays (element pairs (0, 1), (2, 3), ... then the pairs of their results: a tree, the
   shape a GPU's reduction takes), so the kernel's combine function still runs and decides the
   result, in log2(n) calls. Order is kept (left operand before right), so a combine function
   needs only be associative, as Triton requires; float sums round as a tree does, not as a
   left-to-right loop. An axis whose length is not a power of two, or inputs of different shapes
   (neither occurs: the interpreter's blocks are powers of two), go to Triton's own loop.
2. Every call of a @triton.jit helper from inside a kernel patches triton.language again
   (`_patch_lang`: inspect.getmembers over tl, tl.tensor, tl.math ...; 2 ms a call, a quarter of
   the attention kernels' time here), although the launch patched the same modules already and
   puts them back when it ends. Here a helper's call skips the patch when every language module
   it sees is patched; anything else (a launch, a helper seeing a module the launch did not
   patch) patches as before.

A Triton whose interpreter lacks the methods replaced is left as it is.
"""
from __future__ import annotations

import inspect


def _tree_reduce(self, input, _loop):
    import numpy as np

    original_axis = self.axis
    flat, axis = self.unravel(input, self.axis)
    datas = [arg.handle.data for arg in flat]
    shape = datas[0].shape
    n = shape[axis] if shape else 0
    if n < 2 or n & (n - 1) or any(d.shape != shape for d in datas):
        return _loop(self, input)
    dtypes = [arg.dtype for arg in flat]
    while n > 1:
        pairs = n // 2
        left = [self.to_tensor(np.take(d, np.arange(0, 2 * pairs, 2), axis=axis), t) for d, t in zip(datas, dtypes)]
        right = [self.to_tensor(np.take(d, np.arange(1, 2 * pairs, 2), axis=axis), t) for d, t in zip(datas, dtypes)]
        got = self.combine_fn.fn(*left, *right)
        got = got if isinstance(got, tuple) else (got,)
        if len(got) != len(datas):
            return _loop(self, input)
        half_shape = left[0].handle.data.shape
        combined = []
        for value, d in zip(got, datas):
            value = value.handle.data if hasattr(value, "handle") else value
            combined.append(np.broadcast_to(np.asarray(value), half_shape).astype(d.dtype))
        datas, n = combined, pairs
    ret = []
    for i, data in enumerate(datas):
        data = np.squeeze(data, axis=axis)
        if self.keep_dims:
            if original_axis is not None:
                data = np.expand_dims(data, axis)
            else:
                for _ in range(len(shape)):
                    data = np.expand_dims(data, 0)
        elif original_axis is None:
            data = data.item()
        ret.append(self.to_tensor(data, flat[i].dtype))
    return ret


def _install_tree_reduce(interpreter) -> bool:
    ops = getattr(interpreter, "ReduceOps", None)
    loop = getattr(ops, "generic_reduce", None)
    if loop is None or not all(hasattr(ops, name) for name in ("unravel", "to_tensor")):
        return False
    if getattr(loop, "_gpuparity_tree", False):
        return True

    def generic_reduce(self, input):
        return _tree_reduce(self, input, loop)

    generic_reduce._gpuparity_tree = True
    generic_reduce.elementwise = loop     # the interpreter's own loop (the tests compare with it)
    ops.generic_reduce = generic_reduce
    return True


def _install_patch_once(interpreter) -> bool:
    import triton.language as tl

    full = getattr(interpreter, "_patch_lang", None)
    scope_type = getattr(interpreter, "_LangPatchScope", None)
    if full is None or scope_type is None:
        return False
    if getattr(full, "_gpuparity_once", False):
        return True

    def is_patched(lang) -> bool:
        # _patch_lang_core puts its own `range` on every module it patches, with the rest
        new_range = getattr(lang, "range", None)
        return (getattr(new_range, "__name__", "") == "_new_range"
                and getattr(new_range, "__module__", "") == interpreter.__name__)

    def _patch_lang(fn):
        langs = [value for value in fn.__globals__.values() if inspect.ismodule(value) and value in (tl, tl.core)]
        if langs and all(is_patched(lang) for lang in langs):
            return scope_type()     # nothing to patch, nothing to put back
        return _patch_lang.every_call(fn)

    _patch_lang._gpuparity_once = True
    _patch_lang.every_call = full         # the interpreter's own (the tests compare with it)
    interpreter._patch_lang = _patch_lang
    return True


def install() -> dict:
    """Install both; which of them this Triton took ({} without triton)."""
    try:
        from triton.runtime import interpreter
    except ImportError:
        return {}
    return {"tree_reduce": _install_tree_reduce(interpreter), "patch_once": _install_patch_once(interpreter)}
