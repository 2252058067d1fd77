#!/usr/bin/env bash
# Sets up .venv for gpuparity. Keeps a vendor torch that is already importable (CUDA or ROCm
# wheels bring their own Triton: never replace them), whatever its version string says, and
# installs only the other requirements that are missing (none: no network needed); with no torch
# at all it installs torch 2.13.0.
#   bash scripts/setup.sh          # for running gpuparity
#   bash scripts/setup.sh --test   # plus pytest, pytest-xdist, hypothesis, transformers (the [hf] tests) and, only if
#                                  # missing, triton (for the interpreter tests); offline, what is
#                                  # missing is named and setup exits 1
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

if ! "$VPY" -c "import torch" >/dev/null 2>&1; then
  echo "setup: no torch found; installing torch==2.13.0" >&2
  "$VPY" -m pip install -q "torch==2.13.0"
fi
# From here on the torch that is importable stays: gpuparity goes in with --no-deps, so pip never
# resolves torch (a vendor build's distribution version can differ from torch.__version__, e.g.
# 2.11.0 vs 2.11.0+cu130, and a pin on either can make pip fail offline or fetch a second torch),
# and only the other requirements that are missing are installed, with torch pinned.
TORCH_BEFORE=$("$VPY" -c "import torch; print(torch.__file__, torch.__version__)")
PIP_ARGS=(--no-deps)
# The build backend from .venv when it is recent enough: no download of setuptools (offline).
if "$VPY" -c "import setuptools, sys; sys.exit(int(setuptools.__version__.split('.')[0]) < 77)" \
    >/dev/null 2>&1; then
  PIP_ARGS+=(--no-build-isolation)
fi
EXTRAS=()
if [ "${1:-}" = "--test" ]; then
  EXTRAS=(test plot hf)
fi
"$VPY" -m pip install -q "${PIP_ARGS[@]}" -e .
# set -e stops here when the torch there is too old for gpuparity (the script says so)
REQUIREMENTS=$("$VPY" scripts/missing_requirements.py ${EXTRAS[@]+"${EXTRAS[@]}"})
MISSING=()  # one requirement an entry
while IFS= read -r line; do
  [ -n "$line" ] && MISSING+=("$line")
done <<EOF
$REQUIREMENTS
EOF
if [ "${1:-}" = "--test" ] && ! "$VPY" -c "import triton" >/dev/null 2>&1; then
  # for the interpreter tests; CUDA and ROCm torch wheels bring their own Triton, so only when missing
  MISSING+=(triton)
fi
if [ "${#MISSING[@]}" -gt 0 ]; then
  CONSTRAINTS=$(mktemp)
  trap 'rm -f "$CONSTRAINTS"' EXIT
  # a requirement that wants another torch is then an error, never a second torch
  "$VPY" -c "import importlib.metadata as m; print('torch==' + m.version('torch'))" > "$CONSTRAINTS" 2>/dev/null \
    || : > "$CONSTRAINTS"
  echo "setup: installing ${MISSING[*]}" >&2
  if ! "$VPY" -m pip install -q -c "$CONSTRAINTS" "${MISSING[@]}"; then
    echo "setup: could not install ${MISSING[*]} (offline? install them into the environment of $PY," \
         "or point pip at a folder of wheels with PIP_FIND_LINKS=DIR, then run setup again)" >&2
    exit 1
  fi
fi
TORCH_AFTER=$("$VPY" -c "import torch; print(torch.__file__, torch.__version__)")
if [ "$TORCH_BEFORE" != "$TORCH_AFTER" ]; then
  echo "setup: torch changed while installing gpuparity's requirements ($TORCH_BEFORE -> $TORCH_AFTER);" \
       "remove .venv and install the requirement that pulled it in by hand" >&2
  exit 1
fi
"$VPY" -c "import torch, gpuparity; print(f'setup: gpuparity {gpuparity.__version__}, torch {torch.__version__}')"
