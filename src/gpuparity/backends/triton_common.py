"""What every Triton kernel module shares: is Triton usable here, which vendor's tile configs
apply, and the ahead-of-time compile check that proves a kernel configuration builds for a
target GPU (AMD or NVIDIA) on a machine that has neither.

Kernel modules expose `aot_specs() -> list[AotSpec]`: every configuration they ship.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import re
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
from .. import caches

# Targets every shipped configuration must compile for (CI checks them on the CPU).
AOT_TARGETS = ("hip:gfx942", "hip:gfx90a", "hip:gfx1100", "cuda:80", "cuda:90")
# Shared memory / LDS per block the target can give (bytes).
SHARED_MEMORY_LIMIT = {
    "hip:gfx942": 64 * 1024, "hip:gfx90a": 64 * 1024, "hip:gfx1100": 64 * 1024,
    "cuda:80": 163 * 1024, "cuda:90": 227 * 1024,
}
# Architectures Triton cannot compile for (seen failing: gfx1030, RDNA2, in Triton 3.9's
# AMD pipeline). Backends route these to another backend with this reason.
UNSUPPORTED_ARCHS = {
    "gfx1010": "Triton has no RDNA1 (gfx101x) code generation",
    "gfx1011": "Triton has no RDNA1 (gfx101x) code generation",
    "gfx1012": "Triton has no RDNA1 (gfx101x) code generation",
    "gfx1030": "Triton cannot compile for RDNA2 gfx1030 (its AMD pass pipeline fails)",
    "gfx1031": "Triton cannot compile for RDNA2 (gfx103x)",
    "gfx1032": "Triton cannot compile for RDNA2 (gfx103x)",
    "gfx1034": "Triton cannot compile for RDNA2 (gfx103x)",
    "gfx1035": "Triton cannot compile for RDNA2 (gfx103x)",
    "gfx1036": "Triton cannot compile for RDNA2 (gfx103x)",
}


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def triton_unavailable_reason(device_type: str = "cuda") -> Optional[str]:
    """Why Triton kernels cannot run for tensors on `device_type`, or None if they can."""
    try:
        import triton  # noqa: F401
    except Exception as exc:  # noqa: BLE001
        return f"triton is not installed or not importable ({type(exc).__name__})"
    if interpreting():
        return None  # the interpreter runs on CPU tensors (and GPU tensors)
    if device_type != "cuda":
        return "triton: needs a CUDA or ROCm GPU (or TRITON_INTERPRET=1 for the interpreter)"
    if not torch.cuda.is_available():
        return "triton: no CUDA or ROCm GPU visible"
    arch = device_arch()
    if arch in UNSUPPORTED_ARCHS:
        return f"triton: {UNSUPPORTED_ARCHS[arch]}"
    if vendor() == "nvidia" and torch.cuda.get_device_capability()[0] < 7:
        return "triton: GPU compute capability < 7.0 is too old for Triton"
    return None


def vendor() -> str:
    if getattr(torch.version, "hip", None):
        return "amd"
    if getattr(torch.version, "cuda", None) and torch.cuda.is_available():
        return "nvidia"
    return "cpu"


def device_arch(index: Optional[int] = None) -> str:
    if not torch.cuda.is_available():
        return "cpu"
    props = torch.cuda.get_device_properties(index if index is not None else torch.cuda.current_device())
    if vendor() == "amd":
        return (getattr(props, "gcnArchName", "") or "").split(":")[0]
    return f"sm_{props.major}{props.minor}"


@caches.lru_cache("backends.triton_common.tile_family")
def tile_family() -> str:
    """The row of the norm and rotary kernels' FAMILIES tables for the GPU at hand: "nvidia",
    "cdna" (wave64) or "rdna" (wave32); "nvidia" on the CPU interpreter."""
    if vendor() == "amd":
        return "rdna" if device_arch().startswith("gfx1") else "cdna"
    return "nvidia"


def next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def problem_reasons(problem) -> List[str]:
    """A kernel backend's supports(): why Triton cannot run on the problem's device, if it cannot."""
    reason = triton_unavailable_reason(problem.device.type)
    return [reason] if reason else []


def availability() -> Optional[str]:
    """A kernel backend's availability(): why Triton cannot run here at all, if it cannot."""
    try:
        import triton  # noqa: F401
    except Exception:  # noqa: BLE001 - any import failure means the same here
        return "triton: the triton package is not importable here"
    return triton_unavailable_reason("cuda")


@dataclasses.dataclass
class AotSpec:
    """One shipped kernel configuration to compile ahead of time.

    signature: Triton's signature dict, e.g. {"X": "*bf16", "N": "i32", "BLOCK": "constexpr"}.
    constexprs: values of the constexpr parameters.
    targets: restrict to some of AOT_TARGETS (configs that only ship for one vendor).
    unit_params: integer parameters that a launch on contiguous tensors passes as 1 (innermost
    strides). compile_spec builds the kernel as such a launch does: Triton's JIT turns an int
    argument equal to 1 into the constant 1 and marks 16-byte-aligned pointers and integers divisible
    by 16 as such, which makes loads contiguous and vectorized, and with them the software pipeline's
    shared-memory buffers. Built without it, a kernel can report a fraction of the shared memory
    its real launches need (the attention dq kernel with a second set of loops: 98,304 bytes vs
    the 262,144 an H100 launch asked for, Triton 3.6).
    aligned_params: other integer parameters that real launches pass as multiples of 16 (strides
    not named stride*, e.g. decode's); built with Triton's divisibility-by-16 attribute as those
    launches are.
    """
    name: str
    kernel: Any
    signature: Dict[str, str]
    constexprs: Dict[str, Any]
    num_warps: int = 4
    num_stages: int = 2
    targets: tuple = AOT_TARGETS
    unit_params: tuple = ()
    aligned_params: tuple = ()


def launch_like(spec: AotSpec) -> Tuple[Dict[str, str], Dict[str, Any], Dict[tuple, list]]:
    """(signature, constexprs, attrs) of `spec` as a launch on contiguous, 16-byte-aligned tensors
    compiles it: unit_params become the constant 1; pointers, the parameters named stride* (the
    other strides) and aligned_params get Triton's divisibility-by-16 attribute."""
    signature, constexprs, attrs = dict(spec.signature), dict(spec.constexprs), {}
    for name in spec.unit_params:
        if signature.get(name) != "i32":
            raise ValueError(f"AotSpec {spec.name}: unit_params names {name!r}, which is not an i32 parameter")
        signature[name], constexprs[name] = "constexpr", 1
    for name in spec.aligned_params:
        if signature.get(name) != "i32":
            raise ValueError(f"AotSpec {spec.name}: aligned_params names {name!r}, which is not an i32 parameter")
    for index, (name, kind) in enumerate(signature.items()):
        if kind.startswith("*") or (kind == "i32" and (name.startswith("stride") or name in spec.aligned_params)):
            attrs[(index,)] = [["tt.divisibility", 16]]
    return signature, constexprs, attrs


@dataclasses.dataclass
class AotResult:
    name: str
    target: str
    ok: bool
    shared_bytes: Optional[int] = None
    limit_bytes: Optional[int] = None
    error: str = ""


def _gpu_target(key: str):
    from triton.backends.compiler import GPUTarget
    backend, arch = key.split(":")
    if backend == "cuda":
        return GPUTarget("cuda", int(arch), 32)
    warp = 32 if arch.startswith("gfx1") else 64
    return GPUTarget("hip", arch, warp)


# The stages after LLVM IR (NVIDIA: PTX, then ptxas to a cubin; AMD: the AMDGPU LLVM backend to
# GCN assembly, then the linker to a code object) take about half of a compile on the CPU and turn
# up few errors of their own: Triton's lowering, its layouts and the shared-memory / LDS a kernel
# needs are all settled by the end of LLVM IR. binary=False stops there.
_IR_ONLY_KEY = "gpuparity-aot-stop-after-llir"
_KERNEL_NAME = re.compile(r"define\s+(?:[\w\"()]+\s+)*void\s+@\"?([A-Za-z_$.][\w$.]*)")


def _stop_after_llir(*args):
    """A Triton add_stages_inspection_hook: called with no argument it gives the extra part of
    the cache key (where Triton adds it: so IR-only results never stand in for real binaries;
    _ir_only also gives them a cache directory of their own); called with a backend's
    stages it replaces every stage after "llir" by a placeholder that names the kernel (as the
    skipped stage would have) and returns empty text, or empty bytes for the binary."""
    if not args:
        return _IR_ONLY_KEY, _IR_ONLY_KEY
    backend, stages = args[0], args[1]
    names = list(stages)
    if "llir" not in names:
        return None

    def placeholder(ext):
        def stage(src, metadata):
            if "name" not in metadata:
                found = _KERNEL_NAME.search(src if isinstance(src, str) else "")
                metadata["name"] = found.group(1) if found else "kernel"
            return b"" if ext == backend.binary_ext else ""
        return stage
    for ext in names[names.index("llir") + 1:]:
        stages[ext] = placeholder(ext)
    return None


def ir_only_supported() -> bool:
    """Whether this Triton lets compile_spec(binary=False) stop after LLVM IR: a stage hook, and
    knobs whose scope() puts them back."""
    from triton import knobs
    runtime, cache = getattr(knobs, "runtime", None), getattr(knobs, "cache", None)
    return (hasattr(runtime, "add_stages_inspection_hook") and hasattr(runtime, "scope")
            and hasattr(cache, "scope") and hasattr(cache, "dir"))


@contextlib.contextmanager
def _ir_only():
    """Triton's stages after LLVM IR replaced (_stop_after_llir), with Triton's cache pointed at a
    directory of its own: a Triton whose cache key leaves the stage hook out (Triton 3.6 on the H100
    machine did: the full build after an IR-only one read its empty binary) would
    otherwise keep the placeholder binary under the real kernel's key, where a later launch of
    that kernel would load it. Both knobs are put back on exit."""
    from triton import knobs
    with knobs.cache.scope(), knobs.runtime.scope():
        knobs.cache.dir = os.path.abspath(knobs.cache.dir).rstrip(os.sep) + "-gpuparity-ir-only"
        knobs.runtime.add_stages_inspection_hook = _stop_after_llir
        yield


@contextlib.contextmanager
def _aot_cache():
    """Triton's cache pointed at a directory of its own for ahead-of-time builds: they are built as
    real launches are (launch_like), under the same cache keys, and a GPU machine's test run has
    loaded what the check had put in the shared cache ("no kernel image is available for execution
    on the device", H100, Triton 3.6). Put back on exit."""
    try:
        from triton import knobs
    except ImportError:   # a Triton without knobs (< 3.4): its cache as it is
        knobs = None
    if knobs is None or not hasattr(getattr(knobs, "cache", None), "scope"):
        yield
        return
    with knobs.cache.scope():
        knobs.cache.dir = os.path.abspath(knobs.cache.dir).rstrip(os.sep) + "-gpuparity-aot"
        yield


def compile_spec(spec: AotSpec, target: str, *, binary: bool = True) -> AotResult:
    """Compile one configuration for one target with Triton's own compiler (no GPU needed).
    binary=False stops after LLVM IR where this Triton allows it (ir_only_supported()): the
    lowering and the shared-memory check, without the machine-code stages. Either way the results
    stay out of the Triton cache that launches read (_aot_cache, _ir_only)."""
    import triton
    from triton.compiler import ASTSource
    limit = SHARED_MEMORY_LIMIT.get(target)
    try:
        with _ir_only() if not binary and ir_only_supported() else _aot_cache():
            signature, constexprs, attrs = launch_like(spec)
            source = ASTSource(fn=spec.kernel, signature=signature, constexprs=constexprs, attrs=attrs)
            compiled = triton.compile(source, target=_gpu_target(target),
                                      options={"num_warps": spec.num_warps, "num_stages": spec.num_stages})
        shared = int(getattr(compiled.metadata, "shared", 0) or 0)
    except Exception as exc:  # noqa: BLE001 - a compile error is the result
        return AotResult(spec.name, target, False, limit_bytes=limit,
                         error=f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1][:300] if str(exc).strip() else ''}")
    if limit is not None and shared > limit:
        return AotResult(spec.name, target, False, shared, limit,
                         error=f"needs {shared} bytes of shared memory / LDS, the target has {limit}")
    return AotResult(spec.name, target, True, shared, limit)


def cdiv(a: int, b: int) -> int:
    return (a + b - 1) // b


@caches.lru_cache("backends.triton_common.sm_count")
def _sm_count_of(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def sm_count(device: torch.device) -> Optional[int]:
    """The streaming multiprocessors (compute units) of a CUDA / ROCm device; None elsewhere (the
    interpreter runs on the CPU)."""
    if device.type != "cuda":
        return None
    return _sm_count_of(device.index if device.index is not None else torch.cuda.current_device())


def allocation_template(shape, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A one-element tensor expanded to `shape` (an int or a tuple): `torch.empty_like(template)`
    then allocates a contiguous tensor of that shape, dtype and device. Prepared launches keep one per
    buffer they allocate: empty_like parses no size, dtype or device arguments, so it costs
    less host time per call than torch.empty(size, dtype=..., device=...). Overlapping
    (expanded) inputs get contiguous strides from empty_like."""
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    return torch.empty((1,) * len(shape), dtype=dtype, device=device).expand(shape)


def lazy_kernel(builder: Callable[[], Any]):
    """Build a Triton kernel on first use, so modules import without triton installed."""
    cache: Dict[str, Any] = {}

    def get():
        if "kernel" not in cache:
            cache["kernel"] = builder()
        return cache["kernel"]
    return get


# --------------------------------------------------------------------------- launching
# Triton's `kernel[grid](...)` re-derives the kernel's specialization from every argument on
# every call (types, 16-byte alignment of pointers, ints equal to 1 or divisible by 16), builds
# a cache key from it and the options, then calls the compiled kernel's launcher. For kernels
# with ~50 arguments that costs tens of microseconds of host time per launch, which dominates
# short attention and norm calls. `launch` keeps, per kernel, the compiled kernel for each
# specialization key it has seen (a key at least as fine as Triton's own) and calls the same
# launcher Triton would call. The first call with a new key goes through Triton as usual.
# GPUPARITY_FAST_LAUNCH=0 turns this off; it is off under the interpreter and whenever a launch
# hook (a profiler such as proton) is installed, so hooks see every launch.
_LAUNCH_CACHE: Dict[tuple, Any] = caches.register("backends.triton_common.launch_cache", {})
_FAST_LAUNCH: Dict[str, Any] = caches.register("backends.triton_common.fast_launch", {})


# torch.cuda.current_device() without its lazy-init check: prepared launches run only after a
# first launch through Triton, which initialised CUDA (or ROCm, where the name is the same).
_current_device = torch._C._cuda_getDevice if hasattr(torch._C, "_cuda_getDevice") else torch.cuda.current_device
_INT32 = 2 ** 31
_UINT64_FROM = 2 ** 63
_Tensor = torch.Tensor


def specialization_key(args) -> tuple:
    """What Triton specializes a launch on, per runtime argument (conservatively finer): a
    tensor's dtype and 16-byte alignment; an int's class: in int32 range 1 (== 1), 2
    (divisible by 16) or 0; past it i64 (3, 4) or u64 (>= 2**63: 5, 6), each split by
    divisibility by 16 as Triton splits it. One flat comprehension: this runs on every launch
    (~50 arguments), so it is written for speed (no helper call per argument)."""
    return tuple([((1 if a == 1 else (2 if not a & 15 else 0)) if -_INT32 <= a < _INT32 else
                   (5 if a >= _UINT64_FROM else 3) + (0 if a & 15 else 1))
                  if type(a) is int else
                  ((a.dtype, not a.data_ptr() & 15) if isinstance(a, _Tensor) else
                   ("f" if type(a) is float else (type(a).__name__, a)))
                  for a in args])


def _fast_launch_state() -> Optional[Any]:
    """Triton's knobs module when direct launches are allowed, else None."""
    if "knobs" not in _FAST_LAUNCH:
        knobs = None
        if os.environ.get("GPUPARITY_FAST_LAUNCH", "1") != "0" and not interpreting():
            try:
                from triton import knobs as triton_knobs
                triton_knobs.runtime.launch_enter_hook  # noqa: B018 - the attribute this path relies on
                knobs = triton_knobs
            except Exception as exc:  # noqa: BLE001 - an older or newer Triton: always use its own path
                _FAST_LAUNCH["why_off"] = f"triton.knobs: {type(exc).__name__}: {exc}"
                knobs = None
        _FAST_LAUNCH["knobs"] = knobs
    knobs = _FAST_LAUNCH["knobs"]
    if knobs is None or _hook_active(knobs.runtime.launch_enter_hook) or _hook_active(knobs.runtime.launch_exit_hook):
        return None
    return knobs


def _hook_active(hook) -> bool:
    """A launch hook that would do something: a function, or a HookChain (Triton >= 3.5, where
    the hooks are chains that are never None) with functions in it."""
    if hook is None:
        return False
    calls = getattr(hook, "calls", None)
    return bool(calls) if isinstance(calls, list) else True


class _Traced:
    """Set while a torch.library.triton_op body of gpuparity's is traced (ops/library.py): its
    launches then go through torch.library.wrap_triton, so inductor sees each kernel and calls it
    from its generated code (the tensors are fake then: no pointer to read, nothing to launch)."""
    on = False


TRACED = _Traced()


@contextlib.contextmanager
def traced_launches():
    previous, TRACED.on = TRACED.on, True
    try:
        yield
    finally:
        TRACED.on = previous


# The Triton cache directory this process's launches compile into and load from, as it was when
# this module was imported (None: Triton's default, ~/.triton/cache). Inductor points
# TRITON_CACHE_DIR at a directory of its own (<inductor cache>/triton/<device>) the first time it
# builds a kernel in a process (torch._inductor.runtime.triton_heuristics, CachingAutotuner):
# from then on a kernel's first launch through Triton's JIT in that process (an op served
# eagerly after a torch.compile, or the opaque op in a compiled graph: ops/library.py
# GPUPARITY_COMPILED_KERNELS) would miss the cache the eager calls and the checks filled and
# compile the kernel again. `_home_cache` points such a launch back at the directory of the import.
_HOME_TRITON_CACHE = os.environ.get("TRITON_CACHE_DIR")


def _triton_default_cache_dir() -> Optional[str]:
    try:
        from triton import knobs
        return knobs.cache.get_triton_dir("cache")
    except Exception:  # noqa: BLE001 - a Triton without knobs (< 3.4): its own default, not redirected
        return None


def home_cache_dir() -> Optional[str]:
    """The Triton cache directory a first launch should use when inductor redirected
    TRITON_CACHE_DIR since this module's import; None when it did not (the current one serves)."""
    current = os.environ.get("TRITON_CACHE_DIR")
    if current is None or current == _HOME_TRITON_CACHE:
        return None
    inductor = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if not inductor or os.path.dirname(os.path.abspath(current)) != os.path.join(os.path.abspath(inductor), "triton"):
        return None   # the caller's own choice, not inductor's: left as it is
    return _HOME_TRITON_CACHE or _triton_default_cache_dir()


@contextlib.contextmanager
def _home_cache():
    """Triton's cache pointed back at `home_cache_dir()` for a launch that may compile or load a
    kernel, where inductor redirected it; put back on exit (the knobs' scope restores the
    environment variable too)."""
    home = home_cache_dir()
    if home is None:
        yield
        return
    from triton import knobs
    if not hasattr(getattr(knobs, "cache", None), "scope"):
        yield
        return
    with knobs.cache.scope():
        knobs.cache.dir = home
        yield


def launch(kernel, grid, args, *, num_warps: int, num_stages: Optional[int] = None, **constexprs):
    """`kernel[grid](*args, num_warps=..., num_stages=..., **constexprs)`, with the per-call
    specialization work done once per distinct key (see above). `args` are the runtime
    arguments in order; the constexprs must be the kernel's trailing parameters. Returns the
    (compiled kernel, constexpr tail) entry it launched through, or None on Triton's own path."""
    grid = tuple(grid) + (1,) * (3 - len(grid))
    options = {"num_warps": num_warps} if num_stages is None else {"num_warps": num_warps, "num_stages": num_stages}
    if TRACED.on:
        torch.library.wrap_triton(kernel)[grid](*args, **options, **constexprs)
        return None
    if _fast_launch_state() is None:
        with _home_cache():
            kernel[grid](*args, **options, **constexprs)
        return None
    device = torch.cuda.current_device()
    key = (id(kernel), device, num_warps, num_stages, tuple(constexprs.items()), specialization_key(args))
    entry = _LAUNCH_CACHE.get(key)
    if entry is not None:
        _run_entry(entry, grid, device, args)
        return entry
    with _home_cache():
        compiled = kernel[grid](*args, **options, **constexprs)
    try:
        names = list(kernel.arg_names)[len(args):]
        tail = tuple(constexprs[name] for name in names)
        compiled.function, compiled.packed_metadata, compiled.run  # noqa: B018 - fail here, not mid-launch
    except Exception as exc:  # noqa: BLE001 - unexpected Triton internals: keep using kernel[grid]
        _FAST_LAUNCH["knobs"] = None
        _FAST_LAUNCH["why_off"] = f"{type(exc).__name__}: {exc}"
        return None
    entry = _LAUNCH_CACHE[key] = (compiled, tail)
    return entry


def _run_entry(entry, grid, device, args) -> None:
    """Call a cached compiled kernel's launcher as Triton would (no launch hooks: see above)."""
    compiled, tail = entry
    compiled.run(grid[0], grid[1], grid[2], torch._C._cuda_getCurrentRawStream(device), compiled.function,
                 compiled.packed_metadata, None, None, None, *args, *tail)


class PreparedLaunch:
    """One kernel launch whose grid, trailing scalar arguments and constexprs are fixed; per
    call only the leading tensor arguments change (or, through `call`, scalars the kernel does
    not specialize on). Callers keep one per combination of what
    decides the scalars (shapes, strides, flags) and call it with the tensors. Per call it
    costs one key of the tensors' dtypes, devices and 16-byte alignment and the launcher itself
    (given the tensors' addresses as ints), where `launch` re-derives every argument's
    specialization (~50 arguments for attention)."""

    __slots__ = ("kernel", "grid", "scalars", "options", "_entries")

    def __init__(self, kernel, grid, scalars, *, num_warps: int, num_stages: Optional[int] = None, **constexprs):
        self.kernel = kernel
        self.grid = tuple(grid) + (1,) * (3 - len(grid))
        self.scalars = tuple(scalars)
        self.options = dict(num_warps=num_warps, num_stages=num_stages, **constexprs)
        self._entries: Dict[tuple, Any] = {}

    def __call__(self, *tensors) -> None:
        self.call(tensors, self.scalars)

    def call(self, tensors: tuple, scalars: tuple) -> None:
        """Launch with other trailing scalars than the kept ones. Only for scalars that cannot
        change the compiled kernel: parameters the kernel marks `do_not_specialize` (the kept
        compiled kernel is reused whatever their values), of the same integer width as the kept
        ones (Triton still types an int as i32 or i64; the launcher would truncate a wider one)."""
        if TRACED.on or _fast_launch_state() is None:
            launch(self.kernel, self.grid, tensors + scalars, **self.options)
            return
        device = _current_device()
        pointers = [t.data_ptr() for t in tensors]
        key = (device, *[(t.dtype, t.is_cuda, not p & 15) for t, p in zip(tensors, pointers)])
        entry = self._entries.get(key)
        if entry is None:  # first call with these dtypes / alignments here: through launch
            entry = launch(self.kernel, self.grid, tensors + scalars, **self.options)
            if entry is not None:  # None: that launch switched direct launches off
                self._entries[key] = entry
            return
        # The launcher takes a pointer argument as an int as it is: given a tensor, it would call
        # data_ptr() again and ask the driver whether the address is device memory (a launch of
        # 11 tensors: 6.4 -> 4.9 us, benchmarks/records/h200/attention-host-ab-2026-11-26.md).
        # The key's is_cuda keeps that check for any tensor not on a GPU: its first call goes through launch, which raises.
        _run_entry(entry, self.grid, device, (*pointers, *scalars))


class PlanCache:
    """Prepared launches per call signature, for one module's ops: get(key), keep(key, plan).
    Bounded (emptied when full: a loop over ever-new shapes must not grow it without end).
    `clear_plans()` empties every PlanCache, for tests and tuning scripts that change tile
    tables."""

    def __init__(self, max_size: int = 512):
        self.max_size = max_size
        self._plans: Dict[tuple, Any] = {}
        _PLAN_CACHES.append(self)

    def get(self, key: tuple):
        # traced (TRACED.on): plans hold allocation templates, real or fake tensors of one trace,
        # which no other trace (nor a real call) may reuse
        return None if TRACED.on else self._plans.get(key)

    def keep(self, key: tuple, plan):
        if TRACED.on:
            return plan
        if len(self._plans) >= self.max_size:
            self._plans.clear()
        self._plans[key] = plan
        return plan

    def clear(self) -> None:
        self._plans.clear()

    def __len__(self) -> int:
        return len(self._plans)


_PLAN_CACHES: List[PlanCache] = []


def clear_plans() -> None:
    """Forget every prepared launch (after changing tile tables)."""
    for cache in _PLAN_CACHES:
        cache.clear()


caches.register("backends.triton_common.plans", clear_plans)
