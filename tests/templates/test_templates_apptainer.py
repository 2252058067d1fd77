"""Apptainer definitions: the vendor's image, gpuparity installed without touching torch, doctor in
%test; the shell sections are valid sh, and %post refuses an image with the wrong torch."""
from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest

from gpuparity import __version__
from gpuparity.cli import main
from gpuparity.templates import apptainer, apptainer_definition
from gpuparity.templates.apptainer import checkout_root


def sections(text):
    """{'post': body, 'test': body, ...} of a definition file."""
    found = {}
    for match in re.finditer(r"^%(\w+)\n(.*?)(?=^%\w+\n|\Z)", text, flags=re.S | re.M):
        found[match.group(1)] = match.group(2)
    return found


def _check_sh(tmp_path, name, body):
    path = tmp_path / f"{name}.sh"
    path.write_text("#!/bin/sh\n" + body)
    subprocess.run(["sh", "-n", str(path)], check=True)
    if shutil.which("shellcheck"):
        proc = subprocess.run(["shellcheck", "-s", "sh", str(path)], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stdout


@pytest.mark.parametrize("vendor", ["amd", "nvidia"])
def test_definition_sections_are_valid_sh(tmp_path, vendor):
    text = apptainer_definition(vendor)
    parts = sections(text)
    assert {"labels", "post", "environment", "test", "runscript"} <= set(parts)
    for name in ("post", "environment", "test", "runscript"):
        _check_sh(tmp_path, name, parts[name])
    assert "gpuparity doctor --quick" in parts["test"]
    # gpuparity is not on PyPI: the default installs the checkout the definition was generated from
    assert "pip install --no-cache-dir --no-deps /opt/gpuparity-src\n" in parts["post"]
    assert f"gpuparity=={__version__}" not in text
    assert "HSA_OVERRIDE_GFX_VERSION" not in parts["environment"] or vendor == "amd"


def test_images():
    assert "From: rocm/pytorch:latest" in apptainer_definition("amd")
    assert "From: nvcr.io/nvidia/pytorch:" in apptainer_definition("nvidia")
    assert "From: pytorch/pytorch:2.7.1-cuda12.6-cudnn9-runtime" in apptainer_definition("nvidia", torch_version="2.7.1")
    assert "From: pytorch/pytorch:2.5.0-cuda12.4-cudnn9-runtime" in apptainer_definition("nvidia", torch_version="2.5")
    assert "From: rocm/pytorch:my-tag" in apptainer_definition("amd", image="rocm/pytorch:my-tag")


def test_default_source_is_the_checkout_without_its_venv_or_git(tmp_path):
    root = checkout_root()
    assert root is not None  # the tests run from a checkout
    files = sections(apptainer_definition("amd"))["files"]
    assert files.split() == [os.path.join(root, "pyproject.toml"), "/opt/gpuparity-src/pyproject.toml",
                             os.path.join(root, "README.md"), "/opt/gpuparity-src/README.md",
                             os.path.join(root, "src"), "/opt/gpuparity-src/src"]


def test_without_a_checkout_the_source_must_be_named(monkeypatch):
    # installed from a wheel: nothing to copy in, and `gpuparity==VERSION` cannot be downloaded
    monkeypatch.setattr(apptainer, "checkout_root", lambda: None)
    with pytest.raises(ValueError, match="source: gpuparity is not on PyPI"):
        apptainer_definition("amd")
    assert "pip install --no-cache-dir --no-deps git+https://example.org/gpuparity.git\n" in apptainer_definition(
        "amd", source="git+https://example.org/gpuparity.git")


def test_local_source_is_copied_in(tmp_path):
    wheel = tmp_path / "gpuparity-0.1.0-py3-none-any.whl"
    wheel.write_text("")
    text = apptainer_definition("amd", source=str(wheel))
    assert f"%files\n    {wheel} /opt/gpuparity-src/{wheel.name}" in text
    assert f"--no-deps /opt/gpuparity-src/{wheel.name}" in text


@pytest.mark.parametrize("kwargs,match", [(dict(vendor="intel"), "vendor"),
                                          (dict(vendor="amd", torch_version="latest"), "torch"),
                                          (dict(vendor="nvidia", torch_version="1.13"), "torch"),
                                          (dict(vendor="amd", image="bad image"), "image")])
def test_bad_arguments(kwargs, match):
    vendor = kwargs.pop("vendor")
    with pytest.raises(ValueError, match=match):
        apptainer_definition(vendor, **kwargs)


def _run_post(tmp_path, text, versions):
    """Run %post with stub python3 (answers torch versions in turn) and pip."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    state = tmp_path / "calls"
    state.write_text("")
    answers = " ".join(versions)
    (bin_dir / "python3").write_text(f"""#!/bin/sh
if [ "$1" = "-m" ]; then echo "pip $*" >> {state}; exit 0; fi
n=$(grep -c torch-version {state})
echo torch-version >> {state}
set -- {answers}
shift "$n"
echo "$1"
""")
    (bin_dir / "python3").chmod(0o755)
    script = tmp_path / "post.sh"
    script.write_text("#!/bin/sh\n" + sections(text)["post"])
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}")
    return subprocess.run(["sh", str(script)], env=env, capture_output=True, text=True, timeout=30), state.read_text()


def test_post_installs_without_deps_and_keeps_torch(tmp_path):
    proc, calls = _run_post(tmp_path, apptainer_definition("amd", torch_version="2.7.1"),
                            ["2.7.1+rocm6.3", "2.7.1+rocm6.3"])
    assert proc.returncode == 0, proc.stderr
    assert "pip -m pip install --no-cache-dir --no-deps /opt/gpuparity-src\n" in calls


def test_post_fails_when_torch_changes(tmp_path):
    proc, _ = _run_post(tmp_path, apptainer_definition("amd"), ["2.7.1+rocm6.3", "2.9.0+cu128"])
    assert proc.returncode == 1 and "torch changed" in proc.stderr


def test_post_fails_on_the_wrong_torch(tmp_path):
    proc, calls = _run_post(tmp_path, apptainer_definition("amd", torch_version="2.6"), ["2.7.1+rocm6.3"] * 2)
    assert proc.returncode == 1 and "not 2.6" in proc.stderr
    assert "pip" not in calls


def test_cli(tmp_path, capsys):
    out = tmp_path / "gpuparity.def"
    assert main(["template", "apptainer", "--vendor", "nvidia", "--out", str(out)]) == 0
    assert out.read_text().startswith("Bootstrap: docker\n")
    assert main(["template", "apptainer", "--vendor", "amd", "--torch", "x.y"]) == 2
    assert "torch" in capsys.readouterr().err
