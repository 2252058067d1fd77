"""Every example in README.md and docs/*.md runs as written on a CPU, or says why not.

Each fenced ```python block (also ```py / ```python3, and a fence indented inside a list item)
runs alone in a fresh namespace: a snippet that needs a name from an earlier one fails, as it
would when pasted alone. Each ```bash block whose lines are all `gpuparity ...` commands runs them
through the CLI (in-process, exit code 0). A block that cannot run on a CPU (a GPU, a download, a
cluster, the user's own model or minutes of battery) carries `<!-- not-run: REASON -->` on the
line before its fence; the reason is required. A python block that ends in a `# output...:`
comment line and comment lines after it must print those lines (whitespace aside). All blocks
run in one subprocess (torch imported once), in a scratch directory where `docs/` is this
repository's, with the probe cache in the scratch directory too and a user's environment (the
suite's TRITON_INTERPRET=1 removed)."""
from __future__ import annotations

import contextlib
import glob
import io
import json
import os
import re
import shlex
import subprocess
import sys
import textwrap
import time
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LANGUAGES = {"python": "python", "py": "python", "python3": "python", "bash": "bash"}
_FENCE = re.compile(r"^([ \t]*)```(\w*)[ \t]*\n(.*?)^\1```[ \t]*$", flags=re.S | re.M)
_NOT_RUN = re.compile(r"<!--\s*not-run:\s*(.*?)\s*-->[ \t]*\n(?:[ \t]*\n)?$")


def doc_files():
    """README.md and docs/*.md, relative to the repository root."""
    return ["README.md", *sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "*.md")))]


def doc_blocks(paths=None, root=ROOT):
    """(file:line, language, code, reason-or-None) of every python / bash block of `paths`
    (default: doc_files()); an indented block's code is dedented."""
    found = []
    for path in paths if paths is not None else doc_files():
        with open(os.path.join(root, path), encoding="utf-8") as f:
            text = f.read()
        for match in _FENCE.finditer(text):
            language = LANGUAGES.get(match.group(2).lower())
            if language is None:
                continue
            where = f"{path}:{text.count(chr(10), 0, match.start()) + 1}"
            marker = _NOT_RUN.search(text, 0, match.start())
            reason = marker.group(1) if marker and marker.end() == match.start() else None
            found.append((where, language, textwrap.dedent(match.group(3)), reason))
    return found


def gpuparity_commands(code: str):
    """The argv lists of a bash block made only of `gpuparity ...` commands (joined with &&),
    or a ValueError naming the line that is something else."""
    commands = []
    for line in code.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        while words:
            command = words[:words.index("&&")] if "&&" in words else words
            words = words[len(command) + 1:]
            if not command or command[0] != "gpuparity" or any(w in ("|", ";", ">", "<") for w in command):
                raise ValueError(f"not a plain gpuparity command: {line.strip()!r}")
            commands.append(command[1:])
    return commands


def documented_output(code: str):
    """The lines a python block says it prints: the comment lines after a `# output...:` line at
    the block's end, or None when it has none."""
    lines = code.rstrip().splitlines()
    starts = [i for i, line in enumerate(lines) if re.fullmatch(r"# output\b.*:", line.strip())]
    if not starts or not all(line.startswith("#") for line in lines[starts[-1]:]):
        return None
    return [line[1:].strip() for line in lines[starts[-1] + 1:]]


def _same_lines(text) -> list:
    return [" ".join(line.split()) for line in text if line.strip()]


def _run_block(language: str, code: str, where: str, stdout: io.StringIO) -> str:
    """'' when the block ran (and printed what its `# output:` comment says), else what went wrong."""
    if language == "python":
        exec(compile(code, where, "exec"), {"__name__": "__docs__"})
        expected = documented_output(code)
        printed = _same_lines(stdout.getvalue().splitlines())
        if expected is not None and printed != _same_lines(expected):
            return "printed other lines than its '# output:' comment says:\n" + "\n".join(printed)
        return ""
    from gpuparity.cli import main
    try:
        commands = gpuparity_commands(code)
    except ValueError as exc:
        return f"{exc} (mark the block <!-- not-run: REASON -->)"
    for argv in commands:
        code = main(argv)
        if code != 0:
            return f"gpuparity {shlex.join(argv)} exited {code}"
    return ""


def _run_all(blocks_file: str) -> None:
    with open(blocks_file) as f:
        blocks = json.load(f)
    results = []
    for where, language, code in blocks:
        start = time.perf_counter()
        out, err = io.StringIO(), io.StringIO()
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                error = _run_block(language, code, where, out)
        except BaseException:  # noqa: BLE001 - SystemExit too: the block must run to its end
            error = traceback.format_exc(limit=-3)
        results.append({"where": where, "error": error, "output": (out.getvalue() + err.getvalue())[-1500:],
                        "seconds": round(time.perf_counter() - start, 2)})
    json.dump(results, sys.stdout)


def run_blocks(blocks, cwd, env=None):
    """Run the blocks not marked not-run in one subprocess in `cwd`; the run's results, one per
    block run ({"where", "error", "output", "seconds"}), and the blocks whose marker has no reason."""
    unexplained = [where for where, _, _, reason in blocks if reason == ""]
    to_run = [(where, language, code) for where, language, code, reason in blocks if reason is None]
    blocks_file = os.path.join(cwd, "blocks.json")
    with open(blocks_file, "w") as f:
        json.dump(to_run, f)
    env = dict(os.environ if env is None else env, PYTHONPATH=os.path.join(ROOT, "src"))
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), blocks_file],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout)
    assert [r["where"] for r in results] == [where for where, _, _ in to_run]
    return results, unexplained


def test_every_doc_example_runs_or_says_why_not(tmp_path):
    blocks = doc_blocks()
    assert len(blocks) > 20  # the extraction finds the docs' blocks
    assert any(language == "bash" and reason is None for _, language, _, reason in blocks)
    os.symlink(os.path.join(ROOT, "docs"), tmp_path / "docs")
    env = dict(os.environ, GPUPARITY_CACHE_DIR=str(tmp_path / "cache"))
    env.pop("TRITON_INTERPRET", None)   # the suite's setting (tests/device_env.py), not a user's
    results, unexplained = run_blocks(blocks, str(tmp_path), env)
    assert not unexplained, f"<!-- not-run: --> needs a reason: {unexplained}"
    failed = [f"{r['where']}: {r['error']}\n{r['output']}" for r in results if r["error"]]
    assert not failed, "examples that do not run as written:\n\n" + "\n\n".join(failed)


def test_the_known_issues_example_lists_what_the_rules_give():
    """docs/known-issues.md's saved-report example: its "does not apply (N): ..." line is what the
    rules give for that fixture (it had drifted to 44 of 45; tests/test_cli_repro.py checks the
    counts line)."""
    from gpuparity import known
    from gpuparity.known.engine import DOES_NOT_APPLY

    fixture = "tests/fixtures/platforms/rdna2_gfx1030_rocm62.json"
    with open(os.path.join(ROOT, "docs", "known-issues.md"), encoding="utf-8") as f:
        example = f.read().split(f"$ gpuparity known-issues --platform {fixture}\n", 1)[1].split("```", 1)[0]
    results = known.evaluate(known.load_platform(os.path.join(ROOT, fixture)), probes=False)
    hidden = [r.id for r in results if r.status == DOES_NOT_APPLY]
    assert f"does not apply ({len(hidden)}): {', '.join(hidden[:3])}, ..." in example


PLANTED = """# planted

```python
shared = 1
```

A snippet that uses a name of the one before fails: each runs alone.

```python
print(shared)
```

<!-- not-run: needs a GPU -->
```python
raise RuntimeError("not run")
```

<!-- not-run: -->
```python
raise RuntimeError("a marker without a reason")
```

```python
print("chosen: sdpa_math")
# output:
# chosen: sdpa_math
```

```python
print("chosen: composition")
# output:
# chosen: sdpa_math
```

- in a list:

  ```py
  raise ValueError("indented and raising")
  ```
"""


def test_the_harness_runs_each_snippet_alone_and_fails_on_one_that_raises(tmp_path):
    """Planted: a snippet that needs an earlier snippet's name, one that prints other lines than
    its `# output:` comment, an indented ```py that raises, a marker without a reason; a marked
    snippet is not run. (The harness once missed indented
    fences, so docs/transformers.md's list-item snippets never ran.)"""
    (tmp_path / "planted.md").write_text(PLANTED)
    blocks = doc_blocks(["planted.md"], root=str(tmp_path))
    assert [(where, language, reason) for where, language, _, reason in blocks] == [
        ("planted.md:3", "python", None), ("planted.md:9", "python", None),
        ("planted.md:14", "python", "needs a GPU"), ("planted.md:19", "python", ""),
        ("planted.md:23", "python", None), ("planted.md:29", "python", None), ("planted.md:37", "python", None)]
    results, unexplained = run_blocks(blocks, str(tmp_path))
    assert unexplained == ["planted.md:19"]
    errors = {r["where"]: r["error"] for r in results}
    assert list(errors) == ["planted.md:3", "planted.md:9", "planted.md:23", "planted.md:29", "planted.md:37"]
    assert errors["planted.md:3"] == "" and errors["planted.md:23"] == ""
    assert "NameError: name 'shared' is not defined" in errors["planted.md:9"]
    assert "other lines than its '# output:' comment says:\nchosen: composition" in errors["planted.md:29"]
    assert "ValueError: indented and raising" in errors["planted.md:37"]


if __name__ == "__main__":
    _run_all(sys.argv[1])
