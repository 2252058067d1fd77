"""The checks each rank runs on its own device before the collectives: a matmul and a copy
probe, exact and timed, and the quick battery reduced to counts."""
from __future__ import annotations

import time
from typing import Any, Callable, Dict, Optional

from .collectives import _torch_dtype
from .config import MIB, worst_status


def _sync(device) -> None:
    import torch
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _elapsed_s(fn: Callable[[], Any], iters: int, device) -> float:
    """Seconds per call of fn, timed with CUDA events on a GPU, a wall clock on the CPU."""
    import torch
    if device.type == "cuda":
        # The events must be recorded on the stream that runs fn: the probe process's current
        # device is cuda:0 unless set, and events on another GPU's stream time nothing.
        with torch.cuda.device(device):
            stream = torch.cuda.current_stream(device)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record(stream)
            for _ in range(iters):
                fn()
            end.record(stream)
            end.synchronize()
            return start.elapsed_time(end) / 1e3 / iters
    begin = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - begin) / iters


def probe_matmul(device: str = "cpu", size: Optional[int] = None, dtype: Optional[str] = None,
                 iters: Optional[int] = None, seed: int = 0) -> Dict[str, Any]:
    """Matmul throughput (TFLOP/s on random data) and an exact check: matrices of -1/0/1 give
    integer products that fp32 accumulation holds exactly, compared on sampled rows against a
    float64 product on the CPU."""
    import torch
    dev = torch.device(device)
    on_gpu = dev.type == "cuda"
    size = size or (8192 if on_gpu else 256)
    dtype = dtype or ("bfloat16" if on_gpu else "float32")
    iters = iters or (20 if on_gpu else 5)
    tdtype = _torch_dtype(dtype)
    gen = torch.Generator().manual_seed(seed)
    a = torch.randn(size, size, generator=gen).to(dev, tdtype)
    b = torch.randn(size, size, generator=gen).to(dev, tdtype)
    for _ in range(3):
        torch.matmul(a, b)
    _sync(dev)
    seconds = _elapsed_s(lambda: torch.matmul(a, b), iters, dev)
    del a, b
    ints_a = torch.randint(-1, 2, (size, size), generator=gen, dtype=torch.int8)
    ints_b = torch.randint(-1, 2, (size, size), generator=gen, dtype=torch.int8)
    product = torch.matmul(ints_a.to(dev, tdtype), ints_b.to(dev, tdtype))
    rows = sorted({0, size // 3, (2 * size) // 3, size - 1})
    reference = ints_a[rows].double() @ ints_b.double()
    got = product[rows].cpu()
    wrong = int((got != reference.to(tdtype)).sum())
    return {"tflops": 2.0 * size ** 3 / seconds / 1e12, "time_ms": seconds * 1e3, "size": size,
            "dtype": dtype, "iters": iters, "wrong": wrong, "checked": len(rows) * size}


def probe_copy(device: str = "cpu", nbytes: Optional[int] = None, iters: Optional[int] = None) -> Dict[str, Any]:
    """Device memory bandwidth of a copy (GB/s counting bytes read + written) and an exact check
    of the copied data."""
    import torch
    dev = torch.device(device)
    on_gpu = dev.type == "cuda"
    nbytes = nbytes or (256 * MIB if on_gpu else 8 * MIB)
    iters = iters or (20 if on_gpu else 5)
    count = nbytes // 4
    src = torch.arange(count, device=dev, dtype=torch.int32).view(torch.float32)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    _sync(dev)
    seconds = _elapsed_s(lambda: dst.copy_(src), iters, dev)
    wrong = int((dst.view(torch.int32) != src.view(torch.int32)).sum())
    return {"gbps": 2.0 * count * 4 / seconds / 1e9, "time_ms": seconds * 1e3, "bytes": count * 4,
            "iters": iters, "wrong": wrong, "checked": count}


def run_probes(device: str = "cpu") -> Dict[str, Any]:
    """Both probes; the entry point of the crash-isolated probe process on a GPU."""
    import torch
    out: Dict[str, Any] = {}
    if torch.device(device).type == "cuda":
        torch.cuda.set_device(torch.device(device))  # this process may start on cuda:0
    for name, fn in (("matmul", probe_matmul), ("copy", probe_copy)):
        try:
            value = fn(device)
            value["status"] = "FAIL" if value["wrong"] else "PASS"
            value["reason"] = f"{value['wrong']} of {value['checked']} checked elements wrong" if value["wrong"] else ""
        except Exception as exc:  # noqa: BLE001 - a failed probe is a result
            value = {"status": "ERROR", "reason": f"{type(exc).__name__}: {exc}"[:300]}
        out[name] = value
    return out


def battery_summary(level: str, device: str, timeout: Optional[float] = None) -> Dict[str, Any]:
    """The quick battery on this rank's device, reduced to counts and the failing checks. SKIP
    (with the reason) when the battery cannot be imported."""
    try:
        from ..checks.battery import run_battery
        from ..checks.results import tally
    except Exception as exc:  # noqa: BLE001 - the battery is optional for the fleet
        return {"status": "SKIP", "reason": f"the battery is not available: {type(exc).__name__}: {exc}"[:300]}
    run = run_battery(level=level, device=device)
    bad = [r for r in run.results if r.status.bad]
    statuses = [r.status.value for r in run.results]
    status = worst_status(statuses) if bad else ("PASS" if "PASS" in statuses else "SKIP")
    return {"status": status, "counts": tally(run.results), "duration_s": run.duration_s,
            "failing": [r.key for r in bad][:200],
            "reason": "; ".join(f"{r.key}: {r.status.value}" for r in bad[:5]) + (" ..." if len(bad) > 5 else "")}
