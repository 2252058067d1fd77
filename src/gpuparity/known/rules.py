# long file: one clause language; each clause is a small function beside its sentence, and splitting them
# across files would separate a clause from the table that names it.
"""The rule language of the known-issue base: declarative clauses over a platform report
(gpuparity.platform.collect()), each answering match / miss / unknown with a sentence.

A rule is a JSON object; every key is one clause and all must hold (AND). Clauses:

  vendor: "amd" | ["amd", "nvidia"]         torch build vendor ("nvidia", "amd", "cpu")
  torch_version / rocm_version / cuda_version: RANGE
  arch_in: ["gfx942", "sm_90"]              some device has one of these archs
  arch_prefix: ["gfx103", "gfx11"]          some device's arch starts with one of these
  capability: RANGE                         some device's compute capability ("8.0")
  is_apu: true | false                      some device is (not) an APU
  device_name: "GeForce|TITAN"              some device's name matches this regex
  device_count: RANGE                       number of devices ({">=": 2})
  library: {"cudnn": RANGE, ...}            cudnn, miopen, nccl, rccl, aotriton versions
  env_set: ["VAR"] | {"VAR": "value"}       variable set (to that value)
  env_unset: ["VAR"] | {"VAR": "value"}     variable not set (not to that value)
  kernel_param_absent / kernel_param_present: ["amdgpu.noretry=0", "iommu=pt"]
  numerics: {"cudnn_allow_tf32": true, "float32_matmul_precision": ["high", "medium"]}
  kfd: {"exists": true, "readable_writable": false}
  cuda_available: true | false
  os: "Windows"                             regex on the OS line
  arch_not_in_wheel: true                   some device's arch is missing from torch's arch list
  hsa_override: true                        HSA_OVERRIDE_GFX_VERSION is set (the report's hsa_override)
  always: true | "why, in words"            documented behaviour of every platform
  any_of: [RULE, ...]  all_of: [RULE, ...]  not: RULE
  unconfirmed: RULE                         a bound not verified at the source: a miss here
                                            cannot rule the issue out (see evaluate_rule)

RANGE is {"<": "2.7", ">=": "2.5", "==": "2.5.0", "!=": ...}; versions compare as dotted
integers padded with zeros ("2.5" == "2.5.0"). A fact the report does not know makes its clause
UNKNOWN, which never excludes an issue.
"""
from __future__ import annotations

import dataclasses
import enum
import re
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ..platform import is_unknown, parse_version, rocm_version


class RuleOutcome(str, enum.Enum):
    MATCH = "match"
    MISS = "miss"
    UNKNOWN = "unknown"


@dataclasses.dataclass
class RuleResult:
    """The outcome of a rule and the sentences behind it.

    matched: clauses that hold; missed: hard clauses that do not (why it does not apply);
    unknown: clauses the report cannot decide; soft_missed: unconfirmed bounds that do not hold.
    version_only: a MISS whose every missed clause is a version range (torch, ROCm, CUDA or a
    library outside the range): the platform is the right kind, only the versions say "not
    expected here". A probe that can run here decides such an entry (engine.evaluate).
    """
    outcome: RuleOutcome
    matched: List[str] = dataclasses.field(default_factory=list)
    missed: List[str] = dataclasses.field(default_factory=list)
    unknown: List[str] = dataclasses.field(default_factory=list)
    soft_missed: List[str] = dataclasses.field(default_factory=list)
    version_only: bool = False

    @property
    def applies(self) -> bool:
        """True unless a hard clause rules the issue out."""
        return self.outcome != RuleOutcome.MISS


class _Unknown:
    """A fact the platform report does not know, with the reason."""

    def __init__(self, reason: str):
        self.reason = reason


def _fact(report: Dict[str, Any], *path: str):
    value: Any = report
    for key in path:
        if is_unknown(value):
            return _Unknown(value["unknown"])
        if not isinstance(value, dict) or key not in value:
            return _Unknown(f"{'.'.join(path)} is not in the report")
        value = value[key]
    if is_unknown(value):
        return _Unknown(value["unknown"])
    return value


# --------------------------------------------------------------------------- versions
RANGE_OPS = {
    "<": lambda a, b: a < b, "<=": lambda a, b: a <= b, ">": lambda a, b: a > b,
    ">=": lambda a, b: a >= b, "==": lambda a, b: a == b, "!=": lambda a, b: a != b,
}


def _pad(a: tuple, b: tuple) -> Tuple[tuple, tuple]:
    width = max(len(a), len(b))
    return a + (0,) * (width - len(a)), b + (0,) * (width - len(b))


def in_range(version: tuple, spec: Dict[str, str]) -> bool:
    for op, bound in spec.items():
        left, right = _pad(tuple(version), parse_version(str(bound)))
        if not RANGE_OPS[op](left, right):
            return False
    return True


def range_text(spec: Dict[str, str]) -> str:
    return " and ".join(f"{op} {bound}" for op, bound in spec.items())


class VersionMiss(str):
    """The sentence of a clause that missed only because a known version is outside its range
    (not because the build is of another kind): a version rule sets expectation, and a probe
    that can run here overrides it."""


def _range_clause(label: str, version: Optional[tuple], shown: str, spec: Dict[str, str]):
    if not version:
        return RuleOutcome.UNKNOWN, f"{label} version unknown ({shown})"
    if in_range(version, spec):
        return RuleOutcome.MATCH, f"{label} {shown} {range_text(spec)}"
    return RuleOutcome.MISS, VersionMiss(f"{label} {shown} is not {range_text(spec)}")


def _packed_version(text: Any, unpack: Callable[[int], tuple]) -> tuple:
    """A version given dotted ("9.10.2") or packed into one number (unpacked by `unpack`); ()
    when it is neither."""
    text = str(text)
    if "." in text:
        return parse_version(text)
    return unpack(int(text)) if text.isdigit() else ()


def cudnn_version(text: Any) -> tuple:
    """torch.backends.cudnn.version() as a tuple: 91002 -> (9, 10, 2); 8907 -> (8, 9, 7)."""
    def unpack(number: int) -> tuple:
        if number >= 90000:
            return (number // 10000, number % 10000 // 100, number % 100)
        return (number // 1000, number % 1000 // 100, number % 100)
    return _packed_version(text, unpack)


def miopen_version(text: Any) -> tuple:
    """MIOpen through the cudnn API on ROCm: MAJOR*1000000 + MINOR*1000 + PATCH."""
    return _packed_version(text, lambda number: (number // 1000000, number % 1000000 // 1000, number % 1000))


LIBRARY_LABELS = {"cudnn": "cuDNN", "miopen": "MIOpen", "nccl": "NCCL", "rccl": "RCCL", "aotriton": "aotriton"}
LIBRARY_PARSERS: Dict[str, Callable[[Any], tuple]] = {
    "cudnn": cudnn_version, "miopen": miopen_version,
}


def library_version(report: Dict[str, Any], name: str):
    """(version tuple, shown text) of a library, or _Unknown, or None when the build has none."""
    libraries = _fact(report, "libraries")
    if isinstance(libraries, _Unknown):
        return libraries
    if not isinstance(libraries, dict) or name not in libraries:
        return None
    raw = libraries[name]
    if is_unknown(raw):
        return _Unknown(raw["unknown"])
    version = LIBRARY_PARSERS.get(name, parse_version)(raw)
    if not version:
        return _Unknown(f"cannot read a version from {raw!r}")
    shown = ".".join(str(p) for p in version)
    return version, shown if shown == str(raw) else f"{shown} ({raw})"


# --------------------------------------------------------------------------- words
VENDOR_LABELS = {"amd": "ROCm build", "nvidia": "CUDA build", "cpu": "CPU-only build"}


def torch_text(report: Dict[str, Any]) -> str:
    version = _fact(report, "torch", "version")
    return f"torch {version}" if not isinstance(version, _Unknown) else "torch version unknown"


def _build_text(report: Dict[str, Any]) -> str:
    vendor = report.get("vendor")
    return f"{VENDOR_LABELS.get(vendor, str(vendor))} ({torch_text(report)})"


def _device_label(device: Dict[str, Any]) -> str:
    return f"device {device.get('index', '?')} {device.get('name', '?')}"


def _devices(report: Dict[str, Any]):
    devices = _fact(report, "devices")
    if isinstance(devices, _Unknown):
        return devices
    if not isinstance(devices, list):
        return _Unknown("devices is not a list")
    return devices


def _archs_text(devices: Sequence[Any]) -> str:
    archs = sorted({str(d.get("arch")) for d in devices if isinstance(d, dict)})
    return ", ".join(archs) if archs else "none"


def _device_clause(report, predicate: Callable[[Dict[str, Any]], Optional[bool]],
                   match_text: Callable[[Dict[str, Any]], str], miss_text: Callable[[List[Any]], str]):
    """MATCH when some device satisfies the predicate; UNKNOWN when a device (or the list)
    cannot be read or the predicate cannot tell; MISS otherwise."""
    devices = _devices(report)
    if isinstance(devices, _Unknown):
        return RuleOutcome.UNKNOWN, f"the device list is unknown ({devices.reason})"
    if not devices:
        return RuleOutcome.MISS, "no GPU devices in the report"
    matches, undecided = [], []
    for device in devices:
        if not isinstance(device, dict) or is_unknown(device):
            undecided.append(device)
            continue
        answer = predicate(device)
        if answer is None:
            undecided.append(device)
        elif answer:
            matches.append(device)
    if matches:
        text = match_text(matches[0])
        others = len(matches) - 1
        return RuleOutcome.MATCH, text + (f" (and {others} more device{'s' if others > 1 else ''})" if others else "")
    if undecided:
        return RuleOutcome.UNKNOWN, f"{len(undecided)} device(s) could not be read: {miss_text(devices)}"
    return RuleOutcome.MISS, miss_text(devices)


def _listify(value) -> List[str]:
    return [value] if isinstance(value, str) else list(value)


# --------------------------------------------------------------------------- clauses
def _vendor(report, arg):
    wanted = _listify(arg)
    vendor = report.get("vendor")
    if vendor in wanted:
        return RuleOutcome.MATCH, _build_text(report)
    names = " or ".join(VENDOR_LABELS.get(w, w) for w in wanted)
    return RuleOutcome.MISS, f"not a {names}: {_build_text(report)}"


def _torch_version(report, spec):
    version = _fact(report, "torch", "version")
    if isinstance(version, _Unknown):
        return RuleOutcome.UNKNOWN, f"torch version unknown ({version.reason})"
    return _range_clause("torch", parse_version(version), str(version), spec)


def rocm_release(report: Dict[str, Any]) -> tuple:
    """The ROCm release of a ROCm build: from the wheel tag (2.5.1+rocm6.2.4 -> (6, 2, 4)), else
    major.minor of torch.version.hip, whose third field is a build number, not a patch level."""
    version = _fact(report, "torch", "version")
    match = re.search(r"rocm(\d+(?:\.\d+)*)", str(version)) if not isinstance(version, _Unknown) else None
    if match:
        return tuple(int(p) for p in match.group(1).split("."))
    return rocm_version(report)[:2]


def _rocm_version(report, spec):
    if report.get("vendor") != "amd":
        return RuleOutcome.MISS, f"not a ROCm build: {_build_text(report)}"
    version = rocm_release(report)
    shown = ".".join(str(p) for p in version) if version else "unknown"
    return _range_clause("ROCm", version, shown, spec)


def _cuda_version(report, spec):
    if report.get("vendor") != "nvidia":
        return RuleOutcome.MISS, f"not a CUDA build: {_build_text(report)}"
    version = _fact(report, "torch", "cuda")
    if isinstance(version, _Unknown) or not version:
        return RuleOutcome.UNKNOWN, "CUDA version unknown"
    return _range_clause("CUDA", parse_version(version), str(version), spec)


def _arch_in(report, arg):
    wanted = _listify(arg)
    return _device_clause(
        report, lambda d: None if d.get("arch") is None else d.get("arch") in wanted,
        lambda d: f"{_device_label(d)} is {d.get('arch')}",
        lambda ds: f"no device is {' or '.join(wanted)} (here: {_archs_text(ds)})")


def _arch_prefix(report, arg):
    prefixes = _listify(arg)
    return _device_clause(
        report, lambda d: None if d.get("arch") is None else str(d.get("arch")).startswith(tuple(prefixes)),
        lambda d: f"{_device_label(d)} is {d.get('arch')} ({'/'.join(p + 'x' for p in prefixes)})",
        lambda ds: f"no device is {'/'.join(p + 'x' for p in prefixes)} (here: {_archs_text(ds)})")


def _capability_of(device) -> Optional[tuple]:
    capability = device.get("capability")
    if isinstance(capability, (list, tuple)) and len(capability) == 2:
        return tuple(int(c) for c in capability)
    return None


def _capability(report, spec):
    def predicate(device):
        capability = _capability_of(device)
        return None if capability is None else in_range(capability, spec)

    def shown(device):
        capability = _capability_of(device)
        return f"{_device_label(device)} is {device.get('arch')} (capability {capability[0]}.{capability[1]} {range_text(spec)})"

    return _device_clause(report, predicate, shown,
                          lambda ds: f"no device has capability {range_text(spec)} (here: {_archs_text(ds)})")


def _is_apu(report, arg):
    wanted = bool(arg)
    return _device_clause(
        report, lambda d: None if d.get("is_apu") is None else bool(d.get("is_apu")) == wanted,
        lambda d: f"{_device_label(d)} is {'an APU' if wanted else 'a discrete GPU'}",
        lambda ds: f"no device is {'an APU' if wanted else 'a discrete GPU'}")


def _device_name(report, pattern):
    regex = re.compile(pattern)
    return _device_clause(
        report, lambda d: None if d.get("name") is None else bool(regex.search(str(d.get("name")))),
        lambda d: f"{_device_label(d)} matches /{pattern}/",
        lambda ds: f"no device name matches /{pattern}/")


def _device_count(report, spec):
    devices = _devices(report)
    if isinstance(devices, _Unknown):
        return RuleOutcome.UNKNOWN, f"the device list is unknown ({devices.reason})"
    count = len(devices)
    if in_range((count,), spec):
        return RuleOutcome.MATCH, f"{count} GPU{'s' if count != 1 else ''} ({range_text(spec)})"
    return RuleOutcome.MISS, f"{count} GPU{'s' if count != 1 else ''}, not {range_text(spec)}"


def _library(report, arg):
    # Several libraries in one clause: all must hold, like the keys of a rule.
    results = []
    for name, spec in arg.items():
        label = LIBRARY_LABELS.get(name, name)
        found = library_version(report, name)
        if found is None:
            results.append((RuleOutcome.MISS, f"no {label} in this build"))
        elif isinstance(found, _Unknown):
            results.append((RuleOutcome.UNKNOWN, f"{label} version unknown ({found.reason})"))
        else:
            version, shown = found
            results.append(_range_clause(label, version, shown, spec))
    return _and_simple(results)


def _and_simple(results):
    for outcome in (RuleOutcome.MISS, RuleOutcome.UNKNOWN):
        texts = [text for v, text in results if v == outcome]
        if texts:
            joined = "; ".join(texts)
            if outcome == RuleOutcome.MISS and all(isinstance(text, VersionMiss) for text in texts):
                joined = VersionMiss(joined)
            return outcome, joined
    return RuleOutcome.MATCH, "; ".join(text for _, text in results)


def _env(report):
    env = _fact(report, "env")
    if isinstance(env, _Unknown):
        return env
    return env if isinstance(env, dict) else _Unknown("env is not a mapping")


def _env_items(arg) -> List[Tuple[str, Optional[str]]]:
    if isinstance(arg, dict):
        return [(k, None if v is None else str(v)) for k, v in arg.items()]
    return [(name, None) for name in _listify(arg)]


def _env_set(report, arg):
    env = _env(report)
    if isinstance(env, _Unknown):
        return RuleOutcome.UNKNOWN, f"environment unknown ({env.reason})"
    results = []
    for name, value in _env_items(arg):
        here = env.get(name)
        if here is not None and (value is None or here == value):
            results.append((RuleOutcome.MATCH, f"{name}={here} is set"))
        elif here is None:
            results.append((RuleOutcome.MISS, f"{name} is not set"))
        else:
            results.append((RuleOutcome.MISS, f"{name}={here}, not {value}"))
    return _and_simple(results)


def _env_unset(report, arg):
    env = _env(report)
    if isinstance(env, _Unknown):
        return RuleOutcome.UNKNOWN, f"environment unknown ({env.reason})"
    results = []
    for name, value in _env_items(arg):
        here = env.get(name)
        if here is None:
            results.append((RuleOutcome.MATCH, f"{name} is not set"))
        elif value is not None and here != value:
            results.append((RuleOutcome.MATCH, f"{name}={here}, not {value}"))
        else:
            results.append((RuleOutcome.MISS, f"{name}={here} is set"))
    return _and_simple(results)


def kernel_param_state(report: Dict[str, Any], param: str):
    """True / False whether `key=value` (or bare `key`) is on the kernel command line; or _Unknown."""
    params = _fact(report, "kernel_params")
    if isinstance(params, _Unknown):
        return params
    if not isinstance(params, dict):
        return _Unknown("kernel_params is not a mapping")
    key, has_value, value = param.partition("=")
    for group in params.values():
        if isinstance(group, dict) and key in group:
            return (not has_value) or str(group[key]) == value
    return False


def _kernel_param(report, arg, want_present: bool):
    results = []
    for param in _listify(arg):
        state = kernel_param_state(report, param)
        if isinstance(state, _Unknown):
            results.append((RuleOutcome.UNKNOWN, f"kernel parameters unknown ({state.reason})"))
        elif state == want_present:
            results.append((RuleOutcome.MATCH, f"kernel parameter {param} is {'set' if state else 'not set'}"))
        else:
            results.append((RuleOutcome.MISS, f"kernel parameter {param} is {'set' if state else 'not set'}"))
    return _and_simple(results)


NUMERICS_LABELS = {
    "matmul_allow_tf32": "torch.backends.cuda.matmul.allow_tf32",
    "cudnn_allow_tf32": "torch.backends.cudnn.allow_tf32",
    "float32_matmul_precision": "float32 matmul precision",
    "deterministic_algorithms": "deterministic algorithms",
    "cudnn_deterministic": "torch.backends.cudnn.deterministic",
    "cudnn_benchmark": "torch.backends.cudnn.benchmark",
}


def _numerics(report, arg):
    results = []
    for name, wanted in arg.items():
        label = NUMERICS_LABELS.get(name, name)
        value = _fact(report, "numerics", name)
        if isinstance(value, _Unknown):
            results.append((RuleOutcome.UNKNOWN, f"{label} unknown ({value.reason})"))
            continue
        options = wanted if isinstance(wanted, list) else [wanted]
        if value in options:
            results.append((RuleOutcome.MATCH, f"{label} = {value}"))
        else:
            results.append((RuleOutcome.MISS, f"{label} = {value}, not {' or '.join(map(str, options))}"))
    return _and_simple(results)


def _kfd(report, arg):
    results = []
    for name, wanted in arg.items():
        value = _fact(report, "kfd", name)
        label = {"exists": "/dev/kfd exists", "readable_writable": "/dev/kfd is readable and writable"}.get(name, name)
        if isinstance(value, _Unknown):
            results.append((RuleOutcome.UNKNOWN, f"{label}: unknown ({value.reason})"))
        elif bool(value) == bool(wanted):
            results.append((RuleOutcome.MATCH, f"{label}: {bool(value)}"))
        else:
            results.append((RuleOutcome.MISS, f"{label}: {bool(value)}"))
    return _and_simple(results)


def _cuda_available(report, arg):
    value = _fact(report, "cuda_available")
    if isinstance(value, _Unknown):
        return RuleOutcome.UNKNOWN, f"torch.cuda.is_available() unknown ({value.reason})"
    outcome = RuleOutcome.MATCH if bool(value) == bool(arg) else RuleOutcome.MISS
    return outcome, f"torch.cuda.is_available() is {bool(value)}"


def _os(report, pattern):
    value = _fact(report, "os")
    if isinstance(value, _Unknown):
        return RuleOutcome.UNKNOWN, f"OS unknown ({value.reason})"
    if re.search(pattern, str(value)):
        return RuleOutcome.MATCH, f"OS {value}"
    return RuleOutcome.MISS, f"OS {value} does not match /{pattern}/"


def arch_in_wheel(arch: str, arch_list: Sequence[str], vendor: str) -> bool:
    """Whether torch's wheel carries code for this device arch.

    CUDA: a cubin runs on the same major with an equal or higher minor, and PTX (compute_XY)
    is JIT-compiled for any equal or newer device; arch-specific cubins (sm_90a) only run on
    their own arch. ROCm: code objects are per gfx target, so the arch must be listed exactly.
    """
    if vendor != "nvidia":
        return arch in arch_list
    match = re.fullmatch(r"sm_(\d+)", arch)
    if not match:
        return arch in arch_list
    device = int(match.group(1))
    for entry in arch_list:
        cubin = re.fullmatch(r"sm_(\d+)([af]?)", entry)
        if cubin:
            number, suffix = int(cubin.group(1)), cubin.group(2)
            if number == device or (not suffix and number // 10 == device // 10 and number <= device):
                return True
        ptx = re.fullmatch(r"compute_(\d+)", entry)
        if ptx and int(ptx.group(1)) <= device:
            return True
    return False


def _arch_not_in_wheel(report, arg):
    arch_list = _fact(report, "torch", "arch_list")
    vendor = report.get("vendor")
    if isinstance(arch_list, _Unknown):
        outcome, text = _device_clause(report, lambda d: True, lambda d: f"{_device_label(d)} is {d.get('arch')}",
                                       lambda ds: "no GPU devices")
        if outcome == RuleOutcome.MISS:
            return outcome, text
        return RuleOutcome.UNKNOWN, f"torch's arch list is unknown ({arch_list.reason})"
    listed = ", ".join(arch_list) if arch_list else "empty"

    def missing(device):
        arch = device.get("arch")
        return None if arch is None else not arch_in_wheel(str(arch), arch_list, vendor)

    outcome, text = _device_clause(
        report, missing, lambda d: f"{_device_label(d)} is {d.get('arch')}, not in torch's arch list ({listed})",
        lambda ds: f"every device's arch ({_archs_text(ds)}) is in torch's arch list")
    if not arg:
        outcome = {RuleOutcome.MATCH: RuleOutcome.MISS, RuleOutcome.MISS: RuleOutcome.MATCH}.get(outcome, outcome)
    return outcome, text


def _hsa_override(report, arg):
    value = _fact(report, "hsa_override")
    if isinstance(value, _Unknown):
        return RuleOutcome.UNKNOWN, f"HSA_OVERRIDE_GFX_VERSION unknown ({value.reason})"
    if not value:
        return (RuleOutcome.MISS if arg else RuleOutcome.MATCH), "HSA_OVERRIDE_GFX_VERSION is not set"
    as_arch = value.get("as_arch")
    archs = [a for a in value.get("device_archs") or [] if a]
    text = f"HSA_OVERRIDE_GFX_VERSION={value.get('value')} ({as_arch}) is set"
    if archs:
        others = sorted(set(archs) - {as_arch})
        text += (f"; devices report {', '.join(sorted(set(archs)))}" +
                 (f", not all {as_arch}: the override is wrong for some of them" if others else ""))
    return (RuleOutcome.MATCH if arg else RuleOutcome.MISS), text


def _always(report, arg):
    if arg:
        return RuleOutcome.MATCH, arg if isinstance(arg, str) else "documented behaviour on every platform"
    return RuleOutcome.MISS, "disabled"


CLAUSES: Dict[str, Callable[[Dict[str, Any], Any], Tuple[RuleOutcome, str]]] = {
    "vendor": _vendor,
    "torch_version": _torch_version,
    "rocm_version": _rocm_version,
    "cuda_version": _cuda_version,
    "arch_in": _arch_in,
    "arch_prefix": _arch_prefix,
    "capability": _capability,
    "is_apu": _is_apu,
    "device_name": _device_name,
    "device_count": _device_count,
    "library": _library,
    "env_set": _env_set,
    "env_unset": _env_unset,
    "kernel_param_absent": lambda report, arg: _kernel_param(report, arg, want_present=False),
    "kernel_param_present": lambda report, arg: _kernel_param(report, arg, want_present=True),
    "numerics": _numerics,
    "kfd": _kfd,
    "cuda_available": _cuda_available,
    "os": _os,
    "arch_not_in_wheel": _arch_not_in_wheel,
    "hsa_override": _hsa_override,
    "always": _always,
}
COMBINATORS = ("any_of", "all_of", "not", "unconfirmed")
RANGE_CLAUSES = ("torch_version", "rocm_version", "cuda_version", "capability", "device_count")


# --------------------------------------------------------------------------- validation
def validate_rule(rule: Any, where: str = "rule") -> None:
    """Raise ValueError naming the offending key when a rule is not well formed."""
    if not isinstance(rule, dict) or not rule:
        raise ValueError(f"{where}: expected a non-empty JSON object of clauses, got {rule!r}")
    for key, arg in rule.items():
        here = f"{where}.{key}"
        if key in ("any_of", "all_of"):
            if not isinstance(arg, list) or not arg:
                raise ValueError(f"{here}: expected a non-empty list of rules, got {arg!r}")
            for index, sub in enumerate(arg):
                validate_rule(sub, f"{here}[{index}]")
        elif key in ("not", "unconfirmed"):
            validate_rule(arg, here)
        elif key not in CLAUSES:
            known = ", ".join(sorted(CLAUSES) + list(COMBINATORS))
            raise ValueError(f"{here}: unknown clause {key!r}; known clauses: {known}")
        elif key in RANGE_CLAUSES:
            _validate_range(arg, here)
        elif key == "library":
            if not isinstance(arg, dict) or not arg:
                raise ValueError(f"{here}: expected {{library: RANGE}}, got {arg!r}")
            for name, spec in arg.items():
                if name not in LIBRARY_LABELS:
                    raise ValueError(f"{here}: unknown library {name!r}; known: {', '.join(LIBRARY_LABELS)}")
                _validate_range(spec, f"{here}.{name}")
        elif key in ("numerics", "kfd") and not isinstance(arg, dict):
            raise ValueError(f"{here}: expected an object, got {arg!r}")
        elif key in ("device_name", "os"):
            try:
                re.compile(arg)
            except (re.error, TypeError) as exc:
                raise ValueError(f"{here}: not a valid regular expression: {arg!r} ({exc})") from None


def _validate_range(spec: Any, where: str) -> None:
    if not isinstance(spec, dict) or not spec:
        raise ValueError(f"{where}: expected a range like {{'<': '2.7'}}, got {spec!r}")
    for op, bound in spec.items():
        if op not in RANGE_OPS:
            raise ValueError(f"{where}: unknown comparison {op!r}; use one of {', '.join(RANGE_OPS)}")
        if not parse_version(str(bound)):
            raise ValueError(f"{where}: {bound!r} is not a version")


# --------------------------------------------------------------------------- evaluation
def evaluate_rule(rule: Dict[str, Any], report: Dict[str, Any]) -> RuleResult:
    """AND over the rule's clauses. A hard miss excludes; unknown facts and misses inside
    `unconfirmed` do not (the bound was never verified, so only a probe can decide)."""
    parts = [_evaluate_key(key, arg, report) for key, arg in rule.items()]
    return _and(parts)


def _evaluate_key(key: str, arg: Any, report: Dict[str, Any]) -> RuleResult:
    if key == "all_of":
        return _and([evaluate_rule(sub, report) for sub in arg])
    if key == "any_of":
        return _any([evaluate_rule(sub, report) for sub in arg])
    if key == "not":   # a negated version range stays a hard clause (version_only False)
        inner = evaluate_rule(arg, report)
        if inner.outcome == RuleOutcome.MATCH:
            return RuleResult(RuleOutcome.MISS, missed=inner.matched)
        if inner.outcome == RuleOutcome.MISS:
            return RuleResult(RuleOutcome.MATCH, matched=inner.missed)
        return inner
    if key == "unconfirmed":
        inner = evaluate_rule(arg, report)
        if inner.outcome == RuleOutcome.MISS:
            return RuleResult(RuleOutcome.UNKNOWN, matched=inner.matched, unknown=inner.unknown,
                              soft_missed=[f"{text}, but that bound is unconfirmed, so it cannot rule this out"
                                           for text in inner.missed] + inner.soft_missed)
        return RuleResult(inner.outcome, matched=[f"{text} (unconfirmed)" for text in inner.matched],
                          unknown=inner.unknown, soft_missed=inner.soft_missed)
    outcome, text = CLAUSES[key](report, arg)
    if outcome == RuleOutcome.MATCH:
        return RuleResult(outcome, matched=[text])
    if outcome == RuleOutcome.MISS:
        return RuleResult(outcome, missed=[str(text)], version_only=isinstance(text, VersionMiss))
    return RuleResult(outcome, unknown=[text])


def _and(parts: List[RuleResult]) -> RuleResult:
    missed = [text for part in parts if part.outcome == RuleOutcome.MISS for text in part.missed]
    merged = RuleResult(RuleOutcome.MATCH)
    for part in parts:
        merged.matched += part.matched
        merged.unknown += part.unknown
        merged.soft_missed += part.soft_missed
    if missed:
        return RuleResult(RuleOutcome.MISS, matched=merged.matched, missed=missed,
                          version_only=all(part.version_only for part in parts if part.outcome == RuleOutcome.MISS))
    if any(part.outcome == RuleOutcome.UNKNOWN for part in parts):
        merged.outcome = RuleOutcome.UNKNOWN
    return merged


def _any(parts: List[RuleResult]) -> RuleResult:
    for part in parts:
        if part.outcome == RuleOutcome.MATCH:
            return part
    undecided = [part for part in parts if part.outcome == RuleOutcome.UNKNOWN]
    if undecided:
        return _and(undecided)
    texts = ["; ".join(part.missed) for part in parts]
    return RuleResult(RuleOutcome.MISS, missed=["none of: " + " | ".join(f"({text})" for text in texts)]
                      if len(texts) > 1 else texts, version_only=all(part.version_only for part in parts))


# --------------------------------------------------------------------------- rules in words
def _describe_range(label: str, spec: Dict[str, str]) -> str:
    return " and ".join(f"{label} {op} {bound}" for op, bound in spec.items())


def _describe_env(arg, negate: bool) -> str:
    parts = []
    for name, value in _env_items(arg):
        if value is None:
            parts.append(f"{name} {'unset' if negate else 'set'}")
        else:
            parts.append(f"{name} {'!=' if negate else '='} {value}")
    return " and ".join(parts)


def describe_rule(rule: Dict[str, Any]) -> str:
    """A rule in compact words, for tables: 'ROCm and torch < 2.7 and aotriton < 0.8.2'."""
    return " and ".join(_describe_clause(key, arg) for key, arg in rule.items())


def _describe_clause(key: str, arg: Any) -> str:
    vendor_words = {"amd": "ROCm", "nvidia": "CUDA", "cpu": "CPU build"}
    if key == "vendor":
        return " or ".join(vendor_words.get(v, v) for v in _listify(arg))
    if key in ("torch_version", "rocm_version", "cuda_version", "capability"):
        return _describe_range({"torch_version": "torch", "rocm_version": "ROCm", "cuda_version": "CUDA",
                                "capability": "capability"}[key], arg)
    if key == "device_count":
        return _describe_range("GPUs", arg)
    if key == "library":
        return " and ".join(_describe_range(LIBRARY_LABELS.get(name, name), spec) for name, spec in arg.items())
    if key == "arch_in":
        return "arch " + "/".join(_listify(arg))
    if key == "arch_prefix":
        return "arch " + "/".join(p + "x" for p in _listify(arg))
    if key == "is_apu":
        return "APU" if arg else "discrete GPU"
    if key == "device_name":
        return f"device name ~ /{arg}/"
    if key == "env_set":
        return _describe_env(arg, negate=False)
    if key == "env_unset":
        return _describe_env(arg, negate=True)
    if key == "kernel_param_absent":
        return " and ".join(f"no {p} on the kernel command line" for p in _listify(arg))
    if key == "kernel_param_present":
        return " and ".join(f"{p} on the kernel command line" for p in _listify(arg))
    if key == "numerics":
        return " and ".join(f"{NUMERICS_LABELS.get(k, k)} = {'/'.join(map(str, v)) if isinstance(v, list) else v}"
                            for k, v in arg.items())
    if key == "kfd":
        return " and ".join(f"/dev/kfd {k} = {v}" for k, v in arg.items())
    if key == "cuda_available":
        return f"torch.cuda.is_available() = {arg}"
    if key == "os":
        return f"OS ~ /{arg}/"
    if key == "arch_not_in_wheel":
        return "a device arch missing from torch's arch list" if arg else "every arch in torch's arch list"
    if key == "hsa_override":
        return "HSA_OVERRIDE_GFX_VERSION set" if arg else "HSA_OVERRIDE_GFX_VERSION unset"
    if key == "always":
        return "always (documented)"
    if key == "any_of":
        return "(" + " or ".join(describe_rule(sub) for sub in arg) + ")"
    if key == "all_of":
        return " and ".join(describe_rule(sub) for sub in arg)
    if key == "not":
        return f"not ({describe_rule(arg)})"
    if key == "unconfirmed":
        return f"[unconfirmed: {describe_rule(arg)}]"
    return f"{key}={arg}"
