"""Where the kernel tests run: the CPU (Triton in its interpreter, small shapes) or, with
GPUPARITY_TEST_DEVICE=cuda on a lent machine, a GPU (compiled kernels, realistic sizes)."""
from __future__ import annotations

import os

import pytest

# A module and not tests/conftest.py: `from conftest import X` finds whichever conftest.py
# (tests/known, tests/fuzz) pytest loaded last, so test files import these from here.
TEST_DEVICE = os.environ.get("GPUPARITY_TEST_DEVICE", "cpu")
ON_GPU = TEST_DEVICE == "cuda"
# Triton's interpreter only works when the variable is set before triton is first imported
# (its own @jit library functions are built at import); tests/conftest.py imports this module
# before any test module, so it is set first. The AOT compile test clears it in its own process.
if not ON_GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")


def size(cpu: int, gpu: int):
    """The small interpreter size on the CPU, the realistic one on the GPU."""
    return gpu if ON_GPU else cpu


def require_device() -> None:
    """Skip the calling test module when the GPU run finds no GPU."""
    import torch
    if ON_GPU and not torch.cuda.is_available():
        pytest.skip("GPUPARITY_TEST_DEVICE=cuda but no GPU is visible", allow_module_level=True)


def check_interpreter_is_live() -> None:
    """Fail loudly (not with a cryptic Triton error) when triton was imported before
    TRITON_INTERPRET=1 was set, e.g. by a test module collected earlier."""
    if not ON_GPU:
        import triton.language.standard as standard
        if "Interpreted" not in type(standard.zeros).__name__:
            pytest.fail("triton was imported before TRITON_INTERPRET=1 was set; set it in tests/conftest.py "
                        "before anything imports triton (the interpreter needs it at import time)")
