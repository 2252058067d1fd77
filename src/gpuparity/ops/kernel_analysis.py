"""torch.compile's analysis of gpuparity's Triton kernels, done once per kernel and signature.

When torch.compile traces a `torch.library.triton_op` body (ops/library.py), torch asks, for each
kernel launched through `wrap_triton`, which tensor arguments the kernel reads and writes
(torch._higher_order_ops.triton_kernel_wrap: `identify_accessed_tensors` in recent torch,
`identify_mutated_tensors` before). It answers by generating the kernel's Triton IR from its
source, and it does so at every call site of the graph and more than once per site
(functionalization, then lowering): profiling the first compile of an 8-layer patched Llama on
an H100 found 80 IR generations of a dozen distinct kernels, the largest single piece of the
compile time the patch added (benchmarks/records/h100/model-training-2026-11-27.md).

The answer depends only on the kernel and on what the IR generation sees of the arguments:
every tensor is replaced by a 2-element tensor of its dtype and every symbolic value by 2,
the other arguments (constexprs, integers, floats, flags) are used as they are. So for
gpuparity's own kernels the answer is kept under the key (kernel, per argument: its dtype if a
traced tensor, "symbolic" if symbolic, else its type and value) and a copy is returned on a hit.
The kernel is keyed by its Python function: torch hands the analysis a copy of the kernel object
per call site (the graph is copied with it), and every copy compiles the same source.
An Autotuner (which torch makes of every launch that passes num_warps or num_stages) is keyed as
torch analyses it: its function, with its first config's values merged into the arguments.
Anything the key cannot describe (a concrete tensor, whose address alignment can matter; a TMA
descriptor; an unhashable value) and every kernel that is not gpuparity's go straight to torch.
`install()` wraps the function once per process; ops/library.py calls it when it traces a
triton_op body, so nothing changes for a process that never compiles one.
"""
from __future__ import annotations

import copy
import functools
import importlib
import sys
import threading
import time
from typing import Any, Callable, Dict, List, Optional

from .. import caches

__all__ = ["install", "stats", "signatures"]

_ANALYSES = ("identify_accessed_tensors", "identify_mutated_tensors")
_MODULE = "torch._higher_order_ops.triton_kernel_wrap"

# ((kernel type, kernel function), argument key) -> torch's answer for it. Bounded by the distinct
# kernel signatures a process compiles (tens).
_MEMO: Dict[tuple, Any] = caches.register("ops.kernel_analysis.memo", {})
# "hits" / "misses" / "passed": how the wrapped analysis was answered, and "seconds" spent in
# torch's analysis (misses and passed calls); tests and records read it.
_COUNTS: Dict[str, float] = caches.register("ops.kernel_analysis.counts", {})
_LOCK = threading.Lock()


def _function_of(kernel):
    """The Python function under a Triton kernel (JITFunction, or an Autotuner around one)."""
    fn = kernel
    for _ in range(4):
        inner = getattr(fn, "fn", None)
        if inner is None:
            break
        fn = inner
    return fn


def _is_ours(kernel) -> bool:
    """A Triton kernel defined in gpuparity."""
    return str(getattr(_function_of(kernel), "__module__", "") or "").startswith("gpuparity.")


class _NoKey(Exception):
    """An argument the key cannot describe: the call goes to torch unmemoized."""


def _traced_tensor(value) -> bool:
    fake = sys.modules.get("torch._subclasses.fake_tensor")
    if fake is not None and isinstance(value, fake.FakeTensor):
        return True
    ir = sys.modules.get("torch._inductor.ir")
    return ir is not None and isinstance(value, getattr(ir, "TensorBox", ()))


def _symbolic(value) -> bool:
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return True
    sympy = sys.modules.get("sympy")
    return sympy is not None and isinstance(value, sympy.Expr)


def _argument_key(value):
    if _traced_tensor(value):
        return ("tensor", str(value.dtype))
    if _symbolic(value):
        return ("symbolic",)
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        raise _NoKey("a concrete tensor")
    try:
        hash(value)
    except TypeError:
        raise _NoKey(f"an unhashable {type(value).__name__}") from None
    return (type(value).__name__, value)


def key_of(kernel, kwargs: Dict[str, Any], extra: tuple) -> Optional[tuple]:
    """The memo key of one analysis call, or None when it must go to torch unmemoized."""
    if not _is_ours(kernel) or not isinstance(kwargs, dict):
        return None
    if any(part for part in extra):     # TMA descriptor metadata: not something ours pass
        return None
    configs = getattr(kernel, "configs", None)
    if configs:
        # an Autotuner: torch analyses its function with the first config's values merged in (and
        # torch itself wraps a launch that passes num_warps / num_stages in a one-config Autotuner)
        kwargs = {**kwargs, **getattr(configs[0], "kwargs", {})}
    try:
        arguments = tuple(sorted((str(name), _argument_key(value)) for name, value in kwargs.items()))
    except _NoKey:
        return None
    # the function, not the kernel object: torch analyses a copy of the object per call site
    return (type(kernel), _function_of(kernel)), arguments


def _count(what: str, seconds: float = 0.0) -> None:
    _COUNTS[what] = _COUNTS.get(what, 0) + 1
    _COUNTS["seconds"] = _COUNTS.get("seconds", 0.0) + seconds


def memoized(analysis: Callable) -> Callable:
    """`analysis(kernel, kwargs, *extra)` answered from the memo for gpuparity's kernels."""

    @functools.wraps(analysis)
    def wrapper(kernel, kwargs, *extra, **options):
        key = None if options else key_of(kernel, kwargs, extra)
        if key is None:
            started = time.perf_counter()
            try:
                return analysis(kernel, kwargs, *extra, **options)
            finally:
                with _LOCK:
                    _count("passed", time.perf_counter() - started)
        with _LOCK:
            found = key in _MEMO
            if found:
                _count("hits")
                answer = _MEMO[key]
        if found:
            return copy.deepcopy(answer)
        started = time.perf_counter()
        answer = analysis(kernel, kwargs, *extra)
        with _LOCK:
            _count("misses", time.perf_counter() - started)
            _MEMO[key] = answer
        return copy.deepcopy(answer)

    wrapper._gpuparity_memoized = analysis
    return wrapper


def install(module=None) -> bool:
    """Wrap torch's kernel analysis (in `module`, by default torch's triton_kernel_wrap) with the
    memo; idempotent. False when the module or both functions are missing (another torch)."""
    if module is None:
        try:
            module = importlib.import_module(_MODULE)
        except Exception:       # a torch without it: nothing to memoize
            return False
    wrapped = False
    for name in _ANALYSES:
        analysis = getattr(module, name, None)
        if analysis is None:
            continue
        if not hasattr(analysis, "_gpuparity_memoized"):
            setattr(module, name, memoized(analysis))
        wrapped = True
    return wrapped


def stats() -> Dict[str, float]:
    """How the wrapped analysis was answered in this process: hits, misses, passed (counts) and
    seconds (spent in torch's analysis, misses and passed calls)."""
    with _LOCK:
        counts = {what: int(_COUNTS.get(what, 0)) for what in ("hits", "misses", "passed")}
        counts["seconds"] = round(_COUNTS.get("seconds", 0.0), 3)
        return counts


def signatures() -> List[str]:
    """The kernel signatures analysed so far (kernel name and argument keys), for diagnosis."""
    with _LOCK:
        keys = list(_MEMO)
    names = []
    for (_, fn), arguments in keys:
        described = ", ".join(f"{n}={v[-1]}" if v[0] == "tensor" or len(v) == 1 else f"{n}={v[0]}:{v[1]!r}"
                              for n, v in arguments)
        names.append(f"{getattr(fn, '__name__', repr(fn))}({described})")
    return sorted(names)
