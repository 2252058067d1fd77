"""gpuparity is not on PyPI: it installs from its repository or from a wheel or sdist built from
it. Built here (wheel and sdist) from exactly what `gpuparity template apptainer` copies into an
image by default, installed without a download into a fresh venv, imported and run."""
from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import sys
import tarfile

import pytest

import gpuparity
from gpuparity.templates import apptainer_definition

BUILD = ("import sys; from setuptools import build_meta as b; "
         "print(getattr(b, 'build_' + sys.argv[1])(sys.argv[2]))")


def _build(kind: str, source, out) -> str:
    """setuptools' PEP 517 hooks directly: what `pip wheel --no-build-isolation` and
    `python -m build --no-isolation` call (neither `build` nor a download is needed)."""
    proc = subprocess.run([sys.executable, "-c", BUILD, kind, str(out)], cwd=source, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return os.path.join(out, proc.stdout.strip().splitlines()[-1])


def _installed_and_runs(venv, wheel) -> None:
    python = os.path.join(venv, "bin", "python")
    subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--force-reinstall", wheel],
                   check=True, capture_output=True, timeout=300)
    version = subprocess.run([os.path.join(venv, "bin", "gpuparity"), "--version"], capture_output=True, text=True,
                             timeout=120)
    assert version.returncode == 0 and version.stdout.strip() == f"gpuparity {gpuparity.__version__}", version
    # the installed package, with its data files, not this checkout's
    found = subprocess.run([python, "-c", "import gpuparity, importlib.resources as r; print(gpuparity.__file__); "
                                          "print((r.files('gpuparity') / 'known' / 'issues.json').is_file())"],
                           capture_output=True, text=True, check=True, cwd="/").stdout.split()
    assert found[0].startswith(str(venv)) and found[1] == "True", found


@pytest.mark.slow
def test_wheel_and_sdist_from_the_apptainer_default_source_install_and_run(tmp_path):
    # %files of the default definition: the checkout's parts, copied as an image build would
    definition = apptainer_definition("nvidia")
    files = re.search(r"^%files\n(.*?)\n\n", definition, flags=re.S | re.M).group(1)
    image = tmp_path / "image"
    for line in files.splitlines():
        path, dest = line.split()
        target = image / dest.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        copy = shutil.copytree if os.path.isdir(path) else shutil.copy
        copy(path, target, **({"ignore": shutil.ignore_patterns("__pycache__", "*.egg-info")}
                             if os.path.isdir(path) else {}))
    assert "pip install --no-cache-dir --no-deps /opt/gpuparity-src\n" in definition
    source = image / "opt" / "gpuparity-src"
    dist = tmp_path / "dist"
    wheel = _build("wheel", source, dist)
    sdist = _build("sdist", source, dist)

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    _installed_and_runs(venv, wheel)

    # the sdist holds everything a build needs: unpack it, build a wheel from it alone, install that
    with tarfile.open(sdist) as tar:
        tar.extractall(tmp_path / "unpacked", **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    unpacked = glob.glob(str(tmp_path / "unpacked" / "gpuparity-*"))[0]
    _installed_and_runs(venv, _build("wheel", unpacked, tmp_path / "dist-from-sdist"))
