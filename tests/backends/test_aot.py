"""Ahead-of-time compile check: every shipped configuration of every Triton kernel module in
gpuparity.backends (each module with an `aot_specs()`) builds for every AOT target - AMD
gfx942, gfx90a, gfx1100 and NVIDIA sm_80, sm_90 - on this CPU-only machine, through Triton's
own compiler, without a compile error or a shared-memory / LDS overflow.

The compile runs in a fresh process: kernels decorated under TRITON_INTERPRET=1 (which the
interpreter tests set at import) cannot be compiled, and the interpreter choice is made when a
module is imported. `python tests/backends/test_aot.py --table` prints the shared memory of every config.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

MARKER = "GPUPARITY-AOT "
# Modules that must take part: a kernel module without aot_specs() would escape the check.
REQUIRED = ("gpuparity.backends.triton_norms", "gpuparity.backends.triton_rotary", "gpuparity.backends.triton_attention",
            "gpuparity.backends.triton_decode", "gpuparity.backends.triton_swiglu",
            "gpuparity.backends.triton_cross_entropy")
# Kernels that must be compiled for every target (name prefixes of the AotSpecs).
REQUIRED_KERNELS = ("attention.fwd.", "attention.dq.", "attention.dkdv.", "attention.bwd.", "attention_varlen.fwd.",
                    "attention_varlen.dq.", "attention_varlen.dkdv.", "attention_decode.split.",
                    "attention_decode.combine.", "swiglu.fwd", "swiglu.bwd", "linear_cross_entropy.rows.",
                    "linear_cross_entropy.cols.")


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


def _compile_one(job):
    import importlib

    from gpuparity.backends.triton_common import compile_spec
    module_name, index, target = job
    spec = importlib.import_module(module_name).aot_specs()[index]
    result = compile_spec(spec, target)
    return {"module": module_name, "name": result.name, "target": result.target, "ok": result.ok,
            "shared_bytes": result.shared_bytes, "limit_bytes": result.limit_bytes, "error": result.error}


def main() -> None:
    import importlib
    import multiprocessing

    modules, errors = _kernel_modules()
    jobs = []
    counts = {}
    for name in modules:
        specs = importlib.import_module(name).aot_specs()
        counts[name] = len(specs)
        for index, spec in enumerate(specs):
            jobs.extend((name, index, target) for target in spec.targets)
    workers = max(1, min(4, os.cpu_count() or 1))
    if workers > 1 and len(jobs) > 1:
        with multiprocessing.get_context("fork").Pool(workers) as pool:
            results = pool.map(_compile_one, jobs, chunksize=1)
    else:
        results = [_compile_one(job) for job in jobs]
    if "--table" in sys.argv:
        for r in results:
            shared = "-" if r["shared_bytes"] is None else f"{r['shared_bytes']:>7d} / {r['limit_bytes']}"
            print(f"{'ok  ' if r['ok'] else 'FAIL'} {r['target']:<12} {shared:>18}  {r['name']}  {r['error']}")
    print(MARKER + json.dumps({"modules": counts, "errors": errors, "results": results}))


def test_every_kernel_configuration_compiles_for_every_target():
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "GPUPARITY_AOT_MODULES")}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    proc = subprocess.run([sys.executable, os.path.abspath(__file__)], capture_output=True, text=True, env=env,
                          timeout=1800)
    lines = [line for line in proc.stdout.splitlines() if line.startswith(MARKER)]
    assert proc.returncode == 0 and lines, f"AOT worker failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}"
    report = json.loads(lines[-1][len(MARKER):])
    assert not report["errors"], report["errors"]
    for name in REQUIRED:
        assert report["modules"].get(name), f"{name} must list its configurations in aot_specs()"
    from gpuparity.backends.triton_common import AOT_TARGETS
    targets_seen = {r["target"] for r in report["results"]}
    assert targets_seen == set(AOT_TARGETS), f"targets compiled {sorted(targets_seen)}, expected {AOT_TARGETS}"
    missing = [(kernel, target) for kernel in REQUIRED_KERNELS for target in AOT_TARGETS
               if not any(r["name"].startswith(kernel) and r["target"] == target for r in report["results"])]
    assert not missing, f"kernels never compiled for a target: {missing}"
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
    split/combine kernels, swiglu's and linear_cross_entropy's have an AotSpec on every AOT
    target, with every parameter in its signature."""
    import inspect

    import pytest
    pytest.importorskip("triton")
    from gpuparity.backends import triton_cross_entropy, triton_decode, triton_swiglu
    from gpuparity.backends.triton_attention import aot_specs
    from gpuparity.backends.triton_common import AOT_TARGETS
    specs = aot_specs() + triton_decode.aot_specs() + triton_swiglu.aot_specs() + triton_cross_entropy.aot_specs()
    for kernel in REQUIRED_KERNELS:
        for target in AOT_TARGETS:
            assert any(s.name.startswith(kernel) and target in s.targets for s in specs), (kernel, target)
    for spec in specs:
        if spec.name.startswith(("attention_varlen.", "attention_decode.", "swiglu.", "linear_cross_entropy.")):
            params = inspect.signature(getattr(spec.kernel, "fn", spec.kernel)).parameters
            assert set(spec.signature) == set(params), spec.name
            assert {n for n, t in spec.signature.items() if t == "constexpr"} == set(spec.constexprs), spec.name
