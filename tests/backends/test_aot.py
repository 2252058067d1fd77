"""Ahead-of-time compile check: every shipped configuration of every Triton kernel module in
gpuparity.backends (each module with an `aot_specs()`) builds for every AOT target - AMD
gfx942, gfx90a, gfx1100 and NVIDIA sm_80, sm_90 - on this CPU-only machine, through Triton's
own compiler, without a compile error or a shared-memory / LDS overflow.

Every configuration is lowered through LLVM IR (where Triton's layouts, its lowering and the
shared memory a kernel needs are settled); the machine-code stages (ptxas; the AMDGPU LLVM
backend and linker), 44-48% of each compile on a 2-core CPU
(benchmarks/records/cpu/aot-ir-only-2026-11-26.md), run for the first configuration of each
kernel on each target, so every kernel still reaches a binary for every target. `--binary` (or
GPUPARITY_AOT_BINARY=1 for the test) builds every configuration to a binary.

The compile runs in a fresh process: kernels decorated under TRITON_INTERPRET=1 (which the
interpreter tests set at import) cannot be compiled, and the interpreter choice is made when a
module is imported. The test is one case per target (each its own process, GPUPARITY_AOT_TARGETS
set to that target): every configuration and every binary of a target is decided within that
target, so the cases together check exactly what one process for all targets would, and
`pytest -n` runs them side by side. `python tests/backends/test_aot.py --table` prints the shared
memory of every config (GPUPARITY_AOT_TARGETS=a,b limits a manual run to some targets).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from gpuparity.backends import MODULES
from gpuparity.backends.triton_common import AOT_TARGETS

MARKER = "GPUPARITY-AOT "
# Modules that must take part: a kernel module without aot_specs() would escape the check. Every
# Triton kernel module the manifest (gpuparity.backends.MODULES) names: a new op's kernel module
# takes part by its manifest line, with no list here to edit.
REQUIRED = tuple(name for name in MODULES if name.startswith("gpuparity.backends.triton_"))
# Kernels that must be compiled for every target (name prefixes of the AotSpecs).
REQUIRED_KERNELS = ("attention.fwd.", "attention.dq.", "attention.dkdv.", "attention.bwd.", "attention_varlen.fwd.",
                    "attention_varlen.dq.", "attention_varlen.dkdv.", "attention_decode.split.",
                    "attention_decode.combine.", "swiglu.fwd", "swiglu.bwd", "linear_cross_entropy.rows.",
                    "linear_cross_entropy.cols.", "cross_entropy_loss.fwd.", "cross_entropy_loss.bwd.",
                    "residual_norm.")


def _kernel_modules():
    import importlib
    import pkgutil

    import gpuparity.backends as package
    found, errors = [], []
    # GPUPARITY_AOT_MODULES=a,b limits a manual run to some modules (the test checks them all).
    only = [m for m in os.environ.get("GPUPARITY_AOT_MODULES", "").split(",") if m]
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda i: i.name):
        name = f"gpuparity.backends.{info.name}"
        try:
            module = importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - a module that does not import is a failure
            errors.append({"module": name, "error": f"import failed: {type(exc).__name__}: {exc}"})
            continue
        if callable(getattr(module, "aot_specs", None)) and (not only or name in only):
            found.append(name)
    return found, errors


# module name -> its aot_specs(), listed once by main() before the pool forks (attention's list
# takes ~0.08 s to rebuild: 8 s of CPU per hundred jobs if each job built it again)
_SPECS: dict = {}


def _compile_one(job):
    import importlib

    from gpuparity.backends.triton_common import compile_spec
    module_name, index, target, binary = job
    specs = _SPECS.get(module_name) or importlib.import_module(module_name).aot_specs()
    spec = specs[index]
    result = compile_spec(spec, target, binary=binary)
    return {"module": module_name, "name": result.name, "target": result.target, "ok": result.ok,
            "kernel": _kernel_name(spec), "binary": binary,
            "shared_bytes": result.shared_bytes, "limit_bytes": result.limit_bytes, "error": result.error}


def _kernel_name(spec) -> str:
    return getattr(spec.kernel, "fn", spec.kernel).__name__


def main() -> None:
    import importlib
    import multiprocessing

    from gpuparity.backends.triton_common import ir_only_supported
    modules, errors = _kernel_modules()
    # GPUPARITY_AOT_TARGETS=a,b: only those targets (the test runs one target per case)
    only_targets = [t for t in os.environ.get("GPUPARITY_AOT_TARGETS", "").split(",") if t]
    every_binary = "--binary" in sys.argv or os.environ.get("GPUPARITY_AOT_BINARY") == "1" or not ir_only_supported()
    jobs = []
    counts = {}
    listed = set()  # every target some configuration lists, whether compiled in this run or not
    built = set()   # (module, kernel, target) that has a configuration compiled to a binary
    for name in modules:
        specs = _SPECS[name] = importlib.import_module(name).aot_specs()
        counts[name] = len(specs)
        for index, spec in enumerate(specs):
            for target in spec.targets:
                listed.add(target)
                if only_targets and target not in only_targets:
                    continue
                kernel = (name, _kernel_name(spec), target)
                jobs.append((name, index, target, every_binary or kernel not in built))
                built.add(kernel)
    workers = max(1, min(4, os.cpu_count() or 1))
    if workers > 1 and len(jobs) > 1:
        with multiprocessing.get_context("fork").Pool(workers) as pool:
            results = pool.map(_compile_one, jobs, chunksize=1)
    else:
        results = [_compile_one(job) for job in jobs]
    if "--table" in sys.argv:
        for r in results:
            shared = "-" if r["shared_bytes"] is None else f"{r['shared_bytes']:>7d} / {r['limit_bytes']}"
            stage = "binary" if r["binary"] else "llir"
            print(f"{'ok  ' if r['ok'] else 'FAIL'} {r['target']:<12} {stage:<6} {shared:>18}  {r['name']}  {r['error']}")
    print(MARKER + json.dumps({"modules": counts, "errors": errors, "listed_targets": sorted(listed),
                                "results": results}))


def test_the_manifest_names_every_kernel_module_and_each_lists_its_configurations():
    """REQUIRED comes from the manifest: the seven Triton kernel modules of the shipped ops, and
    each has an aot_specs() (the compile test above asks each for its configurations)."""
    import importlib
    assert set(REQUIRED) >= {"gpuparity.backends.triton_norms", "gpuparity.backends.triton_rotary",
                             "gpuparity.backends.triton_attention", "gpuparity.backends.triton_decode",
                             "gpuparity.backends.triton_swiglu", "gpuparity.backends.triton_cross_entropy",
                             "gpuparity.backends.triton_residual_norm"}
    for name in REQUIRED:
        assert callable(getattr(importlib.import_module(name), "aot_specs", None)), name


@pytest.mark.parametrize("target", AOT_TARGETS)
def test_every_kernel_configuration_compiles_for_every_target(target):
    """One target per case (see the module docstring); the cases cover every AOT target."""
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "GPUPARITY_AOT_MODULES")}
    env["GPUPARITY_AOT_TARGETS"] = target
    # GPUPARITY_AOT_BINARY=1 passes through: every configuration to a binary
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    proc = subprocess.run([sys.executable, os.path.abspath(__file__)], capture_output=True, text=True, env=env,
                          timeout=1800)
    lines = [line for line in proc.stdout.splitlines() if line.startswith(MARKER)]
    assert proc.returncode == 0 and lines, f"AOT worker failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}"
    report = json.loads(lines[-1][len(MARKER):])
    assert not report["errors"], report["errors"]
    for name in REQUIRED:
        assert report["modules"].get(name), f"{name} must list its configurations in aot_specs()"
    # a configuration listing a target outside AOT_TARGETS would be compiled by no case
    assert set(report["listed_targets"]) <= set(AOT_TARGETS), report["listed_targets"]
    targets_seen = {r["target"] for r in report["results"]}
    assert targets_seen == {target}, f"targets compiled {sorted(targets_seen)}, expected {target}"
    missing = [(kernel, target) for kernel in REQUIRED_KERNELS
               if not any(r["name"].startswith(kernel) and r["target"] == target for r in report["results"])]
    assert not missing, f"kernels never compiled for a target: {missing}"
    kernels = {(r["module"], r["kernel"], r["target"]) for r in report["results"]}
    binaries = {(r["module"], r["kernel"], r["target"]) for r in report["results"] if r["binary"]}
    assert kernels == binaries, f"kernels never built to a binary for a target: {sorted(kernels - binaries)}"
    failures = [r for r in report["results"] if not r["ok"]]
    assert not failures, "configurations that do not build:\n" + "\n".join(
        f"  {r['name']} on {r['target']}: {r['error']}" for r in failures)


if __name__ == "__main__":
    main()


def test_specialization_key_separates_what_triton_specializes_on():
    """The direct-launch cache must never reuse a kernel compiled for another specialization:
    pointer alignment, ints equal to 1 or divisible by 16, 32- vs 64-bit ints and dtypes all
    change the key; the same properties give the same key."""
    import torch
    from gpuparity.backends.triton_common import specialization_key
    base = torch.zeros(64, dtype=torch.float16)
    same = torch.ones(64, dtype=torch.float16)
    assert specialization_key((base, 32, 3, 0.5)) == specialization_key((same, 48, 5, 0.25))
    assert specialization_key((base,)) != specialization_key((base[1:],))          # 2-byte offset: unaligned
    assert specialization_key((base,)) != specialization_key((base.float(),))      # dtype
    assert specialization_key((16,)) != specialization_key((17,))                  # divisible by 16
    assert specialization_key((1,)) != specialization_key((3,))                    # equal to 1
    assert specialization_key((2 ** 31 + 16,)) != specialization_key((16,))        # needs 64 bits
    assert specialization_key((2 ** 31 + 16,)) != specialization_key((2 ** 31 + 1,))  # 64-bit, divisible or not
    assert specialization_key((2 ** 63 - 1,)) != specialization_key((2 ** 63,))    # i64 vs u64
    assert specialization_key((-2 ** 31 - 16,)) != specialization_key((-2 ** 31 - 15,))
    assert specialization_key((True,)) != specialization_key((1,))


def test_hook_chains_without_functions_allow_direct_launches():
    from gpuparity.backends.triton_common import _hook_active

    class Chain:
        def __init__(self, calls):
            self.calls = calls
    assert not _hook_active(None)
    assert not _hook_active(Chain([]))
    assert _hook_active(Chain([print]))
    assert _hook_active(print)


def test_varlen_decode_swiglu_and_cross_entropy_kernels_are_listed_for_every_target():
    """Without compiling (the test above does): the varlen forward/dq/dk-dv kernels, the decode
    split/combine kernels, swiglu's, linear_cross_entropy's and residual_norm's have an AotSpec on every AOT
    target, with every parameter in its signature."""
    import inspect

    import pytest
    pytest.importorskip("triton")
    import importlib
    specs = [spec for name in REQUIRED for spec in importlib.import_module(name).aot_specs()]
    for kernel in REQUIRED_KERNELS:
        for target in AOT_TARGETS:
            assert any(s.name.startswith(kernel) and target in s.targets for s in specs), (kernel, target)
    for spec in specs:
        if spec.name.startswith(("attention_varlen.", "attention_decode.", "swiglu.", "linear_cross_entropy.",
                                 "cross_entropy_loss.", "residual_norm.")):
            params = inspect.signature(getattr(spec.kernel, "fn", spec.kernel)).parameters
            assert set(spec.signature) == set(params), spec.name
            assert {n for n, t in spec.signature.items() if t == "constexpr"} == set(spec.constexprs), spec.name


_IR_ONLY_PROBE = r'''
import json
import triton
import triton.language as tl
from triton import knobs
from gpuparity.backends.triton_common import AotSpec, compile_spec

@triton.jit
def square(X, Y, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tile = tl.load(X + offs[:, None] * BLOCK + offs[None, :])
    tl.store(Y + offs[:, None] * BLOCK + offs[None, :], tl.dot(tile, tile).to(tl.float16))

def spec(block):
    return AotSpec(f"probe.b{block}", square, {"X": "*fp16", "Y": "*fp16", "BLOCK": "constexpr"}, {"BLOCK": block},
                   num_stages=1)

import os
sizes = []

def listener(*, src, metadata, metadata_group, times, cache_hit):
    sizes.extend(os.path.getsize(path) for name, path in metadata_group.items() if name.endswith((".cubin", ".hsaco")))

knobs.compilation.listener = listener
out = {}
for target in ("cuda:90", "hip:gfx942"):
    before = (knobs.runtime.add_stages_inspection_hook, knobs.cache.dir)
    ir = compile_spec(spec(64), target, binary=False)
    ir_binary = sizes[-1]
    out[target] = {"ir": [ir.ok, ir.shared_bytes, ir.error], "hook_restored": (knobs.runtime.add_stages_inspection_hook, knobs.cache.dir) == before,
                   "full": [[r.ok, r.shared_bytes] for r in [compile_spec(spec(64), target)]][0],
                   "binary_bytes": [ir_binary, sizes[-1]]}
print("PROBE " + json.dumps(out))
'''


def test_ir_only_compiles_stop_after_llvm_ir_and_leave_triton_as_it_was(tmp_path):
    """compile_spec(binary=False) gives the same verdict and shared-memory size as a full build of
    the same kernel, for an NVIDIA and an AMD target, without building the binary; the full build
    after it is not served the IR-only result from Triton's cache (on Triton 3.6, whose cache key
    leaves the stage hook out, it was, until IR-only compiles got a cache directory of their own);
    Triton's stage hook and cache directory are put back."""
    import pytest
    pytest.importorskip("triton")
    from gpuparity.backends.triton_common import ir_only_supported
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    check = ("from gpuparity.backends.triton_common import ir_only_supported; "
             "import sys; sys.exit(0 if ir_only_supported() else 3)")
    if subprocess.run([sys.executable, "-c", check], env=env).returncode == 3 or not ir_only_supported():
        pytest.skip("this Triton has no add_stages_inspection_hook: every AOT compile builds a binary")
    probe = tmp_path / "ir_only_probe.py"   # @triton.jit needs its source in a file
    probe.write_text(_IR_ONLY_PROBE)
    proc = subprocess.run([sys.executable, str(probe)], capture_output=True, text=True, env=env, timeout=600)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("PROBE ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    report = json.loads(lines[-1][len("PROBE "):])
    for target, result in report.items():
        ok, shared, error = result["ir"]
        assert ok and not error, (target, error)
        assert shared > 0, f"{target}: a 64x64 dot stages its operands in shared memory; the IR-only compile reported {shared}"
        assert result["full"] == [True, shared], (target, result)
        assert result["hook_restored"], target
        ir_binary, full_binary = result["binary_bytes"]
        assert ir_binary == 0 and full_binary > 0, (target, result["binary_bytes"])


def test_alibi_and_paged_variants_are_listed_for_every_target():
    """Without compiling (the test above does): for every AOT target, the ALiBi variant of each
    attention kernel - dense forward, dq, dk/dv and the one-launch backward, the varlen forward,
    dq and dk/dv, the forward as the KV-cache path launches it (each item's keys bounded by its
    length, no padding mask: where the kernels read each item's ALiBi diagonal), with and without
    a mask - and the split-KV decode kernel on pages, with ALiBi on a contiguous cache and on pages."""
    pytest.importorskip("triton")
    from gpuparity.backends import triton_decode
    from gpuparity.backends.triton_attention import aot_specs
    specs = aot_specs() + triton_decode.aot_specs()

    def has(prefix, **constexprs):
        return {target for s in specs if s.name.startswith(prefix)
                and all(s.constexprs.get(k) == v for k, v in constexprs.items()) for target in s.targets}

    everywhere = set(AOT_TARGETS)
    for prefix in ("attention.fwd.", "attention.dq.", "attention.dkdv.", "attention.bwd.", "attention_varlen.fwd.",
                   "attention_varlen.dq.", "attention_varlen.dkdv."):
        assert has(prefix, HAS_ALIBI=True) == everywhere, prefix
    for mask_kind in (0, 1):   # none, bool (launch.MASK_NONE, MASK_BOOL)
        assert has("attention.fwd.", HAS_ALIBI=True, HAS_BOUNDS=True, HAS_KPM=False, MASK_KIND=mask_kind) == everywhere
    assert {t for s in specs if s.name.startswith("attention_decode.split.") and s.constexprs["PAGE_SIZE"] > 0
            for t in s.targets} == everywhere
    assert has("attention_decode.split.", HAS_ALIBI=True, PAGE_SIZE=0) == everywhere
    assert {t for s in specs if s.name.startswith("attention_decode.split.") and s.constexprs["HAS_ALIBI"]
            and s.constexprs["PAGE_SIZE"] > 0 for t in s.targets} == everywhere
