"""Used by scripts/setup.sh after `pip install --no-deps -e .`: prints, one a line, gpuparity's
requirements (with the extras named in argv) that this interpreter does not satisfy yet, leaving
torch out. torch is never installed here: the one already importable is checked against gpuparity's
requirement by its distribution version, or by torch.__version__ when it has no distribution
metadata (a module-provided or PYTHONPATH install), and an unmet torch requirement is an error
(exit 1, message on stderr) rather than something to download.

    python scripts/missing_requirements.py [EXTRA ...]

Exit 0: the lines printed (possibly none) are what pip still has to install."""
from __future__ import annotations

import importlib.metadata as metadata
import sys

try:
    from packaging.requirements import Requirement
    from packaging.version import InvalidVersion, Version
except ImportError:  # a fresh venv has pip (which vendors packaging) but not packaging itself
    from pip._vendor.packaging.requirements import Requirement
    from pip._vendor.packaging.version import InvalidVersion, Version


def installed_version(name: str):
    """The installed version of distribution `name`, or None when it is not installed."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def torch_version() -> str:
    """The importable torch's version as pip would see it: its distribution's version, which
    vendor and NGC-style builds set apart from torch.__version__ (2.11.0 vs 2.11.0+cu130)."""
    found = installed_version("torch")
    if found is not None:
        return found
    import torch
    return torch.__version__


def satisfied(requirement: Requirement, version: str) -> bool:
    try:
        # prereleases=True: a vendor's 2.6.0a0+git... torch satisfies torch>=2.4 as far as
        # gpuparity is concerned, even though pip would skip prereleases when choosing one
        return requirement.specifier.contains(Version(version), prereleases=True)
    except InvalidVersion:
        return False


def main(extras) -> int:
    requires = metadata.requires("gpuparity") or []
    missing = []
    for line in requires:
        requirement = Requirement(line)
        if requirement.marker is not None and not any(
                requirement.marker.evaluate({"extra": extra}) for extra in ("", *extras)):
            continue
        if requirement.name.lower() == "torch":
            version = torch_version()
            if not satisfied(requirement, version):
                print(f"setup: gpuparity needs {requirement}; the torch here is {version}. Install a newer torch "
                      f"into this environment (setup never replaces the one that is there).", file=sys.stderr)
                return 1
            continue
        version = installed_version(requirement.name)
        if version is None or not satisfied(requirement, version):
            missing.append(str(requirement).split(";")[0].strip())
    print("\n".join(missing))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
