#!/usr/bin/env bash
# Build the offline FlashAttention-4 bundle: .fa4/fa4-partA.tar.xz + .fa4/install.sh.
#
# What it makes: a single xz tarball of a ready-to-import site tree (flash_attn.cute from
# flash-attn-4 4.0.0b36, the CuTe DSL nvidia-cutlass-dsl 4.8.1 in its cu13 flavour, and the
# pure/binary deps FA4 needs besides torch), built for CPython 3.12 on manylinux x86_64, plus
# the installer (copied from benchmarks/scripts/fa4_install.sh, the source of truth) that
# unpacks it into /tmp/fa4site and wires up sys.path.
#
# Why: the device (GPU) machine has no network, and a call carries at most 64 MiB of ignored
# files. The cutlass DSL cu13 wheel alone is 92 MB zipped (its _cutlass_ir .so is 193 MB
# unpacked), so the wheels cannot be carried as they are. Unpacking, dropping what is not
# needed (the cu12 libs, Cython sources, tests, bytecode), stripping the unstripped .so files
# and recompressing everything as one xz -9e stream with the x86 BCJ filter and a dictionary
# larger than the whole tree gets it to ~57.2 MiB. Over 58 MiB fails, leaving headroom in
# the 64 MiB carry.
#
# Usage (from anywhere; needs network, python3 -m pip, unzip or python3, binutils, xz, GNU tar):
#     bash benchmarks/scripts/fa4_bundle.sh            # writes .fa4/ in the repo root
#     FA4_OUT=/tmp/fa4test bash benchmarks/scripts/fa4_bundle.sh   # write elsewhere
#   Env: FA4_OUT      output dir (default: <repo>/.fa4)
#        FA4_WHEELS   use the wheels already in this dir instead of downloading
#        FA4_KEEP=1   keep the temp work dir (wheels + unpacked site tree) and print its path
#        FA4_MAX_MIB  size limit in MiB (default 58)
#        PYTHON       interpreter whose pip downloads the wheels (default python3)
#   Compressing takes a few minutes and ~4 GiB of RAM (single-threaded; dict=384MiB).
# Then on the device machine, with .fa4 carried:   bash .fa4/install.sh   (see that file).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
OUT="${FA4_OUT:-$REPO/.fa4}"
PY="${PYTHON:-python3}"
MAX_MIB="${FA4_MAX_MIB:-58}"
INSTALLER="$HERE/fa4_install.sh"
TARBALL_NAME="fa4-partA.tar.xz"

# Exact pins of the bundle that was verified on an H200 (torch 2.11+cu130, triton 3.6).
# nvidia-cutlass-dsl hard-depends on nvidia-cutlass-dsl-libs-cu12; we take libs-cu13 instead
# (the [cu13] extra), hence --no-deps and an explicit list. torch is NOT bundled (the device
# machine has it).
PKGS=(
  flash-attn-4==4.0.0b36
  nvidia-cutlass-dsl==4.8.1
  nvidia-cutlass-dsl-libs-base==4.8.1
  nvidia-cutlass-dsl-libs-core==4.8.1
  nvidia-cutlass-dsl-libs-cu13==4.8.1
  quack-kernels==0.6.5
  apache-tvm-ffi==0.1.15.post2
  torch-c-dlpack-ext==0.1.5
  einops==0.8.2
  cuda-bindings==13.0.3
  cuda-pathfinder==1.9.1
  protobuf==7.36.2
  typing_extensions==4.16.0
)

die() { echo "fa4_bundle: ERROR: $*" >&2; exit 1; }
for t in "$PY" strip readelf xz tar; do
  command -v "$t" >/dev/null 2>&1 || die "needs '$t' on PATH"
done
[ -f "$INSTALLER" ] || die "missing $INSTALLER"

WORK="$(mktemp -d "${TMPDIR:-/tmp}/fa4bundle.XXXXXX")"
if [ "${FA4_KEEP:-0}" = "1" ]; then
  trap 'echo "fa4_bundle: kept work dir $WORK"' EXIT
else
  trap 'rm -rf "$WORK"' EXIT
fi
SITE="$WORK/site"
mkdir -p "$SITE" "$OUT"
t0=$SECONDS

# ---- 1. wheels -------------------------------------------------------------------------
if [ -n "${FA4_WHEELS:-}" ]; then
  WHL="$(cd "$FA4_WHEELS" && pwd)"
  echo "fa4_bundle: using wheels in $WHL (no download)"
else
  WHL="$WORK/w"
  echo "fa4_bundle: downloading ${#PKGS[@]} wheels into $WHL"
  "$PY" -m pip download --no-deps --only-binary=:all: -d "$WHL" \
    --implementation cp --python-version 3.12 --abi cp312 \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 \
    "${PKGS[@]}"
fi

# Pick exactly one wheel per pin (wheel file names use '_' for '-' and '.').
WHEELS=()
for spec in "${PKGS[@]}"; do
  name="${spec%%==*}"; ver="${spec##*==}"
  stem="$(echo "$name" | tr 'A-Z.-' 'a-z__')"
  mapfile -t hits < <(find "$WHL" -maxdepth 1 -iname "${stem}-${ver}-*.whl" | sort)
  [ "${#hits[@]}" -eq 1 ] || die "expected one wheel for $spec in $WHL, found ${#hits[@]}: ${hits[*]:-none}"
  case "${hits[0]}" in
    *-py3-none-any.whl|*cp312*manylinux*x86_64*.whl|*abi3*manylinux*x86_64*.whl) ;;
    *) die "unexpected wheel tag: ${hits[0]}" ;;
  esac
  WHEELS+=("${hits[0]}")
done

# ---- 2. unpack (plain unzip: no INSTALLER/REQUESTED files, RECORDs as shipped, no .pyc) ----
for w in "${WHEELS[@]}"; do
  if command -v unzip >/dev/null 2>&1; then
    TZ=UTC unzip -q -o "$w" -d "$SITE"
  else
    "$PY" - "$w" "$SITE" <<'EOF'
import os, sys, time, zipfile
whl, dest = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(whl) as z:
    for i in z.infolist():
        p = z.extract(i, dest)
        mode = (i.external_attr >> 16) & 0o7777
        if mode and not i.is_dir():
            os.chmod(p, mode)
        t = time.mktime(i.date_time + (0, 0, -1))
        os.utime(p, (t, t))
EOF
  fi
done
echo "fa4_bundle: unpacked ${#WHEELS[@]} wheels ($(du -sm "$SITE" | cut -f1) MiB)"

# ---- 3. prune --------------------------------------------------------------------------
rm -rf "$SITE"/nvidia_cutlass_dsl/cu12 "$SITE"/nvidia_cutlass_dsl_libs_cu12-*.dist-info  # cu12 libs, if any
# Cython sources/headers of cuda-bindings (not needed at run time). tvm_ffi/cython/* is kept.
find "$SITE/cuda" -type f \( -name '*.cpp' -o -name '*.pyx' -o -name '*.pxd' -o -name '*.pxi' \) -delete
rm -rf "$SITE/einops/tests"
find "$SITE" -depth -type d -name __pycache__ -exec rm -rf {} +
find "$SITE" -type f -name '*.pyc' -delete
# NB: tvm_ffi/lib/libtvm_ffi_testing.so must stay (tvm_ffi's core extension refers to it);
# it looks like test-only baggage but is needed. Nothing above removes it; check anyway.
[ -f "$SITE/tvm_ffi/lib/libtvm_ffi_testing.so" ] || die "libtvm_ffi_testing.so went missing"

# ---- 4. strip unstripped x86-64 shared objects ------------------------------------------
# (In practice: protobuf's _upb/_message.abi3.so and torch_c_dlpack_ext's 12 addon .so files.
# The aarch64 stubs under nvidia_cutlass_dsl/cu13/lib/stubs are left alone.)
nstrip=0
while IFS= read -r -d '' f; do
  readelf -h "$f" 2>/dev/null | grep -q 'Machine:.*X86-64' || continue
  readelf -S -W "$f" 2>/dev/null | grep -q ' \.symtab ' || continue
  strip --strip-unneeded -p "$f"
  nstrip=$((nstrip + 1))
done < <(find "$SITE" -type f \( -name '*.so' -o -name '*.so.*' \) -print0)
echo "fa4_bundle: stripped $nstrip .so files; site tree now $(du -sm "$SITE" | cut -f1) MiB"

# ---- 5. tar + xz -------------------------------------------------------------------------
# Member order as in the hand-built bundle: files over 32 MiB first, largest first (the
# _cutlass_ir .so and libcute_dsl_runtime.so), then all other files in C-locale order.
# Regular files only (no directory entries); numeric owner 0/0.
LIST="$WORK/files.lst"
( cd "$SITE"
  find . -type f -size +32M -printf '%s\t%P\n' | sort -k1,1nr | cut -f2-
  find . -type f ! -size +32M -printf '%P\n' | LC_ALL=C sort
) > "$LIST"
echo "fa4_bundle: $(wc -l < "$LIST") files; compressing (xz -9e --x86, dict=384MiB, 1 thread) ..."
TMPX="$WORK/$TARBALL_NAME"
tar -C "$SITE" --owner=0 --group=0 --numeric-owner --no-recursion -T "$LIST" -cf - \
  | xz -T1 --x86 --lzma2=preset=9e,dict=384MiB -c > "$TMPX"

bytes="$(stat -c %s "$TMPX")"
mib="$(awk -v b="$bytes" 'BEGIN{printf "%.1f", b/1048576}')"
if [ "$bytes" -gt $((MAX_MIB * 1048576)) ]; then
  mv -f "$TMPX" "$OUT/$TARBALL_NAME.oversize"
  die "bundle is $mib MiB ($bytes B) > ${MAX_MIB} MiB limit; left at $OUT/$TARBALL_NAME.oversize, $OUT/$TARBALL_NAME untouched"
fi
mv -f "$TMPX" "$OUT/$TARBALL_NAME"
cp -f "$INSTALLER" "$OUT/install.sh"
echo "fa4_bundle: wrote $OUT/$TARBALL_NAME: $mib MiB ($bytes B), limit ${MAX_MIB} MiB"
echo "fa4_bundle: wrote $OUT/install.sh (from benchmarks/scripts/fa4_install.sh)"
echo "fa4_bundle: sha256 $(sha256sum "$OUT/$TARBALL_NAME" | cut -d' ' -f1)"
echo "fa4_bundle: done in $((SECONDS - t0))s. On the device: carry .fa4, run: bash .fa4/install.sh"
