"""Traces on disk, and the identity of what was traced.

A trace is a directory: `trace.json` (metadata, human-readable) and `tensors.safetensors`
(every recorded tensor in the dtype it had). No pickle anywhere, so a trace made on another
machine is safe to open. trace.json records the tensor file's size and a checksum per tensor;
`load` verifies them, so a damaged trace is refused, never mistaken for a divergence. This module also holds the two rules both machines must apply the
same way: deterministic sampling of large tensors, and the fingerprints of weights and inputs.
"""
from __future__ import annotations

import hashlib
import json
import os
import zlib
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np
import torch

SCHEMA_VERSION = 2    # 2: every call's output keyed by the call; a tensor seen before is an "alias_of" entry
KIND = "gpuparity-trace"
META_FILE = "trace.json"
TENSOR_FILE = "tensors.safetensors"
SIGNATURE_VALUES = 32


class TraceMismatch(ValueError):
    """Two traces (or a trace and a model) are not of the same model and inputs."""


class TraceCorrupt(ValueError):
    """A trace's files are damaged, truncated or not a trace: bad input (exit 2), not a finding."""


CHECKSUM = "sha256-16"  # the first 16 hex digits of sha256 over the tensor's raw bytes


def _safetensors():
    try:
        from safetensors import safe_open
        from safetensors.torch import save_file
    except ImportError as exc:
        raise RuntimeError(
            "traces are stored with safetensors, which is not installed here: "
            "pip install safetensors (gpuparity's trace extra)") from exc
    return safe_open, save_file


# --------------------------------------------------------------------------- dtypes
_DTYPES = {str(d): d for d in (torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64,
                               torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool)}


def dtype_from_name(name: str) -> torch.dtype:
    """'torch.bfloat16', 'bfloat16' or 'bf16' -> torch.bfloat16."""
    aliases = {"fp32": "float32", "fp16": "float16", "half": "float16", "bf16": "bfloat16",
               "fp64": "float64", "double": "float64", "float": "float32"}
    key = str(name).replace("torch.", "")
    key = aliases.get(key, key)
    dtype = _DTYPES.get(f"torch.{key}")
    if dtype is None:
        raise ValueError(f"dtype: expected one of float32, bfloat16, float16, float64, got {name!r}")
    return dtype


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


# --------------------------------------------------------------------------- sampling
def sample_indices(shape: Sequence[int], count: int) -> torch.Tensor:
    """Sorted flat indices of a deterministic sample of a tensor of `shape`.

    Derived from the shape alone, so two machines sample the same elements. numpy's legacy
    RandomState is used because its stream is frozen across numpy versions (torch's is not
    promised to be)."""
    numel = int(np.prod(shape)) if len(shape) else 1
    if count >= numel:
        return torch.arange(numel, dtype=torch.int64)
    seed = zlib.crc32(f"gpuparity-sample-{tuple(int(s) for s in shape)}".encode())
    picks = np.random.RandomState(seed).randint(0, numel, size=int(count))
    return torch.from_numpy(np.unique(picks).astype(np.int64))


def sample(tensor: torch.Tensor, count: int) -> torch.Tensor:
    """The deterministic sample of `tensor` as a 1-D tensor (on tensor's device)."""
    index = sample_indices(tuple(tensor.shape), count).to(tensor.device)
    return tensor.reshape(-1).index_select(0, index)


# --------------------------------------------------------------------------- fingerprints
def canonical(tensor: torch.Tensor) -> torch.Tensor:
    """A float64 (or int64) CPU copy: the form hashes are taken on, so a CPU and a GPU copy of
    the same values hash alike."""
    value = tensor.detach().to("cpu")
    if value.is_floating_point():
        return value.to(torch.float64).contiguous()
    return value.to(torch.int64).contiguous()


def tensor_hash(tensor: torch.Tensor) -> str:
    value = canonical(tensor)
    digest = hashlib.sha256()
    digest.update(f"{tuple(value.shape)}|{value.dtype}".encode())
    digest.update(value.numpy().tobytes())
    return digest.hexdigest()[:16]


def signature(tensor: torch.Tensor) -> Dict[str, Any]:
    """Norm, shape and a fixed sample of values: compared with a tolerance when two traces
    hold the same values rounded to different dtypes (fp32 vs bf16), where hashes must differ."""
    value = canonical(tensor)
    floats = value.to(torch.float64)
    picked = sample(floats, SIGNATURE_VALUES) if floats.numel() else floats.reshape(-1)
    return {"shape": list(value.shape), "dtype": dtype_name(tensor.dtype), "hash": tensor_hash(tensor),
            "norm": float(torch.linalg.vector_norm(floats).item()) if floats.numel() else 0.0,
            "values": [float(v) for v in picked.tolist()]}


def fingerprint(named: Iterable[Tuple[str, torch.Tensor]]) -> Dict[str, Any]:
    """{"hash": combined hash, "signatures": {name: signature}} over named tensors."""
    signatures = {name: signature(t) for name, t in named}
    digest = hashlib.sha256()
    for name in sorted(signatures):
        digest.update(f"{name}:{signatures[name]['hash']};".encode())
    return {"hash": digest.hexdigest()[:16], "signatures": signatures}


def _relative(a: Sequence[float], b: Sequence[float]) -> float:
    va, vb = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    norm = float(np.linalg.norm(va))
    diff = float(np.linalg.norm(va - vb))
    return diff / norm if norm else diff


def rounding_tolerance(dtype_a: str, dtype_b: str) -> float:
    """How far two copies of the same values may differ when stored in these dtypes: 0 for
    the same dtype (bit-identical), else twice the tolerance floor of the coarser one."""
    if dtype_a == dtype_b:
        return 0.0
    from ..tolerance import floor_for
    floors = []
    for name in (dtype_a, dtype_b):
        try:
            floors.append(floor_for(dtype_from_name(name)))
        except ValueError:
            return 0.0  # an integer dtype on one side: the values must match exactly
    return 2.0 * max(floors)


def match_fingerprints(what: str, a: Dict[str, Any], b: Dict[str, Any]) -> str:
    """'identical' or 'equal within rounding'; raises TraceMismatch naming the first difference."""
    if a.get("hash") == b.get("hash"):
        return "identical"
    sa, sb = a.get("signatures", {}), b.get("signatures", {})
    only_a, only_b = sorted(set(sa) - set(sb)), sorted(set(sb) - set(sa))
    if only_a or only_b:
        parts = []
        if only_a:
            parts.append(f"only in the first: {', '.join(only_a[:5])}{' ...' if len(only_a) > 5 else ''}")
        if only_b:
            parts.append(f"only in the second: {', '.join(only_b[:5])}{' ...' if len(only_b) > 5 else ''}")
        raise TraceMismatch(f"different {what}: the names differ ({'; '.join(parts)})")
    rounded = False
    for name in sorted(sa):
        x, y = sa[name], sb[name]
        if x["shape"] != y["shape"]:
            raise TraceMismatch(f"different {what}: {name} has shape {tuple(x['shape'])} in the first "
                                f"and {tuple(y['shape'])} in the second")
        if x["hash"] == y["hash"]:
            continue
        tolerance = rounding_tolerance(x.get("dtype", ""), y.get("dtype", ""))
        norm_diff = abs(x["norm"] - y["norm"]) / x["norm"] if x["norm"] else abs(y["norm"])
        value_diff = _relative(x["values"], y["values"])
        if tolerance <= 0 or max(norm_diff, value_diff) > tolerance:
            how = (f"values differ (relative difference {max(norm_diff, value_diff):.3g}"
                   + (f", more than rounding {x.get('dtype')} vs {y.get('dtype')} explains ({tolerance:.3g})"
                      if tolerance > 0 else f"; both are {x.get('dtype')}, so they must be bit-identical") + ")")
            raise TraceMismatch(
                f"different {what}: {name} {how}. Both runs must use the same {what}: build weights "
                "on the CPU with a fixed seed, then move them to the device (see docs/diverging-runs.md)")
        rounded = True
    return "equal within rounding" if rounded else "identical"


# --------------------------------------------------------------------------- integrity
def tensor_checksum(tensor: torch.Tensor) -> Tuple[int, str]:
    """(bytes, checksum) of a tensor's raw bytes as stored: the same on save and on load."""
    flat = tensor.detach().to("cpu").contiguous().reshape(-1)
    raw = flat.view(torch.uint8) if flat.numel() else torch.empty(0, dtype=torch.uint8)
    return int(raw.numel()), hashlib.sha256(raw.numpy().tobytes()).hexdigest()[:16]


def _verify(path: str, meta: Dict[str, Any]) -> str:
    """Check tensors.safetensors against trace.json; returns how the trace's integrity stands
    ('verified ...' or 'unchecked ...'), raises TraceCorrupt naming the file and the problem."""
    tensor_path = os.path.join(path, TENSOR_FILE)
    if not os.path.isfile(tensor_path):
        raise TraceCorrupt(f"trace: {tensor_path} is missing (a trace needs both {META_FILE} and {TENSOR_FILE}; "
                           "copy the whole directory or record it again)")
    integrity = meta.get("integrity")
    size = os.path.getsize(tensor_path)
    if integrity and int(integrity.get("tensor_file_bytes", size)) != size:
        raise TraceCorrupt(f"trace: {tensor_path} has {size:,} bytes, the trace recorded "
                           f"{int(integrity['tensor_file_bytes']):,}: the file is truncated or was replaced "
                           "(copy it again or record the trace again)")
    safe_open, _ = _safetensors()
    try:
        with safe_open(tensor_path, framework="pt", device="cpu") as handle:
            stored = set(handle.keys())
            missing = sorted({m.get("alias_of", k) for k, m in meta["tensors"].items()} - stored)
            if missing:
                raise TraceCorrupt(f"trace: {tensor_path} lacks {len(missing)} tensor(s) that {META_FILE} lists "
                                   f"(first: {missing[0]!r}): the two files are not of the same recording")
            if not integrity:
                return f"unchecked (recorded without checksums: {len(stored)} tensors readable)"
            sums = integrity.get("tensors", {})
            for key in sorted(sums):
                got = tensor_checksum(handle.get_tensor(key))
                want = (int(sums[key]["bytes"]), sums[key]["checksum"])
                if got != want:
                    raise TraceCorrupt(f"trace: {tensor_path}: tensor {key!r} fails its checksum ({got[0]} bytes, "
                                       f"{got[1]}; recorded {want[0]} bytes, {want[1]}): the file was modified or "
                                       "damaged (copy it again or record the trace again)")
    except TraceCorrupt:
        raise
    except Exception as exc:  # noqa: BLE001 - safetensors raises its own error types for bad files
        raise TraceCorrupt(f"trace: {tensor_path} cannot be read ({type(exc).__name__}: "
                           f"{str(exc).splitlines()[0][:200] if str(exc) else 'no detail'}): the file is damaged "
                           "or truncated (copy it again or record the trace again)") from None
    return f"verified ({len(sums)} tensor checksums match)"


# --------------------------------------------------------------------------- traces
class Trace:
    """A recorded trace: `meta` (the JSON) and `tensor(key)` (CPU tensors, loaded lazily)."""

    def __init__(self, path: str, meta: Dict[str, Any], integrity: str = "not verified"):
        self.path = path
        self.meta = meta
        self.integrity = integrity
        self._handle = None

    @property
    def calls(self) -> List[Dict[str, Any]]:
        return self.meta["calls"]

    @property
    def tensor_meta(self) -> Dict[str, Dict[str, Any]]:
        return self.meta["tensors"]

    def has(self, key: str) -> bool:
        return key in self.meta["tensors"]

    def stored_key(self, key: str) -> str:
        """The key a tensor's values are stored under: its own, or for a call's output that is a
        tensor recorded before (its child's), that tensor's ("alias_of")."""
        if key not in self.meta["tensors"]:
            raise KeyError(f"trace {self.path}: no tensor {key!r}")
        return self.meta["tensors"][key].get("alias_of", key)

    def tensor(self, key: str) -> torch.Tensor:
        key = self.stored_key(key)
        try:
            if self._handle is None:
                safe_open, _ = _safetensors()
                self._handle = safe_open(os.path.join(self.path, TENSOR_FILE), framework="pt", device="cpu")
            return self._handle.get_tensor(key)
        except Exception as exc:  # noqa: BLE001 - a file changed after load: still bad input, not a finding
            raise TraceCorrupt(f"trace: {os.path.join(self.path, TENSOR_FILE)}: tensor {key!r} cannot be read "
                               f"({type(exc).__name__}: {str(exc)[:200]})") from None

    @property
    def dtype(self) -> Optional[str]:
        return self.meta.get("dtype")

    @property
    def device(self) -> Optional[str]:
        return self.meta.get("device")

    def __repr__(self) -> str:
        return (f"Trace({self.path!r}, {len(self.calls)} module calls, {len(self.meta['tensors'])} tensors, "
                f"device={self.device}, dtype={self.dtype})")


class MemoryTrace(Trace):
    """A trace held in memory: what `record.record_in_memory` returned, readable by `compare`
    (`gpuparity model` keeps its runs in memory)."""

    def __init__(self, label: str, meta: Dict[str, Any], tensors: Dict[str, torch.Tensor]):
        super().__init__(label, meta)
        self._tensors = tensors

    def tensor(self, key: str) -> torch.Tensor:
        return self._tensors[self.stored_key(key)]


def save(path: str, meta: Dict[str, Any], tensors: Dict[str, torch.Tensor]) -> Trace:
    _, save_file = _safetensors()
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(f"path: expected a directory for the trace, got the existing file {path!r}")
    os.makedirs(path, exist_ok=True)
    tensor_path = os.path.join(path, TENSOR_FILE)
    stored = {k: v.contiguous() for k, v in tensors.items()}
    save_file(stored, tensor_path + ".tmp")
    os.replace(tensor_path + ".tmp", tensor_path)
    sums = {}
    for key, value in stored.items():
        size, checksum = tensor_checksum(value)
        sums[key] = {"bytes": size, "checksum": checksum}
    meta = dict(meta, integrity={"algorithm": CHECKSUM, "tensor_file_bytes": os.path.getsize(tensor_path),
                                 "tensors": sums})
    meta_path = os.path.join(path, META_FILE)
    with open(meta_path + ".tmp", "w", encoding="utf-8") as handle:
        json.dump(meta, handle, indent=1, default=str)
    os.replace(meta_path + ".tmp", meta_path)
    return Trace(path, meta, integrity=f"verified ({len(sums)} tensor checksums written)")


def load(path, verify: bool = True) -> Trace:
    """Open a trace directory (or its trace.json). verify: check tensors.safetensors against the
    sizes and checksums trace.json recorded (reads every tensor once); a damaged or incomplete
    trace raises TraceCorrupt naming the file. Traces recorded before checksums load unchecked."""
    if isinstance(path, Trace):
        return path
    path = os.fspath(path)
    if os.path.basename(path) == META_FILE:
        path = os.path.dirname(path) or "."
    meta_path = os.path.join(path, META_FILE)
    if not os.path.exists(meta_path):
        raise FileNotFoundError(f"trace: no {META_FILE} in {path!r} (record one with `gpuparity trace record`)")
    try:
        with open(meta_path, encoding="utf-8") as handle:
            meta = json.load(handle)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise TraceCorrupt(f"trace: {meta_path} is not valid JSON ({exc}): the file is damaged "
                           "(copy it again or record the trace again)") from None
    if not isinstance(meta, dict) or meta.get("kind") != KIND:
        kind = meta.get("kind") if isinstance(meta, dict) else type(meta).__name__
        raise TraceCorrupt(f"trace: {meta_path} is not a gpuparity trace (kind={kind!r})")
    try:
        version = int(meta.get("schema_version", 0))
    except (TypeError, ValueError):
        raise TraceCorrupt(f"trace: {meta_path} has no valid schema_version "
                           f"(got {meta.get('schema_version')!r})") from None
    if version > SCHEMA_VERSION:
        raise ValueError(f"trace: {meta_path} has schema_version {meta.get('schema_version')}, "
                         f"this gpuparity reads up to {SCHEMA_VERSION}: upgrade gpuparity")
    for key, kind in (("calls", list), ("tensors", dict), ("weights", dict), ("inputs", dict)):
        if not isinstance(meta.get(key), kind):
            raise TraceCorrupt(f"trace: {meta_path} lacks its {key!r} section (expected a {kind.__name__}): "
                               "the file is incomplete or was edited")
    return Trace(path, meta, integrity=_verify(path, meta) if verify else "not verified")
