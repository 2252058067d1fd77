#!/usr/bin/env bash
# Offline installer for FlashAttention-4 (flash-attn-4 4.0.0b36, flash_attn.cute)
# + CuTe DSL (nvidia-cutlass-dsl 4.8.1, cu13 flavour) and deps, into /tmp/fa4site.
#
# Source of truth: benchmarks/scripts/fa4_install.sh (tracked). benchmarks/scripts/fa4_bundle.sh
# copies it to .fa4/install.sh next to the bundle it builds (.fa4/fa4-partA.tar.xz); the
# installer looks for fa4-part*.tar.xz in its own directory, so run the .fa4/ copy, not this one.
#
# On the device machine, carry .fa4 and run from the repo root:
#                           bash .fa4/install.sh        (single-part bundle: does everything)
#                           bash .fa4/install.sh A / B  (only if a part B ever exists)
# Then: export PYTHONPATH=/tmp/fa4site:$PYTHONPATH   (or FA4_DEST=... to unpack elsewhere;
#                                                     PYTHON=... to pick the interpreter)
# Optional: FA4_SMOKE=1 bash .fa4/install.sh   -> also runs a tiny fwd+bwd on the GPU.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
DEST="${FA4_DEST:-/tmp/fa4site}"
PY="${PYTHON:-python3}"
PARTS="A"            # parts this bundle consists of
STEP="${1:-all}"
mkdir -p "$DEST"

unpack() {
  local p="$1" f="$HERE/fa4-part$1.tar.xz"
  if [ ! -f "$f" ]; then echo "fa4: missing $f (carry it with the call)" >&2; exit 2; fi
  local t0=$SECONDS
  if command -v xz >/dev/null 2>&1; then
    tar -xJf "$f" -C "$DEST"
  else
    "$PY" -c "import sys,tarfile; tarfile.open(sys.argv[1],'r:xz').extractall(sys.argv[2])" "$f" "$DEST"
  fi
  touch "$DEST/.fa4_part$p.done"
  echo "fa4: unpacked part $p into $DEST in $((SECONDS-t0))s"
}

finish() {
  for p in $PARTS; do
    if [ ! -f "$DEST/.fa4_part$p.done" ]; then echo "fa4: part $p not unpacked yet" >&2; exit 3; fi
  done
  # PYTHONPATH dirs do not process .pth files; the CuTe DSL needs its
  # nvidia_cutlass_dsl_packages.pth (puts .../dsl_packages, home of `cutlass`, on sys.path).
  cat > "$DEST/sitecustomize.py" <<'EOF'
# fa4 bundle: make PYTHONPATH=/tmp/fa4site act as a site dir (process its .pth files),
# then chain to any other sitecustomize further down sys.path.
import os as _os, sys as _sys, site as _site
_d = _os.path.dirname(_os.path.abspath(__file__))
try:
    _site.addsitedir(_d)
    _dsl = _os.path.join(_d, "nvidia_cutlass_dsl", "dsl_packages")
    if _os.path.isdir(_dsl) and _dsl not in _sys.path:
        _sys.path.insert(0, _dsl)
except Exception as _e:
    print("fa4 sitecustomize:", _e, file=_sys.stderr)
try:
    import importlib.util as _ilu
    for _p in list(_sys.path):
        if not _p or _os.path.abspath(_p) == _d:
            continue
        _f = _os.path.join(_p, "sitecustomize.py")
        if _os.path.isfile(_f):
            _spec = _ilu.spec_from_file_location("_fa4_chained_sitecustomize", _f)
            _m = _ilu.module_from_spec(_spec)
            _spec.loader.exec_module(_m)
            break
except Exception as _e:
    print("fa4 sitecustomize (chained):", _e, file=_sys.stderr)
EOF
  du -sh "$DEST" | sed 's/^/fa4: size /'
  echo "fa4: tip: export PYTHONPATH=$DEST:$DEST/nvidia_cutlass_dsl/dsl_packages:\$PYTHONPATH"
  PYTHONPATH="$DEST:$DEST/nvidia_cutlass_dsl/dsl_packages:${PYTHONPATH:-}" "$PY" -c "import flash_attn.cute as m; print(m.__file__); from flash_attn.cute import flash_attn_func, flash_attn_varlen_func; import cutlass, cuda.bindings, torch; print('fa4 OK: cutlass', cutlass.__file__, '| cuda.bindings', cuda.bindings.__version__, '| torch', torch.__version__)"
  if [ "${FA4_SMOKE:-0}" = "1" ]; then
    PYTHONPATH="$DEST:$DEST/nvidia_cutlass_dsl/dsl_packages:${PYTHONPATH:-}" "$PY" - <<'EOF'
import time, torch
from flash_attn.cute import flash_attn_func
torch.manual_seed(0)
B, S, H, D = 2, 1024, 8, 128
q, k, v = [torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3)]
t = time.time()
out, lse = flash_attn_func(q, k, v, causal=True)
out.backward(torch.ones_like(out)); torch.cuda.synchronize()
print(f"fa4 smoke: fwd+bwd (incl. JIT) {time.time()-t:.1f}s, out {tuple(out.shape)}, lse {None if lse is None else tuple(lse.shape)}")
qr, kr, vr = [x.detach().clone().requires_grad_() for x in (q, k, v)]
ref = torch.nn.functional.scaled_dot_product_attention(qr.transpose(1, 2), kr.transpose(1, 2), vr.transpose(1, 2), is_causal=True).transpose(1, 2)
ref.backward(torch.ones_like(ref))
for n, a, b in (("out", out, ref), ("dq", q.grad, qr.grad), ("dk", k.grad, kr.grad), ("dv", v.grad, vr.grad)):
    print(f"fa4 smoke: max|{n}-ref| = {(a.float() - b.float()).abs().max().item():.3e}")
EOF
  fi
}

case "$STEP" in
  A|B) unpack "$STEP"; if [ "$STEP" = "${PARTS##* }" ]; then finish; else echo "fa4: now run: bash .fa4/install.sh B (within 30 s of this call ending)"; fi ;;
  all|"") for p in $PARTS; do [ -f "$DEST/.fa4_part$p.done" ] && [ "$p" != "${PARTS##* }" ] || unpack "$p"; done; finish ;;
  *) echo "usage: bash .fa4/install.sh [A|B]" >&2; exit 1 ;;
esac
