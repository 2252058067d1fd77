"""FlashAttention's own test files, unmodified, against gpuparity.flash_attn.install() (issue 46).

    bash benchmarks/scripts/fa_own_tests_prepare.sh          # here: exports them into .fa_tests/
    python benchmarks/scripts/fa_own_tests.py --tests .fa_tests --out $OUT/fa --budget-s 420   # on the GPU

Runs pytest once per file (a subprocess each, so one file's crash or hang costs only its share)
with benchmarks/scripts/fa_own_tests_plugin.py, which installs gpuparity's flash_attn, samples
the parametrized cases (a seeded covering of every parameter value, then up to
--max-cases-per-test), deselects the tests that call FlashAttention's C++ internals and supplies
the old transformers functions tests/layers/test_rotary.py imports. The budget is shared over the
files by FILES' weights; time a file leaves unused goes to the ones after it. Writes four files
under --out (the GPU machine returns at most 8): results.json (every case, per test and per file
totals, the plugin's record of each file), summary.md, junit.xml (every file's suite) and logs.txt
(every file's pytest output); the per-file pieces are made in a temporary folder.

--backend (default triton) names the gpuparity backend of every flash_attn op that has one: the
tests then run gpuparity's own Triton kernels, with no first-call verification per new (op, dtype,
kind) and no background timing of other backends; --backend auto tests auto's verified choice
(which may be torch's SDPA for some calls) with that background timing off and first calls
waiting for their verdict (GPUPARITY_FIRST_CALLS=wait).
--collect-only --assume-capability 9.0 is the plumbing check on a machine without CUDA (the files
call torch.cuda.get_device_capability at import).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from typing import Any, Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
# (path under the tests folder, share of the budget): small files first, so what they leave goes
# to test_flash_attn.py
FILES = (("tests/losses/test_cross_entropy.py", 1.0), ("tests/layers/test_rotary.py", 0.5),
         ("tests/ops/triton/test_layer_norm.py", 2.0), ("tests/test_flash_attn.py", 6.0))
OUTCOMES = ("passed", "failed", "skipped", "not_run_budget", "xfailed", "xpassed", "error_setup", "error_teardown")
GRACE_S = 60.0      # past a file's deadline (the case running then, collection, teardown) before it is killed


def _stem(path: str) -> str:
    return os.path.splitext(os.path.basename(path))[0]


def run_file(args, path: str, budget_s: float, work: str) -> Dict[str, Any]:
    stem = _stem(path)
    results = os.path.join(work, f"{stem}.json")
    ini = os.path.join(work, "pytest.ini")       # an empty config: this repository's own one stays out
    cmd = [sys.executable, "-m", "pytest", os.path.join(args.tests, path), "-p", "fa_own_tests_plugin",
           "-p", "no:cacheprovider", "-p", "no:xdist", "-c", ini, "--rootdir", args.tests, "-rA", "-q",
           "--junitxml", os.path.join(work, f"{stem}.xml"), "--fa-results", results,
           "--fa-max-cases-per-test", str(args.max_cases_per_test), "--fa-seed", str(args.seed)]
    started = time.time()
    if args.collect_only:
        cmd.append("--collect-only")
    else:
        cmd += ["--fa-deadline", str(started + budget_s)]
        if importlib.util.find_spec("pytest_timeout") is not None:
            cmd += ["--timeout", str(args.per_test_timeout_s)]
    if args.assume_capability:
        cmd += ["--fa-assume-capability", args.assume_capability]
    cmd += ["--fa-backend", args.backend]
    env = dict(os.environ)
    # auto: no background timing of the other backends (it competes with the tests for the GPU and
    # may move auto's choice mid-run)
    env.setdefault("GPUPARITY_PROBE_REFINE", "off")
    # and first calls wait for their verdict (else the op's baseline, torch's SDPA for attention,
    # serves them while the check runs, and FlashAttention's tests would be checking that)
    env.setdefault("GPUPARITY_FIRST_CALLS", "wait")
    env["PYTHONPATH"] = os.pathsep.join([HERE, os.path.join(ROOT, "src")] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.setdefault("PYTHONUNBUFFERED", "1")
    log = os.path.join(work, f"{stem}.log")
    timed_out = False
    with open(log, "w") as f:
        f.write(" ".join(cmd) + "\n")
        f.flush()
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = proc.wait(timeout=budget_s + GRACE_S)
        except subprocess.TimeoutExpired:
            timed_out = True
            os.killpg(proc.pid, signal.SIGKILL)     # its own session: pytest and what it started
            rc = proc.wait()
    record: Dict[str, Any] = {"file": path, "rc": rc, "killed_past_budget": timed_out, "budget_s": round(budget_s, 1),
                              "wall_s": round(time.time() - started, 1), "cmd": cmd}
    if os.path.exists(results):
        with open(results) as f:
            record.update(json.load(f))
    else:
        with open(log) as f:
            record["tail"] = f.read()[-3000:]
    return record


def totals(record: Dict[str, Any]) -> Dict[str, int]:
    counts = {outcome: 0 for outcome in OUTCOMES}
    for test in record.get("tests", {}).values():
        counts[test["outcome"] or "no_outcome"] = counts.get(test["outcome"] or "no_outcome", 0) + 1
    counts["selected"] = len(record.get("selected", ()))
    counts["cases"] = sum(s["cases"] for s in record.get("sampling", {}).values())
    counts["deselected_internals"] = sum(d["cases"] for d in record.get("deselected_internals", ()))
    counts["collect_errors"] = len(record.get("collect_errors", ()))
    return counts


def per_test(record: Dict[str, Any]) -> Dict[str, Dict[str, Any]]:
    rows: Dict[str, Dict[str, Any]] = {}
    for name, sampling in record.get("sampling", {}).items():
        rows[name] = dict(sampling, **{o: 0 for o in OUTCOMES})
    for nodeid, test in record.get("tests", {}).items():
        name = nodeid.split("[")[0]
        row = rows.setdefault(name, {o: 0 for o in OUTCOMES})
        row[test["outcome"] or "no_outcome"] = row.get(test["outcome"] or "no_outcome", 0) + 1
    return rows


def summary_md(report: Dict[str, Any]) -> str:
    lines = [f"# FlashAttention's own tests against gpuparity.flash_attn.install()", "",
             f"FlashAttention commit {report['commit']}; budget {report['budget_s']} s; seed {report['seed']}; "
             f"max cases per test {report['max_cases_per_test']}; gpuparity backend {report.get('backend', 'auto')}"
             + ("; collect only" if report["collect_only"] else ""),
             "", "| file | cases | selected | passed | failed | skipped | not run (budget) | internals (allowed skip) "
             "| collect errors | rc | wall s |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for rec in report["files"]:
        t = rec["totals"]
        lines.append(f"| {rec['file']} | {t['cases']} | {t['selected']} | {t['passed']} | "
                     f"{t['failed'] + t['error_setup'] + t['error_teardown']} | {t['skipped']} | {t['not_run_budget']} | "
                     f"{t['deselected_internals']} | {t['collect_errors']} | {rec['rc']}"
                     f"{' (killed)' if rec['killed_past_budget'] else ''} | {rec['wall_s']} |")
    lines += ["", "## Per test", "", "| test | cases | covering | selected | passed | failed | skipped | not run |",
              "|---|---|---|---|---|---|---|---|"]
    for rec in report["files"]:
        for name, row in per_test(rec).items():
            lines.append(f"| {name} | {row.get('cases', '')} | {row.get('covering', '')} | {row.get('selected', '')} | "
                         f"{row['passed']} | {row['failed'] + row['error_setup'] + row['error_teardown']} | "
                         f"{row['skipped']} | {row['not_run_budget']} |")
    failures = [(n, t) for rec in report["files"] for n, t in rec.get("tests", {}).items()
                if t["outcome"] in ("failed", "error_setup", "error_teardown")]
    if failures:
        lines += ["", "## Failures", ""] + [f"- `{n}`: {t.get('message', '')}" for n, t in failures]
    reasons: Dict[str, int] = {}
    for rec in report["files"]:
        for t in rec.get("tests", {}).values():
            if t["outcome"] == "skipped":
                reasons[t.get("reason", "")] = reasons.get(t.get("reason", ""), 0) + 1
    if reasons:
        lines += ["", "## Skip reasons", ""] + [f"- {n} x {r}" for r, n in sorted(reasons.items(), key=lambda x: -x[1])]
    internals = [d for rec in report["files"] for d in rec.get("deselected_internals", ())]
    if internals:
        lines += ["", "## Allowed skips: FlashAttention's C++ internals (deselected)", ""]
        lines += [f"- `{d['test']}` ({d['cases']} cases): {d['reason']}" for d in internals]
    supplied = {d["name"]: d for rec in report["files"] for d in rec.get("supplied_by_harness", ())}
    if supplied:
        lines += ["", "## Supplied by the harness (old transformers functions, only while its file is imported)", ""]
        lines += [f"- `{d['name']}` for {d['for']}: {d['why']}" for d in supplied.values()]
    errors = [(rec["file"], e) for rec in report["files"] for e in rec.get("collect_errors", ())]
    if errors:
        lines += ["", "## Collection errors", ""]
        for path, e in errors:
            last = [l for l in e["error"].splitlines() if l.startswith("E ")]
            lines.append(f"- {path}: {(last[-1][1:].strip() if last else e['error'][-300:])}")
    for rec in report["files"]:
        if "not_run" in rec:
            lines += ["", f"## {rec['file']}: not run: {rec['not_run']}"]
        if "tail" in rec:
            lines += ["", f"## {rec['file']}: no results written (log tail)", "", "```", rec["tail"][-1500:], "```"]
    return "\n".join(lines) + "\n"


def main(argv: List[str] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tests", default=".fa_tests", help="folder from fa_own_tests_prepare.sh (default .fa_tests)")
    parser.add_argument("--out", required=True, help="folder for results.json, summary.md, logs")
    parser.add_argument("--budget-s", type=float, default=420.0, help="seconds for all files together (default 420)")
    parser.add_argument("--max-cases-per-test", type=int, default=16,
                        help="cases per test function after the covering, which is kept whole (default 16)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--per-test-timeout-s", type=int, default=120, help="with pytest-timeout, per case (default 120)")
    parser.add_argument("--files", nargs="*", default=None, help="a subset of FILES' paths")
    parser.add_argument("--collect-only", action="store_true", help="collect (imports every file) without running")
    parser.add_argument("--assume-capability", default=None,
                        help="MAJOR.MINOR for torch.cuda.get_device_capability where CUDA is absent (--collect-only)")
    parser.add_argument("--backend", default="triton",
                        help="gpuparity backend for every flash_attn op that has one (default triton: gpuparity's "
                             "own kernels by name, no first-call verification or background timing); auto: "
                             "auto's verified choice, with background refinement off")
    args = parser.parse_args(argv)
    if args.budget_s <= 0:
        parser.error(f"--budget-s: expected > 0, got {args.budget_s}")
    if args.max_cases_per_test < 0:
        parser.error(f"--max-cases-per-test: expected >= 0, got {args.max_cases_per_test}")
    args.tests = os.path.abspath(args.tests)
    known = [path for path, _ in FILES]
    chosen = [(p, w) for p, w in FILES if args.files is None or p in args.files]
    unknown = sorted(set(args.files or ()) - set(known))
    if unknown:
        parser.error(f"--files: {unknown} not among {known}")
    missing = [p for p, _ in chosen if not os.path.isfile(os.path.join(args.tests, p))]
    if missing:
        parser.error(f"--tests {args.tests}: missing {missing}; run benchmarks/scripts/fa_own_tests_prepare.sh first")
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    work = tempfile.mkdtemp(prefix="fa_own_tests_")
    with open(os.path.join(work, "pytest.ini"), "w") as f:
        f.write("[pytest]\n")
    suites = ET.Element("testsuites")
    logs = open(os.path.join(out, "logs.txt"), "w")
    commit_file = os.path.join(args.tests, "COMMIT")
    commit = open(commit_file).read().strip() if os.path.exists(commit_file) else "unknown"
    started = time.time()
    report: Dict[str, Any] = {"commit": commit, "budget_s": args.budget_s, "seed": args.seed, "backend": args.backend,
                              "max_cases_per_test": args.max_cases_per_test, "collect_only": args.collect_only,
                              "python": sys.version.split()[0], "files": []}
    for k, (path, weight) in enumerate(chosen):
        left = args.budget_s - (time.time() - started)
        if left < 5 and not args.collect_only:       # an earlier file ran into its grace time
            report["files"].append({"file": path, "rc": None, "killed_past_budget": False, "budget_s": 0.0,
                                    "wall_s": 0.0, "not_run": "the budget was spent by the files before it",
                                    "totals": totals({})})
            print(f"fa_own_tests: {path}: not run, the budget is spent", flush=True)
            continue
        share = max(left * weight / sum(w for _, w in chosen[k:]), 1.0)
        print(f"fa_own_tests: {path}: budget {share:.0f} s", flush=True)
        rec = run_file(args, path, share, work)
        rec["totals"] = totals(rec)
        stem = _stem(path)
        with open(os.path.join(work, f"{stem}.log")) as f:
            logs.write(f"===== {path}\n{f.read()}\n")
        logs.flush()
        xml = os.path.join(work, f"{stem}.xml")
        if os.path.exists(xml):
            root = ET.parse(xml).getroot()
            suites.extend(root.iter("testsuite"))
        report["files"].append(rec)
        print(f"fa_own_tests: {path}: rc {rec['rc']} in {rec['wall_s']} s: "
              + ", ".join(f"{k} {v}" for k, v in rec["totals"].items() if v), flush=True)
    report["wall_s"] = round(time.time() - started, 1)
    logs.close()
    shutil.rmtree(work, ignore_errors=True)
    ET.ElementTree(suites).write(os.path.join(out, "junit.xml"), encoding="utf-8", xml_declaration=True)
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(report, f, indent=1, default=str)
    text = summary_md(report)
    with open(os.path.join(out, "summary.md"), "w") as f:
        f.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
