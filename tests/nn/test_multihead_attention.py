"""gpuparity.nn.MultiheadAttention: the same state_dict as torch.nn.MultiheadAttention, the
same answers forward and backward (padding masks, batch_first either way), and patch() on an
nn.TransformerEncoder, including the inference paths that bypass self_attn.forward in torch."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
from device_env import TEST_DEVICE as DEVICE, require_device

import gpuparity.nn.attention as gp_attention
from gpuparity import patch
from gpuparity.tolerance import judge
from gpuparity.nn.attention import MultiheadAttention

require_device()

BACKENDS = ["sdpa_math", "triton"]


def padding(batch, seq, lengths):
    return (torch.arange(seq).view(1, seq) >= torch.tensor(lengths).view(batch, 1)).to(DEVICE)


def run_and_grads(module, x, **kwargs):
    x = x.detach().clone().requires_grad_()
    out = module(x, x, x, need_weights=False, **kwargs)[0]
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(5)).to(DEVICE, out.dtype)
    params = [p for p in module.parameters()]
    grads = torch.autograd.grad(out, [x] + params, dout)
    return out, grads


def check_against_torch(torch_module, ours, x, **kwargs):
    """Ours (float32) vs torch's module in float64 (the referee), torch float32 as baseline."""
    ref_module = copy.deepcopy(torch_module).double()
    ref_kwargs = {k: (v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v)
                  for k, v in kwargs.items()}
    ref_out, ref_grads = run_and_grads(ref_module, x.double(), **ref_kwargs)
    base_out, base_grads = run_and_grads(torch_module, x, **kwargs)
    out, grads = run_and_grads(ours, x, **kwargs)
    names = ["out", "dx"] + [f"d{n}" for n, _ in ours.named_parameters()]
    results = [judge(n, o, r, b, torch.float32) for n, o, r, b in
               zip(names, [out, *grads], [ref_out, *ref_grads], [base_out, *base_grads])]
    failed = [r.reason for r in results if not r.passed]
    assert not failed, "\n".join(failed)


# --------------------------------------------------------------------------- the module
def test_state_dict_is_torchs():
    torch_module = nn.MultiheadAttention(32, 4, batch_first=True)
    ours = MultiheadAttention(32, 4, batch_first=True)
    assert list(ours.state_dict()) == list(torch_module.state_dict())
    ours.load_state_dict(torch_module.state_dict())
    separate = nn.MultiheadAttention(32, 4, kdim=16, vdim=24)
    assert list(MultiheadAttention.from_torch(separate).state_dict()) == list(separate.state_dict())
    assert isinstance(ours, nn.MultiheadAttention)


def test_from_torch_shares_the_parameters():
    torch_module = nn.MultiheadAttention(16, 2)
    ours = MultiheadAttention.from_torch(torch_module, backend="sdpa_math")
    assert ours.in_proj_weight is torch_module.in_proj_weight
    assert ours.out_proj.weight is torch_module.out_proj.weight
    assert ours.backend == "sdpa_math"
    with pytest.raises(TypeError, match="module: expected a torch.nn.MultiheadAttention"):
        MultiheadAttention.from_torch(nn.Linear(2, 2))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("batch_first", [True, False])
def test_matches_torch_with_padding_masks(backend, batch_first):
    torch.manual_seed(0)
    torch_module = nn.MultiheadAttention(32, 4, batch_first=batch_first).to(DEVICE)
    ours = MultiheadAttention.from_torch(torch_module, backend=backend)
    batch, seq = 3, 11
    x = torch.randn(batch, seq, 32) if batch_first else torch.randn(seq, batch, 32)
    kpm = padding(batch, seq, [seq, 4, 1])
    check_against_torch(torch_module, ours, x.to(DEVICE), key_padding_mask=kpm)


@pytest.mark.parametrize("backend", BACKENDS)
def test_attn_mask_kinds_and_cross_attention(backend):
    torch.manual_seed(1)
    torch_module = nn.MultiheadAttention(24, 3, batch_first=True, kdim=16, vdim=20).to(DEVICE)
    ours = MultiheadAttention.from_torch(torch_module, backend=backend)
    query = torch.randn(2, 7, 24, device=DEVICE)
    key = torch.randn(2, 9, 16, device=DEVICE)
    value = torch.randn(2, 9, 20, device=DEVICE)
    blocked = torch.rand(7, 9, generator=torch.Generator().manual_seed(2)).to(DEVICE) > 0.7  # MHA: True = blocked
    bias = torch.randn(2 * 3, 7, 9, device=DEVICE)
    kpm = padding(2, 9, [9, 5])
    for kwargs in (dict(attn_mask=blocked), dict(attn_mask=bias, key_padding_mask=kpm)):
        want = torch_module(query, key, value, need_weights=False, **kwargs)[0]
        got = ours(query, key, value, need_weights=False, **kwargs)[0]
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_causal_hint_and_unbatched_input():
    torch_module = nn.MultiheadAttention(16, 2, batch_first=True).to(DEVICE)
    ours = MultiheadAttention.from_torch(torch_module, backend="triton")
    x = torch.randn(2, 9, 16, device=DEVICE)
    causal = nn.Transformer.generate_square_subsequent_mask(9, device=DEVICE)
    want = torch_module(x, x, x, attn_mask=causal, is_causal=True, need_weights=False)[0]
    got = ours(x, x, x, attn_mask=causal, is_causal=True, need_weights=False)[0]
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    with pytest.raises(RuntimeError, match="Need attn_mask"):
        ours(x, x, x, is_causal=True, need_weights=False)
    single = x[0]
    torch.testing.assert_close(ours(single, single, single, need_weights=False)[0],
                               torch_module(single, single, single, need_weights=False)[0], rtol=1e-4, atol=1e-5)


def test_need_weights_falls_back_to_torch():
    torch_module = nn.MultiheadAttention(16, 2).to(DEVICE)
    ours = MultiheadAttention.from_torch(torch_module)
    x = torch.randn(5, 2, 16, device=DEVICE)
    out, weights = ours(x, x, x)  # need_weights=True is torch's default
    want, want_weights = torch_module(x, x, x)
    torch.testing.assert_close(out, want)
    torch.testing.assert_close(weights, want_weights)


def test_dropout_in_training_runs_in_the_kernel_and_not_in_eval():
    torch_module = nn.MultiheadAttention(16, 2, dropout=0.5, batch_first=True).to(DEVICE)
    ours = MultiheadAttention.from_torch(torch_module, backend="triton")
    x = torch.randn(2, 8, 16, device=DEVICE, requires_grad=True)
    ours.train()
    first = ours(x, x, x, need_weights=False)[0]
    second = ours(x, x, x, need_weights=False)[0]
    assert not torch.allclose(first, second)  # a fresh dropout mask each call
    first.sum().backward()
    assert torch.isfinite(x.grad).all()
    ours.eval()
    torch_module.eval()
    torch.testing.assert_close(ours(x, x, x, need_weights=False)[0], torch_module(x, x, x, need_weights=False)[0],
                               rtol=1e-4, atol=1e-5)


# --------------------------------------------------------------------------- patch()
def encoder(seed=0):
    torch.manual_seed(seed)
    layer = nn.TransformerEncoderLayer(32, 4, dim_feedforward=64, dropout=0.0, batch_first=True)
    return nn.TransformerEncoder(layer, 2, enable_nested_tensor=True).to(DEVICE)


def count_calls(monkeypatch):
    calls = []
    original = gp_attention._attention

    def counting(*args, **kwargs):
        calls.append(kwargs.get("backend"))
        return original(*args, **kwargs)
    monkeypatch.setattr(gp_attention, "_attention", counting)
    return calls


@pytest.mark.parametrize("backend", BACKENDS)
def test_patched_encoder_matches_forward_and_backward(backend, monkeypatch):
    """Patched (float32) vs the original in float64 (the referee), the original float32 as baseline."""
    original = encoder()
    patched = copy.deepcopy(original)
    swapped = patch(patched, backend=backend, include=(nn.MultiheadAttention,))
    assert swapped == ["layers.0.self_attn", "layers.1.self_attn"]
    calls = count_calls(monkeypatch)
    x = torch.randn(3, 10, 32, device=DEVICE)
    kpm = padding(3, 10, [10, 6, 2])
    valid = ~kpm.unsqueeze(-1)

    def run(model, inputs):
        inputs = inputs.clone().requires_grad_()
        out = model(inputs, src_key_padding_mask=kpm).masked_fill(~valid, 0.0)
        return [out, *torch.autograd.grad(out.square().sum(), [inputs] + list(model.parameters()))]

    ref = run(copy.deepcopy(original).double(), x.double())
    base = run(original, x)
    ours = run(patched, x)
    assert calls == [backend, backend]
    names = ["out", "dx"] + [f"d{n}" for n, _ in patched.named_parameters()]
    results = [judge(n, o, r, b, torch.float32) for n, o, r, b in zip(names, ours, ref, base)]
    failed = [r.reason for r in results if not r.passed]
    assert not failed, "\n".join(failed)


@pytest.mark.parametrize("with_padding", [True, False])
def test_patched_encoder_uses_our_attention_in_inference(with_padding, monkeypatch):
    """eval + no_grad: torch's encoder would take its fused fast path (with padding: nested
    tensors), bypassing self_attn.forward. The patched one must still call gpuparity."""
    original = encoder(1).eval()
    patched = copy.deepcopy(original)
    patch(patched, backend="sdpa_math", include=(nn.MultiheadAttention,))
    calls = count_calls(monkeypatch)
    x = torch.randn(3, 10, 32, device=DEVICE)
    kwargs = {"src_key_padding_mask": padding(3, 10, [10, 6, 2])} if with_padding else {}
    with torch.no_grad():
        want = original(x, **kwargs)
        got = patched(x, **kwargs)
    assert len(calls) == 2, "the patched encoder bypassed gpuparity's attention"
    assert got.shape == want.shape
    if with_padding:
        valid = ~kwargs["src_key_padding_mask"].unsqueeze(-1)
        got, want = got.masked_fill(~valid, 0), want.masked_fill(~valid, 0)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_patched_encoder_trains_like_the_original():
    """User story 1 in miniature: padded batches, a few optimizer steps, the same loss curve."""
    losses = []
    for do_patch in (False, True):
        model = encoder(2)
        if do_patch:
            patch(model, backend="sdpa_math", include=(nn.MultiheadAttention,))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
        gen = torch.Generator().manual_seed(3)
        curve = []
        for _ in range(4):
            x = torch.randn(4, 12, 32, generator=gen).to(DEVICE)
            lengths = torch.randint(1, 13, (4,), generator=gen).tolist()
            kpm = padding(4, 12, lengths)
            out = model(x, src_key_padding_mask=kpm)
            loss = out.masked_fill(kpm.unsqueeze(-1), 0.0).square().mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            curve.append(loss.item())
        losses.append(curve)
    for original, patched in zip(*losses):
        assert abs(original - patched) <= 1e-4 * max(1.0, abs(original))
