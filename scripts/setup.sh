#!/usr/bin/env bash
# Sets up .venv for gpuparity. Keeps a vendor torch that is already importable (CUDA or ROCm
# wheels bring their own Triton: never replace them); otherwise installs torch 2.13.0.
#   bash scripts/setup.sh          # for running gpuparity
#   bash scripts/setup.sh --test   # plus pytest and, only if missing, triton (for the interpreter tests)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  # --system-site-packages: a torch installed for the system (e.g. a cluster module or a
  # container's vendor build) stays visible and is used as it is.
  "$PY" -m venv --system-site-packages .venv
fi
VPY=.venv/bin/python
"$VPY" -m pip install -q --upgrade pip >/dev/null 2>&1 || true
if ! "$VPY" -c "import torch" >/dev/null 2>&1; then
  echo "setup: no torch found; installing torch==2.13.0" >&2
  "$VPY" -m pip install -q "torch==2.13.0"
fi
if [ "${1:-}" = "--test" ]; then
  "$VPY" -m pip install -q -e ".[test,plot]"
  if ! "$VPY" -c "import triton" >/dev/null 2>&1; then
    "$VPY" -m pip install -q triton
  fi
else
  "$VPY" -m pip install -q -e .
fi
"$VPY" -c "import torch, gpuparity; print(f'setup: gpuparity {gpuparity.__version__}, torch {torch.__version__}')"
