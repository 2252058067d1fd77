"""What every probe shares: the registry and its decorator (device setup, the GPU check), seeded
inputs, the float64 comparison under the tolerance policy, and the finding dict."""
from __future__ import annotations

import functools
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch

from ...tolerance import judge

PROBES: List[str] = []


def probe(fn: Optional[Callable] = None, *, default: str = "cuda", gpu: bool = False) -> Callable:
    """Register a probe under its function's name. The registered callable is
    `probe(device=default, *options)`: it turns `device` into a torch.device (a bare "cuda" is
    cuda:0) and hands it to the function; with gpu=True a device that is not a GPU, or a
    machine without one, gives "cannot tell" without running the function."""
    def register(body: Callable) -> Callable:
        @functools.wraps(body)
        def run(device: str = default, *args: Any, **kwargs: Any) -> Dict[str, Any]:
            dev = device_of(device)
            # Looked up at call time, so tests can let GPU probes run on CPU tensors.
            if gpu and (skip := needs_gpu(dev)) is not None:
                return skip
            return body(dev, *args, **kwargs)

        PROBES.append(body.__name__)
        return run

    return register(fn) if fn is not None else register


# --------------------------------------------------------------------------- findings
def finding(failed: Optional[bool], detail: str, **measured: Any) -> Dict[str, Any]:
    return {"failed": failed, "detail": detail, **measured}


def inconclusive(detail: str, **measured: Any) -> Dict[str, Any]:
    return finding(None, detail, **measured)


def summarize(comparisons, what: str) -> Dict[str, Any]:
    """A probe finding from Comparisons: failed when any comparison failed."""
    failures = [c for c in comparisons if not c.passed]
    worst = max(comparisons, key=lambda c: (c.err or 0.0) / (c.allowed or 1e-30) if c.err is not None else float("inf"))
    measured = {"err": worst.err, "allowed": worst.allowed, "max_abs": worst.max_abs, "checks": len(comparisons),
                "failed_checks": len(failures)}
    if failures:
        more = len(failures) - 1
        return finding(True, f"{what}: {failures[0].reason}"
                       + (f" (and {more} more failed check{'s' * (more != 1)})" if more else ""), **measured)
    return finding(False, f"{what}: {len(comparisons)} check{'s' * (len(comparisons) != 1)} within tolerance "
                          f"(worst {worst.name}: err {worst.err:.3g} <= allowed {worst.allowed:.3g})", **measured)


def first_line(exc: BaseException, limit: int = 300) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {(text[0] if text else '')[:limit]}"


# --------------------------------------------------------------------------- the device
def device_of(device) -> torch.device:
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", 0)
    return dev


def needs_gpu(dev: torch.device) -> Optional[Dict[str, Any]]:
    if dev.type != "cuda":
        return inconclusive(f"this probe needs a GPU device, got {dev}")
    if not torch.cuda.is_available():
        return inconclusive("torch.cuda.is_available() is False")
    return None


def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def is_rocm() -> bool:
    return bool(getattr(torch.version, "hip", None))


def half_dtype(dev: torch.device) -> torch.dtype:
    return torch.float16 if dev.type == "cuda" else torch.float32


# --------------------------------------------------------------------------- inputs and references
def randn(shape, dev, dtype, seed: int, scale: float = 1.0):
    """Normal values drawn on the CPU from `seed` (the same on every device), then moved."""
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=generator, dtype=torch.float32) * scale).to(dev, dtype)


def randns(shape, dev, dtype, *seeds: int) -> List[torch.Tensor]:
    """One `randn` tensor of `shape` per seed (q, k, v = randns(shape, dev, dtype, 1, 2, 3))."""
    return [randn(shape, dev, dtype, seed) for seed in seeds]


def grad_leaves(tensors: Sequence[torch.Tensor]) -> List[torch.Tensor]:
    """Fresh leaf copies that collect gradients."""
    return [t.detach().clone().requires_grad_(True) for t in tensors]


def upcast(tensor, grad: bool):
    """A float64 CPU copy for the reference computation."""
    return tensor.detach().to("cpu", torch.float64).requires_grad_(grad)


def rel_err(out, ref) -> float:
    out = out.detach().to("cpu", torch.float64)
    return float(torch.linalg.vector_norm(out - ref) / torch.linalg.vector_norm(ref))


__all__ = ["PROBES", "device_of", "finding", "first_line", "grad_leaves", "half_dtype", "inconclusive", "is_rocm",
           "judge", "needs_gpu", "probe", "randn", "randns", "rel_err", "summarize", "sync", "upcast"]
