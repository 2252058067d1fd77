"""The op manifest's promise, pinned: the battery's ops in the same order, the same backends per op in
the same order (the order "auto" ranks ties in and `dispatch.backends(op)` lists), each op's contract
and its public exports, as they stood before the manifest (at 1a586e9, from contracts.CONTRACTS,
backends.MODULES and gpuparity._LAZY written by hand)."""
from __future__ import annotations

import pytest

import gpuparity
from gpuparity import backends, contracts, dispatch, manifest

OPS = ("attention", "softmax", "layer_norm", "rms_norm", "rotary", "matmul", "conv2d", "cross_entropy",
       "attention_varlen", "attention_decode", "linear_cross_entropy", "swiglu", "residual_norm")

BACKENDS = {
    "attention": ["sdpa_math", "sdpa_efficient", "sdpa_flash", "sdpa_cudnn", "composition", "triton", "flex"],
    "softmax": ["torch", "composition"],
    "layer_norm": ["torch", "composition", "triton", "compile"],
    "rms_norm": ["torch", "composition", "triton", "compile"],
    "rotary": ["composition", "triton", "compile"],
    "matmul": ["torch", "composition"],
    "conv2d": ["torch", "composition"],
    "cross_entropy": ["torch", "composition", "triton"],
    "attention_varlen": ["triton", "composition"],
    "attention_decode": ["triton", "sdpa", "composition"],
    "linear_cross_entropy": ["composition", "torch", "triton"],
    "swiglu": ["torch", "composition", "triton"],
    "residual_norm": ["composition", "triton"],
}

CONTRACTS = {
    "attention": ("gpuparity.contracts.attention", "SPEC"),
    "softmax": ("gpuparity.contracts.basic", "SOFTMAX_SPEC"),
    "layer_norm": ("gpuparity.contracts.norms", "LN_SPEC"),
    "rms_norm": ("gpuparity.contracts.norms", "RMS_SPEC"),
    "rotary": ("gpuparity.contracts.rotary", "SPEC"),
    "matmul": ("gpuparity.contracts.basic", "MATMUL_SPEC"),
    "conv2d": ("gpuparity.contracts.basic", "CONV2D_SPEC"),
    "cross_entropy": ("gpuparity.contracts.basic", "CROSS_ENTROPY_SPEC"),
    "attention_varlen": ("gpuparity.contracts.varlen", "SPEC"),
    "attention_decode": ("gpuparity.contracts.decode", "SPEC"),
    "linear_cross_entropy": ("gpuparity.contracts.linear_cross_entropy", "SPEC"),
    "swiglu": ("gpuparity.contracts.swiglu", "SPEC"),
    "residual_norm": ("gpuparity.contracts.residual_norm", "SPEC"),
}

# every module load_all imports (the backend families and the contracts whose compositions it registers)
REGISTERING = {
    "gpuparity.backends.ce_composition", "gpuparity.backends.compiled", "gpuparity.backends.flex",
    "gpuparity.backends.sdpa", "gpuparity.backends.torch_ops", "gpuparity.backends.triton_attention",
    "gpuparity.backends.triton_cross_entropy", "gpuparity.backends.triton_decode", "gpuparity.backends.triton_norms",
    "gpuparity.backends.triton_residual_norm", "gpuparity.backends.triton_rotary", "gpuparity.backends.triton_swiglu",
    "gpuparity.contracts.attention", "gpuparity.contracts.basic", "gpuparity.contracts.decode",
    "gpuparity.contracts.norms", "gpuparity.contracts.residual_norm", "gpuparity.contracts.rotary",
    "gpuparity.contracts.swiglu", "gpuparity.contracts.varlen"}

# the ops' public functions among gpuparity's lazy exports
EXPORTS = {
    "attention": "gpuparity.ops.attention", "attention_dropout_mask": "gpuparity.ops.attention",
    "attention_decode": "gpuparity.ops.decode", "kv_cache_append": "gpuparity.ops.decode",
    "attention_varlen": "gpuparity.ops.varlen",
    "rms_norm": "gpuparity.ops.norms", "layer_norm": "gpuparity.ops.norms",
    "apply_rotary": "gpuparity.ops.rotary",
    "linear_cross_entropy": "gpuparity.ops.linear_cross_entropy",
    "swiglu": "gpuparity.ops.swiglu",
    "residual_norm": "gpuparity.ops.residual_norm",
}
OTHER_EXPORTS = {"check": "gpuparity.api", "get_device": "gpuparity.device", "patch": "gpuparity.patching",
                 "prepare": "gpuparity.ops.select", "safe_compile": "gpuparity.compile", "monitor": "gpuparity.shadow",
                 "explain": "gpuparity.explain_run"}


def test_the_battery_lists_the_same_ops_in_the_same_order():
    assert contracts.OPS == OPS
    assert contracts.CONTRACTS == CONTRACTS and list(contracts.CONTRACTS) == list(CONTRACTS)


def builtin_backends(op):
    """dispatch.backends(op), less those a module outside backends/ and contracts/ registered (a
    planted one: gpuparity.workloads.planted registers one for attention when a test imports it)."""
    return [b for b in dispatch.backends(op)
            if getattr(b.fn, "__module__", "").startswith(("gpuparity.backends.", "gpuparity.contracts."))]


def test_each_op_lists_the_same_backends_in_the_same_order():
    assert {op: [b.name for b in builtin_backends(op)] for op in OPS} == BACKENDS


def test_load_all_imports_the_same_modules():
    assert len(backends.MODULES) == len(set(backends.MODULES)) and set(backends.MODULES) == REGISTERING


def test_gpuparity_exports_the_same_names_from_the_same_modules():
    assert gpuparity._LAZY == {**EXPORTS, **OTHER_EXPORTS}
    assert set(gpuparity.__all__) == {"__version__", *EXPORTS, *OTHER_EXPORTS, "nn", "trace", "profile"}


# --------------------------------------------------------------------------- the manifest itself
def _registered_from(backend, modules):
    """The index in `modules` of the module (or package) whose code the backend runs, else None."""
    source = getattr(backend.fn, "__module__", "") or ""
    return next((i for i, m in enumerate(modules) if source == m or source.startswith(m + ".")), None)


def test_each_op_line_names_the_modules_that_register_its_backends_in_its_order():
    """dispatch.backends(op) lists each backend from a module its manifest line names, in the line's
    order: the line, not another op's or an import accident, decides the order."""
    for line in manifest.OPS:
        modules = manifest.backend_modules(line)
        slots = [_registered_from(backend, modules) for backend in builtin_backends(line.name)]
        assert None not in slots and slots == sorted(slots), (line.name, modules, slots)
        assert set(slots) == set(range(len(modules))), f"{line.name}: a module on its line registers none of it"


def test_registration_order_keeps_every_line_and_refuses_two_that_disagree():
    planted = (manifest.Op("a", "x:SPEC", "m1 contract m2", ""), manifest.Op("b", "y:SPEC", "m0 m2", ""),
               manifest.Op("c", "z:SPEC", "m3 m1", ""))
    order = manifest.registration_order(planted)
    for line in planted:
        positions = [order.index(m) for m in manifest.backend_modules(line)]
        assert positions == sorted(positions), (line, order)
    # each line kept; where none orders two modules, the one the manifest names first comes first
    assert order == ("gpuparity.backends.m0", "gpuparity.backends.m3", "gpuparity.backends.m1",
                     "gpuparity.contracts.x", "gpuparity.backends.m2")
    backwards = planted + (manifest.Op("d", "w:SPEC", "m2 m1", ""),)
    with pytest.raises(ValueError, match="both ways: gpuparity.backends.m1, gpuparity.backends.m2"):
        manifest.registration_order(backwards)
    assert backends.MODULES == manifest.registration_order()


def test_every_registering_module_is_on_a_manifest_line(tmp_path):
    """A module under backends/ or contracts/ that registers backends (register(Backend(...)) or
    COMPOSITIONS) is imported by load_all only if the manifest names it: one that is not would
    register nothing, silently."""
    planted = tmp_path / "planted.py"
    planted.write_text("from gpuparity.registry import Backend, register\nregister(Backend('x', 'softmax', len))\n")
    assert unlisted_registering({"gpuparity.backends.planted": planted}) == ["gpuparity.backends.planted"]
    found = unlisted_registering()
    assert not found, "modules that register backends but are on no line of src/gpuparity/manifest.py: " + ", ".join(found)


def unlisted_registering(names=None):
    import ast
    import pathlib
    if names is None:
        src = pathlib.Path(gpuparity.__file__).resolve().parents[1]
        names = {}
        for folder in ("backends", "contracts"):
            for path in (src / "gpuparity" / folder).rglob("*.py"):
                parts = list(path.relative_to(src).with_suffix("").parts)
                names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    found = []
    for module, path in sorted(names.items()):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        registers = any(isinstance(node, ast.Call) and ast.unparse(node.func).split(".")[-1] == "register"
                        and node.args and isinstance(node.args[0], ast.Call)
                        and ast.unparse(node.args[0].func).split(".")[-1] == "Backend" for node in ast.walk(tree))
        registers |= any(isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "COMPOSITIONS" for t in node.targets)
                         for node in tree.body)
        if registers and not any(module == m or module.startswith(m + ".") for m in backends.MODULES):
            found.append(module)
    return found


def test_import_gpuparity_reads_the_manifest_and_nothing_else():
    """The lazy facade's op exports come from the manifest, which imports nothing: `import gpuparity`
    loads these two modules of gpuparity's and no torch (a fresh interpreter)."""
    import os
    import subprocess
    import sys
    src = os.path.dirname(os.path.dirname(gpuparity.__file__))
    probe = ("import sys, gpuparity\n"
             "print(sorted(m for m in sys.modules if m.startswith('gpuparity')), 'torch' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": src})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["['gpuparity',", "'gpuparity.manifest']", "False"]


def test_a_backend_module_imported_before_load_all_keeps_its_place():
    """Import order does not decide: triton_attention imported first (as an import of every module
    does) registers its backends before sdpa's, and load_all puts them back in attention's line
    order (a fresh interpreter: here the registry is filled already)."""
    import os
    import subprocess
    import sys
    src = os.path.dirname(os.path.dirname(gpuparity.__file__))
    probe = ("import gpuparity.backends.triton_attention, gpuparity.backends.compiled\n"
             "from gpuparity import dispatch\n"
             "print([b.name for b in dispatch.backends('attention')], [b.name for b in dispatch.backends('rms_norm')])\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": src})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == f"{BACKENDS['attention']} {BACKENDS['rms_norm']}"


def test_a_first_call_loads_its_ops_line_only_and_any_load_order_gives_the_same_backends():
    """dispatch.backends(op) imports the modules of op's line, not every op's: after a first
    attention lookup no module that only other ops' lines name (the norms' kernels, torch.compile's,
    the other contracts) is imported. Whichever op comes first, each op then lists the backends of
    BACKENDS in that order (fresh interpreters: here the registry is filled already)."""
    import os
    import subprocess
    import sys
    src = os.path.dirname(os.path.dirname(gpuparity.__file__))
    probe = ("import sys\n"
             "from gpuparity import backends, dispatch\n"
             "first = [b.name for b in dispatch.backends('attention')]\n"
             "line = set(backends._LINES['attention'])\n"
             "print(sorted(m for m in backends.MODULES if m not in line and m in sys.modules))\n"
             "print(sorted(backends._LOADED_OPS))\n"
             "print({op: [b.name for b in dispatch.backends(op)] for op in sys.argv[1:]}, first)\n")
    for ops in (OPS[::-1], ("attention_varlen", "rms_norm", "attention_decode", *OPS)):
        done = subprocess.run([sys.executable, "-c", probe, *ops], capture_output=True, text=True, timeout=120,
                              env={**os.environ, "PYTHONPATH": src})
        assert done.returncode == 0, done.stderr[-2000:]
        others, loaded, listed = done.stdout.splitlines()
        assert others == "[]" and loaded == "['attention']", done.stdout
        assert listed == f"{ {op: BACKENDS[op] for op in ops} } {BACKENDS['attention']}", (ops, listed)
