"""Probes of the install and the machine: torch's arch list, ROCm device permissions, the HSA gfx
override, APU memory and NUMA placement (sysfs)."""
from __future__ import annotations

import glob
import os
import re
from typing import Any, Dict, List, Optional

import torch

from ..rules import arch_in_wheel
from .base import finding, first_line, inconclusive, is_rocm, probe, randn, sync


@probe(gpu=True)
def arch_smoke(dev: torch.device) -> Dict[str, Any]:
    """torch's arch list against this device's arch, and one kernel launch."""
    arch_list = list(torch.cuda.get_arch_list())
    props = torch.cuda.get_device_properties(dev)
    if is_rocm():
        arch = (getattr(props, "gcnArchName", "") or "").split(":")[0]
    else:
        arch = f"sm_{props.major}{props.minor}"
    listed = arch_in_wheel(arch, arch_list, "amd" if is_rocm() else "nvidia")
    try:
        value = float((torch.ones(16, device=dev) * 2 + 1).sum().item())
        sync(dev)
    except RuntimeError as exc:
        return finding(True, f"{props.name} ({arch}): a kernel launch fails: {first_line(exc)}; torch's arch list: "
                             f"{', '.join(arch_list)}", arch=arch, arch_list=arch_list)
    if value != 48.0:
        return finding(True, f"{props.name} ({arch}): a kernel ran but computed {value}, expected 48")
    note = "listed in" if listed else "not listed in (a compatible or overridden target ran)"
    return finding(False, f"{props.name} ({arch}) is {note} torch's arch list; a kernel launch works",
                   arch=arch, arch_list=arch_list)


@probe(default="cpu")
def rocm_perms(dev: torch.device) -> Dict[str, Any]:
    """Access to /dev/kfd and the render nodes, the user's groups, and torch.cuda.is_available()."""
    import grp
    if not os.path.exists("/dev/kfd"):
        return inconclusive("no /dev/kfd: the amdgpu kernel driver is not loaded (or this is a container "
                            "without the device passed in)")
    access = {path: os.access(path, os.R_OK | os.W_OK) for path in ["/dev/kfd"] + sorted(glob.glob("/dev/dri/renderD*"))}
    groups = sorted({grp.getgrgid(gid).gr_name for gid in os.getgroups() if _group_exists(gid)})
    denied = [path for path, ok in access.items() if not ok]
    available = bool(torch.cuda.is_available())
    if denied:
        owners = {path: _group_of(path) for path in denied}
        return finding(True, f"no read/write access to {', '.join(denied)} (owned by group "
                             f"{', '.join(sorted(set(owners.values())))}); this user's groups: {', '.join(groups)}",
                       denied=denied, groups=groups, cuda_available=available)
    if not available:
        return inconclusive("the device files are accessible but torch.cuda.is_available() is False "
                            "(check HIP_VISIBLE_DEVICES / ROCR_VISIBLE_DEVICES and the driver)", groups=groups)
    return finding(False, f"/dev/kfd and {len(access) - 1} render node(s) accessible; GPU available", groups=groups)


def _group_exists(gid: int) -> bool:
    import grp
    try:
        grp.getgrgid(gid)
        return True
    except KeyError:
        return False


def _group_of(path: str) -> str:
    import grp
    try:
        return grp.getgrgid(os.stat(path).st_gid).gr_name
    except (KeyError, OSError):
        return "?"


def _read(path: str) -> Optional[str]:
    try:
        with open(path) as handle:
            return handle.read()
    except OSError:
        return None


def kfd_gfx_targets(root: str = "/sys/class/kfd/kfd/topology/nodes") -> List[int]:
    """The hardware gfx_target_version of each GPU node (the override does not change these)."""
    targets = []
    for properties in sorted(glob.glob(os.path.join(root, "*", "properties"))):
        text = _read(properties) or ""
        match = re.search(r"^gfx_target_version\s+(\d+)", text, re.MULTILINE)
        if match and int(match.group(1)) > 0:
            targets.append(int(match.group(1)))
    return targets


def gfx_name(target: int) -> str:
    """KFD gfx_target_version (major*10000 + minor*100 + stepping) -> 'gfx90a', 'gfx1100'."""
    major, minor, stepping = target // 10000, target // 100 % 100, target % 100
    return f"gfx{major}{minor:x}{stepping:x}"


def override_target(value: str) -> Optional[int]:
    parts = value.strip().split(".")
    if len(parts) != 3 or not all(part.isdigit() for part in parts):
        return None
    major, minor, stepping = (int(part) for part in parts)
    return major * 10000 + minor * 100 + stepping


@probe(default="cpu")
def hsa_override(dev: torch.device, topology_root: str = "/sys/class/kfd/kfd/topology/nodes") -> Dict[str, Any]:
    """HSA_OVERRIDE_GFX_VERSION against each GPU's real gfx target (KFD sysfs); then one matmul
    on the GPU (a stale override crashes it)."""
    value = os.environ.get("HSA_OVERRIDE_GFX_VERSION")
    if not value:
        return finding(False, "HSA_OVERRIDE_GFX_VERSION is not set in this process")
    wanted = override_target(value)
    if wanted is None:
        return finding(True, f"HSA_OVERRIDE_GFX_VERSION={value!r} is not MAJOR.MINOR.STEPPING")
    targets = kfd_gfx_targets(topology_root)
    findings = []
    if targets:
        # Same major.minor with another stepping is the common workaround; another family is stale.
        foreign = [gfx_name(t) for t in targets if t // 100 != wanted // 100]
        if foreign:
            findings.append(f"override {value} ({gfx_name(wanted)}) does not match the hardware "
                            f"{', '.join(sorted(set(foreign)))}: code for the wrong family runs on it")
        hardware = ", ".join(sorted({gfx_name(t) for t in targets}))
    else:
        hardware = "unknown (KFD topology not readable)"
    smoke = ""
    if dev.type == "cuda" and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(dev)
        a = randn((256, 256), dev, torch.float32, 1)
        value_sum = float((a @ a).sum().item())
        sync(dev)
        smoke = f"; {props.name} reports {getattr(props, 'gcnArchName', '?')} and a matmul ran ({value_sum:.3g})"
    if findings:
        return finding(True, "; ".join(findings) + smoke, override=value, hardware=hardware)
    if not targets:
        return inconclusive(f"HSA_OVERRIDE_GFX_VERSION={value}; the hardware gfx target could not be read{smoke}",
                            override=value)
    same = all(t == wanted for t in targets)
    note = ("it equals the hardware target and can be removed" if same else
            "same family as the hardware (the usual workaround for an unlisted stepping); it still bypasses "
            "ROCm's support matrix")
    return finding(False, f"HSA_OVERRIDE_GFX_VERSION={value} ({gfx_name(wanted)}) on {hardware}: {note}{smoke}",
                   override=value, hardware=hardware)


def _drm_memory() -> List[Dict[str, Any]]:
    cards = []
    for device_dir in sorted(glob.glob("/sys/class/drm/card[0-9]*/device")):
        vram, gtt = _read(os.path.join(device_dir, "mem_info_vram_total")), _read(os.path.join(device_dir, "mem_info_gtt_total"))
        if vram is None and gtt is None:
            continue
        cards.append({"card": device_dir.split("/")[-2], "vram_total": int(vram) if vram else None,
                      "gtt_total": int(gtt) if gtt else None})
    return cards


@probe(gpu=True)
def apu_memory(dev: torch.device) -> Dict[str, Any]:
    """torch's view of the APU's memory (mem_get_info) against the VRAM carve-out and GTT in sysfs."""
    free, total = torch.cuda.mem_get_info(dev)
    cards = _drm_memory()
    if not cards:
        return inconclusive(f"torch sees {total / 2**30:.1f} GiB; no amdgpu memory info in sysfs", torch_total=total)
    card = min(cards, key=lambda c: abs((c["vram_total"] or 0) - total))
    vram, gtt = card["vram_total"] or 0, card["gtt_total"] or 0
    text = (f"torch sees {total / 2**30:.1f} GiB ({free / 2**30:.1f} free); {card['card']}: VRAM carve-out "
            f"{vram / 2**30:.1f} GiB, GTT {gtt / 2**30:.1f} GiB")
    measured = {"torch_total": total, "vram_total": vram, "gtt_total": gtt}
    if total <= vram * 1.05 and gtt > 2 * vram:
        return finding(True, text + ": only the carve-out is usable", **measured)
    if total > vram * 1.5:
        return finding(False, text + ": torch sees more than the carve-out", **measured)
    return inconclusive(text, **measured)


def _node_free_kib() -> Dict[int, int]:
    free = {}
    for path in glob.glob("/sys/devices/system/node/node[0-9]*/meminfo"):
        match = re.search(r"MemFree:\s+(\d+) kB", _read(path) or "")
        if match:
            free[int(path.split("/node")[-1].split("/")[0])] = int(match.group(1))
    return free


def _device_numa_node(dev: torch.device) -> Optional[int]:
    props = torch.cuda.get_device_properties(dev)
    bus, slot, domain = (getattr(props, name, None) for name in ("pci_bus_id", "pci_device_id", "pci_domain_id"))
    if bus is None or slot is None:
        return None
    text = _read(f"/sys/bus/pci/devices/{int(domain or 0):04x}:{int(bus):02x}:{int(slot):02x}.0/numa_node")
    return int(text) if text and text.strip().lstrip("-").isdigit() and int(text) >= 0 else None


@probe(gpu=True)
def numa_spill(dev: torch.device) -> Dict[str, Any]:
    """Per-NUMA-node MemFree around a 1 GiB allocation: did it land on this APU's node?"""
    before = _node_free_kib()
    if not before:
        return inconclusive("no NUMA node meminfo in sysfs")
    block = torch.empty(2 ** 28, dtype=torch.float32, device=dev).fill_(1.0)
    sync(dev)
    after = _node_free_kib()
    del block
    torch.cuda.empty_cache()
    drops = {node: (before[node] - after.get(node, before[node])) * 1024 for node in before}
    local = _device_numa_node(dev)
    total_drop = sum(max(0, d) for d in drops.values())
    text = ", ".join(f"node {node}: {drop / 2**20:+.0f} MiB" for node, drop in sorted(drops.items()))
    measured = {"drops_bytes": {str(k): v for k, v in drops.items()}, "local_node": local}
    if local is None or total_drop < 2 ** 29:
        return inconclusive(f"1 GiB allocation; MemFree drop per node: {text}; the device's node "
                            f"{'unknown' if local is None else local}", **measured)
    remote = sum(max(0, d) for node, d in drops.items() if node != local)
    if remote > total_drop / 2:
        return finding(True, f"most of a 1 GiB allocation landed off the device's node {local}: {text}", **measured)
    return inconclusive(f"a 1 GiB allocation landed on the device's node {local} ({text}); spills happen under "
                        "memory pressure, which this probe does not create", **measured)
