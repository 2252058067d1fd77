"""`get_device()`: a device verified by a smoke workload in a separate process (matmul, conv,
softmax, one small training step, each compared with the CPU). A GPU that crashes or computes
wrong is reported in a warning and the CPU is returned (user story 2).

`device_name()` is the one check of a device argument, shared by the API and every command's
--device; it imports no torch, so that a bad --device is refused at once."""
from __future__ import annotations

import re
import warnings
from typing import TYPE_CHECKING, Any, Dict, Optional

from .isolate import call_isolated
from . import caches

if TYPE_CHECKING:
    import torch

_VERIFIED: Dict[str, Dict[str, Any]] = caches.register("device.verified", {})
SMOKE_TOLERANCE = 2e-3  # relative error vs the CPU in fp32 (TF32 may be on for convolutions)
DEVICE_FORMS = "'cpu', 'cuda' or 'cuda:N' (ROCm GPUs are cuda:N too)"
_DEVICE = re.compile(r"(cpu|cuda)(:[0-9]+)?\Z")


def device_name(value: Any, argument: str = "device") -> str:
    """`value` (a string or a torch.device) as a device name: 'cpu', 'cpu:N' or 'cuda:N' ('cuda'
    becomes 'cuda:0'). Anything else raises before any work: ValueError (TypeError for a value
    that is not a string or a torch.device) naming `argument`, what it got and what it needs.
    Whether torch sees the GPU is not checked here (checks.plan.validate_device does that)."""
    text = str(value) if type(value).__name__ == "device" and type(value).__module__ == "torch" else value
    if not isinstance(text, str):
        raise TypeError(f"{argument}: expected a device string like 'cuda:0' or a torch.device, "
                        f"got {type(value).__name__}")
    if not _DEVICE.match(text):
        raise ValueError(f"{argument}: expected {DEVICE_FORMS}, got {value!r}")
    return "cuda:0" if text == "cuda" else text


def smoke(device: str) -> Dict[str, Any]:
    """Run in a child process: the smoke workload on `device`, compared with the CPU."""
    import torch
    torch.manual_seed(0)
    dev = torch.device(device)
    report: Dict[str, Any] = {}

    def rel(a, b):
        a, b = a.detach().double().cpu(), b.detach().double().cpu()
        return float((a - b).norm() / b.norm().clamp_min(1e-30))

    a, b = torch.randn(256, 256), torch.randn(256, 256)
    report["matmul"] = rel(a.to(dev) @ b.to(dev), a.double() @ b.double())
    x, w = torch.randn(4, 3, 32, 32), torch.randn(8, 3, 3, 3)
    report["conv2d"] = rel(torch.nn.functional.conv2d(x.to(dev), w.to(dev), padding=1),
                           torch.nn.functional.conv2d(x.double(), w.double(), padding=1))
    s = torch.randn(64, 1000) * 5
    report["softmax"] = rel(s.to(dev).softmax(-1), s.double().softmax(-1))

    def train_step(target_device):
        torch.manual_seed(1)
        model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Flatten(),
                                    torch.nn.Linear(8 * 16 * 16, 10)).to(target_device)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        data = torch.randn(8, 3, 16, 16, generator=torch.Generator().manual_seed(2)).to(target_device)
        labels = torch.arange(8).remainder(10).to(target_device)
        loss = torch.nn.functional.cross_entropy(model(data), labels)
        loss.backward()
        opt.step()
        return torch.cat([p.detach().reshape(-1).cpu() for p in model.parameters()])
    report["train_step"] = rel(train_step(dev), train_step(torch.device("cpu")))
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    return report


def verify_device(device: str, timeout: float = 120.0) -> Dict[str, Any]:
    """{"ok": bool, "reason": str, "errors": {...}}; the smoke test runs in a child process."""
    outcome = call_isolated("gpuparity.device:smoke", {"device": device}, timeout=timeout)
    if outcome.status != "ok":
        detail = outcome.error + (f"; stderr: {outcome.stderr_tail.splitlines()[-1]}" if outcome.stderr_tail else "")
        return {"ok": False, "reason": f"smoke test {outcome.status.upper()} on {device}: {detail}", "errors": {}}
    errors = outcome.value
    wrong = {k: v for k, v in errors.items() if not v <= SMOKE_TOLERANCE}
    if wrong:
        return {"ok": False, "errors": errors, "reason": f"{device} computes wrong answers: " + ", ".join(
            f"{k} relative error {v:.3g} (allowed {SMOKE_TOLERANCE:g})" for k, v in wrong.items())}
    return {"ok": True, "errors": errors, "reason": ""}


def get_device(prefer: Optional[str] = None, *, timeout: float = 120.0) -> torch.device:
    """The preferred device (default: the first GPU) if a smoke workload passes on it in a
    separate process; otherwise a warning that says why, and the CPU. A `prefer` that names no
    device (device_name) raises before any work."""
    wanted = device_name(prefer, "prefer") if prefer is not None else None
    import torch
    if wanted is None:
        wanted = "cuda:0" if torch.cuda.is_available() else "cpu"
    if wanted.startswith("cpu"):
        return torch.device(wanted)
    if wanted.startswith("cuda") and not torch.cuda.is_available():
        warnings.warn(f"gpuparity.get_device: {wanted} asked for but torch sees no GPU "
                      f"(torch {torch.__version__}); using the CPU", RuntimeWarning, stacklevel=2)
        return torch.device("cpu")
    if wanted not in _VERIFIED:
        _VERIFIED[wanted] = verify_device(wanted, timeout)
    verdict = _VERIFIED[wanted]
    if not verdict["ok"]:
        warnings.warn(f"gpuparity.get_device: {verdict['reason']}. Falling back to the CPU. "
                      f"Run `gpuparity doctor --device {wanted}` for the details and known remedies.",
                      RuntimeWarning, stacklevel=2)
        return torch.device("cpu")
    return torch.device(wanted)
