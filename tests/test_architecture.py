"""The layout's rules, checked: imports among src/gpuparity modules form no cycle (static imports
anywhere in a file, and the modules a package imports by name through importlib), and no
source file grows past ~600 lines without saying why at its top (a "# long file: <reason>" line)."""
from __future__ import annotations

import ast
import pathlib
import re

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


def import_graph(names=None):
    """{module: set of gpuparity modules it imports}. The root package `gpuparity` is left out
    as a target: it is a lazy facade that imports nothing when imported."""
    names = names or module_names()
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
    return graph


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
    assert "gpuparity.backends.registry" in graph["gpuparity.dispatch"]   # the graph sees real edges
    found = cycles(graph)
    assert not found, "import cycles (each list imports itself round): " + "; ".join(" -> ".join(c) for c in found)


@pytest.mark.parametrize("lower, upper", [
    ("gpuparity.dispatch", "gpuparity.checks"),
    ("gpuparity.dispatch", "gpuparity.ops"),
    ("gpuparity.backends", "gpuparity.dispatch"),
    ("gpuparity.backends", "gpuparity.checks"),
    ("gpuparity.backends", "gpuparity.ops"),
    ("gpuparity.ops", "gpuparity.commands"),
    ("gpuparity.checks", "gpuparity.ops"),
])
def test_imports_point_down(lower, upper):
    """dispatch imports nothing above backends; backends register through backends.registry."""
    graph = import_graph()
    offending = sorted(f"{m} -> {t}" for m, targets in graph.items() if m == lower or m.startswith(lower + ".")
                       for t in targets if t == upper or t.startswith(upper + "."))
    assert not offending, f"{lower} must not import {upper}: " + ", ".join(offending)


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
