#!/usr/bin/env bash
# Sets up .venv for gpuparity. Keeps a vendor torch that is already importable (CUDA or ROCm
# wheels bring their own Triton: never replace them); otherwise installs torch 2.13.0.
#   bash scripts/setup.sh          # for running gpuparity
#   bash scripts/setup.sh --test   # plus pytest, pytest-xdist, hypothesis, transformers (the [hf] tests) and, only if
#                                  # missing, triton (for the interpreter tests)
# PYTHON=/path/to/python picks the interpreter (default python3). When it imports torch (a
# venv, a conda env, a module-provided install, a container), .venv sees that interpreter's own
# packages and needs no network for torch.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VPY=.venv/bin/python

# The site directories of $PY, when it imports torch: its own packages, not its base
# interpreter's (which is all `venv --system-site-packages` would show for a venv or conda env).
host_sites() {
  "$PY" - <<'EOF' 2>/dev/null
import os, site, sys
import torch
dirs = list(site.getsitepackages()) if hasattr(site, "getsitepackages") else []
dirs.append(os.path.dirname(os.path.dirname(os.path.abspath(torch.__file__))))
seen = []
for d in dirs:
    d = os.path.abspath(d)
    if os.path.isdir(d) and d not in seen:
        seen.append(d)
print("\n".join(seen))
EOF
}

SITES=$(host_sites || true)
if [ ! -x "$VPY" ]; then
  if [ -n "$SITES" ]; then
    "$PY" -m venv .venv
  else
    # --system-site-packages: a torch installed for the system (e.g. a cluster module or a
    # container's vendor build) stays visible and is used as it is.
    "$PY" -m venv --system-site-packages .venv
  fi
fi
if [ -n "$SITES" ] && ! "$VPY" -c "import torch" >/dev/null 2>&1; then
  # Plain path lines (no `import`): $PY's packages come after .venv's own, and the .pth files
  # in them (e.g. an editable gpuparity elsewhere) are not run.
  VSITE=$("$VPY" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
  printf '%s\n' "$SITES" > "$VSITE/gpuparity-host-python.pth"
  echo "setup: using the torch of $PY (its site-packages are visible in .venv)" >&2
  # Python < 3.12 puts an old setuptools into every new venv; it would shadow $PY's newer one,
  # which can build gpuparity without a download.
  if "$VPY" -m pip show -q setuptools >/dev/null 2>&1 && "$PY" -c "import setuptools, sys; \
      sys.exit(int(setuptools.__version__.split('.')[0]) < 77)" >/dev/null 2>&1; then
    "$VPY" -m pip uninstall -q -y setuptools >/dev/null 2>&1 || true
  fi
fi

# pip before 21.3 cannot install a pyproject.toml project in editable mode
if ! "$VPY" -c "import pip, sys; sys.exit(tuple(map(int, pip.__version__.split('.')[:2])) < (21, 3))" \
    >/dev/null 2>&1; then
  "$VPY" -m pip install -q --upgrade pip >/dev/null 2>&1 || true
fi

PIP_ARGS=()
if "$VPY" -c "import torch" >/dev/null 2>&1; then
  # Never replace the torch that is there: pin it, so a requirement it misses is an error.
  CONSTRAINTS=$(mktemp)
  trap 'rm -f "$CONSTRAINTS"' EXIT
  "$VPY" -c "import torch; print('torch==' + torch.__version__)" > "$CONSTRAINTS"
  PIP_ARGS+=(-c "$CONSTRAINTS")
else
  echo "setup: no torch found; installing torch==2.13.0" >&2
  "$VPY" -m pip install -q "torch==2.13.0"
fi
# The build backend from .venv when it is recent enough: no download of setuptools (offline).
if "$VPY" -c "import setuptools, sys; sys.exit(int(setuptools.__version__.split('.')[0]) < 77)" \
    >/dev/null 2>&1; then
  PIP_ARGS+=(--no-build-isolation)
fi
if [ "${1:-}" = "--test" ]; then
  "$VPY" -m pip install -q ${PIP_ARGS[@]+"${PIP_ARGS[@]}"} -e ".[test,plot,hf]"
  if ! "$VPY" -c "import triton" >/dev/null 2>&1; then
    "$VPY" -m pip install -q triton
  fi
else
  "$VPY" -m pip install -q ${PIP_ARGS[@]+"${PIP_ARGS[@]}"} -e .
fi
"$VPY" -c "import torch, gpuparity; print(f'setup: gpuparity {gpuparity.__version__}, torch {torch.__version__}')"
