#!/usr/bin/env bash
# Issue 5 on a GPU: traces (GPU vs CPU, triton vs math, the planted mask bug), trace replay,
# workload runs (aam with --attn triton / sdpa_math / the planted bug; cnn isolated) and
# workload compare, plus compile-check. Made for an NVIDIA H100/H200 with torch 2.11 and
# triton 3.6; finishes in under 4 minutes there.
#
#   PYTHONPATH=src OUT=out/gpu bash benchmarks/scripts/gpu_trace_workload.sh
#
# Writes under $OUT (at most 8 files, as the lent GPU machines return): log.txt (everything
# printed), summary.json (exit codes, verdicts, key numbers), two loss-curve plots, one trace
# plot, and results.tar.gz (every JSON/HTML report). Traces stay in $TMPDIR (they are large).
# Each step's expected exit code is in the summary: 0 = agrees, 1 = diverges (the planted bug).
set -u -o pipefail
OUT=${OUT:-out/gpu_trace_workload}
export PYTHONPATH=${PYTHONPATH:-src}
export PYTHONUNBUFFERED=1
R="$OUT/results"
T="${TMPDIR:-/tmp}/gpuparity-traces"
mkdir -p "$R"
rm -rf "$T" && mkdir -p "$T"
exec > >(tee "$OUT/log.txt") 2>&1

GP=(python3 -m gpuparity)
STEPS_FILE="$R/steps.tsv"
: > "$STEPS_FILE"
SECONDS=0

# step NAME EXPECTED_EXIT TIMEOUT_S COMMAND...
step() {
    local name=$1 expected=$2 limit=$3
    shift 3
    echo
    echo "=== [$SECONDS s] $name (expect exit $expected): $*"
    local start=$SECONDS
    timeout "$limit" "$@"
    local rc=$?
    echo "=== $name: exit $rc (expected $expected) in $((SECONDS - start)) s"
    printf '%s\t%s\t%s\t%s\n' "$name" "$rc" "$expected" "$((SECONDS - start))" >> "$STEPS_FILE"
}

AAM=gpuparity.workloads.aam:trace_factory
echo "gpuparity issue-5 GPU run, $(date -u +%Y-%m-%dT%H:%M:%SZ)"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"
step env 0 60 "${GP[@]}" env --json "$R/env.json"

# ---------------------------------------------------------------- traces (small aam model)
step record_cpu_math 0 60 "${GP[@]}" trace record $AAM --device cpu --factory-arg attn=sdpa_math --out "$T/cpu_math"
step record_cuda_math 0 60 "${GP[@]}" trace record $AAM --device cuda --factory-arg attn=sdpa_math --out "$T/cuda_math"
step record_cuda_triton 0 60 "${GP[@]}" trace record $AAM --device cuda --factory-arg attn=triton --out "$T/cuda_triton"
step record_cuda_triton_bf16 0 60 "${GP[@]}" trace record $AAM --device cuda --dtype bfloat16 \
    --factory-arg attn=triton --out "$T/cuda_triton_bf16"
step record_cuda_planted 0 60 "${GP[@]}" trace record $AAM --device cuda \
    --factory-arg attn=planted_ignore_mask --out "$T/cuda_planted"

step compare_cpu_vs_cuda_math 0 60 "${GP[@]}" trace compare "$T/cpu_math" "$T/cuda_math" \
    --json "$R/trace_cpu_vs_cuda_math.json"
step compare_cpu_vs_cuda_triton 0 60 "${GP[@]}" trace compare "$T/cpu_math" "$T/cuda_triton" \
    --json "$R/trace_cpu_vs_cuda_triton.json" --html "$R/trace_cpu_vs_cuda_triton.html" \
    --plot "$OUT/trace_cpu_vs_cuda_triton.png"
step compare_cpu_vs_cuda_triton_bf16 0 60 "${GP[@]}" trace compare "$T/cpu_math" "$T/cuda_triton_bf16" \
    --json "$R/trace_cpu_vs_cuda_triton_bf16.json"
step compare_cpu_vs_cuda_planted 1 60 "${GP[@]}" trace compare "$T/cpu_math" "$T/cuda_planted" \
    --json "$R/trace_cpu_vs_cuda_planted.json" --html "$R/trace_cpu_vs_cuda_planted.html"
step replay_planted_on_cuda 1 90 "${GP[@]}" trace replay "$T/cuda_planted" --device cuda \
    --factory-arg attn=sdpa_math --json "$R/replay_planted_on_cuda.json"
step replay_cpu_trace_on_cuda_triton 0 90 "${GP[@]}" trace replay "$T/cpu_math" --device cuda \
    --factory-arg attn=triton --json "$R/replay_cpu_trace_on_cuda_triton.json"

# ---------------------------------------------------------------- a full-size trace, sampled
step record_full_cuda_math 0 90 "${GP[@]}" trace record $AAM --device cuda --factory-arg attn=sdpa_math \
    --factory-arg size=full --max-elements 65536 --out "$T/full_math"
step record_full_cuda_triton 0 90 "${GP[@]}" trace record $AAM --device cuda --factory-arg attn=triton \
    --factory-arg size=full --max-elements 65536 --out "$T/full_triton"
step compare_full_math_vs_triton 0 60 "${GP[@]}" trace compare "$T/full_math" "$T/full_triton" \
    --json "$R/trace_full_math_vs_triton.json"

# ---------------------------------------------------------------- workloads (user story 1's shape)
step aam_math 0 150 "${GP[@]}" workload run aam --device cuda --attn sdpa_math --out "$R/aam_math.json"
step aam_triton 0 150 "${GP[@]}" workload run aam --device cuda --attn triton --out "$R/aam_triton.json"
step aam_planted 0 150 "${GP[@]}" workload run aam --device cuda --attn planted_ignore_mask \
    --out "$R/aam_planted.json"
step compare_aam_math_vs_triton 0 30 "${GP[@]}" workload compare "$R/aam_math.json" "$R/aam_triton.json" \
    --json "$R/compare_aam_math_vs_triton.json" --plot "$OUT/aam_math_vs_triton.png"
step compare_aam_math_vs_planted 1 30 "${GP[@]}" workload compare "$R/aam_math.json" "$R/aam_planted.json" \
    --json "$R/compare_aam_math_vs_planted.json" --plot "$OUT/aam_math_vs_planted.png"
step aam_triton_bf16 0 150 "${GP[@]}" workload run aam --device cuda --attn triton --dtype bfloat16 --steps 150 \
    --out "$R/aam_triton_bf16.json"
step aam_math_bf16 0 150 "${GP[@]}" workload run aam --device cuda --attn sdpa_math --dtype bfloat16 --steps 150 \
    --out "$R/aam_math_bf16.json"
step compare_aam_bf16_math_vs_triton 0 30 "${GP[@]}" workload compare "$R/aam_math_bf16.json" \
    "$R/aam_triton_bf16.json" --json "$R/compare_aam_bf16_math_vs_triton.json"
step cnn_isolated 0 150 "${GP[@]}" workload run cnn --device cuda --out "$R/cnn.json"

# ---------------------------------------------------------------- safe compile
step compile_check_cnn 0 180 "${GP[@]}" compile-check gpuparity.workloads.cnn:trace_factory --device cuda \
    --json "$R/compile_check_cnn.json"

# ---------------------------------------------------------------- summary
python3 - "$R" "$OUT/summary.json" <<'EOF'
import json, os, sys
results, out = sys.argv[1], sys.argv[2]
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
EOF
tar -czf "$OUT/results.tar.gz" -C "$OUT" results && rm -rf "$R"
echo "=== done in $SECONDS s; files under $OUT"
