#!/usr/bin/env bash
# README command 1's doctor and `doctor --quick`, timed on a GPU machine (issue 45's targets: the
# default doctor within 175 s with Triton's cache warm, --quick within 45 s there). Runs, in order:
# the setup, `doctor --quick` (Triton's cache cold for the battery's kernels), the default doctor
# (stores the verdicts, timings and probe outcomes that --quick then keeps), `doctor --quick` again, warm.
# Writes $OUT: times.txt (walls and each run's `time:` line), runs.tgz (the JSON reports and logs).
# About 4-5 minutes on an H100 (benchmarks/records/h100/doctor-2026-12-06.md).
set -u
OUT=${OUT:-out/doctor-times}
mkdir -p "$OUT/runs"
S=$(date +%s)
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null; git log --oneline -1; date -u; } > "$OUT/times.txt"
timed() {   # name, limit, command...
  local name=$1 limit=$2; shift 2
  local t=$(date +%s)
  timeout "$limit" "$@" > "$OUT/runs/$name.log" 2>&1
  echo "$name rc=$? wall $(( $(date +%s) - t )) s | $(grep '^time:' "$OUT/runs/$name.log" | tail -1)" >> "$OUT/times.txt"
}
timed setup 120 bash scripts/setup.sh
timed quick-cold 150 .venv/bin/gpuparity doctor --quick --json "$OUT/runs/quick-cold.json"
timed default 300 .venv/bin/gpuparity doctor --json "$OUT/runs/default.json"
timed quick-warm 150 .venv/bin/gpuparity doctor --quick --json "$OUT/runs/quick-warm.json"
echo "total $(( $(date +%s) - S )) s" >> "$OUT/times.txt"
python3 - "$OUT"/runs/quick-cold.json "$OUT"/runs/default.json "$OUT"/runs/quick-warm.json >> "$OUT/times.txt" 2>&1 <<'PY'
import json, os, sys
for path in sys.argv[1:]:
    try:
        report = json.load(open(path))
    except (OSError, ValueError) as exc:
        print(os.path.basename(path), "unreadable:", exc)
        continue
    runners = {}
    for result in report.get("known_issues", []):
        outcome = result.get("probe_outcome") or {}
        if outcome:
            runner = "kept" if outcome.get("reused") else outcome.get("runner")
            runners[runner] = runners.get(runner, 0) + 1
    print(os.path.basename(path), "phases", report.get("phases_s"), "| timings kept", report.get("timings_reused"),
          "| probe outcomes kept", report.get("probes_reused"), "| probe runners", runners)
PY
tar czf "$OUT/runs.tgz" -C "$OUT" runs && rm -rf "$OUT/runs"
cat "$OUT/times.txt"
