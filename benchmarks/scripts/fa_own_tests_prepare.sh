#!/bin/bash
# Exports FlashAttention's own test files, byte for byte, from a FlashAttention git checkout
# (bare or not) into .fa_tests/ at the repository root, for benchmarks/scripts/fa_own_tests.py:
#   bash benchmarks/scripts/fa_own_tests_prepare.sh [GIT_DIR] [COMMIT]
# GIT_DIR defaults to /work/.mirror/Dao-AILab+flash-attention/repo, COMMIT to HEAD.
# .fa_tests/COMMIT records the full commit id; /.fa_tests/ goes into .git/info/exclude (never
# committed: carry it to the GPU machine).
set -euo pipefail
GIT_DIR=${1:-/work/.mirror/Dao-AILab+flash-attention/repo}
REV=${2:-HEAD}
ROOT=$(git rev-parse --show-toplevel)
DEST="$ROOT/.fa_tests"
# tests/test_rotary.py: not among fa_own_tests.py's files (fa_gpu_check.sh's step fa_rotary runs its
# compiled test_rotary_emb_qkv)
FILES=(tests/test_flash_attn.py tests/ops/triton/test_layer_norm.py tests/losses/test_cross_entropy.py
       tests/layers/test_rotary.py tests/test_rotary.py)
G=(git --git-dir="$GIT_DIR")
COMMIT=$("${G[@]}" rev-parse --verify "$REV^{commit}")
rm -rf "$DEST"
mkdir -p "$DEST"
# every conftest.py on the way from tests/ to a file (the files' own folders and their parents)
CONFTESTS=()
for f in "${FILES[@]}"; do
  d=$(dirname "$f")
  while [ "$d" != "." ]; do
    if "${G[@]}" cat-file -e "$COMMIT:$d/conftest.py" 2>/dev/null; then CONFTESTS+=("$d/conftest.py"); fi
    d=$(dirname "$d")
  done
done
# byte for byte: each exported file's blob id is the one in the commit
source "$(dirname "$0")/fa_export_lib.sh"
fa_export "$GIT_DIR" "$COMMIT" "$DEST" fa_own_tests_prepare "${FILES[@]}" ${CONFTESTS[@]+"${CONFTESTS[@]}"}
echo "$COMMIT" > "$DEST/COMMIT"
EXCLUDE="$(git rev-parse --git-path info/exclude)"
mkdir -p "$(dirname "$EXCLUDE")"
grep -qxF '/.fa_tests/' "$EXCLUDE" 2>/dev/null || echo '/.fa_tests/' >> "$EXCLUDE"
echo "fa_own_tests_prepare: $(wc -l < "$DEST/FILES") files at $COMMIT in $DEST"
