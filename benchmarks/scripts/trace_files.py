"""How many source files of gpuparity a first call and a doctor run cross.

Runs, each in a fresh process with an empty GPUPARITY_CACHE_DIR:
  (a) one first `gpuparity.attention(q, k, v, key_padding_mask=m, backend="auto")` call;
  (b) `gpuparity doctor --quick --ops attention`;
under a `sys.setprofile` (and `threading.setprofile`) hook that notes the file of every Python
frame that starts. The hook is installed by a `sitecustomize.py` this script writes to a temp
folder put first on PYTHONPATH, so every subprocess the library starts (the battery's workers,
the probe worker) installs it too and appends to the same list. Prints, per run, the distinct
files under <src>/gpuparity whose functions ran (module bodies run at import not counted) and,
for reference, the files with any frame at all (imports included).

    python benchmarks/scripts/trace_files.py [--src SRC] [--device cpu] [--list]

--src: the `src` folder of the tree to measure (default: this repository's), so an older tree
checked out with `git worktree add /tmp/before <commit>` is measured with the same script.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))

SITECUSTOMIZE = textwrap.dedent('''
    import os, sys, threading
    _out = os.environ.get("TRACE_FILES_OUT")
    _root = os.environ.get("TRACE_FILES_ROOT")
    if _out and _root:
        _seen = set()
        _lock = threading.Lock()

        def _note(frame, event, arg):
            if event != "call":
                return
            code = frame.f_code
            key = (code.co_filename, code.co_name == "<module>")
            if key in _seen or not code.co_filename.startswith(_root):
                return
            with _lock:
                if key in _seen:
                    return
                _seen.add(key)
                # appended line by line, so a worker killed mid-run still leaves what it ran
                with open(_out, "a") as fh:
                    fh.write(("module " if key[1] else "function ") + code.co_filename + "\\n")

        sys.setprofile(_note)
        threading.setprofile(_note)
''')

FIRST_CALL = textwrap.dedent('''
    import torch, gpuparity
    q, k, v = (torch.randn(2, 4, 128, 64) for _ in range(3))
    m = torch.zeros(2, 128, dtype=torch.bool)
    m[1, 100:] = True
    q = q.to(DEVICE); k = k.to(DEVICE); v = v.to(DEVICE); m = m.to(DEVICE)
    out = gpuparity.attention(q, k, v, key_padding_mask=m, backend="auto")
    print("first call ok", tuple(out.shape))
''')


def run(name: str, argv, src: str, device: str, workdir: str) -> dict:
    out = os.path.join(workdir, f"{name}.files")
    cache = os.path.join(workdir, f"{name}-cache")
    os.makedirs(cache)
    env = dict(os.environ)
    env.update(TRACE_FILES_OUT=out, TRACE_FILES_ROOT=os.path.join(src, "gpuparity") + os.sep,
               GPUPARITY_CACHE_DIR=cache, DEVICE=device,
               PYTHONPATH=os.pathsep.join([workdir, src] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])))
    proc = subprocess.run(argv, env=env, capture_output=True, text=True)
    lines = open(out).read().split("\n") if os.path.exists(out) else []
    functions = {line.split(" ", 1)[1] for line in lines if line.startswith("function ")}
    anything = {line.split(" ", 1)[1] for line in lines if line}
    rel = lambda files: sorted(os.path.relpath(f, src) for f in files)  # noqa: E731
    return {"run": name, "exit": proc.returncode, "files_with_functions": len(functions),
            "files_any_frame": len(anything), "functions": rel(functions),
            "tail": (proc.stdout + proc.stderr)[-600:]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--src", default=os.path.join(REPO, "src"), help="the src folder of the tree to measure")
    parser.add_argument("--device", default="cpu", help="device of the first call and the doctor run")
    parser.add_argument("--list", action="store_true", help="also list the files with functions that ran")
    parser.add_argument("--json", help="write the results as JSON to this file")
    args = parser.parse_args()
    src = os.path.abspath(args.src)
    with tempfile.TemporaryDirectory(prefix="trace-files-") as workdir:
        with open(os.path.join(workdir, "sitecustomize.py"), "w") as fh:
            fh.write(SITECUSTOMIZE)
        results = [
            run("first_call", [sys.executable, "-c", FIRST_CALL.replace("DEVICE", repr(args.device))],
                src, args.device, workdir),
            run("doctor", [sys.executable, "-m", "gpuparity", "doctor", "--quick", "--ops", "attention",
                           "--device", args.device], src, args.device, workdir),
        ]
    for result in results:
        print(f"{result['run']}: exit {result['exit']}, {result['files_with_functions']} files under "
              f"src/gpuparity whose functions ran ({result['files_any_frame']} with any frame, imports included)")
        if args.list:
            print("  " + "\n  ".join(result["functions"]))
        if result["exit"] not in (0, 1):
            print("  " + result["tail"].replace("\n", "\n  "))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
