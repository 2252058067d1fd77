"""Summaries for benchmarks/scripts/gpu_run.sh: `trace-workload RESULTS OUT_JSON`, `fleet DIR`, `audit DIR`
and `not-run CHECK_JSON` (the audit step's resume list)."""
import json
import os
import sys


def trace_workload(args):
    """Collect the trace/workload step results (steps.tsv and each JSON report) into one summary."""
    results, out = args
    def load(name):
        try:
            with open(os.path.join(results, name)) as handle:
                return json.load(handle)
        except (OSError, ValueError):
            return None
    steps = []
    with open(os.path.join(results, "steps.tsv")) as handle:
        for line in handle:
            name, rc, expected, seconds = line.rstrip("\n").split("\t")
            steps.append({"step": name, "exit": int(rc), "expected": int(expected), "seconds": int(seconds),
                          "as_expected": rc == expected})
    summary = {"schema_version": 1, "steps": steps, "traces": {}, "replays": {}, "workloads": {}, "comparisons": {}}
    for name in sorted(os.listdir(results)):
        data = load(name) if name.endswith(".json") else None
        if not data:
            continue
        key = name[:-5]
        kind = data.get("kind", "")
        if kind == "gpuparity-trace-comparison":
            first = data.get("first_forward") or {}
            worst = max((r["err"] for r in data["forward"] if r.get("err") is not None), default=None)
            summary["traces"][key] = {"passed": data["passed"], "identity": data["identity"],
                                      "first_forward": first.get("key"),
                                      "first_backward": (data.get("first_backward") or {}).get("key"),
                                      "max_forward_rel_err": worst, "rows": len(data["forward"])}
        elif kind == "gpuparity-trace-replay":
            summary["replays"][key] = {"passed": data["passed"],
                                       "culprit_forward": (data.get("culprit_forward") or {}).get("key"),
                                       "culprit_backward": (data.get("culprit_backward") or {}).get("key")}
        elif kind == "gpuparity-workload-run":
            summary["workloads"][key] = {"status": data["status"], "attn": data.get("attn"), "dtype": data["dtype"],
                                         "steps": data["steps"], "final": data["final"],
                                         "step_time_ms_median": data.get("step_time_ms_median"),
                                         "time_s": data.get("time_s"), "error": data.get("error")}
        elif kind == "gpuparity-workload-comparison":
            summary["comparisons"][key] = {"passed": data["passed"], "problems": data["problems"],
                                           "worst_loss_diff": data["tracking"]["worst_rel_diff"],
                                           "final": {m["name"]: m["rel_diff"] for m in data["final"]}}
        elif "attempts" in data:
            summary["compile_check"] = {"backend": data["backend"], "wrong_answer": data["wrong_answer"],
                                        "attempts": [(a["backend"], a["status"], a["err"], a["seconds"])
                                                     for a in data["attempts"]]}
    with open(out, "w") as handle:
        json.dump(summary, handle, indent=1)
    bad = [s["step"] for s in steps if not s["as_expected"]]
    print("\n=== summary:", len(steps), "steps,", len(bad), "not as expected", bad)
    print(json.dumps({k: v for k, v in summary.items() if k != "steps"}, indent=1))


def fleet(args):
    """Print the fleet reports' verdicts, the large collectives and the aam profiles."""
    out = args[0]
    def load(name):
        path = os.path.join(out, name)
        return json.load(open(path)) if os.path.exists(path) else None
    for name in ("fleet.json", "fleet_battery.json"):
        rep = load(name)
        if not rep:
            print(name, "missing"); continue
        s = rep["summary"]
        print(name, s["status"], "exit", s["exit_code"], "suspects", s["suspect_ranks"], "medians", s["medians"])
        for row in rep["ranks"]:
            p = row.get("probes", {})
            print("  rank", row["rank"], row["status"], row.get("device_name"), "battery", row.get("battery", {}).get("status"),
                  "matmul TFLOP/s", p.get("matmul", {}).get("tflops"), "copy GB/s", p.get("copy", {}).get("gbps"))
        for c in rep["collectives"]:
            if c["bytes"] >= (1 << 27) or c["wrong"]:
                print("  %-14s %-8s %10d B  wrong %d  algbw %s  busbw %s" % (c["collective"], c["dtype"], c["bytes"], c["wrong"],
                      c["algbw_gbps"] and round(c["algbw_gbps"], 1), c["busbw_gbps"] and round(c["busbw_gbps"], 1)))
    mem = load("aam_memory.json")
    if mem:
        print("aam memory: peak allocated %.0f MiB, reserved %.0f MiB, utilisation %s" % (
            (mem["peak_allocated_bytes"] or 0) / 2**20, (mem["peak_reserved_bytes"] or 0) / 2**20, mem["utilisation"]))
        for ph in mem["phases"]:
            print("  %-16s calls %4d  peak alloc %8.1f MiB" % (ph["name"], ph["calls"], (ph["peak_allocated_bytes"] or 0) / 2**20))
    ker = load("aam_kernels.json")
    if ker:
        print("aam kernels:", ker.get("error") or "%d steps, %.3f ms/step (%s)" % (ker["steps_profiled"], ker["total_time_per_step_us"] / 1e3, ker["time_basis"]))
        for k in ker.get("top", [])[:10]:
            print("  %5.1f%%  %8.3f ms/step  %s" % (100 * k["share"], k["time_per_step_us"] / 1e3, k["name"][:90]))


def audit(args):
    """One line per `gpuparity check --json` of the audit step: its statuses, then each FAIL, and
    each ERROR or TIMEOUT that is not the machine's (out of memory)."""
    import collections
    import glob
    for path in sorted(glob.glob(os.path.join(args[0], "*.json"))):
        with open(path) as handle:
            results = json.load(handle)["results"]
        print(os.path.basename(path), dict(collections.Counter(r["status"] for r in results)))
        for r in results:
            if r["status"] in ("FAIL", "ERROR", "TIMEOUT", "CRASH") and "out of memory" not in r["reason"]:
                print("  ", r["status"], r["backend"], r["dtype"], r["case"], r["reason"][:300].replace("\n", " "))


def not_run(args):
    """The case names a `gpuparity check --json` left NOT_RUN, comma-separated (the audit's resume)."""
    with open(args[0]) as handle:
        results = json.load(handle)["results"]
    print(",".join(sorted({r["case"] for r in results if r["status"] == "NOT_RUN"})))


if __name__ == "__main__":
    {"trace-workload": trace_workload, "fleet": fleet, "audit": audit, "not-run": not_run}[sys.argv[1]](sys.argv[2:])
