#!/bin/bash
# The GPU runs behind benchmarks/records/, one step per measurement, on a lent GPU machine:
#   OUT=out bash benchmarks/scripts/gpu_run.sh STEP [STEP...]
# Steps (each writes under $OUT/STEP/; $OUT/versions.txt and $OUT/steps.txt record the run):
#   tests            kernel/op/drop-in tests at GPU sizes (TESTS, default tests/backends tests/ops tests/nn;
#                    8 workers when pytest-xdist is importable or its wheels are carried in .wheels/)
#   doctor           gpuparity doctor with empty Triton and probe caches (cold), then again (warm)
#   bench-attention  gpuparity bench attention, every backend, eager and in CUDA graphs (ATT_SHAPES)
#   bench-norm       gpuparity bench norm, eager and in CUDA graphs
#   bench-rope       gpuparity bench rope, eager and in CUDA graphs
#   host             host time per attention fwd+bwd step (benchmarks/host_overhead.py)      [A/B]
#   host-norms       host time per norm fwd+bwd step (host_overhead.py --norms)               [A/B]
#   host-breakdown   where a small norm / RoPE call's host time goes (benchmarks/host_breakdown.py --profile)
#   decode           int-offset rotary decode calls, host time (host_breakdown.py)           [A/B]
#   norm-ab          the shipped norm backward alone (benchmarks/tune_norm_bwd.py --shipped-only) [A/B]
#   rope-ab          gpuparity bench rope, triton only, then beside torch.compile            [A/B]
#   norm-sweep       the norm backward config sweep (benchmarks/tune_norm_bwd.py)
#   rope-sweep       the rotary tile sweep (benchmarks/tune_norms_rope.py --only rope)
#   rope-variants    rotary tile sizes A/B in one process (benchmarks/rope_variants.py --rounds 3)
#   tune-attention   the attention tile sweep (benchmarks/tune_attention.py $TUNE_ARGS)
#   fp32-dot         fp32 attention with FMA vs split-TF32 dots (benchmarks/fp32_dot.py)
#   trace-workload   traces GPU vs CPU, the planted mask bug, replay, aam/cnn workloads, compile-check
#   fleet            fleet check with NCCL on every local GPU, then aam memory / kernel profiles
#                    (kind nvidia-h200-x2; NVLink multicast stays off)
#   readme           README command 1 exactly as written, in a copy of this tree without .venv/.git
#   monitor          the monitor's overhead at every=100 (benchmarks/bench_monitor.py, ROUNDS x STEPS)
#   attention-ab     gpuparity bench attention --suite dense,varlen, triton only, prev/new alternated [A/B]
#                    (AB_GRAPH=1 adds the CUDA-graph column: the kernels without the launch rate)
#   model            benchmarks/bench_model.py (MODEL_ARGS, default eager 2048 sdpa/attn-impl/gpuparity/liger)
#   patch-compiled   benchmarks/patch_compiled.py (PC_ARGS)
#   audit            gpuparity check --level full, fp32 + bf16, ONE run at a time (each run already uses
#                    several workers; runs side by side ran an H100 out of memory): AUDIT = words
#                    "op:backend[,backend]" (default below), AUDIT_BUDGET seconds each (300);
#                    AUDIT_RESUME=DIR of an earlier audit's JSONs reruns only the checks they left NOT_RUN
# PACK=1 packs $OUT into $OUT.tar.gz after every step; PACK=only leaves $OUT/run.tar.gz alone at the end.
# [A/B]: with the previous code in .ab_prev/src, alternating rounds of it ("prev") and this tree
# ("new"); without it, this tree only. Each step runs under a time limit (LIMIT_<STEP>, seconds).
set -uo pipefail
[ $# -gt 0 ] || { sed -n '2,30p' "$0"; exit 2; }
OUT=${OUT:-out}
mkdir -p "$OUT"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export GPUPARITY_CACHE_DIR=${GPUPARITY_CACHE_DIR:-/tmp/gp-cache}
HERE=$(dirname "$0")
PY=python3

# run NAME LIMIT_S COMMAND...: COMMAND under a limit, its output in $D/NAME.log, a line in steps.txt
run() {
    local name=$1 limit=$2; shift 2
    local started=$SECONDS
    timeout -k 10 "$limit" "$@" > "$D/$name.log" 2>&1
    local rc=$?
    echo "== $name: exit $rc after $((SECONDS - started)) s: $*" | tee -a "$OUT/steps.txt"
    return $rc
}
# sides: "prev new" when .ab_prev/src holds the previous code, else "new"; src_of SIDE: its source path
sides() { if [ -d .ab_prev/src ]; then echo "prev new"; else echo new; fi; }
src_of() { if [ "$1" = prev ]; then echo "$PWD/.ab_prev/src"; else echo "$PWD/src"; fi; }
# ab NAME ROUNDS COMMAND...: COMMAND in alternating rounds per side, appended to $D/NAME.txt
ab() {
    local name=$1 rounds=$2 round side; shift 2
    for round in $(seq "$rounds"); do
        for side in $(sides); do
            echo "## $side round $round" >> "$D/$name.txt"
            PYTHONPATH=$(src_of $side) timeout -k 10 150 "$@" --label "$side" >> "$D/$name.txt" 2>> "$D/$name.err"
        done
    done
    echo "== $name: $(sides) x $rounds rounds" | tee -a "$OUT/steps.txt"
}

{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nproc
  $PY -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version(), 'triton', triton.__version__)"
} >> "$OUT/versions.txt" 2>&1

for STEP in "$@"; do
  D="$OUT/$STEP"; mkdir -p "$D"
  LIMIT_VAR="LIMIT_${STEP//-/_}"; LIMIT=${!LIMIT_VAR:-}
  case $STEP in
  tests)
    $PY -c "import xdist" 2> /dev/null || $PY -m pip install -q --no-deps .wheels/*.whl > /dev/null 2>&1
    XDIST=""; $PY -c "import xdist" 2> /dev/null && XDIST="-n ${TEST_WORKERS:-8}" \
      || echo "== tests: pytest-xdist missing (carry its wheels in .wheels/); one worker" | tee -a "$OUT/steps.txt"
    run tests "${LIMIT:-400}" env GPUPARITY_TEST_DEVICE=cuda $PY -m pytest -q -p no:cacheprovider $XDIST \
        ${PYTEST_ARGS:-} ${TESTS:-tests/backends tests/ops tests/nn}
    tail -3 "$D/tests.log" ;;
  doctor)
    for pass in cold warm; do
      extra=(); [ $pass = cold ] && extra=(--json "$D/doctor.json" --html "$D/doctor.html")
      started=$SECONDS
      TRITON_CACHE_DIR=${TRITON_CACHE_DIR_DOCTOR:-$D/triton-cache} GPUPARITY_CACHE_DIR=$D/probe-cache \
        timeout -k 10 "${LIMIT:-330}" $PY -m gpuparity doctor "${extra[@]}" > "$D/doctor_$pass.txt" 2>&1
      echo "doctor ($pass caches) exit code $?, wall $((SECONDS - started)) s (command: gpuparity doctor)" \
        | tee -a "$D/doctor_$pass.txt" "$OUT/steps.txt"
    done
    rm -rf "$D/triton-cache" "$D/probe-cache"; gzip -f "$D/doctor.json" 2> /dev/null ;;
  bench-attention)
    run att "${LIMIT:-300}" $PY -m gpuparity bench attention --shapes "${ATT_SHAPES:-aam-nuc,aam-asv,bert,llm-4k,llm-8k}" \
        --pad 0,0.25 --backends "${ATT_BACKENDS:-math,cudnn,flex,triton}" --graph \
        --json "$D/att.json" --markdown "$D/att.md" --plot "$D/att.png" ;;
  bench-norm)
    run norm "${LIMIT:-150}" $PY -m gpuparity bench norm --modes fwd,fwd+bwd,fwd+bwd:graph \
        --json "$D/norm.json" --md "$D/norm.md" --plot "$D/norm.png" ;;
  bench-rope)
    run rope "${LIMIT:-150}" $PY -m gpuparity bench rope --modes fwd,fwd+bwd,fwd+bwd:graph \
        --json "$D/rope.json" --md "$D/rope.md" --plot "$D/rope.png" ;;
  host)
    ab host ${ROUNDS:-3} $PY benchmarks/host_overhead.py --backends triton,cudnn ;;
  host-norms)
    ab host_norms ${ROUNDS:-3} $PY benchmarks/host_overhead.py --norms ;;
  host-breakdown)
    run host_breakdown "${LIMIT:-120}" $PY benchmarks/host_breakdown.py --profile ;;
  decode)
    for round in 1 2 3; do
      for side in $(sides); do
        echo "{\"side\": \"$side\", \"round\": $round}" >> "$D/decode.jsonl"
        PYTHONPATH=$(src_of $side) timeout 120 $PY benchmarks/host_breakdown.py 2>> "$D/decode.err" | head -1 >> "$D/decode.jsonl"
      done
    done
    echo "== decode: $(wc -l < "$D/decode.jsonl") lines" | tee -a "$OUT/steps.txt" ;;
  norm-ab)
    for round in 1 2 3; do
      for side in $(sides); do
        echo "## $side round $round" >> "$D/normab.txt"
        PYTHONPATH=$(src_of $side) timeout 120 $PY benchmarks/tune_norm_bwd.py --shipped-only \
            --shapes 16384x4096,65536x1024,131072x128,8192x8192,16384x5120,32768x768 >> "$D/normab.txt" 2>&1
      done
    done
    echo "== norm-ab done" | tee -a "$OUT/steps.txt" ;;
  rope-ab)
    ROPE_ARGS=(--layouts half,interleaved,varlen --modes fwd,fwd+bwd,fwd+bwd:graph --rep-ms 50)
    for round in 1 2; do
      for side in $(sides); do
        run "rope_${side}_$round" 150 env PYTHONPATH="$(src_of $side)" $PY -m gpuparity bench rope --backends triton \
            "${ROPE_ARGS[@]}" --md "$D/rope_${side}_$round.md"
      done
    done
    run rope_compile 200 $PY -m gpuparity bench rope --backends triton,compile "${ROPE_ARGS[@]}" --md "$D/rope_compile.md" ;;
  norm-sweep)
    run sweep "${LIMIT:-300}" $PY benchmarks/tune_norm_bwd.py --warps "${SWEEP_WARPS:-8,16}" \
        --per-sm "${SWEEP_PER_SM:-1,2,3}" --out "$D/bwd_sweep.json" ;;
  rope-sweep)
    run ropesw "${LIMIT:-200}" $PY benchmarks/tune_norms_rope.py --only rope --out "$D/rope_sweep.json" ;;
  rope-variants)
    run variants "${LIMIT:-240}" $PY benchmarks/rope_variants.py --rounds 3 --out "$D/variants.jsonl"
    tail -14 "$D/variants.log" > "$D/variants.txt" ;;
  tune-attention)
    # shellcheck disable=SC2086  # TUNE_ARGS is a list of arguments
    run tuneatt "${LIMIT:-240}" $PY benchmarks/tune_attention.py ${TUNE_ARGS:---buckets 128 --kernels dkdv,dq --recent} \
        --budget-s "${TUNE_BUDGET:-200}" --json "$D/tune_att.json" ;;
  fp32-dot)
    for choice in ieee tf32x3; do
      TRITON_CACHE_DIR=$(mktemp -d) GPUPARITY_FP32_DOT=$choice timeout -k 10 180 $PY benchmarks/fp32_dot.py >> "$D/fp32_dot.txt" 2>&1
      echo "== fp32-dot $choice: exit $?" | tee -a "$OUT/steps.txt"
    done ;;
  trace-workload)
    R="$D/results"; T="${TMPDIR:-/tmp}/gpuparity-traces"; mkdir -p "$R"; rm -rf "$T"; mkdir -p "$T"
    : > "$R/steps.tsv"
    # tw NAME EXPECTED_EXIT LIMIT_S ARGS...: gpuparity ARGS; 0 = agrees, 1 = diverges (the planted bug)
    tw() {
      local name=$1 expected=$2 limit=$3 started=$SECONDS; shift 3
      echo "=== $name (expect exit $expected): gpuparity $*" >> "$D/log.txt"
      timeout "$limit" $PY -m gpuparity "$@" >> "$D/log.txt" 2>&1
      local rc=$?
      echo "=== $name: exit $rc (expected $expected) in $((SECONDS - started)) s" | tee -a "$D/log.txt"
      printf '%s\t%s\t%s\t%s\n' "$name" "$rc" "$expected" "$((SECONDS - started))" >> "$R/steps.tsv"
    }
    AAM=gpuparity.workloads.aam:trace_factory
    tw env 0 60 env --json "$R/env.json"
    tw record_cpu_math 0 60 trace record $AAM --device cpu --factory-arg attn=sdpa_math --out "$T/cpu_math"
    tw record_cuda_math 0 60 trace record $AAM --device cuda --factory-arg attn=sdpa_math --out "$T/cuda_math"
    tw record_cuda_triton 0 60 trace record $AAM --device cuda --factory-arg attn=triton --out "$T/cuda_triton"
    tw record_cuda_planted 0 60 trace record $AAM --device cuda --factory-arg attn=planted_ignore_mask --out "$T/cuda_planted"
    tw compare_cpu_vs_cuda_math 0 60 trace compare "$T/cpu_math" "$T/cuda_math" --json "$R/trace_cpu_vs_cuda_math.json"
    tw compare_cpu_vs_cuda_triton 0 60 trace compare "$T/cpu_math" "$T/cuda_triton" \
        --json "$R/trace_cpu_vs_cuda_triton.json" --plot "$D/trace_cpu_vs_cuda_triton.png"
    tw compare_cpu_vs_cuda_planted 1 60 trace compare "$T/cpu_math" "$T/cuda_planted" --json "$R/trace_cpu_vs_cuda_planted.json"
    tw replay_planted_on_cuda 1 90 trace replay "$T/cuda_planted" --device cuda --factory-arg attn=sdpa_math \
        --json "$R/replay_planted_on_cuda.json"
    tw record_full_cuda_math 0 90 trace record $AAM --device cuda --factory-arg attn=sdpa_math \
        --factory-arg size=full --max-elements 65536 --out "$T/full_math"
    tw record_full_cuda_triton 0 90 trace record $AAM --device cuda --factory-arg attn=triton \
        --factory-arg size=full --max-elements 65536 --out "$T/full_triton"
    tw compare_full_math_vs_triton 0 60 trace compare "$T/full_math" "$T/full_triton" --json "$R/trace_full_math_vs_triton.json"
    tw aam_math 0 150 workload run aam --device cuda --attn sdpa_math --out "$R/aam_math.json"
    tw aam_triton 0 150 workload run aam --device cuda --attn triton --out "$R/aam_triton.json"
    tw aam_planted 0 150 workload run aam --device cuda --attn planted_ignore_mask --out "$R/aam_planted.json"
    tw compare_aam_math_vs_triton 0 30 workload compare "$R/aam_math.json" "$R/aam_triton.json" \
        --json "$R/compare_aam_math_vs_triton.json" --plot "$D/aam_math_vs_triton.png"
    tw compare_aam_math_vs_planted 1 30 workload compare "$R/aam_math.json" "$R/aam_planted.json" \
        --json "$R/compare_aam_math_vs_planted.json"
    tw cnn_isolated 0 150 workload run cnn --device cuda --out "$R/cnn.json"
    tw compile_check_cnn 0 180 compile-check gpuparity.workloads.cnn:trace_factory --device cuda --json "$R/compile_check_cnn.json"
    $PY "$HERE/gpu_run_summary.py" trace-workload "$R" "$D/summary.json" | tee -a "$D/log.txt"
    tar -czf "$D/results.tar.gz" -C "$D" results && rm -rf "$R" ;;
  fleet)
    export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
    NGPU=$(nvidia-smi -L | wc -l)
    { nvidia-smi; nvidia-smi topo -m; } > "$D/nvidia-smi.txt" 2>&1
    run fleet 60 $PY -m torch.distributed.run --standalone --nproc-per-node "$NGPU" -m gpuparity fleet \
        --no-battery --timeout 30 --all-sizes --json "$D/fleet.json"
    run aam_memory 120 $PY -m gpuparity profile memory --json "$D/aam_memory.json" -- \
        python -m gpuparity workload run aam --attn triton --steps 20 --no-isolate --out "$D/aam_run_memory.json"
    run aam_kernels 120 $PY -m gpuparity profile kernels --steps 10 --warmup 5 --top 25 --json "$D/aam_kernels.json" -- \
        python -m gpuparity workload run aam --attn triton --steps 20 --no-isolate --out "$D/aam_run_kernels.json"
    run fleet_battery 100 $PY -m torch.distributed.run --standalone --nproc-per-node "$NGPU" -m gpuparity fleet \
        --level quick --battery-timeout 60 --timeout 20 --sizes 8,1M,256M --json "$D/fleet_battery.json"
    $PY "$HERE/gpu_run_summary.py" fleet "$D" | tee "$D/summary.txt" ;;
  readme)
    FRESH=$(mktemp -d)/gpuparity; mkdir -p "$FRESH"
    tar --exclude=./.venv --exclude=./.git --exclude=./.ab_prev --exclude=./.wheels --exclude=./out -cf - . | tar -xf - -C "$FRESH"
    ( cd "$FRESH" && unset PYTHONPATH GPUPARITY_CACHE_DIR && export PIP_NO_INDEX=1 PIP_FIND_LINKS= \
      && timeout -k 10 "${LIMIT:-300}" bash -c 'bash scripts/setup.sh && .venv/bin/gpuparity doctor' ) > "$D/readme.txt" 2>&1
    echo "== readme: exit $? (bash scripts/setup.sh && .venv/bin/gpuparity doctor, fresh copy $FRESH)" | tee -a "$D/readme.txt" "$OUT/steps.txt"
    tail -5 "$D/readme.txt" ;;
  monitor)
    run monitor "${LIMIT:-200}" $PY benchmarks/bench_monitor.py --rounds "${ROUNDS:-6}" --steps "${STEPS:-15}" --out "$D"
    grep -v USDT "$D/monitor.log" | tail -4 ;;
  attention-ab)
    for round in $(seq "${ROUNDS:-2}"); do
      for side in $(sides); do
        run "att_${side}_$round" 200 env PYTHONPATH="$(src_of $side)" $PY -m gpuparity bench attention --suite dense,varlen \
            --backends triton --no-error ${AB_GRAPH:+--graph} --json "$D/att_${side}_$round.json" --md "$D/att_${side}_$round.md"
      done
    done ;;
  model)
    $PY -c "import liger_kernel" 2> /dev/null || $PY -m pip install -q --no-deps .wheels/*.whl > /dev/null 2>&1
    # shellcheck disable=SC2086  # MODEL_ARGS is a list of arguments
    run model "${LIMIT:-400}" $PY benchmarks/bench_model.py ${MODEL_ARGS:---seqs 2048 --modes eager --variants sdpa,attn-impl,gpuparity,liger --rounds 3 --first-steps} --out "$D"
    tail -30 "$D/model.log" ;;
  patch-compiled)
    # shellcheck disable=SC2086  # PC_ARGS is a list of arguments
    run pc "${LIMIT:-400}" $PY benchmarks/patch_compiled.py ${PC_ARGS:---layers 8 --rounds 3 --steps 5} --out "$D/pc.json"
    grep -v USDT "$D/pc.log" | tail -25 ;;
  audit)
    AUDIT_BUDGET=${AUDIT_BUDGET:-300}
    for item in ${AUDIT:-attention:triton attention_varlen:triton attention:sdpa_math,sdpa_efficient \
                attention:sdpa_flash,sdpa_cudnn attention:flex attention_decode:triton,sdpa rms_norm:triton,torch,compile \
                layer_norm:triton,torch,compile rotary:triton,compile softmax:torch conv2d:torch}; do
      op=${item%%:*}; backends=${item#*:}; name="${op}_${backends//,/_}"; cases=()
      if [ -n "${AUDIT_RESUME:-}" ]; then
        [ -f "$AUDIT_RESUME/$name.json" ] || { echo "== audit $name: no $AUDIT_RESUME/$name.json to resume" | tee -a "$OUT/steps.txt"; continue; }
        left=$($PY "$HERE/gpu_run_summary.py" not-run "$AUDIT_RESUME/$name.json")
        [ -n "$left" ] || { echo "== audit $name: nothing left NOT_RUN" | tee -a "$OUT/steps.txt"; continue; }
        cases=(--case "$left")
      fi
      run "$name" $((AUDIT_BUDGET + 60)) $PY -m gpuparity check --device cuda --level full --op "$op" --backend "$backends" \
          --dtype float32,bfloat16 --budget "$AUDIT_BUDGET" --no-shrink "${cases[@]}" --json "$D/$name.json"
    done
    $PY "$HERE/gpu_run_summary.py" audit "$D" | tee "$D/summary.txt" ;;
  *)
    echo "unknown step '$STEP': pick from the list at the top of $0" >&2; exit 2 ;;
  esac
  # The lent machines return a limited number of files: the whole run, packed after every step.
  [ "${PACK:-0}" = 1 ] && tar -czf "$OUT.tar.gz" -C "$(dirname "$OUT")" "$(basename "$OUT")"
done
# PACK=only: one tarball, $OUT/run.tar.gz, in place of the folders (the lent machine returns a few
# files, none deeper than three folders: a run's logs were lost to those limits)
if [ "${PACK:-0}" = only ]; then
  tar -czf "/tmp/gpu_run_$$.tar.gz" -C "$OUT" . && rm -rf "${OUT:?}"/* && mv "/tmp/gpu_run_$$.tar.gz" "$OUT/run.tar.gz"
fi
