# Shared by the GPU run scripts (source it, then call start_run):
#   start_run DEFAULT_STEPS TAR   checks OUT, exports the run's environment, sets STEPS
#                                 (",a,b,": the STEPS variable or DEFAULT_STEPS), W (a scratch
#                                 folder) and TAR, and records the versions
#   step NAME LIMIT_S COMMAND...  runs COMMAND under a time limit, its output in $W/NAME.log,
#   appends "== NAME: exit ..." to $OUT/steps.txt and packs $W into $OUT/$TAR after every
#   step, so a run cut short still returns what it measured (the device returns at most 8 files).
#   versions                      appends date, GPU, driver, torch/cuDNN/Triton versions to $OUT/versions.txt
#   gpu_tests DEFAULT_TESTS       pytest at GPU sizes (GPUPARITY_TEST_DEVICE=cuda) on TESTS or the
#                                 default paths, 8 workers (pytest-xdist wheels carried in .wheels/)
step() {
    local name=$1 limit=$2; shift 2
    local started=$SECONDS
    timeout -k 10 "$limit" "$@" > "$W/$name.log" 2>&1
    echo "== $name: exit $? after $((SECONDS - started)) s: $*" | tee -a "$OUT/steps.txt"
    tar -czf "$OUT/$TAR" -C "$W" .
}
versions() {
    { date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader;
      python3 -c "import torch, triton; print('torch', torch.__version__, 'cudnn', torch.backends.cudnn.version(), 'triton', triton.__version__)"; } >> "$OUT/versions.txt" 2>&1
}
start_run() {
    : "${OUT:?set OUT}"
    mkdir -p "$OUT"
    export PYTHONUNBUFFERED=1 GPUPARITY_CACHE_DIR=/tmp/gp-cache
    STEPS=",${STEPS:-$1},"
    W=$(mktemp -d)
    TAR=$2
    versions
}
gpu_tests() {
    pip install -q --no-deps .wheels/*.whl > /dev/null 2>&1
    python3 -c "import xdist" 2> /dev/null || echo "== tests: pytest-xdist missing (carry .wheels/)" | tee -a "$OUT/steps.txt"
    step tests "${TESTS_LIMIT:-400}" env PYTHONPATH=src GPUPARITY_TEST_DEVICE=cuda python3 -m pytest -q -n 8 \
        -p no:cacheprovider ${TESTS:-$1}
    tail -3 "$W/tests.log"
}
