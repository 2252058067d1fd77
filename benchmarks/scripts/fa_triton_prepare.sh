#!/bin/bash
# Exports FlashAttention's Triton kernels for rotary, the fused (residual) layer norm and cross
# entropy, with the two helper modules layer_norm.py imports, byte for byte, from a FlashAttention
# git checkout (bare or not) into .fa_src/ at the repository root, for benchmarks/fa_triton_speed.py
# (which loads them by path under names install() does not shadow):
#   bash benchmarks/scripts/fa_triton_prepare.sh [GIT_DIR] [COMMIT]
# GIT_DIR defaults to /work/.mirror/Dao-AILab+flash-attention/repo, COMMIT to 0251105a (the commit
# FlashAttention's own tests ran at). .fa_src/COMMIT records the full commit id; .fa_src/ is never
# committed (exclude it, and carry it to the GPU machine).
set -euo pipefail
GIT_DIR=${1:-/work/.mirror/Dao-AILab+flash-attention/repo}
REV=${2:-0251105a}
ROOT=$(git rev-parse --show-toplevel)
DEST="$ROOT/.fa_src"
FILES=(flash_attn/ops/triton/rotary.py flash_attn/ops/triton/layer_norm.py flash_attn/ops/triton/cross_entropy.py
       flash_attn/utils/torch.py flash_attn/utils/library.py)
G=(git --git-dir="$GIT_DIR")
COMMIT=$("${G[@]}" rev-parse --verify "$REV^{commit}")
rm -rf "$DEST"
mkdir -p "$DEST"
source "$(dirname "$0")/fa_export_lib.sh"
fa_export "$GIT_DIR" "$COMMIT" "$DEST" fa_triton_prepare "${FILES[@]}"
echo "$COMMIT" > "$DEST/COMMIT"
echo "fa_triton_prepare: ${#FILES[@]} files of FlashAttention $COMMIT in $DEST"
