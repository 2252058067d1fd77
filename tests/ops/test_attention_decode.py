"""gpuparity.attention_decode and kv_cache_append: the split-KV Triton kernel (under the
interpreter on the CPU), SDPA and the composition against the float64 reference under the
tolerance policy, edge cases (empty and full items, empty splits), argument errors and the
dispatcher's reasons."""
from __future__ import annotations

import pytest
import torch
from device_env import TEST_DEVICE, size  # sets TRITON_INTERPRET=1 on the CPU before triton imports

import gpuparity  # noqa: E402
from gpuparity import dispatch  # noqa: E402
from gpuparity.backends import triton_decode as td  # noqa: E402
from gpuparity.contracts.decode import decode_composition  # noqa: E402
from gpuparity.registry import BackendUnavailable  # noqa: E402
from gpuparity.tolerance import judge  # noqa: E402
from gpuparity.ops import decode  # noqa: E402
from gpuparity.ops.decode import attention_decode, decode_reference, kv_cache_append  # noqa: E402

DEVICE = torch.device(TEST_DEVICE)
pytestmark = pytest.mark.usefixtures("triton_interpreter_is_live")


def make(batch=3, heads=8, kv_heads=2, q_len=1, s_max=None, head_dim=16, lengths=None, dtype=torch.float32,
         seed=0):
    s_max = s_max or size(45, 1000)
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads, q_len, head_dim, generator=gen)
    k = torch.randn(batch, kv_heads, s_max, head_dim, generator=gen)
    v = torch.randn(batch, kv_heads, s_max, head_dim, generator=gen)
    if lengths is None:
        lengths = [0, s_max, s_max // 2 + 1][:batch]
    seqlens = torch.tensor(lengths, dtype=torch.int32)
    return [t.to(DEVICE, dtype) for t in (q, k, v)] + [seqlens.to(DEVICE)]


def check(out, q, k, v, seqlens, softcap=None, scale=None):
    """out against float64 under the policy, the composition in the same dtype as baseline;
    rows that see no key must be exactly zero."""
    ref = decode_reference(q, k, v, seqlens.cpu(), softcap=softcap, scale=scale)
    base = decode_composition(q, k, v, seqlens, softcap=softcap, scale=scale)
    visible = seqlens.cpu().long().view(-1, 1, 1, 1) - q.shape[2] + 1 + torch.arange(q.shape[2]).view(1, 1, -1, 1)
    empty = (visible <= 0).expand(q.shape[0], q.shape[1], q.shape[2], 1)
    assert not torch.isnan(out).any()
    result = judge("out", out.cpu(), ref, base.cpu(), q.dtype, valid=~empty, must_be_zero=empty)
    assert result.passed, result.reason
    return empty


BACKENDS = ["triton", "composition"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("q_len", [1, 4])
@pytest.mark.parametrize("backend", BACKENDS)
def test_decode_matches_the_reference(backend, q_len, dtype):
    args = make(q_len=q_len, dtype=dtype)            # GQA 4:1, lengths 0, S_max and in between
    empty = check(attention_decode(*args, backend=backend), *args)
    assert empty[0].all() and not empty[1].any()   # the empty item and the full one are both there


@pytest.mark.parametrize("backend", BACKENDS)
def test_softcap_and_scale(backend):
    args = make(q_len=4)
    args[0] = args[0] * 4                           # large scores, so the cap matters
    out = attention_decode(*args, softcap=3.0, scale=0.3, backend=backend)
    check(out, *args, softcap=3.0, scale=0.3)
    plain = attention_decode(*args, scale=0.3, backend=backend)
    assert (out - plain).abs().max() > 1e-2            # the cap changed something


@pytest.mark.parametrize("splits", [2, 4])
def test_triton_splits_including_splits_past_the_length(splits):
    # item 2 has 5 keys: one tile, so every split but the first is wholly past cache_seqlens
    args = make(batch=3, q_len=4, lengths=[size(45, 1000), 5, 2])
    out = td.triton_decode(*args, num_splits=splits)
    check(out, *args)
    torch.testing.assert_close(out, td.triton_decode(*args, num_splits=1), rtol=1e-5, atol=1e-5)


def test_split_count_fills_the_machine_and_stays_within_the_tiles():
    cpu = torch.device("cpu")
    assert td.choose_splits(1, 1, 1000, 16, cpu) == 2
    assert td.choose_splits(1, 1, 10, 16, cpu) == 1        # one tile: one split
    assert td.choose_splits(64, 8, 10 ** 6, 16, cpu) == 1


def test_split_rule_on_a_132_sm_gpu_is_the_measured_best(monkeypatch):
    # benchmarks/records/h100/decode-2026-11-24.md, CUDA-graph timings (Hkv 8, BLOCK_N 64): few rows
    # with long caches split to 128, many rows still split in 2-3 (1 split lost 7-11% at B=64)
    from gpuparity.backends import triton_common
    monkeypatch.setattr(triton_common, "sm_count", lambda device: 132)
    monkeypatch.setattr(triton_common, "interpreting", lambda: False)
    gpu = torch.device("cuda", 0)
    grid = {batch: [td.choose_splits(batch, 8, seq, 64, gpu) for seq in (4096, 16384, 65536, 131072)]
            for batch in (1, 4, 16, 64)}
    assert grid == {1: [33, 33, 128, 128], 4: [9, 32, 33, 33], 16: [3, 3, 3, 3], 64: [2, 2, 3, 3]}


def test_append_then_decode_equals_attention_over_the_whole_sequence():
    batch, kv_heads, heads, head_dim, s_max = 2, 2, 4, 16, size(40, 512)
    prefix = [size(7, 300), size(20, 100)]
    new_len = 3
    gen = torch.Generator().manual_seed(3)
    full_k = [torch.randn(kv_heads, p + new_len, head_dim, generator=gen) for p in prefix]
    full_v = [torch.randn(kv_heads, p + new_len, head_dim, generator=gen) for p in prefix]
    k_cache = torch.zeros(batch, kv_heads, s_max, head_dim)
    v_cache = torch.zeros(batch, kv_heads, s_max, head_dim)
    for b, p in enumerate(prefix):
        k_cache[b, :, :p], v_cache[b, :, :p] = full_k[b][:, :p], full_v[b][:, :p]
    k_cache, v_cache = k_cache.to(DEVICE), v_cache.to(DEVICE)
    seqlens = torch.tensor(prefix, dtype=torch.int64, device=DEVICE)
    k_new = torch.stack([kk[:, -new_len:] for kk in full_k]).to(DEVICE)
    v_new = torch.stack([vv[:, -new_len:] for vv in full_v]).to(DEVICE)
    grown = kv_cache_append(k_cache, v_cache, k_new, v_new, seqlens)
    assert grown.tolist() == [p + new_len for p in prefix] and seqlens.tolist() == prefix   # a new tensor
    assert grown.dtype == torch.int64
    q = torch.randn(batch, heads, new_len, head_dim, generator=gen).to(DEVICE)
    out = attention_decode(q, k_cache, v_cache, grown, backend="triton")
    for b, p in enumerate(prefix):
        # the same queries at the end of the whole sequence: bottom-right causal, i.e. a
        # top-left causal mask of the full length with the first p queries left out
        total = p + new_len
        q_full = torch.zeros(1, heads, total, head_dim, device=DEVICE)
        q_full[:, :, p:] = q[b:b + 1]
        want = gpuparity.attention(q_full, full_k[b][None].to(DEVICE), full_v[b][None].to(DEVICE),
                                   is_causal=True, backend="composition")[:, :, p:]
        torch.testing.assert_close(out[b:b + 1], want, rtol=1e-4, atol=1e-4)
    assert (k_cache[0, :, prefix[0] + new_len:] == 0).all()   # nothing written past the new tokens


def test_append_overflow_names_cache_seqlens():
    k_cache, v_cache = torch.zeros(2, 1, 8, 4), torch.zeros(2, 1, 8, 4)
    k_new = torch.ones(2, 1, 3, 4)
    with pytest.raises(ValueError, match=r"cache_seqlens: .*S_max=8.*max 6.*overflow by 1"):
        kv_cache_append(k_cache, v_cache, k_new, k_new, torch.tensor([0, 6]))
    assert (k_cache == 0).all()                                   # nothing written
    assert kv_cache_append(k_cache, v_cache, k_new, k_new, torch.tensor([0, 5])).tolist() == [3, 8]
    assert k_cache[1, 0, 5:].eq(1).all() and k_cache[1, 0, :5].eq(0).all() and k_cache[0, 0, 3:].eq(0).all()
    with pytest.raises(ValueError, match=r"^cache_seqlens: .*cache_seqlens >= 0, got cache_seqlens min -1"):
        kv_cache_append(k_cache, v_cache, k_new, k_new, torch.tensor([-1, 0]))


@pytest.mark.parametrize("call, pattern", [
    (lambda a: attention_decode(a[0].expand(3, 8, 17, 16), *a[1:]), r"q: expected 1 to 16 new queries.*Sq=17"),
    (lambda a: attention_decode(a[0][:, :7], *a[1:]), r"k_cache: expected a number of heads Hkv that divides"),
    (lambda a: attention_decode(a[0], a[1], a[2][:, :, :-1], a[3]), r"v_cache: expected the shape of k_cache"),
    (lambda a: attention_decode(a[0].half(), *a[1:]), r"k_cache: expected dtype float16"),
    (lambda a: attention_decode(a[0], a[1], a[2], a[3].float()), r"cache_seqlens: expected dtype in \(int32, int64\)"),
    (lambda a: attention_decode(a[0], a[1], a[2], a[3][:2]), r"cache_seqlens: expected one length per batch item"),
    (lambda a: attention_decode(a[0][..., :8], *a[1:]), r"q: expected shape \(B=3, H, Sq, D=16\)"),
    (lambda a: attention_decode(*a, softcap=-1.0), r"softcap: expected a finite number > 0"),
    (lambda a: attention_decode(*a, backend=3), r"backend: expected a backend name"),
    (lambda a: attention_decode(a[0].requires_grad_(), *a[1:]), r"q: attention_decode is inference only"),
    (lambda a: kv_cache_append(a[1], a[2], a[1][:, :1, :2], a[2][:, :1, :2], a[3]), r"k_new: expected shape"),
    (lambda a: kv_cache_append(a[1], a[2], a[1][:, :, :2].half(), a[2][:, :, :2].half(), a[3]),
     r"k_new: expected dtype float32"),
])
def test_bad_arguments_are_named(call, pattern):
    args = [t.cpu() for t in make()]
    with pytest.raises((ValueError, TypeError), match=pattern):
        call(args)


def test_cpu_lengths_past_the_cache_are_refused():
    args = make(lengths=[0, 3, 46], s_max=45, batch=3)
    with pytest.raises(ValueError, match=r"cache_seqlens: expected lengths in \[0, S_max=45\], got min 0, max 46"):
        attention_decode(*[t.cpu() for t in args])


def test_dispatcher_reasons_in_words():
    args = make(q_len=1)
    problem = decode.decode_problem(*args, softcap=2.0)
    assert any("no logit softcap" in r for r in dispatch.get("attention_decode", "sdpa").reasons(problem))
    with pytest.raises(BackendUnavailable, match="sdpa: SDPA has no logit softcap"):
        attention_decode(*args, softcap=2.0, backend="sdpa")
    big = decode.decode_problem(*make(head_dim=272, s_max=20))
    assert any("head_dim 272 > 256" in r for r in dispatch.get("attention_decode", "triton").reasons(big))
    table = decode.explain_attention_decode(*args, softcap=2.0)
    rows = {row["name"]: row for row in table["candidates"]}
    assert rows["sdpa"]["status"] == "unsupported" and rows["composition"]["status"] == "fallback"
    # triton can serve it: chosen, or (where the device family's prior puts the composition
    # before it, as on a CPU) listed after the choice without a check
    assert rows["triton"]["status"] in ("verified", "unchecked") and table["chosen"] in ("triton", "composition")


def test_auto_skips_a_candidate_that_fails_its_check(monkeypatch):
    # probed in this process: a crash-isolating child (the default on a GPU) has no planted backend
    monkeypatch.setenv("GPUPARITY_PROBE", "inprocess")
    from gpuparity.checks import priors
    for family in priors.PRIORS:   # ranked first, so that auto checks it before anything else
        monkeypatch.setitem(priors.PRIORS[family], "attention_decode", ["broken"])

    def broken(q, k_cache, v_cache, cache_seqlens, *, scale=None, softcap=None):
        return torch.zeros_like(q) + 1.0
    from gpuparity.registry import Backend, register, unregister
    register(Backend("broken", "attention_decode", broken, "planted: wrong answers"))
    try:
        args = make()
        dispatch.forget()
        table = decode.explain_attention_decode(*args)
        rows = {row["name"]: row for row in table["candidates"]}
        # the battery's verdict: its attention_decode cases failed, with the first one's reason
        assert rows["broken"]["status"] == "failed-probe"
        assert rows["broken"]["reason"].startswith("failed ") and "FAIL out: " in rows["broken"]["reason"]
        assert table["chosen"] != "broken"
    finally:
        unregister("attention_decode", "broken")


def test_sdpa_peer_matches_the_reference():
    args = make(q_len=4)
    check(attention_decode(*args, backend="sdpa"), *args)


def test_tiles_fit_shared_memory_for_wide_heads_in_fp32():
    # the H100 battery: D=256 fp32 at 3 stages x 64 keys asked for 296 KB of shared memory
    nvidia = td.TILE_BYTES["nvidia"]
    assert td.fit_tiles(64, 3, 128, 2, nvidia) == (64, 3)          # the tuned bf16 D=128 config stays
    block_n, stages = td.fit_tiles(64, 3, 256, 4, nvidia)
    assert stages * 2 * block_n * 256 * 4 <= nvidia and block_n >= 16
    assert td.fit_tiles(64, 1, 256, 4, td.TILE_BYTES["amd"]) == (32, 1)      # 2 x 32 x 256 x 4 = 64 KB


def test_ahead_of_time_specs_are_the_tiles_triton_decode_launches():
    """aot_specs compiles each case at the tile triton_decode would launch on that vendor: its
    config fitted to the vendor's shared-memory budget (D=256 at 3 stages of 64 keys would not fit)."""
    pytest.importorskip("triton")
    specs = [s for s in td.aot_specs() if s.name.startswith("attention_decode.split.")]
    assert specs
    for spec in specs:
        vendor = "amd" if spec.targets[0].startswith("hip") else "nvidia"
        cfg = td.VENDOR_CONFIGS[vendor]
        element = 4 if spec.signature["Q"] == "*fp32" else 2
        expected = td.fit_tiles(cfg["block_n"], cfg["num_stages"], spec.constexprs["HEAD_DIM"], element,
                                td.TILE_BYTES[vendor])
        assert (spec.constexprs["BLOCK_N"], spec.num_stages) == expected, spec.name
