"""gpuparity.nn.RMSNorm / LayerNorm: torch.nn's state_dict both ways, shared parameters after
from_torch, and gpuparity.patch(model) swapping them in a model that then computes the same
outputs and gradients."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn
from device_env import TEST_DEVICE as DEVICE, require_device

from gpuparity.tolerance import judge
from gpuparity.nn.norms import LayerNorm, RMSNorm
from gpuparity.patching import patch

require_device()


def _randomise(module, seed=0):
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in module.parameters():
            param.copy_(torch.randn(param.shape, generator=gen))
    return module


@pytest.mark.parametrize("ours,theirs,kwargs", [
    (RMSNorm, nn.RMSNorm, {"eps": 1e-6}),
    (RMSNorm, nn.RMSNorm, {"elementwise_affine": False}),
    (LayerNorm, nn.LayerNorm, {}),
    (LayerNorm, nn.LayerNorm, {"bias": False}),
    (LayerNorm, nn.LayerNorm, {"elementwise_affine": False}),
])
def test_state_dict_round_trip(ours, theirs, kwargs):
    torch_module = _randomise(theirs(24, **kwargs)).to(DEVICE)
    drop_in = ours(24, backend="triton", device=DEVICE, **kwargs)
    assert isinstance(drop_in, theirs)
    drop_in.load_state_dict(torch_module.state_dict(), strict=True)
    back = theirs(24, device=DEVICE, **kwargs)
    back.load_state_dict(drop_in.state_dict(), strict=True)
    assert drop_in.state_dict().keys() == torch_module.state_dict().keys()
    for key, value in torch_module.state_dict().items():
        assert torch.equal(back.state_dict()[key], value)
    x = torch.randn(3, 5, 24, device=DEVICE)
    baseline = torch_module(x)
    expected = torch_module.double().cpu()(x.double().cpu())
    result = judge("out", drop_in(x), expected, baseline, torch.float32)
    assert result.passed, result.reason


def test_from_torch_shares_parameters():
    rms = _randomise(nn.RMSNorm(16, eps=1e-5))
    ln = _randomise(nn.LayerNorm(16), seed=1).eval()
    ours_rms = RMSNorm.from_torch(rms, backend="triton")
    ours_ln = LayerNorm.from_torch(ln, backend="triton")
    assert ours_rms.weight is rms.weight and ours_rms.eps == 1e-5
    assert ours_ln.weight is ln.weight and ours_ln.bias is ln.bias and not ours_ln.training
    with pytest.raises(TypeError, match="module: expected a torch.nn.LayerNorm"):
        LayerNorm.from_torch(rms)


class Block(nn.Module):
    def __init__(self, width=32):
        super().__init__()
        self.norm_in = nn.LayerNorm(width)
        self.proj = nn.Linear(width, width)
        self.inner = nn.Sequential(nn.GELU(), nn.RMSNorm(width, eps=1e-6))
        self.head = nn.Linear(width, 4)

    def forward(self, x):
        return self.head(self.inner(self.proj(self.norm_in(x))))


def test_patch_swaps_norms_and_keeps_answers():
    torch.manual_seed(0)
    model = Block().to(DEVICE)
    for module in (model.norm_in, model.inner[1]):
        _randomise(module)
    original = Block().to(DEVICE)
    original.load_state_dict(model.state_dict())
    x = torch.randn(6, 7, 32, device=DEVICE)

    swapped = patch(model, backend="triton")
    assert sorted(swapped) == ["inner.1", "norm_in"]
    assert type(model.norm_in) is LayerNorm and type(model.inner[1]) is RMSNorm
    assert patch(model, backend="triton") == [], "patching twice must not swap drop-ins again"
    assert model.state_dict().keys() == original.state_dict().keys()

    reference_model = Block().double()
    reference_model.load_state_dict({k: v.double().cpu() for k, v in original.state_dict().items()})
    out_ref = reference_model(x.double().cpu())
    out, out_base = model(x), original(x)
    result = judge("out", out, out_ref, out_base, torch.float32)
    assert result.passed, result.reason
    grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(2)).to(DEVICE)
    out.backward(grad_out)
    out_base.backward(grad_out)
    out_ref.backward(grad_out.double().cpu())
    params = dict(model.named_parameters())
    base_params = dict(original.named_parameters())
    for name, param in reference_model.named_parameters():
        result = judge(f"grad {name}", params[name].grad, param.grad, base_params[name].grad, torch.float32)
        assert result.passed, result.reason
