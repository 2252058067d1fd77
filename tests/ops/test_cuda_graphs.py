"""gpuparity's Triton ops inside CUDA graphs (torch.cuda.graph / make_graphed_callables), the
way to run short, fixed-shape steps without per-call host overhead: forward and backward
captured once, replayed on new input values, must equal an eager step on those values bit for
bit (the kernels are deterministic). GPU only: GPUPARITY_TEST_DEVICE=cuda."""
from __future__ import annotations

import pytest
import torch
from device_env import ON_GPU

if not ON_GPU or not torch.cuda.is_available():
    pytest.skip("CUDA graphs need a GPU (run with GPUPARITY_TEST_DEVICE=cuda)", allow_module_level=True)

import gpuparity  # noqa: E402


def _attention(q, k, v, extra):
    return gpuparity.attention(q, k, v, key_padding_mask=extra["kpm"], backend="triton")


def _rms(x, w, extra):
    return gpuparity.rms_norm(x, (x.shape[-1],), w, backend="triton")


def _ln(x, w, b, extra):
    return gpuparity.layer_norm(x, (x.shape[-1],), w, b, backend="triton")


def _rope(x, extra):
    return gpuparity.apply_rotary(x, extra["cos"], extra["sin"], seqlen_offsets=extra["offsets"], backend="triton")


def _case(name, gen):
    def r(*shape):
        return torch.randn(*shape, generator=gen, device="cuda", dtype=torch.bfloat16)
    if name == "attention":
        kpm = torch.arange(150, device="cuda").view(1, 150) >= torch.tensor([150, 97, 3, 60], device="cuda").view(4, 1)
        return _attention, [r(4, 2, 150, 32), r(4, 2, 150, 32), r(4, 2, 150, 32)], {"kpm": kpm}
    if name == "rms_norm":
        return _rms, [r(1000, 128), r(128)], {}
    if name == "layer_norm":
        return _ln, [r(333, 768), r(768), r(768)], {}
    angles = torch.rand(80, 16, generator=gen, device="cuda") * 6.3
    extra = {"cos": angles.cos(), "sin": angles.sin(), "offsets": torch.tensor([0, 7, 30], device="cuda")}
    return _rope, [r(3, 40, 4, 32)], extra


@pytest.mark.parametrize("name", ["attention", "rms_norm", "layer_norm", "rotary"])
def test_forward_and_backward_replay_in_a_cuda_graph(name):
    gen = torch.Generator(device="cuda").manual_seed(0)
    fn, inputs, extra = _case(name, gen)
    leaves = [t.clone().requires_grad_() for t in inputs]
    with torch.no_grad():  # no autograd graph kept alive from outside the capture
        out0 = fn(*leaves, extra)
    dout = torch.randn(out0.shape, generator=gen, device="cuda", dtype=out0.dtype)

    def step():
        out = fn(*leaves, extra)
        return (out, *torch.autograd.grad(out, leaves, dout))

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()

    # new values in the same buffers, then replay: the graph must compute what eager computes
    with torch.no_grad():
        for leaf in leaves:
            leaf.copy_(torch.randn(leaf.shape, generator=gen, device="cuda", dtype=leaf.dtype))
    graph.replay()
    torch.cuda.synchronize()
    eager = step()
    for got, want in zip(captured, eager):
        assert torch.equal(got, want), name
    assert not torch.equal(captured[0], out0)  # the replay really used the new values
