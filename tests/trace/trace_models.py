"""Small models for the trace tests, with planted bugs; also a SPEC file:
path/to/trace_models.py:factory."""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.ln = nn.LayerNorm(width)
        self.fc = nn.Linear(width, width)
        self.act = nn.GELU()

    def forward(self, x):
        return x + self.act(self.fc(self.ln(x)))


class ScaledGelu(nn.GELU):
    """Planted forward bug: 5% too large."""

    def forward(self, x):
        return super().forward(x) * 1.05


class _WrongBackwardGelu(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return F.gelu(x)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        with torch.enable_grad():
            x = x.detach().requires_grad_(True)
            (true_grad,) = torch.autograd.grad(F.gelu(x), x, grad)
        return true_grad * 1.3  # planted backward bug


class WrongBackwardGelu(nn.Module):
    def forward(self, x):
        return _WrongBackwardGelu.apply(x)


class Net(nn.Module):
    def __init__(self, width: int = 32, blocks: int = 4):
        super().__init__()
        self.inp = nn.Linear(16, width)
        self.blocks = nn.ModuleList(Block(width) for _ in range(blocks))
        self.head = nn.Linear(width, 4)

    def forward(self, x):
        h = self.inp(x)
        for block in self.blocks:
            h = block(h)
        return self.head(h)


def factory(device="cpu", dtype=torch.float32, bug: str = "none", weights_seed: int = 0, inputs_seed: int = 1):
    torch.manual_seed(weights_seed)
    model = Net().eval()
    if bug == "forward":
        model.blocks[2].act = ScaledGelu()
    elif bug == "backward":
        model.blocks[2].act = WrongBackwardGelu()
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(inputs_seed))
    return model.to(device=device, dtype=dtype), (x.to(device=device, dtype=dtype),)


class Shared(nn.Module):
    """A module called twice and tuple / dict outputs."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8)
        self.split = Split()

    def forward(self, x, scale: float = 1.0):
        a = self.proj(x)
        b = self.proj(a * scale)
        first, second = self.split(b)
        return {"sum": first + second, "pair": (a, b)}


class Split(nn.Module):
    def forward(self, x):
        return x[:, :4], x[:, 4:]
