"""A simulated sticky device error for tests/checks/test_sticky_errors.py (no GPU needed): the
implementation faults on an input with a storage offset, as torch's memory-efficient SDPA did
on an H100 ("CUDA error: misaligned address"), and from then on every call in its process raises
the same error, whatever its inputs, as a CUDA context does after such a fault."""
from __future__ import annotations

import torch

# torch.AcceleratorError where torch has it (a RuntimeError), else a RuntimeError
DEVICE_ERROR = getattr(torch, "AcceleratorError", RuntimeError)
MESSAGE = ("CUDA error: misaligned address\nCUDA kernel errors might be asynchronously reported at some other "
           "API call, so the stacktrace below might be incorrect.")
_POISONED = {"by": None}   # this process's "GPU context": broken once the fault happened


def _fault_if(trigger: bool) -> None:
    if trigger:
        _POISONED["by"] = "fault"
    if _POISONED["by"]:
        raise DEVICE_ERROR(MESSAGE)


def softmax_faults_on_offset(x, dim=-1):
    """Faults on an x with a storage offset (a view into its buffer); correct otherwise."""
    _fault_if(x.storage_offset() != 0)
    return torch.softmax(x, dim=dim)


def softmax_faults_on_wide(x, dim=-1):
    """Faults on rows of 1024 or more (the timing case); correct otherwise."""
    _fault_if(x.shape[-1] >= 1024)
    return torch.softmax(x, dim=dim)


def softmax_writes_then_faults(x, dim=-1):
    """Writes 7 into its input, then faults (this process is not poisoned: tests call it in-process)."""
    with torch.no_grad():
        x.fill_(7.0)
    raise DEVICE_ERROR(MESSAGE)
