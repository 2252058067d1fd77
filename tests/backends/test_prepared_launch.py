"""triton_common.PreparedLaunch, the launch path of every eager op: the first call per key (the
tensors' dtypes, devices and 16-byte alignment) goes through Triton's own launch; later calls go
to the cached compiled kernel's launcher with the tensors' addresses as ints. Checked: results on
new tensors (no address kept from an earlier call), an unaligned view (a key of its own, its own
compiled kernel), and a CPU tensor on a GPU run (Triton's error, not a launch on a host address).
On the CPU the interpreter runs every call through launch: the same results are checked there."""
from __future__ import annotations

import pytest
import torch
from device_env import ON_GPU, TEST_DEVICE as DEVICE, require_device

pytest.importorskip("triton")
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from gpuparity.backends import triton_common  # noqa: E402

require_device()
pytestmark = pytest.mark.usefixtures("triton_interpreter_is_live")


@triton.jit
def _axpy(X, Y, Out, n, alpha, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    keep = offs < n
    x = tl.load(X + offs, mask=keep)
    y = tl.load(Y + offs, mask=keep)
    tl.store(Out + offs, x * alpha + y, mask=keep)


def _prepared(n: int, alpha: float = 2.0) -> triton_common.PreparedLaunch:
    return triton_common.PreparedLaunch(_axpy, (triton.cdiv(n, 64),), (n, alpha), num_warps=4, num_stages=1,
                                        BLOCK=64)


def test_repeated_calls_read_each_calls_tensors():
    n = 300
    run = _prepared(n)
    gen = torch.Generator().manual_seed(0)
    for step in range(4):     # the first call through launch, the rest through the cached kernel
        x, y = (torch.randn(n, generator=gen).to(DEVICE) for _ in range(2))
        out = torch.full((n,), float("nan"), device=DEVICE)
        run(x, y, out)
        torch.testing.assert_close(out, x * 2.0 + y, rtol=0, atol=1e-6, msg=f"call {step}")
    # the same tensors' storage reused for other values: the launch reads them, not a copy
    x.copy_(torch.arange(n, dtype=torch.float32))
    run(x, y, out)
    torch.testing.assert_close(out, x * 2.0 + y, rtol=0, atol=1e-6)
    if ON_GPU:
        assert len(run._entries) == 1      # one key for every aligned float32 call


def test_an_unaligned_view_gets_its_own_entry_and_the_right_result():
    n = 200
    run = _prepared(n)
    base = torch.randn(n + 1, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    y = torch.randn(n, generator=torch.Generator().manual_seed(2)).to(DEVICE)
    out = torch.empty(n, device=DEVICE)
    for x in (base[:n], base[1:], base[:n], base[1:]):   # aligned, 4 bytes past 16, and again
        run(x, y, out)
        torch.testing.assert_close(out, x * 2.0 + y, rtol=0, atol=1e-6)
    if ON_GPU:
        assert len(run._entries) == 2


@pytest.mark.skipif(not ON_GPU, reason="a CPU tensor in a GPU launch: only on a GPU run")
def test_a_cpu_tensor_after_gpu_calls_raises_and_launches_nothing():
    n = 128
    run = _prepared(n)
    x, y = torch.ones(n, device="cuda"), torch.ones(n, device="cuda")
    out = torch.empty(n, device="cuda")
    run(x, y, out)
    run(x, y, out)
    with pytest.raises((ValueError, RuntimeError)):   # Triton's "cannot be accessed from Triton (cpu tensor?)"
        run(x.cpu(), y, out)
    torch.cuda.synchronize()      # no illegal address was launched: the context still works
    run(x, y, out)
    torch.testing.assert_close(out, torch.full((n,), 3.0, device="cuda"))
