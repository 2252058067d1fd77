"""The Triton rotary kernel against the float64 referee, forward and backward: half-split and
interleaved layouts, partial rotary_dim, int and per-batch offsets, packed varlen, in place,
strided inputs, all three dtypes. B > 1 with different offsets in every layout is where a
real port got the batch stride wrong, so every batched case is also checked one sequence at
a time. CPU: TRITON_INTERPRET=1 on small shapes; GPUPARITY_TEST_DEVICE=cuda: real sizes."""
from __future__ import annotations

import os

import pytest
import torch
from device_env import ON_GPU, TEST_DEVICE as DEVICE, require_device

pytest.importorskip("triton")

from gpuparity import reference  # noqa: E402
from gpuparity.backends import triton_rotary  # noqa: E402
from gpuparity.contracts import rotary as rotary_contract  # noqa: E402
from gpuparity.tolerance import judge  # noqa: E402

require_device()

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
DTYPE_IDS = ["float32", "float16", "bfloat16"]


pytestmark = pytest.mark.usefixtures("triton_interpreter_is_live")


def tables(length, rotary_dim, seed=0, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    angles = torch.rand(length, rotary_dim // 2, generator=gen, dtype=torch.float64) * 6.3
    return angles.cos().to(DEVICE, dtype), angles.sin().to(DEVICE, dtype)


def run_rotary(fn, x, cos, sin, dy, **kwargs):
    leaf = x.detach().requires_grad_()
    out = fn(leaf, cos, sin, **kwargs)
    (dx,) = torch.autograd.grad(out, [leaf], dy.to(out.dtype))
    return out, dx


def check_rotary(x, cos, sin, seed=0, **kwargs):
    gen = torch.Generator().manual_seed(seed + 1)
    dy = torch.randn(x.shape, generator=gen).to(x.device, x.dtype)
    got = run_rotary(triton_rotary.triton_apply_rotary, x, cos, sin, dy, **kwargs)
    # The eager composition computes in x's dtype: the trusted baseline of the policy.
    base = run_rotary(rotary_contract.rotary_composition, x, cos.to(x.dtype), sin.to(x.dtype), dy, **kwargs)
    up = lambda t: t.detach().to("cpu", torch.float64)  # noqa: E731
    ref_kwargs = dict(kwargs)
    for key in ("seqlen_offsets", "cu_seqlens"):
        if isinstance(ref_kwargs.get(key), torch.Tensor):
            ref_kwargs[key] = ref_kwargs[key].cpu()
    expected = run_rotary(reference.apply_rotary, up(x), up(cos), up(sin), up(dy), **ref_kwargs)
    for name, g, b, e in zip(("out", "dx"), got, base, expected):
        assert g.dtype == x.dtype and g.shape == x.shape
        result = judge(name, g, e, b, x.dtype)
        assert result.passed, f"{tuple(x.shape)} {x.dtype} {kwargs}: {result.reason}"
    return got


def per_sequence_agrees(x, cos, sin, out, *, interleaved, seqlen_offsets, cu_seqlens=None):
    """Each sequence rotated alone equals its slice of the batched result (the batch stride)."""
    batch = x.shape[0] if cu_seqlens is None else cu_seqlens.numel() - 1
    for b in range(batch):
        offset = int(seqlen_offsets[b]) if isinstance(seqlen_offsets, torch.Tensor) else int(seqlen_offsets)
        if cu_seqlens is None:
            alone = triton_rotary.triton_apply_rotary(x[b:b + 1], cos, sin, interleaved=interleaved,
                                                      seqlen_offsets=offset)
            assert torch.equal(alone[0], out[b]), f"sequence {b} differs when batched"
        else:
            start, end = int(cu_seqlens[b]), int(cu_seqlens[b + 1])
            if end == start:
                continue
            alone = triton_rotary.triton_apply_rotary(x[start:end].unsqueeze(0), cos, sin, interleaved=interleaved,
                                                      seqlen_offsets=offset)
            assert torch.equal(alone[0], out[start:end]), f"packed sequence {b} differs"


def _sizes():
    # (B, S, H, D, rotary_dim)
    if ON_GPU:
        return [(8, 1024, 32, 128, 128), (64, 256, 4, 32, 32), (3, 1000, 12, 80, 40), (2, 333, 5, 96, 64)]
    # (2, 5, 11, 8, 8): more heads than one program takes (two head blocks, the second partial)
    return [(2, 7, 3, 16, 16), (3, 9, 2, 20, 12), (1, 17, 1, 6, 2), (2, 5, 3, 34, 34), (2, 5, 11, 8, 8)]


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("interleaved", [False, True], ids=["half", "interleaved"])
@pytest.mark.parametrize("size", _sizes(), ids=lambda s: "x".join(map(str, s)))
def test_batched_with_per_batch_offsets(size, interleaved, dtype):
    batch, seqlen, heads, head_dim, rotary_dim = size
    gen = torch.Generator().manual_seed(sum(size))
    x = torch.randn(batch, seqlen, heads, head_dim, generator=gen).to(DEVICE, dtype)
    offsets = torch.arange(batch, dtype=torch.int32).mul(3).add(1).to(DEVICE)  # every sequence differs
    cos, sin = tables(seqlen + int(offsets.max()) + 2, rotary_dim)
    out, _ = check_rotary(x, cos, sin, interleaved=interleaved, seqlen_offsets=offsets)
    per_sequence_agrees(x, cos, sin, out, interleaved=interleaved, seqlen_offsets=offsets)
    if rotary_dim < head_dim:
        assert torch.equal(out[..., rotary_dim:], x[..., rotary_dim:]), "features past rotary_dim must pass through"


@pytest.mark.parametrize("interleaved", [False, True], ids=["half", "interleaved"])
def test_int_offset(interleaved):
    x = torch.randn(2, 6, 3, 16).to(DEVICE)
    cos, sin = tables(20, 16)
    check_rotary(x, cos, sin, interleaved=interleaved, seqlen_offsets=5)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("interleaved", [False, True], ids=["half", "interleaved"])
@pytest.mark.parametrize("offsets", ["int", "tensor"])
def test_packed_varlen(offsets, interleaved, dtype):
    lengths = [5, 0, 9, 1] if not ON_GPU else [1000, 0, 4096, 1, 777]
    cu = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)), dtype=torch.int32).to(DEVICE)
    heads, head_dim, rotary_dim = (3, 24, 16) if not ON_GPU else (8, 128, 64)
    x = torch.randn(int(cu[-1]), heads, head_dim, generator=torch.Generator().manual_seed(4)).to(DEVICE, dtype)
    seqlen_offsets = 2 if offsets == "int" else torch.tensor([0, 4, 7, 1, 3][:len(lengths)], device=DEVICE)
    cos, sin = tables(max(lengths) + 10, rotary_dim)
    out, _ = check_rotary(x, cos, sin, interleaved=interleaved, seqlen_offsets=seqlen_offsets, cu_seqlens=cu,
                          max_seqlen=max(lengths))
    per_sequence_agrees(x, cos, sin, out, interleaved=interleaved, seqlen_offsets=seqlen_offsets, cu_seqlens=cu)


@pytest.mark.parametrize("interleaved", [False, True], ids=["half", "interleaved"])
def test_inplace_forward_and_backward(interleaved):
    x = torch.randn(2, 5, 3, 20, generator=torch.Generator().manual_seed(8)).to(DEVICE)
    cos, sin = tables(12, 12)
    offsets = torch.tensor([1, 4], device=DEVICE)
    expected = triton_rotary.triton_apply_rotary(x, cos, sin, interleaved=interleaved, seqlen_offsets=offsets)
    source = x.clone().requires_grad_()
    work = source * 1.0                           # a non-leaf we may overwrite
    pointer = work.data_ptr()
    out = triton_rotary.triton_apply_rotary(work, cos, sin, interleaved=interleaved, seqlen_offsets=offsets,
                                            inplace=True)
    assert out.data_ptr() == pointer and torch.equal(out, expected)
    dy = torch.randn(out.shape, generator=torch.Generator().manual_seed(9)).to(DEVICE)
    (dx,) = torch.autograd.grad(out, [source], dy)
    leaf = x.clone().requires_grad_()
    (dx_expected,) = torch.autograd.grad(
        triton_rotary.triton_apply_rotary(leaf, cos, sin, interleaved=interleaved, seqlen_offsets=offsets), [leaf], dy)
    assert torch.equal(dx, dx_expected)


@pytest.mark.parametrize("interleaved", [False, True], ids=["half", "interleaved"])
def test_strided_q_from_packed_qkv(interleaved):
    """q and k as views of one (B, S, 3, H, D) projection: read through their strides."""
    qkv = torch.randn(2, 6, 3, 4, 32, generator=torch.Generator().manual_seed(6)).to(DEVICE, torch.bfloat16)
    q, k = qkv[:, :, 0], qkv[:, :, 1]
    assert not q.is_contiguous()
    cos, sin = tables(10, 32)
    offsets = torch.tensor([0, 3], device=DEVICE)
    out, _ = check_rotary(q, cos, sin, interleaved=interleaved, seqlen_offsets=offsets)
    per_sequence_agrees(q, cos, sin, out, interleaved=interleaved, seqlen_offsets=offsets)
    check_rotary(k.transpose(0, 1).contiguous().transpose(0, 1), cos, sin, interleaved=interleaved)


def test_prepared_launches_follow_the_arguments():
    """Launches are kept per call signature: calls that share shapes but differ in the offsets'
    kind, layout, direction or in-place-ness must each get their own, and a kept launch must
    take each call's int offset (0, then 5, then 5 again after others), in one process."""
    x = torch.randn(2, 6, 3, 16, generator=torch.Generator().manual_seed(10)).to(DEVICE)
    cos, sin = tables(24, 16)
    for kwargs in ({"seqlen_offsets": 0}, {"seqlen_offsets": 5}, {"seqlen_offsets": 0, "interleaved": True},
                   {"seqlen_offsets": torch.tensor([2, 7], device=DEVICE)}, {"seqlen_offsets": 5}):
        for _ in range(2):  # the second call runs through the kept launch
            check_rotary(x, cos, sin, **kwargs)
            work = x.clone()
            triton_rotary.triton_apply_rotary(work, cos, sin, inplace=True, **kwargs)
            assert torch.equal(work, triton_rotary.triton_apply_rotary(x, cos, sin, **kwargs)), kwargs


@pytest.mark.parametrize("interleaved", [False, True], ids=["half", "interleaved"])
def test_decode_loop_int_offsets_share_one_launch(interleaved):
    """A decode loop rotates one new position per step with a new int offset: every step must
    use its own offset (forward and backward) while one kept launch serves them all."""
    cos, sin = tables(40, 16, seed=3)
    gen = torch.Generator().manual_seed(11)
    x = torch.randn(3, 1, 2, 16, generator=gen).to(DEVICE)
    triton_rotary._PLANS.clear()
    # 1 first: a kernel specialized on offset 1 would fold it in and ignore every later value
    for pos in (1, 0, 16, 17, 5, 39, 1):
        check_rotary(x, cos, sin, interleaved=interleaved, seqlen_offsets=pos)
    # forward and backward (rotation by -theta) each keep one launch, whatever the offsets
    assert len(triton_rotary._PLANS) == 2
    # an offset past int32 gets a launch of its own (the kept i32 launcher would truncate it)
    key = lambda offset: triton_rotary._plan_key(x, cos, sin, interleaved, offset, None, None, False, False)  # noqa: E731
    assert key(0) == key(2 ** 31 - 1) != key(2 ** 31) == key(2 ** 40)


def test_offset_scalar_position_matches_the_kernel():
    import inspect
    fn = getattr(triton_rotary._rotary_kernel, "fn", triton_rotary._rotary_kernel)
    names = list(inspect.signature(fn).parameters)
    assert names[6 + triton_rotary._OFFSET_SCALAR] == "offset_value"


def test_kernel_does_not_specialize_on_the_offset():
    """Kept launches reuse one compiled kernel for every int offset: only sound if Triton does
    not specialize on its value (the interpreter ignores that flag, so ask a compiling import)."""
    code = ("import json; from gpuparity.backends import triton_rotary as t; "
            "print(json.dumps([p.name for p in t._rotary_kernel.params if p.do_not_specialize]))")
    if ON_GPU:
        names = [p.name for p in triton_rotary._rotary_kernel.params if p.do_not_specialize]
    else:
        import json
        import subprocess
        import sys
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
        names = json.loads(done.stdout.strip().splitlines()[-1])
    assert names == ["offset_value"]


def test_half_precision_tables():
    x = torch.randn(2, 5, 2, 16).to(DEVICE, torch.float16)
    cos, sin = tables(8, 16, dtype=torch.float16)
    check_rotary(x, cos, sin, seqlen_offsets=2)


def test_configs_cover_every_family():
    for fam in triton_rotary.FAMILIES:
        for heads, half, pass_dim in ((1, 1, 0), (32, 64, 0), (5, 20, 40), (64, 128, 0)):
            cfg = triton_rotary.rotary_config(heads, half, pass_dim, fam=fam)
            assert cfg.block_r >= half and cfg.block_h <= triton_rotary.MAX_BLOCK_H and 1 <= cfg.num_warps <= 16


# ----------------------------------------------------------------------------- q and k in one launch
def _pair_sizes():
    # (B, S, Hq, Hk, D, rotary_dim): grouped heads (Hk < Hq, also Hk not dividing the head
    # block), position counts that leave a partial last block, partial rotary with pass-through
    if ON_GPU:
        return [(2, 2048, 16, 4, 128, 128), (3, 1000, 12, 4, 80, 40), (1, 333, 5, 5, 96, 64)]
    return [(2, 7, 4, 2, 16, 16), (1, 9, 3, 1, 20, 12), (2, 5, 11, 3, 8, 8), (3, 1, 2, 2, 34, 34)]


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("interleaved", [False, True], ids=["half", "interleaved"])
@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
@pytest.mark.parametrize("size", _pair_sizes(), ids=lambda s: "x".join(map(str, s)))
def test_pair_matches_the_reference_and_the_single_launches(size, layout, interleaved, dtype):
    """q and k rotated in one launch: forward and backward against float64 within the policy,
    and bit for bit the kernel's single-tensor launches (same math per element). "bhsd" gives
    HF's layout, a transposed (B, H, S, D) read through its strides."""
    batch, seqlen, heads_q, heads_k, head_dim, rotary_dim = size
    gen = torch.Generator().manual_seed(sum(size))

    def make(heads):
        shape = (batch, seqlen, heads, head_dim) if layout == "bshd" else (batch, heads, seqlen, head_dim)
        t = (torch.randn(shape, generator=gen) * 4).to(DEVICE, dtype)
        return t if layout == "bshd" else t.transpose(1, 2)

    q, k = make(heads_q), make(heads_k)
    dq_out = torch.randn(q.shape, generator=gen).to(DEVICE, dtype)
    dk_out = torch.randn(k.shape, generator=gen).to(DEVICE, dtype)
    cos, sin = tables(seqlen + 3, rotary_dim)
    q_leaf, k_leaf = q.detach().requires_grad_(), k.detach().requires_grad_()
    q_out, k_out = triton_rotary.triton_apply_rotary_pair(q_leaf, k_leaf, cos, sin, interleaved=interleaved)
    dq, dk = torch.autograd.grad((q_out, k_out), (q_leaf, k_leaf), (dq_out, dk_out))
    for x, dy, out, dx in ((q, dq_out, q_out, dq), (k, dk_out, k_out, dk)):
        single = run_rotary(triton_rotary.triton_apply_rotary, x, cos, sin, dy, interleaved=interleaved)
        assert torch.equal(out, single[0]) and torch.equal(dx, single[1])
        assert out.shape == x.shape and out.dtype == x.dtype
        up = lambda t: t.detach().to("cpu", torch.float64)  # noqa: E731
        expected = run_rotary(reference.apply_rotary, up(x), up(cos), up(sin), up(dy), interleaved=interleaved)
        base = run_rotary(rotary_contract.rotary_composition, x, cos.to(x.dtype), sin.to(x.dtype), dy,
                          interleaved=interleaved)
        for name, g, b, e in zip(("out", "dx"), (out, dx), base, expected):
            result = judge(name, g, e, b, x.dtype)
            assert result.passed, f"{size} {layout} {dtype}: {result.reason}"
    if rotary_dim < head_dim:
        assert torch.equal(k_out[..., rotary_dim:], k[..., rotary_dim:])


def test_pair_through_apply_rotary_pair_checks_its_arguments():
    from gpuparity.ops.rotary import apply_rotary_pair
    cos, sin = tables(8, 16)
    q, k = torch.randn(2, 5, 4, 16).to(DEVICE), torch.randn(2, 5, 2, 16).to(DEVICE)
    with pytest.raises(ValueError, match=r"^k: expected q's batch, sequence length and head dim"):
        apply_rotary_pair(q, k[:, :4], cos, sin, backend="triton")
    with pytest.raises(TypeError, match=r"^k: expected q's dtype"):
        apply_rotary_pair(q, k.double(), cos, sin, backend="triton")
    with pytest.raises(ValueError, match=r"^q: .*cos"):
        apply_rotary_pair(q, k, *tables(8, 40), backend="triton")
    q_out, k_out = apply_rotary_pair(q, k, cos, sin, backend="triton")
    assert torch.equal(q_out, triton_rotary.triton_apply_rotary(q, cos, sin))
    assert torch.equal(k_out, triton_rotary.triton_apply_rotary(k, cos, sin))
