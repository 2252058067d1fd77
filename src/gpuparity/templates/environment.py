"""The environment a job should start with, from the known-issue base judged against the target
cluster (which is rarely the machine the script is written on)."""
from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Optional, Tuple

VENDORS = ("amd", "nvidia")

# Used when gpuparity.known cannot be imported: the settings the base recommends most often.
BUILTIN_DEFAULTS = {
    "amd": [("HSA_FORCE_FINE_GRAIN_PCIE", "1", "RCCL-IOMMU",
             "RCCL between GPUs of one node without iommu=pt", True)],
    "nvidia": [],
}


@dataclasses.dataclass
class EnvSetting:
    name: str
    value: Optional[str]      # None: unset the variable
    source: str               # the known-issue id (or "gpuparity")
    why: str

    def shell(self) -> str:
        return f"unset {self.name}" if self.value is None else f"export {self.name}={_quote(self.value)}"


def _quote(value: str) -> str:
    import shlex
    return shlex.quote(value)


def target_platform(vendor: str, gpus_per_node: int, arch: Optional[str] = None,
                    torch_version: Optional[str] = None) -> Dict[str, Any]:
    """A platform report for a compute node described by the template's arguments. Facts the
    arguments do not give stay unknown, so rules that need them cannot decide. The job starts
    from the environment the script sets and the kernel's default parameters."""
    if vendor not in VENDORS:
        raise ValueError(f"vendor: expected amd or nvidia, got {vendor!r}")
    unknown = {"unknown": "not given to the template (pass --platform with a compute node's report)"}
    # None (not an "unknown" record) is how a device fact the rules cannot read is spelled.
    device = {"name": None, "arch": arch}
    return {
        "schema_version": 1,
        "vendor": vendor,
        "torch": {"version": torch_version or unknown, "hip": unknown if vendor == "amd" else None,
                  "cuda": unknown if vendor == "nvidia" else None},
        "devices": [dict(device, index=i) for i in range(gpus_per_node)],
        "libraries": unknown,
        "env": {},
        "kernel_params": {"amdgpu": {}, "iommu": {}},
        "hsa_override": None,
        "numerics": unknown,
        "cuda_available": True,
    }


def recommended_environment(vendor: str, gpus_per_node: int, *, platform: Optional[Dict[str, Any]] = None,
                            arch: Optional[str] = None) -> Tuple[List[EnvSetting], List[EnvSetting], str]:
    """(settings to export, settings that may apply but the facts cannot decide, where they came from).

    Only entries of the known-issue base whose every clause holds on the target make the first
    list; an entry that needs a fact the arguments do not give (ROCm version, device name) goes
    to the second, which the scripts show as commented-out lines. Entries whose remedy applies
    only when a probe confirmed the bug never appear: a script cannot run the probe."""
    if vendor not in VENDORS:
        raise ValueError(f"vendor: expected amd or nvidia, got {vendor!r}")
    report = platform if platform is not None else target_platform(vendor, gpus_per_node, arch)
    try:
        from ..known import evaluate
        from ..known.engine import CONFIRMED, MAY_APPLY
    except Exception as exc:  # noqa: BLE001 - the base is optional for a template
        settings = [EnvSetting(n, v, s, w) for n, v, s, w, multi in BUILTIN_DEFAULTS[vendor]
                    if not multi or gpus_per_node > 1]
        return settings, [], f"gpuparity's built-in defaults (the known-issue base is not available: {exc})"
    decided: Dict[str, EnvSetting] = {}
    undecided: Dict[str, EnvSetting] = {}
    results = evaluate(report, probes=False)
    for status in (CONFIRMED, MAY_APPLY):
        for result in results:
            if result.status != status or not result.remedy_env:
                continue
            if status == MAY_APPLY and result.remedy_env_scope == CONFIRMED:
                continue
            unknowns = [w[len("cannot tell: "):].split(" (")[0] for w in result.why if w.startswith("cannot tell: ")]
            target = undecided if unknowns else decided
            why = result.title + (f" (cannot tell: {'; '.join(unknowns)})" if unknowns else "")
            for name, value in result.remedy_env.items():
                if name not in decided and name not in target:
                    target[name] = EnvSetting(name, value, result.id, why)
    for name in decided:
        undecided.pop(name, None)
    where = "a compute node's platform report" if platform is not None else "the template's arguments"
    return list(decided.values()), list(undecided.values()), f"gpuparity's known-issue base, judged on {where}"
