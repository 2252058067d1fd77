"""scripts/setup.sh with torch in the interpreter's own venv: .venv uses that torch, offline."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _torch_file(python: str) -> str:
    return subprocess.run([python, "-c", "import torch; print(torch.__file__)"], capture_output=True, text=True,
                          check=True).stdout.strip()


@pytest.mark.slow
def test_setup_uses_the_torch_of_the_venv_it_was_started_from(tmp_path):
    # This test's own interpreter imports torch; in CI and here it is a venv whose base
    # interpreter has no torch: exactly the case `venv --system-site-packages` got wrong.
    host = sys.executable
    repo = tmp_path / "repo"
    repo.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(os.path.join(ROOT, name), repo / name)
    for name in ("src", "scripts"):
        shutil.copytree(os.path.join(ROOT, name), repo / name,
                        ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    env = dict(os.environ, PYTHON=host, PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    env.pop("VIRTUAL_ENV", None)
    proc = subprocess.run(["bash", "scripts/setup.sh"], cwd=repo, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "installing torch" not in proc.stderr
    assert "Deprecat" not in proc.stdout + proc.stderr  # e.g. setuptools on project.license
    new_python = str(repo / ".venv" / "bin" / "python")
    assert _torch_file(new_python) == _torch_file(host)
    imported = subprocess.run([new_python, "-c", "import gpuparity; print(gpuparity.__file__)"],
                              capture_output=True, text=True, check=True, cwd=tmp_path).stdout.strip()
    assert imported.startswith(str(repo))  # the copy's gpuparity, not the host's
