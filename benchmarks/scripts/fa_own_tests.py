"""FlashAttention's own test files, unmodified, against gpuparity.flash_attn.install() (issue 46).

    bash benchmarks/scripts/fa_own_tests_prepare.sh          # here: exports them into .fa_tests/
    python benchmarks/scripts/fa_own_tests.py --tests .fa_tests --out $OUT/fa --budget-s 420 --jobs 12   # on the GPU

Runs pytest with benchmarks/scripts/fa_own_tests_plugin.py, which installs gpuparity's
flash_attn, samples the parametrized cases (a seeded covering of every parameter value, then up
to --max-cases-per-test), deselects the tests that call FlashAttention's C++ internals and
supplies the old transformers functions tests/layers/test_rotary.py imports. In two steps:

1. collection: one `pytest --collect-only` per file, all at once, records each file's selected
   cases and their parameters; their counts, the shard plan and a rough estimate are printed
   before anything runs.
2. the run: each file's selected cases are split into shards by a key that groups the cases
   sharing Triton kernels (the test and every parameter but the shapes': dtype, head dim,
   causal / local / alibi / ... flags; see kernel_key), whole groups to the shard with the fewest
   cases, so a kernel is compiled by one process only. --jobs (default min(12, CPU count))
   shards in all, spread over the files by their case counts (one at least each), run as
   concurrent pytest processes on the same GPU (each compiles single-threaded: on a cold Triton
   cache compiling dominates, so they run side by side; they share Triton's disk cache,
   TRITON_CACHE_DIR, Triton's default place unless set). One global deadline, --budget-s after
   the start: cases a shard has not reached by then are 'not run (budget)'; a shard still running
   GRACE_S after it is killed. A shard that crashes or is killed loses only its own cases, recorded
   as 'lost (shard)' with the shard's rc (its log is in the tar).

Writes four files under --out (the GPU machine returns at most 8): results.json (every case, per
test and per file totals, each file's merged record and its shards), summary.md, junit.xml
(every shard's suites) and logs.tar.gz (the collection's and every shard's pytest output, record,
selection and junit file).

--backend (default triton) names the gpuparity backend of every flash_attn op that has one: the
tests then run gpuparity's own Triton kernels, with no first-call verification per new (op, dtype,
kind) and no background timing of other backends; --backend auto tests auto's verified choice
(which may be torch's SDPA for some calls) with that background timing off and first calls
waiting for their verdict (GPUPARITY_FIRST_CALLS=wait).
--collect-only --assume-capability 9.0 is the plumbing check on a machine without CUDA (the files
call torch.cuda.get_device_capability at import): step 1 and the plan, nothing run.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
from typing import Any, Dict, List, Optional, Sequence

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
FILES = ("tests/losses/test_cross_entropy.py", "tests/layers/test_rotary.py", "tests/ops/triton/test_layer_norm.py",
         "tests/test_flash_attn.py")
OUTCOMES = ("passed", "failed", "skipped", "not_run_budget", "lost_shard", "xfailed", "xpassed", "error_setup",
            "error_teardown")
GRACE_S = 60.0          # past the deadline (the case running then, teardown) before a shard is killed
COLLECT_TIMEOUT_S = 300.0
# parameters that change only shapes (sizes, offsets, their order), not which Triton kernels a case
# compiles: left out of the sharding key
SHAPE_PARAMS = re.compile(r"seqlen|batch|nheads|swap_sq_sk")
# the printed estimate, rough: each kernel group compiles on a cold cache (seconds: the 2026-12-06
# H100 record ran about 9 s a case, mostly compiling, in one process), each case then runs briefly
START_S, GROUP_S, CASE_S = 30.0, 8.0, 1.0


def _stem(path: str) -> str:
    return os.path.splitext(os.path.basename(path))[0]


def kernel_key(nodeid: str, params: Dict[str, str]) -> str:
    """The sharding key of a case: its test and every parameter but those SHAPE_PARAMS names."""
    kept = sorted((arg, value) for arg, value in params.items() if not SHAPE_PARAMS.search(arg))
    return nodeid.split("[")[0] + "[" + ",".join(f"{arg}={value}" for arg, value in kept) + "]"


def shard_cases(nodeids: Sequence[str], keys: Sequence[str], n: int) -> List[List[str]]:
    """`nodeids` split into at most n shards, never splitting the cases of one key: groups in order
    of size (largest first, then first appearance), each to the shard with the fewest cases so far
    (the lowest index on ties). Each shard keeps its ids in the input order; no empty shard."""
    if len(nodeids) != len(keys):
        raise ValueError(f"shard_cases: {len(nodeids)} node ids but {len(keys)} keys")
    if n < 1:
        raise ValueError(f"shard_cases: n: expected >= 1, got {n!r}")
    groups: Dict[str, List[int]] = {}
    for i, key in enumerate(keys):
        groups.setdefault(key, []).append(i)
    n = min(n, len(groups))
    loads, members = [0] * n, [[] for _ in range(n)]
    for key in sorted(groups, key=lambda k: (-len(groups[k]), groups[k][0])):
        j = min(range(n), key=lambda j: (loads[j], j))
        loads[j] += len(groups[key])
        members[j].extend(groups[key])
    return [[nodeids[i] for i in sorted(m)] for m in members]


def allocate_jobs(cases: Dict[str, int], groups: Dict[str, int], jobs: int) -> Dict[str, int]:
    """Shards per file: one for each file with cases, then one at a time to the file with the most
    cases per shard (the first such file on ties), never more than its groups, until `jobs` are
    given (a file with no case gets none; more files than jobs still get one each)."""
    if jobs < 1:
        raise ValueError(f"allocate_jobs: jobs: expected >= 1, got {jobs!r}")
    shards = {path: (1 if n else 0) for path, n in cases.items()}
    while sum(shards.values()) < jobs:
        open_ = [p for p in cases if shards[p] and shards[p] < groups[p]]
        if not open_:
            break
        best = max(open_, key=lambda p: (cases[p] / shards[p], -list(cases).index(p)))
        shards[best] += 1
    return shards


def estimate_s(shard_groups: Sequence[int], shard_cases_: Sequence[int]) -> float:
    """Rough seconds for the slowest shard (all shards run at once)."""
    return max((START_S + GROUP_S * g + CASE_S * c for g, c in zip(shard_groups, shard_cases_)), default=0.0)


def merge_file(path: str, collect: Dict[str, Any], shards: Sequence[Dict[str, Any]]) -> Dict[str, Any]:
    """One file's record from its collection record and its shards' runs (each: index, cases (node
    ids), groups, rc, killed_past_budget, wall_s, started (False: never started, the budget spent),
    results (the plugin's record or None), log). Every selected case gets an outcome: the shard's,
    else not_run_budget (a shard never started, or killed at the deadline before reaching it), else
    lost_shard (a shard crashed, or was killed while running it)."""
    rec: Dict[str, Any] = {"file": path}
    for key in ("sampling", "deselected_internals", "supplied_by_harness", "install", "backends", "assumed_capability"):
        if key in collect:
            rec[key] = collect[key]
    errors = {e["nodeid"]: e for e in collect.get("collect_errors", ())}
    for shard in shards:
        for e in (shard.get("results") or {}).get("collect_errors", ()):
            errors.setdefault(e["nodeid"], e)
    rec["collect_errors"] = list(errors.values())
    rec["selected"] = list(collect.get("selected", ()))
    tests: Dict[str, Dict[str, Any]] = {}
    for shard in shards:
        res = shard.get("results") or {}
        got = res.get("tests", {})
        finished = (shard["started"] and not shard["killed_past_budget"] and shard["rc"] in (0, 1)
                    and res.get("exitstatus") is not None)
        for nodeid in shard["cases"]:
            t = got.get(nodeid)
            if t is not None and t.get("outcome"):
                tests[nodeid] = dict(t, shard=shard["index"])
            elif not shard["started"]:
                tests[nodeid] = {"outcome": "not_run_budget", "shard": shard["index"],
                                 "reason": "its shard was not started: the budget was spent"}
            elif shard["killed_past_budget"] and t is None:
                tests[nodeid] = {"outcome": "not_run_budget", "shard": shard["index"],
                                 "reason": "not reached: its shard was killed past the deadline"}
            else:
                why = ("its shard was killed past the deadline while running it" if shard["killed_past_budget"]
                       else f"its shard ended (rc {shard['rc']}) without reporting it" if finished
                       else f"its shard crashed (rc {shard['rc']}, pytest exit status {res.get('exitstatus')})")
                tests[nodeid] = {"outcome": "lost_shard", "shard": shard["index"], "reason": why}
    order = {nodeid: k for k, nodeid in enumerate(rec["selected"])}
    rec["tests"] = dict(sorted(tests.items(), key=lambda kv: order.get(kv[0], len(order))))
    rcs = [s["rc"] for s in shards if s["started"]]
    rec["rc"] = next((rc for rc in rcs if rc != 0), 0 if rcs else None)
    rec["killed_past_budget"] = any(s["killed_past_budget"] for s in shards)
    rec["wall_s"] = max((s["wall_s"] for s in shards), default=0.0)
    rec["shards"] = [{k: s[k] for k in ("index", "groups", "rc", "killed_past_budget", "wall_s", "started", "log")}
                     | {"cases": len(s["cases"]), "exitstatus": (s.get("results") or {}).get("exitstatus"),
                        "select_missing": (s.get("results") or {}).get("select_missing", [])}
                     for s in shards]
    return rec


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


def _pytest_cmd(args, path: str, work: str, name: str) -> List[str]:
    return [sys.executable, "-m", "pytest", os.path.join(args.tests, path), "-p", "fa_own_tests_plugin",
            "-p", "no:cacheprovider", "-p", "no:xdist", "-c", os.path.join(work, "pytest.ini"),
            "--rootdir", args.tests, "-rA", "-q", "--junitxml", os.path.join(work, f"{name}.xml"),
            "--fa-results", os.path.join(work, f"{name}.json"), "--fa-max-cases-per-test", str(args.max_cases_per_test),
            "--fa-seed", str(args.seed), "--fa-backend", args.backend] + (
        ["--fa-assume-capability", args.assume_capability] if args.assume_capability else [])


def _env(jobs: int) -> Dict[str, str]:
    env = dict(os.environ)
    # auto: no background timing of the other backends (it competes with the tests for the GPU and
    # may move auto's choice mid-run)
    env.setdefault("GPUPARITY_PROBE_REFINE", "off")
    # and first calls wait for their verdict (else the op's baseline, torch's SDPA for attention,
    # serves them while the check runs, and FlashAttention's tests would be checking that)
    env.setdefault("GPUPARITY_FIRST_CALLS", "wait")
    # one Triton disk cache for every process (Triton's own default place, named so all agree)
    env.setdefault("TRITON_CACHE_DIR", os.path.join(env.get("TRITON_HOME") or os.path.expanduser("~"), ".triton", "cache"))
    # the shards share the CPU cores: torch's CPU threads (the tests' references) split them
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // max(1, jobs))))
    env["PYTHONPATH"] = os.pathsep.join([HERE, os.path.join(ROOT, "src")] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


_live: Dict[int, subprocess.Popen] = {}      # running pytest processes, killed if the driver is interrupted
_live_lock = threading.Lock()


def run_pytest(cmd: List[str], env: Dict[str, str], log: str, timeout_s: float) -> Dict[str, Any]:
    """Runs cmd (its output to log) in its own session; killed with all it started after timeout_s."""
    started = time.time()
    killed = False
    with open(log, "w") as f:
        f.write(" ".join(cmd) + "\n")
        f.flush()
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        with _live_lock:
            _live[proc.pid] = proc
        try:
            rc = proc.wait(timeout=max(timeout_s, 1.0))
        except subprocess.TimeoutExpired:
            killed = True
            os.killpg(proc.pid, signal.SIGKILL)     # its own session: pytest and what it started
            rc = proc.wait()
        finally:
            with _live_lock:
                _live.pop(proc.pid, None)
    return {"rc": rc, "killed_past_budget": killed, "wall_s": round(time.time() - started, 1)}


def _load(path: str) -> Optional[Dict[str, Any]]:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _tail(path: str, n: int = 3000) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read()[-n:]
    except OSError:
        return ""


def collect(args, path: str, work: str, env: Dict[str, str], timeout_s: float) -> Dict[str, Any]:
    """Step 1 for one file: its plugin record after --collect-only (selected cases, their params)."""
    name = f"collect_{_stem(path)}"
    run = run_pytest(_pytest_cmd(args, path, work, name) + ["--collect-only"], env,
                     os.path.join(work, f"{name}.log"), timeout_s)
    record = _load(os.path.join(work, f"{name}.json"))
    out = dict(record or {}, collect_rc=run["rc"], collect_wall_s=run["wall_s"], collect_killed=run["killed_past_budget"])
    if record is None:
        out["tail"] = _tail(os.path.join(work, f"{name}.log"))
    return out


def plan(args, records: Dict[str, Dict[str, Any]]) -> List[Dict[str, Any]]:
    """The shards of every file: kernel groups split by shard_cases, --jobs spread by allocate_jobs."""
    keyed = {}
    for path, rec in records.items():
        selected = rec.get("selected", [])
        params = rec.get("params", {})
        keyed[path] = (selected, [kernel_key(nodeid, params.get(nodeid, {})) for nodeid in selected])
    counts = {path: len(sel) for path, (sel, _) in keyed.items()}
    groups = {path: len(set(keys)) for path, (_, keys) in keyed.items()}
    per_file = allocate_jobs(counts, groups, args.jobs)
    shards = []
    for path, (selected, keys) in keyed.items():
        if not selected:
            continue
        key_of = dict(zip(selected, keys))
        for k, cases in enumerate(shard_cases(selected, keys, per_file[path])):
            shards.append({"file": path, "index": f"{_stem(path)}.{k}", "cases": cases,
                           "groups": len({key_of[c] for c in cases})})
    return shards


def run_shard(args, shard: Dict[str, Any], work: str, env: Dict[str, str], deadline: float) -> Dict[str, Any]:
    name = f"shard_{shard['index']}"
    log = os.path.join(work, f"{name}.log")
    shard = dict(shard, log=f"{name}.log", results=None)
    if time.time() > deadline - 5:      # queued (more shards than jobs) until the budget was spent
        return dict(shard, started=False, rc=None, killed_past_budget=False, wall_s=0.0)
    select = os.path.join(work, f"{name}.select")
    with open(select, "w") as f:
        f.write("".join(c + "\n" for c in shard["cases"]))
    cmd = _pytest_cmd(args, shard["file"], work, name) + ["--fa-select", select, "--fa-deadline", str(deadline)]
    if importlib.util.find_spec("pytest_timeout") is not None:
        cmd += ["--timeout", str(args.per_test_timeout_s)]
    run = run_pytest(cmd, env, log, deadline + GRACE_S - time.time())
    results = _load(os.path.join(work, f"{name}.json"))
    out = dict(shard, started=True, results=results, **run)
    if results is None or run["rc"] not in (0, 1):
        out["tail"] = _tail(log, 1500)
    return out


def summary_md(report: Dict[str, Any]) -> str:
    lines = [f"# FlashAttention's own tests against gpuparity.flash_attn.install()", "",
             f"FlashAttention commit {report['commit']}; budget {report['budget_s']} s; seed {report['seed']}; "
             f"max cases per test {report['max_cases_per_test']}; gpuparity backend {report.get('backend', 'auto')}; "
             f"jobs {report.get('jobs', 1)}; wall {report.get('wall_s', '')} s" + ("; collect only" if report["collect_only"] else ""),
             "", "| file | cases | selected | shards | passed | failed | skipped | not run (budget) | lost (shard) "
             "| internals (allowed skip) | collect errors | rc | wall s |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for rec in report["files"]:
        t = rec["totals"]
        lines.append(f"| {rec['file']} | {t['cases']} | {t['selected']} | {len(rec.get('shards', ()))} | {t['passed']} | "
                     f"{t['failed'] + t['error_setup'] + t['error_teardown']} | {t['skipped']} | {t['not_run_budget']} | "
                     f"{t['lost_shard']} | {t['deselected_internals']} | {t['collect_errors']} | {rec.get('rc')}"
                     f"{' (killed)' if rec.get('killed_past_budget') else ''} | {rec.get('wall_s', '')} |")
    lines += ["", "## Per test", "", "| test | cases | covering | selected | passed | failed | skipped | not run | lost |",
              "|---|---|---|---|---|---|---|---|---|"]
    for rec in report["files"]:
        for name, row in per_test(rec).items():
            lines.append(f"| {name} | {row.get('cases', '')} | {row.get('covering', '')} | {row.get('selected', '')} | "
                         f"{row['passed']} | {row['failed'] + row['error_setup'] + row['error_teardown']} | "
                         f"{row['skipped']} | {row['not_run_budget']} | {row['lost_shard']} |")
    failures = [(n, t) for rec in report["files"] for n, t in rec.get("tests", {}).items()
                if t["outcome"] in ("failed", "error_setup", "error_teardown")]
    if failures:
        lines += ["", "## Failures", ""] + [f"- `{n}`: {t.get('message', '')}" for n, t in failures]
    lost = [(n, t) for rec in report["files"] for n, t in rec.get("tests", {}).items() if t["outcome"] == "lost_shard"]
    if lost:
        lines += ["", "## Lost with their shard", ""] + [f"- `{n}` (shard {t['shard']}): {t['reason']}" for n, t in lost]
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
    shards = [(rec["file"], sh) for rec in report["files"] for sh in rec.get("shards", ())]
    if shards:
        lines += ["", "## Shards (logs in logs.tar.gz)", "", "| shard | cases | kernel groups | rc | wall s | log |",
                  "|---|---|---|---|---|---|"]
        lines += [f"| {sh['index']} | {sh['cases']} | {sh['groups']} | "
                  f"{sh['rc'] if sh['started'] else 'not started'}{' (killed)' if sh['killed_past_budget'] else ''} | "
                  f"{sh['wall_s']} | {sh['log']} |" for _, sh in shards]
    for rec in report["files"]:
        if "not_run" in rec:
            lines += ["", f"## {rec['file']}: not run: {rec['not_run']}"]
        if "tail" in rec:
            lines += ["", f"## {rec['file']}: no results written (log tail)", "", "```", rec["tail"][-1500:], "```"]
    return "\n".join(lines) + "\n"


def main(argv: List[str] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tests", default=".fa_tests", help="folder from fa_own_tests_prepare.sh (default .fa_tests)")
    parser.add_argument("--out", required=True, help="folder for results.json, summary.md, junit.xml, logs.tar.gz")
    parser.add_argument("--budget-s", type=float, default=420.0,
                        help="seconds from the start (collection included) to the deadline of every shard (default 420)")
    parser.add_argument("--jobs", type=int, default=min(12, os.cpu_count() or 1),
                        help="concurrent pytest processes (shards) over all files (default min(12, CPU count))")
    parser.add_argument("--max-cases-per-test", type=int, default=16,
                        help="cases per test function after the covering, which is kept whole (default 16)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--per-test-timeout-s", type=int, default=120, help="with pytest-timeout, per case (default 120)")
    parser.add_argument("--files", nargs="*", default=None, help="a subset of FILES' paths (tests/ optional)")
    parser.add_argument("--collect-only", action="store_true", help="collect (imports every file) and plan, without running")
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
    if args.jobs < 1:
        parser.error(f"--jobs: expected >= 1, got {args.jobs}")
    args.tests = os.path.abspath(args.tests)
    wanted = [p if p.startswith("tests/") else f"tests/{p}" for p in (args.files or ())]
    unknown = sorted(set(wanted) - set(FILES))
    if unknown:
        parser.error(f"--files: {unknown} not among {list(FILES)}")
    chosen = [p for p in FILES if args.files is None or p in wanted]
    missing = [p for p in chosen if not os.path.isfile(os.path.join(args.tests, p))]
    if missing:
        parser.error(f"--tests {args.tests}: missing {missing}; run benchmarks/scripts/fa_own_tests_prepare.sh first")
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    work = tempfile.mkdtemp(prefix="fa_own_tests_")
    with open(os.path.join(work, "pytest.ini"), "w") as f:
        f.write("[pytest]\n")
    commit_file = os.path.join(args.tests, "COMMIT")
    commit = open(commit_file).read().strip() if os.path.exists(commit_file) else "unknown"
    started = time.time()
    deadline = started + args.budget_s
    env = _env(args.jobs)
    report: Dict[str, Any] = {"commit": commit, "budget_s": args.budget_s, "seed": args.seed, "backend": args.backend,
                              "max_cases_per_test": args.max_cases_per_test, "collect_only": args.collect_only,
                              "jobs": args.jobs, "triton_cache_dir": env["TRITON_CACHE_DIR"],
                              "python": sys.version.split()[0], "files": []}
    try:
        # step 1: every file's collection at once
        timeout = COLLECT_TIMEOUT_S if args.collect_only else min(COLLECT_TIMEOUT_S, args.budget_s)
        with concurrent.futures.ThreadPoolExecutor(max_workers=min(args.jobs, len(chosen))) as pool:
            collected = dict(zip(chosen, pool.map(lambda p: collect(args, p, work, env, timeout), chosen)))
        shards = plan(args, collected)
        for path in chosen:
            mine = [s for s in shards if s["file"] == path]
            rec = collected[path]
            n_cases = sum(x["cases"] for x in rec.get("sampling", {}).values())
            print(f"fa_own_tests: {path}: {len(rec.get('selected', ()))} cases selected (of {n_cases}), "
                  f"{sum(s['groups'] for s in mine)} kernel groups, {len(mine)} shards of "
                  f"{[len(s['cases']) for s in mine]} cases; collected in {rec['collect_wall_s']} s"
                  + ("" if "tail" not in rec else f"; COLLECTION FAILED (rc {rec['collect_rc']})"), flush=True)
        est = estimate_s([s["groups"] for s in shards], [len(s["cases"]) for s in shards])
        print(f"fa_own_tests: {sum(len(s['cases']) for s in shards)} cases in {len(shards)} shards, {args.jobs} at once; "
              f"rough estimate on a cold Triton cache {est:.0f} s for the slowest shard (budget {args.budget_s:.0f} s, "
              f"{time.time() - started:.0f} s spent collecting)", flush=True)
        report["estimate_s"] = round(est, 1)
        runs: List[Dict[str, Any]] = []
        if not args.collect_only and shards:
            # step 2: the shards, --jobs at once, longest first
            order = sorted(shards, key=lambda s: -(GROUP_S * s["groups"] + CASE_S * len(s["cases"])))
            with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
                futures = {pool.submit(run_shard, args, s, work, env, deadline): s for s in order}
                for future in concurrent.futures.as_completed(futures):
                    run = future.result()
                    runs.append(run)
                    got = (run.get("results") or {}).get("tests", {})
                    counts: Dict[str, int] = {}
                    for t in got.values():
                        counts[t["outcome"] or "running"] = counts.get(t["outcome"] or "running", 0) + 1
                    print(f"fa_own_tests: shard {run['index']}: rc {run['rc']}"
                          f"{' (killed)' if run['killed_past_budget'] else ''} in {run['wall_s']} s: "
                          + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())), flush=True)
        for path in chosen:
            rec = collected[path]
            if args.collect_only or "tail" in rec:
                merged = dict(rec, file=path, rc=rec["collect_rc"], killed_past_budget=rec["collect_killed"],
                              wall_s=rec["collect_wall_s"], shards=[])
                merged.pop("params", None)
                if "tail" in rec:
                    merged["not_run"] = "its collection wrote no record"
            else:
                merged = merge_file(path, rec, sorted((r for r in runs if r["file"] == path), key=lambda r: r["index"]))
                merged["collect_wall_s"] = rec["collect_wall_s"]
            merged["totals"] = totals(merged)
            report["files"].append(merged)
            print(f"fa_own_tests: {path}: " + ", ".join(f"{k} {v}" for k, v in merged["totals"].items() if v), flush=True)
    finally:
        with _live_lock:
            for proc in list(_live.values()):
                os.killpg(proc.pid, signal.SIGKILL)
    report["wall_s"] = round(time.time() - started, 1)
    suites = ET.Element("testsuites")
    for name in sorted(os.listdir(work)):
        if name.startswith("shard_") and name.endswith(".xml"):
            try:
                suites.extend(ET.parse(os.path.join(work, name)).getroot().iter("testsuite"))
            except ET.ParseError:
                pass        # a shard killed while writing it
    ET.ElementTree(suites).write(os.path.join(out, "junit.xml"), encoding="utf-8", xml_declaration=True)
    with tarfile.open(os.path.join(out, "logs.tar.gz"), "w:gz") as tar:
        tar.add(work, arcname="fa_own_tests_logs")
    shutil.rmtree(work, ignore_errors=True)
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(report, f, indent=1, default=str)
    text = summary_md(report)
    with open(os.path.join(out, "summary.md"), "w") as f:
        f.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
