"""Apptainer definition files on the vendors' official PyTorch images. gpuparity goes in with
`pip install --no-deps`, so the image's own torch and Triton (vendor builds) are never replaced;
the build fails if torch changed anyway, and %test runs `gpuparity doctor --quick`. gpuparity is
not on PyPI: by default the image installs the checkout this gpuparity runs from."""
from __future__ import annotations

import os
import re
import shlex
from typing import Optional

from .. import __version__
from .environment import VENDORS

# Default images: AMD's ROCm PyTorch image; NVIDIA's NGC PyTorch image.
DEFAULT_IMAGES = {"amd": "rocm/pytorch:latest", "nvidia": "nvcr.io/nvidia/pytorch:25.01-py3"}
# pytorch/pytorch (Docker Hub) CUDA runtime images by torch version: the CUDA each release is
# published with (the tag is VERSION-cudaCU-cudnn9-runtime).
PYTORCH_HUB_CUDA = {"2.4": "12.4", "2.5": "12.4", "2.6": "12.6", "2.7": "12.6", "2.8": "12.8", "2.9": "12.8"}
_VERSION = re.compile(r"^\d+\.\d+(\.\d+)?$")
_IMAGE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:/@+-]*$")


def image_for(vendor: str, torch_version: Optional[str], image: Optional[str]) -> str:
    if image:
        if not _IMAGE.match(image):
            raise ValueError(f"image: expected a registry reference such as rocm/pytorch:TAG, got {image!r}")
        return image
    if torch_version and vendor == "nvidia":
        major_minor = ".".join(torch_version.split(".")[:2])
        cuda = PYTORCH_HUB_CUDA.get(major_minor)
        if cuda is None:
            raise ValueError(f"torch: no known pytorch/pytorch CUDA image for {torch_version!r} (known: "
                             f"{', '.join(sorted(PYTORCH_HUB_CUDA))}); pass --image with the tag you want")
        patch = torch_version if torch_version.count(".") == 2 else f"{torch_version}.0"
        return f"pytorch/pytorch:{patch}-cuda{cuda}-cudnn9-runtime"
    return DEFAULT_IMAGES[vendor]


# What pip needs of a gpuparity checkout to build it (not its .git, .venv or reports).
_CHECKOUT_PARTS = ("pyproject.toml", "README.md", "src")


def checkout_root() -> Optional[str]:
    """The source checkout this gpuparity runs from (an editable install or PYTHONPATH=src), or
    None when it was installed from a wheel."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    return root if _is_checkout(root) else None


def _is_checkout(path: str) -> bool:
    try:
        with open(os.path.join(path, "pyproject.toml"), encoding="utf-8") as f:
            named = 'name = "gpuparity"' in f.read()
    except OSError:
        return False
    return named and os.path.isdir(os.path.join(path, "src", "gpuparity"))


def apptainer_definition(vendor: str, *, torch_version: Optional[str] = None, image: Optional[str] = None,
                         source: Optional[str] = None, generated_by: str = "", filename: Optional[str] = None) -> str:
    """The definition file as text. `source`: what pip installs gpuparity from: a local wheel or
    source folder (copied into the image through %files; of a gpuparity checkout only what the
    build needs), a git URL or a pip requirement. Default: the checkout this gpuparity runs from
    (gpuparity is not on PyPI); installed from a wheel, there is none and `source` is required.
    filename: the name the definition is written as (default gpuparity.def): its build and run
    lines name it and the image built from it (NAME.sif)."""
    if vendor not in VENDORS:
        raise ValueError(f"vendor: expected amd or nvidia, got {vendor!r}")
    if torch_version is not None and not _VERSION.match(torch_version):
        raise ValueError(f"torch: expected a version such as 2.7 or 2.7.1, got {torch_version!r}")
    base = image_for(vendor, torch_version, image)
    definition = filename or "gpuparity.def"
    if "/" in definition or any(c.isspace() for c in definition):
        raise ValueError(f"filename: expected a file name without spaces or folders, got {filename!r}")
    sif = (definition[:-len(".def")] if definition.endswith(".def") else definition) + ".sif"
    if source is None:
        source = checkout_root()
        if source is None:
            raise ValueError("source: gpuparity is not on PyPI and this one was installed from a wheel, not run from "
                             "a checkout; pass --source with the repository folder, a wheel built from it "
                             "(python -m pip wheel --no-deps -w dist REPO) or a git URL (git+https://...)")
    if not source or "\n" in source or "'" in source:
        raise ValueError(f"source: expected a pip requirement, URL or path, got {source!r}")
    files = ""
    if os.path.exists(source):
        inside = "/opt/gpuparity-src" + ("/" + os.path.basename(source) if source.endswith(".whl") else "")
        if os.path.isdir(source) and _is_checkout(source):
            copies = [(os.path.join(os.path.abspath(source), part), f"{inside}/{part}") for part in _CHECKOUT_PARTS
                      if os.path.exists(os.path.join(source, part))]
        else:
            copies = [(os.path.abspath(source), inside)]
        if any(" " in path for path, _ in copies):
            # %files splits its lines on whitespace
            raise ValueError(f"source: %files cannot copy a path with a space; got {source!r} (build a wheel "
                             f"and pass it from a path without spaces)")
        files = "\n%files\n" + "".join(f"    {path} {dest}\n" for path, dest in copies)
        source = inside

    flag = "--rocm" if vendor == "amd" else "--nv"
    expect = ""
    if torch_version:
        expect = (f'\n    # --torch {torch_version}: the image must carry it (pick the tag with --image otherwise).\n'
                  f'    case "$TORCH_BEFORE" in {torch_version}|{torch_version}.*|{torch_version}+*|{torch_version}a*) ;;\n'
                  f'        *) echo "image {base} has torch $TORCH_BEFORE, not {torch_version}" >&2; exit 1 ;;\n'
                  f'    esac')
    env_lines = ["    export PYTHONUNBUFFERED=1"]
    if vendor == "amd":
        env_lines.append("    unset HSA_OVERRIDE_GFX_VERSION  # runs kernels built for another GPU")
    return f"""Bootstrap: docker
From: {base}

# gpuparity {__version__} on the {vendor.upper()} PyTorch image {base}
# ({generated_by or 'gpuparity template apptainer'}).
# Build: apptainer build {sif} {definition}   (add --notest on a machine without a GPU)
# Test on a compute node: apptainer test {flag} {sif}
# Run: apptainer exec {flag} {sif} python train.py

%labels
    org.gpuparity.version {__version__}
    org.gpuparity.vendor {vendor}
    org.gpuparity.base {base}
{files}
%post
    set -eu
    TORCH_BEFORE=$(python3 -c 'import torch; print(torch.__version__)')
    echo "image torch: $TORCH_BEFORE"{expect}
    # --no-deps: the image's vendor builds of torch and Triton must stay; gpuparity's other
    # dependencies (numpy, rich) do not pull torch in.
    python3 -m pip install --no-cache-dir --no-deps {shlex.quote(source)}
    python3 -m pip install --no-cache-dir numpy 'rich>=12'
    TORCH_AFTER=$(python3 -c 'import torch; print(torch.__version__)')
    if [ "$TORCH_BEFORE" != "$TORCH_AFTER" ]; then
        echo "torch changed from $TORCH_BEFORE to $TORCH_AFTER while installing gpuparity" >&2
        exit 1
    fi

%environment
{chr(10).join(env_lines)}

%test
    # Needs the GPU: apptainer test {flag} {sif}
    exec gpuparity doctor --quick

%runscript
    if [ "$#" -eq 0 ]; then
        exec gpuparity doctor --quick
    fi
    exec "$@"

%help
    gpuparity {__version__} on {base}. `apptainer run {flag} {sif}` checks this machine
    (gpuparity doctor --quick); `apptainer exec {flag} {sif} CMD` runs CMD.
"""
