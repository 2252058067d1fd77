"""The layout's rules, checked: imports among src/gpuparity modules form no cycle (static imports
anywhere in a file, and the modules a package imports by name through importlib, those the op
manifest names among them), and no source file grows past ~600 lines without saying why at its
top (a "# long file: <reason>" line)."""
from __future__ import annotations

import ast
import os
import pathlib
import re
import subprocess
import sys
import textwrap

import pytest

SRC = pathlib.Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "gpuparity"
LONG_FILE_LINES = 600
LONG_FILE_REASON = re.compile(r"^# long file: \S")


def module_names():
    names = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names[".".join(parts)] = path
    return names


_SRC_GRAPH = []   # the graph of src/ as this test session found it: each rule reads it, built once


def import_graph(names=None):
    """{module: set of gpuparity modules it imports}. The root package `gpuparity` is left out
    as a target: it is a lazy facade that imports nothing when imported."""
    if names is None:
        if not _SRC_GRAPH:
            _SRC_GRAPH.append(_build_graph(module_names()))
        return {name: set(targets) for name, targets in _SRC_GRAPH[0].items()}
    return _build_graph(names)


def _build_graph(names):
    graph = {name: set() for name in names}
    for name, path in names.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets = []
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[:len(package.split(".")) - node.level + 1]
                    module = ".".join(base + ([node.module] if node.module else []))
                else:
                    module = node.module or ""
                for alias in node.names:
                    child = f"{module}.{alias.name}"
                    targets.append(child if child in names else module)
            elif isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and path.name == "__init__.py":
                # a package that imports its modules by name (backends.MODULES through importlib)
                targets = [node.value] if node.value in names else []
            graph[name].update(t for t in targets if t in names and t not in (name, "gpuparity"))
    for name, targets in manifest_imports().items():
        if name in graph:
            graph[name].update(t for t in targets if t in names and t not in (name, "gpuparity"))
    return graph


def manifest_imports():
    """The modules packages import by name from the op manifest (src/gpuparity/manifest.py):
    backends.load_all its registration order, contracts.get_spec each contract, gpuparity's lazy
    facade each op's public module."""
    from gpuparity import manifest
    return {"gpuparity.backends": set(manifest.registration_order()),
            "gpuparity.contracts": {module for module, _ in manifest.contracts().values()},
            "gpuparity": set(manifest.exports().values())}


def cycles(graph):
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, on_stack, stack, found, counter = {}, {}, set(), [], [], [0]
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]; counter[0] += 1
        stack.append(root); on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter[0]; counter[0] += 1
                    stack.append(child); on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop(); on_stack.discard(member); component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_cycle_finder_finds_a_planted_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_among_src_modules():
    graph = import_graph()
    assert "gpuparity.registry" in graph["gpuparity.dispatch"]   # the graph sees real edges
    assert {"gpuparity.backends.sdpa", "gpuparity.contracts.norms"} <= graph["gpuparity.backends"]   # by name
    found = cycles(graph)
    assert not found, "import cycles (each list imports itself round): " + "; ".join(" -> ".join(c) for c in found)


@pytest.mark.parametrize("lower, upper", [
    ("gpuparity.dispatch", "gpuparity.checks"),
    ("gpuparity.dispatch", "gpuparity.ops"),
    # the selector (ops/select.py) chooses; it reaches verification only through ops/select.Verification,
    # loaded by a target string at the first need: no op imports checks/
    ("gpuparity.ops", "gpuparity.checks"),
    # a contract says what an op means apart from its backends (what a mask means, where a paged
    # cache keeps its keys: contracts/masks.py); backends implement it and may import it
    ("gpuparity.contracts", "gpuparity.backends"),
    ("gpuparity.backends", "gpuparity.dispatch"),
    ("gpuparity.backends", "gpuparity.checks"),
    ("gpuparity.backends", "gpuparity.ops"),
    ("gpuparity.ops", "gpuparity.commands"),
    ("gpuparity.checks", "gpuparity.ops"),
    # the base pieces (isolation, tolerance) come from the base, not from checks/
    ("gpuparity.device", "gpuparity.checks"),
    ("gpuparity.trace", "gpuparity.checks"),
    ("gpuparity.workloads", "gpuparity.checks"),
    ("gpuparity.compile", "gpuparity.checks"),
    # patching.py (gpuparity.patch) drives both the drop-ins (nn/) and the adapters (integrations/);
    # neither of those two reaches into the other or up into it
    ("gpuparity.integrations", "gpuparity.nn"),
    ("gpuparity.nn", "gpuparity.integrations"),
    ("gpuparity.nn", "gpuparity.patching"),
    ("gpuparity.integrations", "gpuparity.patching"),
])
def test_imports_point_down(lower, upper):
    """dispatch imports nothing above backends; backends register through gpuparity.registry (the base)."""
    offending = upward_imports(import_graph(), lower, upper)
    assert not offending, f"{lower} must not import {upper}: " + ", ".join(offending)


def upward_imports(graph, lower, upper, allowed=()):
    """The edges from `lower` (a module or package) to `upper`, less those in `allowed` ("a -> b"
    strings, or a target module that anyone may import)."""
    return sorted(f"{m} -> {t}" for m, targets in graph.items() if m == lower or m.startswith(lower + ".")
                  for t in targets if (t == upper or t.startswith(upper + ".")) and t not in allowed
                  and f"{m} -> {t}" not in allowed)


def test_the_upward_rule_sees_planted_edges():
    planted = {"gpuparity.ops.select": {"gpuparity.checks.selection", "gpuparity.dispatch"},
               "gpuparity.dispatch": {"gpuparity.checks.verdicts"},
               "gpuparity.contracts.attention": {"gpuparity.backends.masks"}}
    assert upward_imports(planted, "gpuparity.ops", "gpuparity.checks") == [
        "gpuparity.ops.select -> gpuparity.checks.selection"]
    assert upward_imports(planted, "gpuparity.dispatch", "gpuparity.checks") == [
        "gpuparity.dispatch -> gpuparity.checks.verdicts"]
    assert upward_imports(planted, "gpuparity.contracts", "gpuparity.backends") == [
        "gpuparity.contracts.attention -> gpuparity.backends.masks"]
    allowed = ("gpuparity.contracts.attention -> gpuparity.backends.masks",)
    assert upward_imports(planted, "gpuparity.contracts", "gpuparity.backends", allowed) == []


# --------------------------------------------------------------------------- no process at import
# A fresh interpreter that believes it is a CUDA torch program on a GPU machine (torch.version.cuda,
# the device file /dev/nvidiactl), with checks in workers (GPUPARITY_PROBE=subprocess): what made
# gpuparity start its checking worker at import before. `children()` lists the live child
# processes of the interpreter (from /proc); the script ends them before it exits.
_COUNT_CHILDREN = textwrap.dedent("""
    import os, torch
    def children():
        mine, found = str(os.getpid()), []
        for entry in os.listdir("/proc"):
            try:
                with open(f"/proc/{entry}/stat") as handle:
                    state, parent = handle.read().rsplit(")", 1)[1].split()[:2]
            except (OSError, ValueError):
                continue
            if entry.isdigit() and parent == mine and state != "Z":
                found.append(int(entry))
        return found
    torch.version.cuda = "13.0"
    _exists = os.path.exists
    os.path.exists = lambda path: path == "/dev/nvidiactl" or _exists(path)
""")


def processes_started_by(statement, path=None, after=""):
    """How many child processes are alive after `statement` ran in that interpreter (and the
    output of `after`, run next), each ended before it exits."""
    script = (_COUNT_CHILDREN + statement + "\nprint('children', len(children()))\n" + after +
              "\nfor pid in children():\n    os.kill(pid, 9)\n")
    env = {**os.environ, "GPUPARITY_PROBE": "subprocess",
           "PYTHONPATH": os.pathsep.join([str(SRC)] + ([str(path)] if path else []))}
    env.pop("GPUPARITY_PARENT_PID", None)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    counted = next(line for line in lines if line.startswith("children "))
    return int(counted.split()[1]), lines[lines.index(counted) + 1:]


def test_the_process_counter_sees_a_process_started_at_import(tmp_path):
    (tmp_path / "planted_worker.py").write_text(
        "import subprocess, sys\n_worker = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n")
    assert processes_started_by("import planted_worker", path=tmp_path)[0] == 1
    assert processes_started_by("import json", path=tmp_path)[0] == 0


IMPORT_EVERY_OP = ("import importlib, pkgutil, sys, gpuparity, gpuparity.ops\n"
                   "for found in pkgutil.iter_modules(gpuparity.ops.__path__):\n"
                   "    importlib.import_module('gpuparity.ops.' + found.name)\n")


def test_importing_gpuparity_and_its_ops_starts_no_process_and_loads_no_checks():
    """The checking worker starts at the first call that needs a verdict, at gpuparity.patch or at
    gpuparity.prepare(), never at an import (tests/test_prestart.py: prepare() starts it)."""
    count, after = processes_started_by(IMPORT_EVERY_OP, after="print(sorted(m for m in sys.modules if "
                                                               "m.startswith('gpuparity.checks')))")
    assert count == 0, "importing gpuparity and its ops started a process"
    assert after == ["[]"], f"importing the ops loaded checks/: {after}"


# The base layer (docs/architecture.md): what every floor above may take, importing nothing above it.
BASE = ("gpuparity.platform", "gpuparity.numerics", "gpuparity.validation", "gpuparity.cachedir",
        "gpuparity.caches", "gpuparity.isolate", "gpuparity.tolerance", "gpuparity.targets", "gpuparity.registry",
        "gpuparity.manifest")


def base_violations(graph):
    """Base modules that import a gpuparity module outside the base."""
    return sorted(f"{m} -> {t}" for m in BASE if m in graph for t in graph[m] if t not in BASE)


def test_the_base_imports_only_the_base():
    graph = import_graph()
    assert {"gpuparity.isolate", "gpuparity.tolerance", "gpuparity.targets", "gpuparity.registry"} <= set(graph)
    assert base_violations({"gpuparity.tolerance": {"gpuparity.checks.results"}}) == [
        "gpuparity.tolerance -> gpuparity.checks.results"]   # the rule sees a planted edge
    found = base_violations(graph)
    assert not found, "the base imports a module above it: " + ", ".join(found)


def test_known_imports_nothing_of_checks():
    """known/ records its remedies on stored verdicts through their key type, a base piece
    (registry.VerdictKey), as are isolation and tolerance, which its probes use: checks/ takes the
    known-issue base, never the other way round."""
    planted = {"gpuparity.known.avoid": {"gpuparity.checks.verdicts"}, "gpuparity.checks.verdicts": set()}
    assert upward_imports(planted, "gpuparity.known", "gpuparity.checks") == [
        "gpuparity.known.avoid -> gpuparity.checks.verdicts"]   # the rule sees a planted edge
    found = upward_imports(import_graph(), "gpuparity.known", "gpuparity.checks")
    assert not found, "known/ imports checks/: " + ", ".join(found)


def own_target_loaders(names=None):
    """Functions outside gpuparity.targets that split a "module:attr" string (partition/rpartition/
    split on ":") and import what it names (importlib.import_module, spec_from_file_location):
    a loader of their own instead of targets.load."""
    found = []
    for module, path in sorted((names or module_names()).items()):
        if module == "gpuparity.targets":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            calls = [c for c in ast.walk(node) if isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute)]
            splits = any(c.func.attr in ("partition", "rpartition", "split") and c.args
                         and isinstance(c.args[0], ast.Constant) and c.args[0].value == ":" for c in calls)
            imports = any(c.func.attr in ("import_module", "spec_from_file_location") for c in calls)
            if splits and imports:
                found.append(f"{module}.{node.name}")
    return found


def test_module_attr_strings_load_in_one_place(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text("import importlib\ndef load(t):\n    m, _, a = t.rpartition(':')\n"
                       "    return getattr(importlib.import_module(m), a)\n")
    assert own_target_loaders({"planted": planted}) == ["planted.load"]
    found = own_target_loaders()
    assert not found, "'module:attr' loaded outside gpuparity.targets (use targets.load): " + ", ".join(found)


def test_long_files_say_why_at_their_top():
    unexplained = []
    for path in sorted(PACKAGE.rglob("*.py")):
        lines = path.read_text(encoding="utf-8").splitlines()
        if len(lines) > LONG_FILE_LINES and not any(LONG_FILE_REASON.match(line) for line in lines[:12]):
            unexplained.append(f"{path.relative_to(SRC)} ({len(lines)} lines)")
    assert not unexplained, (f"over {LONG_FILE_LINES} lines without a '# long file: <reason>' line at the top: "
                             + ", ".join(unexplained))


def test_the_lazy_facade_imports_on_first_use_and_keeps_the_name():
    """`import gpuparity` imports no op module; the first `gpuparity.attention` imports it and keeps
    the function as a module global, so later calls skip the module's __getattr__ (a fresh
    interpreter: other tests have imported the ops already)."""
    import subprocess
    import sys
    probe = (
        "import sys, gpuparity\n"
        "assert 'gpuparity.ops.attention' not in sys.modules\n"
        "fn = gpuparity.attention\n"
        "from gpuparity.ops.attention import attention\n"
        "assert fn is attention and vars(gpuparity)['attention'] is attention\n"
        "assert 'rms_norm' not in vars(gpuparity)\n"
        "print('ok')\n")
    env = {**__import__("os").environ, "PYTHONPATH": str(SRC)}
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


# --------------------------------------------------------------------------- one contract per op
# What defines an op lives in its contract (src/gpuparity/contracts/<op>.py): its float64 reference
# and the battery's cases and regime families. Modules outside contracts/ whose public functions are
# named like a reference but are not an op's, with why (none today):
NOT_OP_REFERENCES = {}
_REFERENCE_NAME = re.compile(r"^(reference_\w+|[a-z]\w*_reference)$")   # public names: private helpers adapt
# Backend modules that register an op's "composition" themselves, with why:
COMPOSITION_ELSEWHERE = {
    "gpuparity.backends.ce_composition": "linear_cross_entropy's composition is the chunked driver its Triton "
                                         "backend runs too (the kernels replace its steps)",
}
_CASE_BUILDERS = {"family", "Family", "Case", "view_members"}


def outside_contracts(names=None):
    """Definitions that belong in an op contract but sit outside contracts/: a function named like a
    float64 reference (reference_* / *_reference), an OpSpec subclass, the op's "composition"
    backend, a case or family built at module level (Case(...), family(...), view_members(...))."""
    found = []
    for module, path in sorted((names or module_names()).items()):
        if module.startswith("gpuparity.contracts") or module in NOT_OP_REFERENCES:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _REFERENCE_NAME.search(node.name):
                found.append(f"{module}.{node.name} (a float64 reference)")
            elif isinstance(node, ast.ClassDef) and any(ast.unparse(b).split(".")[-1] == "OpSpec" for b in node.bases):
                found.append(f"{module}.{node.name} (an OpSpec: the battery's cases)")
            elif (isinstance(node, ast.Call) and ast.unparse(node.func).split(".")[-1] == "Backend" and node.args
                  and isinstance(node.args[0], ast.Constant) and node.args[0].value == "composition"
                  and module not in COMPOSITION_ELSEWHERE):
                found.append(f"{module}: Backend('composition', ...) at line {node.lineno} (the op's trusted composition)")
        for node in tree.body:   # module level: cases and families declared here
            for call in (n for n in ast.walk(node) if isinstance(n, ast.Call)):
                name = ast.unparse(call.func).split(".")[-1]
                if name in _CASE_BUILDERS and not isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                    found.append(f"{module}: {name}(...) at line {call.lineno} (the battery's cases)")
    return found


def test_the_contract_finder_sees_planted_definitions(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text("from gpuparity.contracts.base import Case, OpSpec, family\n"
                       "def attention_reference(q):\n    return q\n"
                       "class MySpec(OpSpec):\n    pass\n"
                       "CASES = [Case('a', {})]\n"
                       "FAMILIES = [family('f', [])]\n"
                       "def fine(x):\n    return x\n"
                       "register(Backend('composition', 'attention', fine))\n")
    assert outside_contracts({"gpuparity.ops.planted": planted}) == [
        "gpuparity.ops.planted.attention_reference (a float64 reference)",
        "gpuparity.ops.planted.MySpec (an OpSpec: the battery's cases)",
        "gpuparity.ops.planted: Backend('composition', ...) at line 10 (the op's trusted composition)",
        "gpuparity.ops.planted: Case(...) at line 6 (the battery's cases)",
        "gpuparity.ops.planted: family(...) at line 7 (the battery's cases)"]
    assert outside_contracts({"gpuparity.contracts.planted": planted}) == []


def test_references_and_cases_live_in_their_op_contract():
    found = outside_contracts()
    assert not found, ("an op's float64 reference or battery cases outside contracts/ (move them into "
                       "contracts/<op>.py, or list a non-reference in NOT_OP_REFERENCES with why): " + ", ".join(found))


def test_the_check_engine_runs_contracts_from_the_registry():
    """checks/ finds each op's spec through contracts.get_spec, never a contract module by name."""
    found = upward_imports(import_graph(), "gpuparity.checks", "gpuparity.contracts",
                           allowed=("gpuparity.contracts", "gpuparity.contracts.base"))
    assert not found, "checks/ imports an op's contract directly: " + ", ".join(found)


# --------------------------------------------------------------------------- process-level caches
# Module-level state that is not a memo: registries filled at import, and one-shot flags.
NOT_CACHES = {
    "gpuparity.caches": {"_CLEARERS": "the cache registry itself"},
    "gpuparity.isolate": {"_CHILDREN": "the live worker processes, ended with the parent"},
    "gpuparity.checks.selection": {"_THREADS": "the live background threads, joined at exit"},
    "gpuparity.registry": {"_REGISTRY": "the backend registry, filled at import",
                           "_LISTENERS": "callbacks told when the registry changes",
                           "_SOURCES": "the module that registered each backend, filled with the registry"},
    "gpuparity.known.probes.base": {"PROBES": "the probe registry, filled at import"},
    "gpuparity.backends": {"_LOADED_OPS": "the ops whose backends are registered, filled with the registry",
                           "_IMPORTED": "the modules imported to fill it (a contract's compositions registered once)"},
    "gpuparity.backends.triton_attention": {"_IMPORT_ERROR": "why the kernels did not import, set once",
                                            "_UNAVAILABLE": "the same, for the backend's reason"},
    "gpuparity.backends.triton_attention.tiles": {"_OVERRIDES_LOADED": "a one-shot flag: tile overrides read"},
    "gpuparity.backends.triton_common": {"_PLAN_CACHES": "the PlanCache objects; clear_plans is registered"},
    "gpuparity.integrations.transformers": {"_SWAPPED_CLASSES": "classes patched in place (undo state)"},
    "gpuparity.integrations.transformers_mlp": {"_SWAPPED": "classes patched in place (undo state)"},
    "gpuparity.ops.dropout": {"_CHECK": "the dropout self-check case's sizes, a constant (registered, clear_all "
                                        "emptied it and the next self-check failed with KeyError)"},
}
_EMPTY_CALLS = {"dict", "set", "list", "OrderedDict", "WeakKeyDictionary", "WeakValueDictionary", "defaultdict",
                "WeakSet", "deque"}


def _is_empty_container(value) -> bool:
    if isinstance(value, ast.Dict):
        return not value.keys
    if isinstance(value, (ast.List, ast.Set)):
        return not value.elts
    if isinstance(value, ast.Call):
        name = getattr(value.func, "id", getattr(value.func, "attr", None))
        return name in _EMPTY_CALLS and not value.args
    return False


def unregistered_caches(names=None):
    """Module-level memos (an empty dict/list/set/... assigned at the top of a module, or a function
    under functools.lru_cache / functools.cache) that are not registered in gpuparity.caches."""
    found = []
    for module, path in sorted((names or module_names()).items()):
        allowed = NOT_CACHES.get(module, {})
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    if (isinstance(target, ast.Name) and target.id != "__all__" and target.id not in allowed
                            and _is_empty_container(node.value)):
                        found.append(f"{module}.{target.id}")
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for decorator in node.decorator_list:
                    text = ast.unparse(decorator)
                    if text.split("(")[0] in ("functools.lru_cache", "lru_cache", "functools.cache", "cache"):
                        found.append(f"{module}.{node.name} (@{text}: use @caches.lru_cache(name))")
    return found


def test_the_cache_finder_sees_a_planted_memo(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text("import functools\n_MEMO = {}\n_OK = caches.register('x', {})\nTABLE = {'a': 1}\n"
                       "@functools.lru_cache(maxsize=None)\ndef f():\n    return 1\n")
    assert unregistered_caches({"planted": planted}) == [
        "planted._MEMO", "planted.f (@functools.lru_cache(maxsize=None): use @caches.lru_cache(name))"]


def test_every_module_level_cache_is_registered():
    found = unregistered_caches()
    assert not found, ("module-level caches not registered in gpuparity.caches (wrap them in "
                       "caches.register(name, ...), or list a non-cache in NOT_CACHES with why): " + ", ".join(found))


def test_clear_all_empties_every_registered_cache():
    import importlib
    from gpuparity import caches
    for module in module_names():
        if not module.startswith(("gpuparity.commands", "gpuparity.cli", "gpuparity.__main__")):
            try:
                importlib.import_module(module)
            except ImportError:     # an optional extra (transformers, matplotlib) is not installed
                continue
    from gpuparity.device import _VERIFIED
    _VERIFIED["planted"] = {"ok": True}
    cleared = caches.clear_all()
    assert "device.verified" in cleared and not _VERIFIED
    assert len(cleared) == len(caches.names()) >= 10


# --------------------------------------------------------------------------- one declaration per op
# An op's argument list is declared once, in its contract (a `Signature` of contracts/signature.py);
# the torch.library schema, the library op's body, fake and autograd setup, the monitor's capture
# and repro, explain's entry, the battery's `fn(...)` line come from it. A second spelling of it
# under src/ is, outside the op's contract module:
#   - a `def` (or lambda) whose parameters (self/cls/ctx aside), in order, are the op's public
#     parameters or its torch.library op's arguments: a wrapper, body, fake or traced twin that
#     restates them (a def taking the backends' call convention is an implementation of the op,
#     which the battery checks through the contract, not a restatement);
#   - a tuple or list of names, or of (name, default) pairs, or a tuple unpacking, that lists the
#     public parameters, the library op's arguments, the backends' call convention, or the
#     positional parameters when there are four or more (three, "q, k, v", is any attention's
#     locals);
#   - a string holding the op's schema text (its first three "type name" pairs).
# Exempt: the public function itself (gpuparity.<op>, which tests/contracts/test_signature.py holds
# to the declaration), backends/ (implementations), and modules that mirror someone else's API:
SPELLING_EXEMPT_PACKAGES = {
    "gpuparity.backends": "implementations of the declared call convention, checked by the battery",
    "gpuparity.flash_attn": "FlashAttention 2.8's public API, mirrored",
    "gpuparity.nn": "torch.nn modules' signatures, mirrored",
    "gpuparity.integrations": "transformers' and the kernel hub's signatures, mirrored",
}
# (module, op): why a spelling there is someone else's API, not a restatement of ours
SPELLING_EXEMPT = {
    ("gpuparity.explain_run", "apply_rotary_pair"): "MODEL_ROTARY: transformers' apply_rotary_pos_emb(q, k, cos, "
                                                    "sin), the model's own helper explain watches",
}
# gpuparity.<op>'s public functions not in gpuparity's lazy exports
PUBLIC_ELSEWHERE = {"apply_rotary_pair": "gpuparity.ops.rotary"}


def declared_signatures():
    """library op name -> (its contract module, its Signature), from every contract module."""
    import importlib

    from gpuparity.contracts import MODULES
    from gpuparity.contracts.signature import Signature
    found = {}
    for module in MODULES:
        for value in vars(importlib.import_module(module)).values():
            if isinstance(value, Signature):
                found[value.library_name] = (module, value)
    return found


def _spelled_lists(signature):
    lists = {tuple(a.name for a in signature.public_args()): "public parameters",
             tuple(a.name for a in signature.library_order()): "library op arguments"}
    calls = {tuple(a.name for a in signature.backend_args()): "backends' call convention"}
    if len(signature.positional()) >= 4:
        calls[signature.positional()] = "positional parameters"
    defs = {k: v for k, v in lists.items() if len(k) >= 3}
    return defs, {**{k: v for k, v in calls.items() if len(k) >= 3}, **defs}


def _names_listed(node):
    if isinstance(node, (ast.Tuple, ast.List)) and node.elts:
        if all(isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts):
            return tuple(e.value for e in node.elts)
        if all(isinstance(e, ast.Tuple) and e.elts and isinstance(e.elts[0], ast.Constant)
               and isinstance(e.elts[0].value, str) for e in node.elts):
            return tuple(e.elts[0].value for e in node.elts)
        if isinstance(node, ast.Tuple) and isinstance(node.ctx, ast.Store) and all(
                isinstance(e, ast.Name) for e in node.elts):
            return tuple(e.id for e in node.elts)
    return None


def second_spellings(names=None, signatures=None):
    """Each spelling of a declared op's argument list outside its contract (see above), as
    "module:line: what (op's list)"."""
    import gpuparity
    signatures = signatures or declared_signatures()
    public = {op: PUBLIC_ELSEWHERE.get(op, gpuparity._LAZY.get(op)) for op in signatures}
    ops = [(op, contract, *_spelled_lists(signature),
            ", ".join(f"{a.type} {a.name}" for a in signature.library_order()[:3]))
           for op, (contract, signature) in signatures.items()]
    found = []
    for module, path in sorted((names or module_names()).items()):
        if any(module == p or module.startswith(p + ".") for p in SPELLING_EXEMPT_PACKAGES):
            continue
        mine = [entry for entry in ops if module != entry[1] and (module, entry[0]) not in SPELLING_EXEMPT]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                args = node.args
                params = tuple(a.arg for a in args.posonlyargs + args.args + args.kwonlyargs)
                if params[:1] in (("self",), ("cls",), ("ctx",)):
                    params = params[1:]
                name = getattr(node, "name", "<lambda>")
                found += [(module, node.lineno, f"def {name}: the {defs[params]} ({op})")
                          for op, _, defs, _, _ in mine
                          if params in defs and not (name == op and public.get(op) == module)]
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                found += [(module, node.lineno, f"a string with its schema text ({op})")
                          for op, _, _, _, text in mine if text in node.value]
            else:
                listed_names = _names_listed(node)
                if listed_names:
                    found += [(module, node.lineno, f"names listed: the {listed[listed_names]} ({op})")
                              for op, _, _, listed, _ in mine if listed_names in listed]
    return [f"{module}:{line}: {what}" for module, line, what in sorted(set(found))]


def test_the_spelling_finder_sees_planted_second_spellings(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text(
        "def _rms_norm_body(x, normalized_shape, weight, eps, backend):\n    return x\n"          # 1: a body
        "CALLS = {'rms': ('x', 'normalized_shape', 'weight', 'eps')}\n"                         # 2: repro's table
        "PARAMS = (('x', None), ('normalized_shape', None), ('weight', None), ('eps', None))\n"  # 3: monitor's
        "def setup(ctx, inputs):\n    x, normalized_shape, weight, eps, backend = inputs\n"    # 4-5: unpacking
        "SCHEMA = '(Tensor x, SymInt[] normalized_shape, Tensor? weight, float? eps) -> Tensor'\n"  # 6
        "def impl(x, normalized_shape, weight=None, eps=None):\n    return x\n"                # 7: implementation
        "def rms_norm(x, normalized_shape, weight=None, eps=None, *, backend='auto'):\n    return x\n"
        "q, k, v = 1, 2, 3\n")
    found = second_spellings({"gpuparity.ops.planted": planted})
    assert found == [
        "gpuparity.ops.planted:1: def _rms_norm_body: the library op arguments (rms_norm)",
        "gpuparity.ops.planted:3: names listed: the positional parameters (rms_norm)",
        "gpuparity.ops.planted:4: names listed: the positional parameters (rms_norm)",
        "gpuparity.ops.planted:6: names listed: the library op arguments (rms_norm)",
        "gpuparity.ops.planted:7: a string with its schema text (layer_norm)",   # its first three are rms_norm's
        "gpuparity.ops.planted:7: a string with its schema text (rms_norm)",
        "gpuparity.ops.planted:10: def rms_norm: the library op arguments (rms_norm)"]   # not the public one
    # the same lines in the op's own contract, or under backends/, are no second spelling
    assert second_spellings({"gpuparity.contracts.norms": planted}) == []
    assert second_spellings({"gpuparity.backends.planted": planted}) == []


def test_an_ops_argument_list_is_spelled_once_in_its_contract():
    found = second_spellings()
    assert not found, ("an op's argument list spelled again outside its contract (derive it from the contract's "
                       "Signature: library.define, Signature.bind / positional / schema; or, for someone else's "
                       "API, list it in SPELLING_EXEMPT with why): " + "; ".join(found))
