"""GPUPARITY_COMPILED_KERNELS (ops/library.py): "twin" serves a traced Triton backend through its
triton_op twin, "opaque" through the opaque custom op, whose body launches the kernels as an
eager call does; and a kernel's first launch after inductor redirected TRITON_CACHE_DIR reads
the cache of the import again (backends/triton_common.py home_cache_dir)."""
from __future__ import annotations

import os

import pytest
import torch

from gpuparity.backends import triton_common
from gpuparity.ops import library

from device_env import TEST_DEVICE

DEVICE = torch.device(TEST_DEVICE)


def test_an_unknown_mode_is_refused(monkeypatch):
    monkeypatch.setenv(library.COMPILED_KERNELS, "fused")
    with pytest.raises(ValueError, match="GPUPARITY_COMPILED_KERNELS.*'fused'"):
        library.compiled_kernels()


@pytest.mark.skipif(not library.TRITON_OP, reason="torch without torch.library.triton_op")
def test_opaque_takes_the_custom_op_where_the_twin_would_serve(monkeypatch):
    """Where the twin could serve (compiled kernels, static shapes), "opaque" routes the call to the
    custom op instead; the default is opaque (the first compiled steps on the H100: 1.14x the
    unpatched model's against the twin's 1.34x), "twin" asks for the twin."""
    monkeypatch.setattr(triton_common, "interpreting", lambda: False)
    x = torch.randn(4, 8)
    monkeypatch.delenv(library.COMPILED_KERNELS, raising=False)
    assert not library._kernels_traceable(x)
    monkeypatch.setenv(library.COMPILED_KERNELS, "twin")
    assert library._kernels_traceable(x)
    monkeypatch.setenv(library.COMPILED_KERNELS, "opaque")
    assert not library._kernels_traceable(x)


@pytest.mark.triton
def test_the_opaque_graph_compiles_fullgraph_and_matches_float64(monkeypatch):
    """A block of rotary pair + attention on the Triton backend, compiled with fullgraph=True under
    "opaque": the graph holds the opaque ops (no _kernels twin), and its outputs and gradients
    match the float64 composition's."""
    pytest.importorskip("triton")
    from gpuparity.ops.attention import attention
    from gpuparity.ops.rotary import apply_rotary_pair
    monkeypatch.setenv(library.COMPILED_KERNELS, "opaque")
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 6, heads, 16, device=DEVICE) for heads in (4, 2, 2))
    angle = torch.arange(6, device=DEVICE)[:, None] * torch.rand(8, device=DEVICE)
    cos, sin = angle.cos(), angle.sin()
    pad = torch.arange(6, device=DEVICE)[None, :] >= torch.tensor([6, 4], device=DEVICE)[:, None]

    def block(q, k, v, cos, sin, rotary_backend, attention_backend):
        q, k = apply_rotary_pair(q, k, cos, sin, backend=rotary_backend)
        out = attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), key_padding_mask=pad,
                        is_causal=True, backend=attention_backend)
        return out.double().square().sum()

    targets = []

    def recording(gm, example_inputs):
        targets.extend(str(node.target) for node in gm.graph.nodes if node.op == "call_function")
        return gm.forward

    torch._dynamo.reset()
    compiled = torch.compile(lambda q, k, v: block(q, k, v, cos, sin, "triton", "triton"), fullgraph=True,
                             backend=recording)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    got = compiled(*leaves)
    got_grads = torch.autograd.grad(got, leaves)
    ours = sorted(t for t in targets if "gpuparity" in t)
    assert ours == ["gpuparity.apply_rotary_pair", "gpuparity.attention"], targets

    ref_leaves = [t.double().requires_grad_(True) for t in (q, k, v)]
    ref = block(*ref_leaves, cos.double(), sin.double(), "composition", "composition")
    ref_grads = torch.autograd.grad(ref, ref_leaves)
    torch.testing.assert_close(got.double(), ref, rtol=1e-4, atol=1e-4)
    for mine, theirs in zip(got_grads, ref_grads):
        torch.testing.assert_close(mine.double(), theirs, rtol=1e-4, atol=1e-4)


# ----------------------------------------------------------------------------- Triton's cache
@pytest.fixture
def home(monkeypatch, tmp_path):
    """The cache of the import: tmp/home; inductor's: tmp/inductor (its redirect: .../triton/0)."""
    monkeypatch.setattr(triton_common, "_HOME_TRITON_CACHE", str(tmp_path / "home"))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "home"))
    return tmp_path


def test_no_redirect_while_the_cache_is_the_imports(home):
    assert triton_common.home_cache_dir() is None


def test_inductors_redirect_is_undone_for_a_first_launch(home, monkeypatch):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(home / "inductor" / "triton" / "0"))
    assert triton_common.home_cache_dir() == str(home / "home")


def test_a_directory_the_caller_chose_is_left_alone(home, monkeypatch):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(home / "mine"))
    assert triton_common.home_cache_dir() is None


@pytest.mark.triton
def test_the_home_cache_holds_for_the_launch_and_is_put_back(home, monkeypatch):
    triton = pytest.importorskip("triton")
    if not hasattr(getattr(getattr(triton, "knobs", None), "cache", None), "scope"):
        pytest.skip("a Triton without knobs.cache.scope")
    from triton import knobs
    redirected = str(home / "inductor" / "triton" / "0")
    monkeypatch.setenv("TRITON_CACHE_DIR", redirected)
    with triton_common._home_cache():
        assert knobs.cache.dir == str(home / "home")
    assert os.environ["TRITON_CACHE_DIR"] == redirected
    assert knobs.cache.dir == redirected
