#!/usr/bin/env python3
"""Run transformers' own model test suites with gpuparity in the models. NOT part of CI: the
transformers wheel ships no tests, so this fetches them, which NEEDS NETWORK ACCESS to github.com
(or pass --transformers-src with a checkout you have).

For the installed transformers version V it takes tests/ of the tag vV (a shallow, sparse git
clone into --workdir), then runs tests/models/<family>/test_modeling_<family>.py of each family
in each mode through the pytest plugin transformers_suites_plugin.py (next to this file):

  baseline  nothing changed (what the suite gives here without gpuparity; --modes to include it)
  impl      attn_implementation="gpuparity" for every model built without an explicit choice
  patch     gpuparity.patch(model) right after each model's post_init

and writes, under --out: results.json (every test's outcome per family and mode) and
summary.md (counts per family and mode; the failures; the tests that assert an attention
implementation's name, listed as expected differences in impl mode, not findings).

  python scripts/transformers_suites.py                       # nine families, impl and patch
  python scripts/transformers_suites.py --families llama bert --modes baseline impl -k generate
  python scripts/transformers_suites.py --transformers-src ~/src/transformers   # no network needed

Exit code: 0 when every failure is an expected difference (or also fails in baseline when that
ran), 1 otherwise, 2 when the tests cannot be fetched or found.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "bert", "roberta", "vit")
MODES = ("baseline", "impl", "patch")
REPO = "https://github.com/huggingface/transformers"
PLUGIN = "transformers_suites_plugin"


def fetch_tests(version: str, workdir: str) -> str:
    """A checkout of transformers' tests/ at tag v<version> (reused if already there)."""
    target = os.path.join(workdir, f"transformers-v{version}")
    if os.path.isdir(os.path.join(target, "tests", "models")):
        return target
    os.makedirs(workdir, exist_ok=True)
    steps = [["git", "clone", "--depth", "1", "--branch", f"v{version}", "--filter=blob:none", "--sparse", REPO, target],
             ["git", "-C", target, "sparse-checkout", "set", "tests", "utils"]]
    for step in steps:
        print("+", " ".join(step), flush=True)
        done = subprocess.run(step, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"transformers_suites: could not fetch transformers' tests for v{version} "
                             f"({' '.join(step[:2])} exited {done.returncode}: {done.stderr.strip()[-400:]}). "
                             f"This needs network access to github.com; or pass --transformers-src DIR, a checkout "
                             f"of {REPO} at v{version}")
    return target


def run_family(source: str, family: str, mode: str, out: str, extra: List[str], device: Optional[str],
               timeout: float) -> Dict[str, Any]:
    """One family's test file in one mode, in its own pytest process; its report as a dict."""
    path = os.path.join("tests", "models", family, f"test_modeling_{family}.py")
    if not os.path.exists(os.path.join(source, path)):
        return {"mode": mode, "error": f"no {path} in {source}", "tests": []}
    report = os.path.join(out, "raw", f"{family}-{mode}.json")
    log = os.path.join(out, "raw", f"{family}-{mode}.log")
    os.makedirs(os.path.dirname(report), exist_ok=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (HERE, source, os.environ.get("PYTHONPATH")) if p))
    if device:
        env["TRANSFORMERS_TEST_DEVICE"] = device
    command = [sys.executable, "-m", "pytest", path, "-p", PLUGIN, "--gpuparity-mode", mode,
               "--gpuparity-report", report, "-q", "-p", "no:cacheprovider", "-o", "addopts=", *extra]
    print(f"[{family} / {mode}]", " ".join(command), flush=True)
    started = time.time()
    try:
        with open(log, "w", encoding="utf-8") as handle:
            done = subprocess.run(command, cwd=source, env=env, stdout=handle, stderr=subprocess.STDOUT,
                                  timeout=timeout)
        code = done.returncode
    except subprocess.TimeoutExpired:
        code = "timeout"
    if not os.path.exists(report):
        return {"mode": mode, "error": f"pytest exited {code} without a report (see {log})", "tests": []}
    with open(report, encoding="utf-8") as handle:
        data = json.load(handle)
    data.update(pytest_exit=code, wall_s=round(time.time() - started, 1), log=os.path.relpath(log, out))
    return data


def classify(results: Dict[str, Dict[str, Dict[str, Any]]]) -> None:
    """Mark, in place, each failure: without gpuparity (baseline mode), expected (asserts an
    implementation's name, in impl mode), also failing in baseline (when that ran), or a finding."""
    for family, modes in results.items():
        baseline = {t["nodeid"]: t["outcome"] for t in modes.get("baseline", {}).get("tests", [])}
        for mode, data in modes.items():
            for test in data.get("tests", []):
                if test["outcome"] not in ("failed", "error"):
                    continue
                if mode == "baseline":
                    test["class"] = "baseline: fails without gpuparity"
                elif mode == "impl" and test.get("asserts_implementation_name"):
                    test["class"] = "expected: asserts an attention implementation's name"
                elif mode != "baseline" and baseline.get(test["nodeid"]) in ("failed", "error"):
                    test["class"] = "fails in baseline too"
                else:
                    test["class"] = "finding"


def counts(tests: List[Dict[str, Any]]) -> Dict[str, int]:
    found: Dict[str, int] = {}
    for test in tests:
        found[test["outcome"]] = found.get(test["outcome"], 0) + 1
    return found


def summary_markdown(meta: Dict[str, Any], results: Dict[str, Dict[str, Dict[str, Any]]]) -> str:
    modes = meta["modes"]
    lines = ["# transformers' model test suites with gpuparity", "",
             f"- transformers {meta['transformers']}, torch {meta['torch']}, gpuparity {meta['gpuparity']}",
             f"- tests from {meta['source']}; device {meta['device'] or 'the suite default'}; {meta['date']}",
             f"- command: `{meta['command']}`", "",
             "| family | " + " | ".join(modes) + " |", "|---|" + "---|" * len(modes)]
    for family, by_mode in results.items():
        cells = []
        for mode in modes:
            data = by_mode.get(mode, {})
            if data.get("error"):
                cells.append(f"error: {data['error'][:60]}")
                continue
            c = counts(data.get("tests", []))
            findings = sum(1 for t in data.get("tests", []) if t.get("class") == "finding")
            cells.append(f"{c.get('passed', 0)} passed, {c.get('failed', 0) + c.get('error', 0)} failed "
                         f"({findings} findings), {c.get('skipped', 0)} skipped")
        lines.append(f"| {family} | " + " | ".join(cells) + " |")
    for title, wanted in (("Findings", "finding"), ("Expected differences",
                                                    "expected: asserts an attention implementation's name"),
                          ("Failing in baseline too", "fails in baseline too"),
                          ("Failing without gpuparity (baseline)", "baseline: fails without gpuparity")):
        rows = [(mode, t) for by_mode in results.values() for mode, data in by_mode.items()
                for t in data.get("tests", []) if t.get("class") == wanted]
        lines += ["", f"## {title} ({len(rows)})", ""]
        if wanted.startswith("expected"):
            lines.append("Tests that assert the name of the attention implementation (`_attn_implementation == "
                         "\"sdpa\"` and the like): with attn_implementation=\"gpuparity\" they fail by design.")
            lines.append("")
        lines += [f"- `{t['nodeid']}` ({mode}): {t['message'].splitlines()[0][:200] if t['message'] else ''}"
                  for mode, t in rows] or ["none"]
    return "\n".join(lines) + "\n"


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--families", nargs="+", default=list(FAMILIES), metavar="FAMILY",
                        help=f"model families (default: {' '.join(FAMILIES)})")
    parser.add_argument("--modes", nargs="+", default=["impl", "patch"], choices=MODES,
                        help="modes to run (default: impl patch; add baseline to tell failures this environment "
                             "has anyway)")
    parser.add_argument("--transformers-src", metavar="DIR",
                        help="a checkout of transformers at the installed version (default: fetch one; needs network)")
    parser.add_argument("--workdir", default=os.path.join(os.path.expanduser("~"), ".cache", "gpuparity",
                                                          "transformers-tests"),
                        help="where fetched tests go (default: %(default)s)")
    parser.add_argument("--out", default="transformers-suites", help="results folder (default: %(default)s)")
    parser.add_argument("--device", default=None, help="TRANSFORMERS_TEST_DEVICE for the suites (e.g. cuda, cpu)")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds per family and mode (default: 3600)")
    parser.add_argument("-k", dest="keyword", default=None, help="pytest -k expression, passed through")
    args = parser.parse_args(argv)
    unknown = [f for f in args.families if f not in FAMILIES]
    if unknown:
        print(f"transformers_suites: note: {', '.join(unknown)} are not among the nine families this was written "
              "for; running their tests/models/<family>/test_modeling_<family>.py anyway", file=sys.stderr)

    import torch
    import transformers
    try:
        import gpuparity
        gpuparity_version = getattr(gpuparity, "__version__", "?")
    except ImportError:
        parser.error("gpuparity is not importable: install it (pip install -e .) or run with PYTHONPATH=src")
    version = transformers.__version__
    if args.transformers_src:
        source = os.path.abspath(args.transformers_src)
        if not os.path.isdir(os.path.join(source, "tests", "models")):
            parser.error(f"--transformers-src: {source} has no tests/models (a checkout of {REPO} is needed)")
    else:
        try:
            source = fetch_tests(version, args.workdir)
        except SystemExit as exc:
            print(exc, file=sys.stderr)
            return 2
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    extra = ["-k", args.keyword] if args.keyword else []
    results: Dict[str, Dict[str, Dict[str, Any]]] = {}
    modes = [m for m in MODES if m in args.modes]      # baseline first: the others are classified against it
    for family in args.families:
        results[family] = {mode: run_family(source, family, mode, out, extra, args.device, args.timeout)
                           for mode in modes}
    classify(results)
    meta = {"transformers": version, "torch": torch.__version__, "gpuparity": gpuparity_version, "source": source,
            "device": args.device, "modes": modes, "families": args.families,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": " ".join([os.path.basename(sys.executable), "scripts/transformers_suites.py",
                                 *(argv if argv is not None else sys.argv[1:])])}
    with open(os.path.join(out, "results.json"), "w", encoding="utf-8") as handle:
        json.dump({"meta": meta, "results": results}, handle, indent=1)
    with open(os.path.join(out, "summary.md"), "w", encoding="utf-8") as handle:
        handle.write(summary_markdown(meta, results))
    findings = sum(1 for by_mode in results.values() for data in by_mode.values()
                   for t in data.get("tests", []) if t.get("class") == "finding")
    errors = [f"{f}/{m}" for f, by_mode in results.items() for m, d in by_mode.items() if d.get("error")]
    print(f"wrote {os.path.join(out, 'summary.md')} and results.json: {findings} findings"
          + (f"; no report from {', '.join(errors)}" if errors else ""))
    return 1 if findings or errors else 0


if __name__ == "__main__":
    sys.exit(main())
