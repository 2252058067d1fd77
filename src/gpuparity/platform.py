"""What machine is this: vendor, build, devices, libraries, numerics flags and the environment
that changes numerics. `collect()` never raises: what it cannot read is recorded as
{"unknown": reason}."""
from __future__ import annotations

import hashlib
import json
import os
import platform as _pyplatform
import re
import sys
from typing import Any, Callable, Dict, List, Optional

SCHEMA_VERSION = 1

# Environment variables that change numerics, stability or collectives.
ENV_PREFIXES = ("HSA_", "HIP_", "ROCR_", "ROCM_", "ROCBLAS_", "HIPBLASLT_", "MIOPEN_", "NCCL_", "RCCL_",
                "CUBLAS_", "CUBLASLT_", "CUDNN_", "CUDA_", "PYTORCH_", "TORCH_", "TRITON_",
                "AMD_", "GPU_", "OMP_NUM_THREADS")
# Variables whose values are secrets or noise rather than configuration.
ENV_SKIP = ("CUDA_CACHE_PATH",)


def unknown(reason: str) -> Dict[str, str]:
    return {"unknown": reason}


def is_unknown(value) -> bool:
    return isinstance(value, dict) and set(value) == {"unknown"}


def _safe(fn: Callable[[], Any]) -> Any:
    """Run a probe; an exception becomes an "unknown" record with the reason."""
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - the platform report must never raise
        return unknown(f"{type(exc).__name__}: {exc}"[:300])


def _torch_build() -> Dict[str, Any]:
    import torch
    hip = getattr(torch.version, "hip", None)
    cuda = getattr(torch.version, "cuda", None)
    return {
        "version": torch.__version__,
        "git_version": getattr(torch.version, "git_version", None),
        "cuda": cuda,
        "hip": hip,
        "debug": bool(getattr(torch.version, "debug", False)),
        "arch_list": _safe(lambda: list(torch.cuda.get_arch_list())),
    }


def _vendor() -> str:
    import torch
    if getattr(torch.version, "hip", None):
        return "amd"
    if getattr(torch.version, "cuda", None):
        return "nvidia"
    return "cpu"


def _arch_of(props, vendor: str) -> str:
    if vendor == "amd":
        name = getattr(props, "gcnArchName", "") or ""
        return name.split(":")[0] or "gfx-unknown"
    return f"sm_{props.major}{props.minor}"


def _is_apu(props, vendor: str, arch: str) -> Optional[bool]:
    if vendor != "amd":
        return bool(getattr(props, "is_integrated", False))
    integrated = getattr(props, "is_integrated", None)
    if integrated:
        return True
    # MI300A (gfx942 with unified HBM) and Strix/Phoenix APUs report as integrated on
    # recent builds; older builds do not, so fall back to the marketing name.
    name = getattr(props, "name", "") or ""
    return bool(re.search(r"MI300A|Radeon \d+M|Graphics", name)) or arch in ("gfx1150", "gfx1151", "gfx1103")


def _devices(vendor: str) -> Any:
    import torch
    if vendor == "cpu":
        return []
    if not torch.cuda.is_available():
        return unknown("torch.cuda.is_available() is False")
    devices: List[Dict[str, Any]] = []
    for index in range(torch.cuda.device_count()):
        def one(index=index):
            props = torch.cuda.get_device_properties(index)
            arch = _arch_of(props, vendor)
            return {
                "index": index,
                "name": props.name,
                "arch": arch,
                "capability": [props.major, props.minor],
                "total_memory_bytes": int(props.total_memory),
                "multiprocessors": int(props.multi_processor_count),
                "warp_size": int(getattr(props, "warp_size", 64 if vendor == "amd" else 32)),
                "is_apu": _is_apu(props, vendor, arch),
                "l2_cache_bytes": int(getattr(props, "L2_cache_size", 0)) or None,
            }
        devices.append(_safe(one))
    return devices


def _triton() -> Dict[str, Any]:
    try:
        import triton  # noqa: F401
    except Exception as exc:  # noqa: BLE001
        return {"version": None, "can_compile": False, "reason": f"triton is not importable: {exc}"}
    info: Dict[str, Any] = {"version": getattr(triton, "__version__", "unknown")}
    if os.environ.get("TRITON_INTERPRET") == "1":
        info.update(can_compile=False, interpreter=True,
                    reason="TRITON_INTERPRET=1: kernels run in the interpreter (correctness only)")
        return info
    try:
        from triton.runtime import driver
        target = driver.active.get_current_target()
        info.update(can_compile=True, target=f"{target.backend}:{target.arch}", reason="")
    except Exception as exc:  # noqa: BLE001
        info.update(can_compile=False, reason=f"no GPU target for Triton: {type(exc).__name__}: {exc}"[:300])
    return info


def _libraries(vendor: str) -> Dict[str, Any]:
    import torch
    libs: Dict[str, Any] = {}

    def cudnn():
        if vendor != "nvidia":
            return None
        version = torch.backends.cudnn.version()
        return str(version) if version is not None else unknown("cuDNN not loaded")

    def nccl():
        if vendor == "cpu":
            return None
        version = torch.cuda.nccl.version()
        return ".".join(str(v) for v in version) if isinstance(version, tuple) else str(version)

    def miopen():
        if vendor != "amd":
            return None
        version = torch.backends.cudnn.version()  # MIOpen answers through the cudnn API on ROCm
        return str(version) if version is not None else unknown("MIOpen not loaded")

    def aotriton():
        if vendor != "amd":
            return None
        config = torch.__config__.show()
        match = re.search(r"aotriton[^\n]*?(\d+\.\d+(?:\.\d+)?)", config, re.IGNORECASE)
        return match.group(1) if match else unknown("not named in torch.__config__.show()")

    libs["cudnn"] = _safe(cudnn)
    libs["miopen"] = _safe(miopen)
    libs["nccl" if vendor != "amd" else "rccl"] = _safe(nccl)
    libs["aotriton"] = _safe(aotriton)
    return {k: v for k, v in libs.items() if v is not None}


def _numerics() -> Dict[str, Any]:
    import torch

    from .numerics import cudnn_tf32, matmul_tf32
    return {
        "matmul_allow_tf32": _safe(matmul_tf32),
        "cudnn_allow_tf32": _safe(cudnn_tf32),
        "float32_matmul_precision": _safe(torch.get_float32_matmul_precision),
        "deterministic_algorithms": _safe(torch.are_deterministic_algorithms_enabled),
        "cudnn_deterministic": _safe(lambda: bool(torch.backends.cudnn.deterministic)),
        "cudnn_benchmark": _safe(lambda: bool(torch.backends.cudnn.benchmark)),
        "sdp_enabled": _safe(lambda: {
            "flash": torch.backends.cuda.flash_sdp_enabled(),
            "efficient": torch.backends.cuda.mem_efficient_sdp_enabled(),
            "math": torch.backends.cuda.math_sdp_enabled(),
            "cudnn": torch.backends.cuda.cudnn_sdp_enabled(),
        }),
    }


def _env() -> Dict[str, str]:
    return {k: v for k, v in sorted(os.environ.items())
            if k.startswith(ENV_PREFIXES) and k not in ENV_SKIP}


def _kernel_params() -> Any:
    with open("/proc/cmdline") as handle:
        cmdline = handle.read().split()
    amdgpu = {}
    other = {}
    for item in cmdline:
        key, _, value = item.partition("=")
        if key.startswith("amdgpu."):
            amdgpu[key] = value
        elif key in ("iommu", "amd_iommu", "intel_iommu", "pci"):
            other[key] = value
    return {"amdgpu": amdgpu, "iommu": other}


def _kfd() -> Dict[str, Any]:
    path = "/dev/kfd"
    exists = os.path.exists(path)
    return {"exists": exists,
            "readable_writable": bool(exists and os.access(path, os.R_OK | os.W_OK))}


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return _pyplatform.processor() or _pyplatform.machine()


def _hsa_override(devices) -> Optional[Dict[str, Any]]:
    value = os.environ.get("HSA_OVERRIDE_GFX_VERSION")
    if not value:
        return None
    archs = [d.get("arch") for d in devices if isinstance(d, dict)] if isinstance(devices, list) else []
    parts = value.split(".")
    as_gfx = "gfx" + "".join(parts[:1]) + "".join(f"{int(p):x}" if p.isdigit() else p for p in parts[1:]) \
        if len(parts) == 3 else value
    return {"value": value, "as_arch": as_gfx, "device_archs": archs}


DRIVER_FILES = {"nvidia": "/proc/driver/nvidia/version", "amdgpu": "/sys/module/amdgpu/version"}


def _driver(files: Optional[Dict[str, str]] = None) -> Dict[str, Any]:
    """Kernel-driver versions, from the files the drivers expose on Linux (NVIDIA's
    /proc/driver/nvidia/version; amdgpu's module version, present for DKMS builds)."""
    found: Dict[str, Any] = {}
    for name, path in (files or DRIVER_FILES).items():
        try:
            with open(path, encoding="utf-8", errors="replace") as handle:
                text = handle.read(4096)
        except OSError:
            continue
        if name == "nvidia":
            match = re.search(r"Kernel Module(?: for \S+)?\s+([0-9]+(?:\.[0-9]+)+)", text)
            found[name] = match.group(1) if match else unknown(f"unparsed {path}: {text.strip()[:120]}")
        else:
            found[name] = text.strip()[:60] or unknown(f"{path} is empty")
    return found or unknown("no NVIDIA or amdgpu driver version file readable here")


def collect() -> Dict[str, Any]:
    """The platform report. Never raises."""
    import torch
    vendor = _safe(_vendor)
    if is_unknown(vendor):
        vendor = "cpu"
    devices = _safe(lambda: _devices(vendor))
    report: Dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "gpuparity_version": _safe(lambda: __import__("gpuparity").__version__),
        "hostname": _safe(_pyplatform.node),
        "python": sys.version.split()[0],
        "os": _safe(lambda: f"{_pyplatform.system()} {_pyplatform.release()}"),
        "cpu_model": _safe(_cpu_model),
        "cpu_count": os.cpu_count(),
        "vendor": vendor,
        "torch": _safe(_torch_build),
        "driver": _safe(_driver),
        "devices": devices,
        "triton": _safe(_triton),
        "libraries": _safe(lambda: _libraries(vendor)),
        "numerics": _safe(_numerics),
        "env": _safe(_env),
        "kernel_params": _safe(_kernel_params),
        "kfd": _safe(_kfd),
        "hsa_override": _safe(lambda: _hsa_override(devices)),
        "cuda_available": _safe(lambda: bool(torch.cuda.is_available())),
    }
    return report


_CACHE: Optional[Dict[str, Any]] = None


def current() -> Dict[str, Any]:
    """The platform report of this process, collected once."""
    global _CACHE
    if _CACHE is None:
        _CACHE = collect()
    return _CACHE


# Environment variables that change fp32 numerics beneath torch's own switches (which the
# verdict keys follow): NVIDIA's libraries' TF32 override (NVIDIA_TF32_OVERRIDE=0 turns TF32
# off in cuBLAS/cuDNN whatever torch asks), torch's TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1, and
# ROCm torch's HIPBLASLT_ALLOW_TF32 (TF32 on hipBLASLt only when it is 1). A verdict made under
# one setting is not evidence under another, so they are part of the probe-cache fingerprint.
NUMERICS_ENV = ("NVIDIA_TF32_OVERRIDE", "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE", "HIPBLASLT_ALLOW_TF32")


def fingerprint_key(report: Dict[str, Any], device_index: Optional[int] = None) -> str:
    """A short stable key for caches: the facts that decide whether a backend is correct."""
    devices = report.get("devices") if isinstance(report.get("devices"), list) else []
    if device_index is not None and device_index < len(devices):
        devices = [devices[device_index]]
    torch_info = report.get("torch") if isinstance(report.get("torch"), dict) else {}
    libs = report.get("libraries") if isinstance(report.get("libraries"), dict) else {}
    triton_info = report.get("triton") if isinstance(report.get("triton"), dict) else {}
    key = {
        "vendor": report.get("vendor"),
        "torch": torch_info.get("version"),
        "devices": [(d.get("name"), d.get("arch")) for d in devices if isinstance(d, dict)],
        "libs": {k: v for k, v in libs.items() if isinstance(v, str)},
        "triton": triton_info.get("version"),
        # a driver update changes the vendor libraries' kernels: verdicts are re-made
        "driver": report.get("driver") if isinstance(report.get("driver"), dict) and not is_unknown(report.get("driver")) else None,
        "interpret": os.environ.get("TRITON_INTERPRET") == "1",
        "gpuparity": report.get("gpuparity_version"),
    }
    numerics_env = {name: os.environ[name] for name in NUMERICS_ENV if name in os.environ}
    if numerics_env:  # absent when unset, so existing caches keep their keys
        key["numerics_env"] = numerics_env
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def summary_line(report: Dict[str, Any]) -> str:
    """One line naming the machine: for report headers."""
    torch_info = report.get("torch") if isinstance(report.get("torch"), dict) else {}
    devices = report.get("devices") if isinstance(report.get("devices"), list) else []
    names = ", ".join(f"{d.get('name')} ({d.get('arch')})" for d in devices if isinstance(d, dict))
    build = torch_info.get("hip") and f"HIP {torch_info['hip']}" or \
        torch_info.get("cuda") and f"CUDA {torch_info['cuda']}" or "CPU build"
    return f"torch {torch_info.get('version')} ({build}); {names or 'no GPU'}; CPU {report.get('cpu_model')}"


def parse_version(text: Optional[str]) -> tuple:
    """'2.5.1+rocm6.2' -> (2, 5, 1). Unknown -> ()."""
    if not isinstance(text, str):
        return ()
    match = re.match(r"(\d+(?:\.\d+)*)", text)
    return tuple(int(p) for p in match.group(1).split(".")) if match else ()


def rocm_version(report: Dict[str, Any]) -> tuple:
    torch_info = report.get("torch") if isinstance(report.get("torch"), dict) else {}
    hip = parse_version(torch_info.get("hip"))
    if hip:
        return hip[:3]
    match = re.search(r"rocm(\d+(?:\.\d+)*)", str(torch_info.get("version")))
    return tuple(int(p) for p in match.group(1).split(".")) if match else ()
