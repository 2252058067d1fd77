"""A planted bug for tests/ops/test_residual_norm.py: the Triton forward kernel launched without
its residual (HAS_RESIDUAL=False) when the hidden size is 1 mod 64, as a mis-specialized
kernel variant would; every other call runs the real kernels."""
from __future__ import annotations

from gpuparity.backends import triton_residual_norm as kernels

N_ARG = 14   # the forward kernel's runtime argument N (its hidden size)


def residual_dropped_at_64k_plus_1(x, residual, weight, bias=None, eps=None, norm="rms", residual_in_fp32=False,
                                   **extra):
    real = kernels.launch

    def variant(kernel, grid, args, **options):
        if kernel is kernels._residual_norm_fwd_kernel and args[N_ARG] % 64 == 1:
            options = {**options, "HAS_RESIDUAL": False}
        return real(kernel, grid, args, **options)

    kernels.launch = variant
    try:
        return kernels.triton_residual_norm(x, residual, weight, bias, eps=eps, norm=norm,
                                            residual_in_fp32=residual_in_fp32, **extra)
    finally:
        kernels.launch = real
