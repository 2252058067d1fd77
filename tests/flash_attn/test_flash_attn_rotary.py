"""gpuparity.flash_attn.layers.rotary and ops.triton.rotary against a float64 referee written as
complex multiplication (independent of gpuparity's rotary contract), forward and backward: both
layouts, rotary_dim < head dim, int and per-sequence offsets, packed varlen, a sequence of one
token, in place on a leaf, packed qkv (MHA and GQA) and kv, XPos, RotaryEmbedding's cache,
FlashAttention-shaped errors and torch.compile."""
from __future__ import annotations

import math

import pytest
import torch
from device_env import TEST_DEVICE, require_device  # sets TRITON_INTERPRET=1 on the CPU

import gpuparity.flash_attn as flash_attn
from gpuparity.flash_attn.layers.rotary import (RotaryEmbedding, apply_rotary_emb, apply_rotary_emb_func,
                                                apply_rotary_emb_kv_, apply_rotary_emb_qkv_, apply_rotary_emb_torch)
from gpuparity.flash_attn.ops.triton.rotary import apply_rotary
from fa_reference import check

require_device()
DEVICE = torch.device(TEST_DEVICE)


def positions_of(batch, seqlen, offsets, cu_seqlens=None):
    """Each token's position: (B, S), or (total,) when packed."""
    if cu_seqlens is None:
        base = torch.arange(seqlen).view(1, -1).expand(batch, seqlen)
        return base + (offsets.cpu().long().view(-1, 1) if isinstance(offsets, torch.Tensor) else offsets)
    bounds = cu_seqlens.cpu().tolist()
    parts = [torch.arange(bounds[b + 1] - bounds[b]) + (int(offsets[b]) if isinstance(offsets, torch.Tensor)
                                                          else offsets) for b in range(len(bounds) - 1)]
    return torch.cat(parts)


def rotated(x, cos, sin, positions, interleaved):
    """The referee: feature pairs as complex numbers times cos + i sin of their position (float64)."""
    x, cos, sin = x.cpu().double(), cos.cpu().double(), sin.cpu().double()
    half = cos.shape[1]
    part = x[..., :2 * half]
    if interleaved:
        pairs = torch.complex(part[..., 0::2], part[..., 1::2])
    else:
        pairs = torch.complex(part[..., :half], part[..., half:])
    turn = torch.complex(cos[positions], sin[positions]).unsqueeze(-2)   # over the heads
    out = pairs * turn
    if interleaved:
        rotated_part = torch.stack((out.real, out.imag), dim=-1).flatten(-2)
    else:
        rotated_part = torch.cat((out.real, out.imag), dim=-1)
    return torch.cat((rotated_part, x[..., 2 * half:]), dim=-1)


def tables(rows, rotary_dim, seed=1, scale=None):
    angles = torch.rand(rows, rotary_dim // 2, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * 6
    cos, sin = angles.cos(), angles.sin()
    if scale is not None:
        cos, sin = cos * scale, sin * scale
    return cos, sin


def run(fn, x, grad):
    """(out, dx) of fn on a leaf copy of x."""
    leaf = x.detach().clone().requires_grad_()
    out = fn(leaf)
    out.backward(grad)
    return out.detach(), leaf.grad


CASES = {
    "half_partial_odd": dict(shape=(3, 5, 3, 10), rotary_dim=6, offsets=2),
    "interleaved_tensor_offsets": dict(shape=(2, 7, 2, 8), rotary_dim=8, interleaved=True, offsets=[0, 5]),
    "half_tensor_offsets_partial": dict(shape=(3, 4, 1, 12), rotary_dim=4, offsets=[3, 0, 9]),
    "one_token_rows": dict(shape=(2, 1, 3, 6), rotary_dim=6, interleaved=True, offsets=[4, 1]),
    "varlen_interleaved_partial": dict(varlen=[3, 1, 6], heads=2, head_dim=10, rotary_dim=6, interleaved=True,
                                       offsets=[1, 0, 2]),
    "varlen_half_int_offset": dict(varlen=[4, 2], heads=3, head_dim=8, rotary_dim=8, offsets=3),
    "inplace_half": dict(shape=(2, 5, 2, 8), rotary_dim=4, inplace=True, offsets=[2, 0]),
}


@pytest.mark.parametrize("backend", ["composition", "triton"])
@pytest.mark.parametrize("name", list(CASES))
def test_apply_rotary_emb_matches_float64(name, backend):
    case = CASES[name]
    gen = torch.Generator().manual_seed(0)
    interleaved, inplace = case.get("interleaved", False), case.get("inplace", False)
    cu_seqlens = max_seqlen = None
    if "varlen" in case:
        x = torch.randn(sum(case["varlen"]), case["heads"], case["head_dim"], generator=gen)
        cu_seqlens = torch.tensor([0] + case["varlen"]).cumsum(0).to(torch.int32)
        max_seqlen = max(case["varlen"])
    else:
        x = torch.randn(case["shape"], generator=gen)
    offsets = case["offsets"]
    offsets = torch.tensor(offsets, dtype=torch.int32) if isinstance(offsets, list) else offsets
    batch = x.shape[0] if cu_seqlens is None else len(case["varlen"])
    positions = positions_of(batch, x.shape[1], offsets, cu_seqlens)
    cos, sin = tables(int(positions.max()) + 3, case["rotary_dim"])
    grad = torch.randn(x.shape, generator=gen)
    move = (lambda t: t.to(DEVICE) if isinstance(t, torch.Tensor) else t)

    def call(t, c, s):
        if inplace:
            t = t * 1.0   # a non-leaf to rotate in place (a leaf in place is the qkv_ test's)
        return apply_rotary_emb(t, c, s, interleaved=interleaved, inplace=inplace, seqlen_offsets=move(offsets),
                                cu_seqlens=move(cu_seqlens), max_seqlen=max_seqlen)

    with flash_attn.backends(rotary=backend):
        mine = run(lambda t: call(t, cos.float().to(DEVICE), sin.float().to(DEVICE)), x.to(DEVICE), grad.to(DEVICE))
    ref = run(lambda t: rotated(t, cos, sin, positions, interleaved), x.double(), grad.double())
    base = run(lambda t: rotated(t, cos.float(), sin.float(), positions, interleaved).float(), x, grad)
    check([t.cpu() for t in mine], ref, base, torch.float32, names=("out", "dx"))


def test_apply_rotary_bf16_on_the_kernel_and_old_name():
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(2, 9, 3, 16, generator=gen)
    cos, sin = tables(12, 10)
    grad = torch.randn(x.shape, generator=gen)
    with flash_attn.backends(rotary="triton"):
        mine = run(lambda t: apply_rotary_emb_func(t, cos.float().to(DEVICE), sin.float().to(DEVICE),
                                                   seqlen_offsets=2),
                   x.to(DEVICE, torch.bfloat16), grad.to(DEVICE, torch.bfloat16))
    positions = positions_of(2, 9, 2)
    ref = run(lambda t: rotated(t, cos, sin, positions, False), x.double(), grad.double())
    base = run(lambda t: rotated(t, cos.float(), sin.float(), positions, False).bfloat16(), x.bfloat16(),
               grad.bfloat16())
    check([t.cpu() for t in mine], ref, base, torch.bfloat16, names=("out", "dx"))


def test_ops_triton_apply_rotary_conjugate_undoes_the_rotation():
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(2, 6, 2, 8, generator=gen).to(DEVICE)
    cos, sin = (t.float().to(DEVICE) for t in tables(9, 8))
    offsets = torch.tensor([0, 3], dtype=torch.int64, device=DEVICE)
    with flash_attn.backends(rotary="triton"):
        forward = apply_rotary(x, cos, sin, seqlen_offsets=offsets, interleaved=True)
        back = apply_rotary(forward, cos, sin, seqlen_offsets=offsets, interleaved=True, conjugate=True)
        inplace = x.clone()
        returned = apply_rotary(inplace, cos, sin, seqlen_offsets=offsets, interleaved=True, inplace=True)
    assert returned is inplace
    torch.testing.assert_close(inplace, forward)
    torch.testing.assert_close(back, x, rtol=1e-5, atol=1e-5)
    assert (forward - x).abs().max() > 0.1
    positions = positions_of(2, 6, offsets)
    check([forward.cpu()], [rotated(x, cos, sin, positions, True)],
          [rotated(x, cos, sin, positions, True).float()], torch.float32, names=("out",))


def qkv_reference(qkv, cos, sin, cos_k, sin_k, positions, interleaved, heads_q=None):
    """Packed qkv with q and k rotated by the referee (float64)."""
    qkv = qkv.cpu().double()
    if qkv.dim() == 5:
        q, k, v = qkv.unbind(2)
        return torch.stack((rotated(q, cos, sin, positions, interleaved),
                            rotated(k, cos_k, sin_k, positions, interleaved), v), dim=2)
    heads_k = (qkv.shape[2] - heads_q) // 2
    q, k, v = qkv.split((heads_q, heads_k, heads_k), dim=2)
    return torch.cat((rotated(q, cos, sin, positions, interleaved), rotated(k, cos_k, sin_k, positions, interleaved),
                      v), dim=2)


@pytest.mark.parametrize("layout", ["mha", "gqa", "xpos", "strided"])
def test_apply_rotary_emb_qkv_in_place_on_a_leaf(layout):
    gen = torch.Generator().manual_seed(5)
    heads_q = 4 if layout == "gqa" else None
    shape = {"mha": (2, 5, 3, 2, 8), "xpos": (2, 5, 3, 2, 8), "gqa": (2, 5, 4 + 2 * 1, 8),
             "strided": (2, 5, 2, 3, 8)}[layout]
    qkv = torch.randn(shape, generator=gen)
    if layout == "strided":   # (B, S, H, 3, D) viewed as (B, S, 3, H, D): q and k cannot merge into one view
        qkv = qkv.transpose(2, 3)
    offsets = torch.tensor([1, 4], dtype=torch.int32)
    positions = positions_of(2, 5, offsets)
    cos, sin = tables(10, 6)
    cos_k, sin_k = (cos, sin) if layout != "xpos" else tables(10, 6, seed=2, scale=0.8)
    grad = torch.randn(qkv.shape, generator=gen)
    leaf = qkv.clone().to(DEVICE).requires_grad_()   # FlashAttention's test rotates a leaf in place
    before = leaf.detach().clone()
    with flash_attn.backends(rotary="triton"):
        out = apply_rotary_emb_qkv_(leaf, cos.float().to(DEVICE), sin.float().to(DEVICE),
                                    cos_k.float().to(DEVICE) if layout == "xpos" else None,
                                    sin_k.float().to(DEVICE) if layout == "xpos" else None,
                                    seqlen_offsets=offsets.to(DEVICE), num_heads_q=heads_q)
        out.backward(grad.to(DEVICE))
    assert torch.equal(out.detach(), leaf.detach())   # in place
    ref = run(lambda t: qkv_reference(t, cos, sin, cos_k, sin_k, positions, False, heads_q), qkv.double(),
              grad.double())
    base = run(lambda t: qkv_reference(t, cos.float(), sin.float(), cos_k.float(), sin_k.float(), positions, False,
                                       heads_q).float(), qkv, grad)
    check([out.detach().cpu(), leaf.grad.cpu()], ref, base, torch.float32, names=("out", "dqkv"))
    v_slice = (slice(None), slice(None), 2) if qkv.dim() == 5 else (slice(None), slice(None), slice(6 - 1, 6))
    assert torch.equal(out.detach()[v_slice], before[v_slice])
    assert torch.equal(leaf.grad[v_slice], grad.to(DEVICE)[v_slice])


def test_apply_rotary_emb_kv_and_rotary_embedding_xpos_with_kv():
    gen = torch.Generator().manual_seed(6)
    q, kv = torch.randn(2, 4, 2, 8, generator=gen), torch.randn(2, 4, 2, 2, 8, generator=gen)
    rotary = RotaryEmbedding(6, base=100.0, scale_base=16, device=DEVICE)
    q_leaf, kv_leaf = q.to(DEVICE).requires_grad_(), kv.to(DEVICE).requires_grad_()
    gq, gkv = torch.randn(q.shape, generator=gen), torch.randn(kv.shape, generator=gen)
    with flash_attn.backends(rotary="triton"):
        q_out, kv_out = rotary(q_leaf * 1.0, kv_leaf * 1.0, seqlen_offset=3)
        (q_out * gq.to(DEVICE)).sum().add((kv_out * gkv.to(DEVICE)).sum()).backward()
    # XPos as FlashAttention defines it, in float64: positions 0..6, scale ** ((p - 7 // 2) / scale_base)
    seqlen = 7
    inv_freq = 1.0 / (100.0 ** (torch.arange(0, 6, 2, dtype=torch.float64) / 6))
    angles = torch.arange(seqlen, dtype=torch.float64).view(-1, 1) * inv_freq
    per_freq = (torch.arange(0, 6, 2, dtype=torch.float64) + 0.4 * 6) / (1.4 * 6)
    scale = per_freq ** ((torch.arange(seqlen, dtype=torch.float64) - seqlen // 2) / 16).view(-1, 1)
    positions = positions_of(2, 4, 3)
    ref_q = run(lambda t: rotated(t, angles.cos() * scale, angles.sin() * scale, positions, False), q.double(),
                gq.double())
    ref_k = run(lambda t: rotated(t, angles.cos() / scale, angles.sin() / scale, positions, False), kv[:, :, 0].double(),
                gkv[:, :, 0].double())
    base_q = run(lambda t: rotated(t, angles.cos() * scale, angles.sin() * scale, positions, False).float(), q, gq)
    base_k = run(lambda t: rotated(t, angles.cos() / scale, angles.sin() / scale, positions, False).float(),
                 kv[:, :, 0], gkv[:, :, 0])
    check([q_out.detach().cpu(), q_leaf.grad.cpu()], ref_q, base_q, torch.float32, names=("q", "dq"))
    check([kv_out.detach()[:, :, 0].cpu(), kv_leaf.grad[:, :, 0].cpu()], ref_k, base_k, torch.float32,
          names=("k", "dk"))
    assert torch.equal(kv_out.detach()[:, :, 1].cpu(), kv[:, :, 1]) and torch.equal(kv_leaf.grad[:, :, 1].cpu(),
                                                                                    gkv[:, :, 1])
    assert rotary._cos_cached.shape == (7, 3) and rotary._cos_k_cached is not None
    # kv alone, without the module
    kv2 = kv.to(DEVICE).clone()
    with flash_attn.backends(rotary="composition"):
        apply_rotary_emb_kv_(kv2, angles.cos().float().to(DEVICE), angles.sin().float().to(DEVICE), seqlen_offsets=3)
    torch.testing.assert_close(kv2[:, :, 0].cpu().double(), rotated(kv[:, :, 0], angles.cos(), angles.sin(), positions,
                                                                    False), rtol=1e-5, atol=1e-5)


def test_rotary_embedding_cache_matches_the_neox_and_gptj_tables():
    rotary = RotaryEmbedding(8, interleaved=True, device=DEVICE)
    qkv = torch.randn(1, 3, 3, 1, 8, device=DEVICE)
    with flash_attn.backends(rotary="composition"):
        rotary(qkv, seqlen_offset=5)
    angles = torch.arange(8, dtype=torch.float64).view(-1, 1) * (1.0 / 10000 ** (torch.arange(0, 8, 2) / 8.0))
    torch.testing.assert_close(rotary._cos_cached.cpu().double(), angles.cos(), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(rotary._sin_cached.cpu().double(), angles.sin(), rtol=1e-6, atol=1e-6)
    ours = apply_rotary_emb_torch(torch.ones(1, 2, 1, 4, dtype=torch.float64), torch.tensor([[0.0, 1.0]] * 2,
                                  dtype=torch.float64), torch.tensor([[1.0, 0.0]] * 2, dtype=torch.float64))
    assert ours[0, 0, 0].tolist() == [-1.0, 1.0, 1.0, 1.0]   # pair 0 turned by 90 degrees, pair 1 kept
    with pytest.raises(ValueError, match="max_seqlen: needed with a tensor seqlen_offset"):
        RotaryEmbedding(8)(qkv, seqlen_offset=torch.tensor([0]))


def test_rotary_errors_are_flash_attention_shaped():
    x = torch.randn(2, 4, 2, 8, device=DEVICE)
    cos, sin = (t.float().to(DEVICE) for t in tables(5, 8))
    with flash_attn.backends(rotary="composition"):
        with pytest.raises(RuntimeError, match="apply_rotary: cos: positions reach 6"):
            apply_rotary_emb(x, cos, sin, seqlen_offsets=3)
        with pytest.raises(flash_attn.FlashAttnArgumentError, match="seqlen_offsets: expected one offset per sequence"):
            apply_rotary_emb(x, cos, sin, seqlen_offsets=torch.tensor([0, 1, 2], device=DEVICE))
        with pytest.raises(ValueError, match="rotary_dim"):
            apply_rotary_emb(x, *(t.repeat(1, 2) for t in (cos, sin)))
        with pytest.raises(ValueError, match="num_heads_q: needed with a 4-D qkv"):
            apply_rotary_emb_qkv_(torch.randn(2, 4, 6, 8, device=DEVICE), cos, sin)
        with pytest.raises(ValueError, match="num_heads_q: expected qkv.shape"):
            apply_rotary_emb_qkv_(torch.randn(2, 4, 6, 8, device=DEVICE), cos, sin, num_heads_q=3)
        with pytest.raises(ValueError, match="kv: expected"):
            apply_rotary_emb_kv_(torch.randn(2, 4, 3, 2, 8, device=DEVICE), cos, sin)
        with pytest.raises(TypeError, match="conjugate"):
            apply_rotary(x, cos, sin, conjugate=1)
    with pytest.raises(ValueError, match="dim: expected an even int"):
        RotaryEmbedding(7)


def compiled_like_eager(step, x):
    """(out, dx) of step compiled with fullgraph=True (backend aot_eager: inductor's CPU compile is
    too slow for the suite), checked equal to eager."""
    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    with flash_attn.backends(rotary="composition"):
        eager = run(step, x, torch.ones_like(x))
        got = run(compiled, x, torch.ones_like(x))
    torch.testing.assert_close(got[0], eager[0])
    torch.testing.assert_close(got[1], eager[1])
    return got


def test_apply_rotary_emb_under_torch_compile_fullgraph():
    cos, sin = (t.float().to(DEVICE) for t in tables(6, 6))
    offsets = torch.tensor([0, 2], device=DEVICE)
    got = compiled_like_eager(lambda t: apply_rotary_emb(t, cos, sin, interleaved=True, seqlen_offsets=offsets),
                              torch.randn(2, 3, 2, 8, device=DEVICE))
    assert math.isfinite(float(got[0].sum()))


def test_rotary_embedding_in_place_under_torch_compile_fullgraph():
    """RotaryEmbedding (apply_rotary_emb_qkv_ in place on a non-leaf, XPos): forward and the
    gradient of the projected qkv."""
    x = torch.randn(2, 3, 3, 2, 8, device=DEVICE)
    rotary = RotaryEmbedding(6, scale_base=32, device=DEVICE)
    got = compiled_like_eager(lambda t: rotary(t * 2.0, seqlen_offset=2), x)
    assert not torch.equal(got[0], x * 2.0)
