"""Every example in README.md and docs/*.md runs as written on a CPU, or says why not.

Each fenced ```python block runs in a fresh namespace; each ```bash block whose lines are all
`gpuparity ...` commands runs them through the CLI (in-process, exit code 0). A block that cannot
run on a CPU (a GPU, a download, a cluster, the user's own model or minutes of battery) carries
`<!-- not-run: REASON -->` on the line before its fence; the reason is required. All blocks run in
one subprocess (torch imported once), in a scratch directory where `docs/` is this repository's,
with the probe cache in the scratch directory too."""
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
import time
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUNNABLE = ("python", "bash")
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", flags=re.S | re.M)
_NOT_RUN = re.compile(r"<!--\s*not-run:\s*(.*?)\s*-->\s*\n(?:[ \t]*\n)?$")


def doc_blocks():
    """(file:line, language, code, reason-or-None) of every ```python / ```bash block."""
    found = []
    docs = sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "*.md")))
    for path in ["README.md", *docs]:
        with open(os.path.join(ROOT, path), encoding="utf-8") as f:
            text = f.read()
        for match in _FENCE.finditer(text):
            language = match.group(1)
            if language not in RUNNABLE:
                continue
            where = f"{path}:{text.count(chr(10), 0, match.start()) + 1}"
            marker = _NOT_RUN.search(text, 0, match.start())
            reason = marker.group(1) if marker and marker.end() == match.start() else None
            found.append((where, language, match.group(2), reason))
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


def _run_block(language: str, code: str, where: str) -> str:
    """'' when the block ran, else what went wrong."""
    if language == "python":
        exec(compile(code, where, "exec"), {"__name__": "__docs__"})
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
        out = io.StringIO()
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
                error = _run_block(language, code, where)
        except BaseException:  # noqa: BLE001 - SystemExit too: the block must run to its end
            error = traceback.format_exc(limit=-3)
        results.append({"where": where, "error": error, "output": out.getvalue()[-1500:],
                        "seconds": round(time.perf_counter() - start, 2)})
    json.dump(results, sys.stdout)


def test_every_doc_example_runs_or_says_why_not(tmp_path):
    blocks = doc_blocks()
    assert len(blocks) > 20  # the extraction finds the docs' blocks
    unexplained = [where for where, _, _, reason in blocks if reason == ""]
    assert not unexplained, f"<!-- not-run: --> needs a reason: {unexplained}"
    to_run = [(where, language, code) for where, language, code, reason in blocks if reason is None]
    assert any(language == "bash" for _, language, _ in to_run)
    (tmp_path / "blocks.json").write_text(json.dumps(to_run))
    os.symlink(os.path.join(ROOT, "docs"), tmp_path / "docs")
    env = dict(os.environ, GPUPARITY_CACHE_DIR=str(tmp_path / "cache"), PYTHONPATH=os.path.join(ROOT, "src"))
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), str(tmp_path / "blocks.json")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout)
    assert len(results) == len(to_run)
    failed = [f"{r['where']}: {r['error']}\n{r['output']}" for r in results if r["error"]]
    assert not failed, "examples that do not run as written:\n\n" + "\n\n".join(failed)


if __name__ == "__main__":
    _run_all(sys.argv[1])
