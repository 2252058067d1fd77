"""RMSNorm and LayerNorm drop-ins: subclasses of torch.nn.RMSNorm / torch.nn.LayerNorm (same
parameters, same state_dict, isinstance still holds) whose forward goes through gpuparity's
verified dispatcher."""
from __future__ import annotations

import torch
import torch.nn as nn

from ..ops.norms import layer_norm, rms_norm


class RMSNorm(nn.RMSNorm):
    REPLACES = nn.RMSNorm

    def __init__(self, normalized_shape, eps=None, elementwise_affine: bool = True, device=None, dtype=None,
                 *, backend: str = "auto"):
        super().__init__(normalized_shape, eps=eps, elementwise_affine=elementwise_affine, device=device, dtype=dtype)
        self.backend = backend

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.normalized_shape, self.weight, self.eps, backend=self.backend)

    @classmethod
    def from_torch(cls, module: nn.RMSNorm, backend: str = "auto") -> "RMSNorm":
        """A drop-in sharing `module`'s weight Parameter (optimizer state stays valid)."""
        if not isinstance(module, nn.RMSNorm):
            raise TypeError(f"module: expected a torch.nn.RMSNorm, got {type(module).__name__}")
        new = cls(module.normalized_shape, eps=module.eps, elementwise_affine=module.elementwise_affine,
                  device="meta", backend=backend)
        new.weight = module.weight
        new.train(module.training)
        return new

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, backend={self.backend!r}"


class LayerNorm(nn.LayerNorm):
    REPLACES = nn.LayerNorm

    def __init__(self, normalized_shape, eps: float = 1e-5, elementwise_affine: bool = True, bias: bool = True,
                 device=None, dtype=None, *, backend: str = "auto"):
        super().__init__(normalized_shape, eps=eps, elementwise_affine=elementwise_affine, bias=bias,
                         device=device, dtype=dtype)
        self.backend = backend

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps, backend=self.backend)

    @classmethod
    def from_torch(cls, module: nn.LayerNorm, backend: str = "auto") -> "LayerNorm":
        """A drop-in sharing `module`'s weight and bias Parameters."""
        if not isinstance(module, nn.LayerNorm):
            raise TypeError(f"module: expected a torch.nn.LayerNorm, got {type(module).__name__}")
        new = cls(module.normalized_shape, eps=module.eps, elementwise_affine=module.elementwise_affine,
                  bias=module.bias is not None, device="meta", backend=backend)
        new.weight = module.weight
        new.bias = module.bias
        new.train(module.training)
        return new

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, backend={self.backend!r}"
