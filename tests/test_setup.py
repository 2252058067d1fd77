"""scripts/setup.sh keeps the torch it finds and needs no network: with torch in the
interpreter's own venv, and with a vendor-style torch whose distribution version differs from
torch.__version__ (2.11.0 vs 2.11.0+cu130), offline."""
from __future__ import annotations

import glob
import importlib.metadata
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _torch_file(python: str) -> str:
    return subprocess.run([python, "-c", "import torch; print(torch.__file__)"], capture_output=True, text=True,
                          check=True).stdout.strip()


def _copy_repo(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(os.path.join(ROOT, name), repo / name)
    for name in ("src", "scripts"):
        shutil.copytree(os.path.join(ROOT, name), repo / name,
                        ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    return repo


def _offline_env(python: str) -> dict:
    """No index, no wheel folder, no pip configuration file (this machine's names a wheel folder)."""
    env = dict(os.environ, PYTHON=python, PIP_NO_INDEX="1", PIP_FIND_LINKS="", PIP_CONFIG_FILE=os.devnull,
               PIP_DISABLE_PIP_VERSION_CHECK="1")
    env.pop("VIRTUAL_ENV", None)
    return env


def _setup(repo, env, *args):
    return subprocess.run(["bash", "scripts/setup.sh", *args], cwd=repo, env=env, capture_output=True, text=True,
                          timeout=600)


@pytest.mark.slow
def test_setup_uses_the_torch_of_the_venv_it_was_started_from(tmp_path):
    # This test's own interpreter imports torch; in CI and here it is a venv whose base
    # interpreter has no torch: exactly the case `venv --system-site-packages` got wrong.
    host = sys.executable
    repo = _copy_repo(tmp_path)
    proc = _setup(repo, _offline_env(host))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "installing torch" not in proc.stderr
    assert "Deprecat" not in proc.stdout + proc.stderr  # e.g. setuptools on project.license
    new_python = str(repo / ".venv" / "bin" / "python")
    assert _torch_file(new_python) == _torch_file(host)
    imported = subprocess.run([new_python, "-c", "import gpuparity; print(gpuparity.__file__)"],
                              capture_output=True, text=True, check=True, cwd=tmp_path).stdout.strip()
    assert imported.startswith(str(repo))  # the copy's gpuparity, not the host's


def _fake_distribution(site: str, name: str, version: str) -> None:
    info = os.path.join(site, f"{name}-{version}.dist-info")
    os.makedirs(info)
    with open(os.path.join(info, "METADATA"), "w") as f:
        f.write(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    for file, text in (("INSTALLER", "pip\n"), ("RECORD", "")):
        with open(os.path.join(info, file), "w") as f:
            f.write(text)


@pytest.mark.slow
def test_setup_keeps_a_vendor_torch_whose_distribution_version_differs_offline(tmp_path):
    # The GPU test machine: a venv whose torch says 2.11.0+cu130 while its distribution is 2.11.0.
    # A pin on torch.__version__ made pip resolve torch and fail offline (or, with a wheel folder
    # in reach, install a second torch). Here: a tiny stand-in torch with exactly that mismatch,
    # numpy and rich present (as distributions), setuptools >= 77 to build gpuparity, no index.
    host_dir = tmp_path / "host"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(host_dir)], check=True)
    host = str(host_dir / "bin" / "python")
    site = subprocess.run([host, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    os.makedirs(os.path.join(site, "torch"))
    with open(os.path.join(site, "torch", "__init__.py"), "w") as f:
        f.write('__version__ = "2.11.0+cu130"\n')
    _fake_distribution(site, "torch", "2.11.0")
    _fake_distribution(site, "numpy", "2.0.0")
    _fake_distribution(site, "rich", "13.0.0")
    setuptools = importlib.metadata.distribution("setuptools")
    for top in ("setuptools", "_distutils_hack", os.path.basename(str(setuptools._path))):
        os.symlink(os.path.join(os.path.dirname(str(setuptools._path)), top), os.path.join(site, top))
    repo = _copy_repo(tmp_path)
    env = _offline_env(host)

    proc = _setup(repo, env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "setup: gpuparity 0.1.0, torch 2.11.0+cu130" in proc.stdout
    venv_python = str(repo / ".venv" / "bin" / "python")
    assert _torch_file(venv_python) == os.path.join(site, "torch", "__init__.py")
    assert not glob.glob(str(repo / ".venv" / "lib" / "*" / "site-packages" / "torch*"))  # no second torch

    # --test offline: the test extras are missing and cannot be fetched: a clear error naming them,
    # still no torch installed
    proc = _setup(repo, env, "--test")
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "setup: could not install" in proc.stderr and "pytest" in proc.stderr, proc.stderr[-3000:]
    assert "installing torch" not in proc.stderr
    assert _torch_file(venv_python) == os.path.join(site, "torch", "__init__.py")
