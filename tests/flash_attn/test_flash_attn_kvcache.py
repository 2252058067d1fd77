"""gpuparity.flash_attn.flash_attn_with_kvcache against the float64 referee, modelled on
FlashAttention's test_flash_attn_kvcache: in-place append of new keys/values (rotated by
rotary_cos/sin, interleaved or not), GQA, causal / window / ALiBi bottom-right on each item's
length, cache_leftpad, cache_batch_idx, paged caches on shuffled pages, the lse output, the
inference-only refusal and the argument errors; the decode case (ALiBi included) on the split-KV
decode kernel."""
from __future__ import annotations

import pytest
import torch
from device_env import TEST_DEVICE, require_device  # sets TRITON_INTERPRET=1 on the CPU

import gpuparity.flash_attn as flash_attn
from fa_reference import check, reference

require_device()
DEVICE = torch.device(TEST_DEVICE)
BATCH, HEADS, KV_HEADS, HEAD_DIM, SEQ_CACHE = 3, 4, 2, 16, 20
BACKENDS = dict(attention="composition", rotary="composition")


def rotate(x, cos, sin, positions, interleaved):
    """Rotary by hand: x (B, S, H, D) at positions (B, S); the first 2 * cos.shape[1] features turn."""
    half = cos.shape[1]
    c, s = cos[positions].unsqueeze(2), sin[positions].unsqueeze(2)
    turned, rest = x[..., :2 * half], x[..., 2 * half:]
    if interleaved:
        a, b = turned[..., 0::2], turned[..., 1::2]
        turned = torch.stack([a * c - b * s, a * s + b * c], dim=-1).flatten(-2)
    else:
        a, b = turned[..., :half], turned[..., half:]
        turned = torch.cat([a * c - b * s, a * s + b * c], dim=-1)
    return torch.cat([turned, rest], dim=-1)


def case_inputs(q_len=3, new_len=2, cache_rows=BATCH, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(BATCH, q_len, HEADS, HEAD_DIM, generator=gen)
    k_new, v_new = (torch.randn(BATCH, new_len, KV_HEADS, HEAD_DIM, generator=gen) for _ in range(2))
    k_cache, v_cache = (torch.randn(cache_rows, SEQ_CACHE, KV_HEADS, HEAD_DIM, generator=gen) for _ in range(2))
    angle = torch.rand(SEQ_CACHE + q_len, 4, generator=gen) * 6.28
    return dict(q=q, k=k_new, v=v_new, k_cache=k_cache, v_cache=v_cache, cos=angle.cos(), sin=angle.sin())


CASES = {
    "append_rotary_interleaved_causal": dict(causal=True, rotary=True, interleaved=True),
    "append_rotary_neox_not_causal": dict(causal=False, rotary=True, interleaved=False),
    "append_rotary_window": dict(window=(4, 0), rotary=True, interleaved=True),
    "leftpad_alibi_window": dict(leftpad=True, alibi=True, window=(6, 1)),
    "batch_idx_causal_alibi_per_head": dict(batch_idx=True, causal=True, alibi="head"),
    "no_new_kv_causal_q_longer_than_some_caches": dict(new=False, causal=True, q_len=5),
    "no_new_kv_right_window_not_causal": dict(new=False, window=(-1, 2), q_len=5, alibi=True),
    "decode_one_query_causal_alibi_per_batch": dict(causal=True, q_len=1, new_len=1, alibi="batch"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_kvcache_matches_the_reference(name):
    check_kvcache_case(name, BACKENDS)


def _no_bias(*args, **kwargs):
    raise AssertionError("a (B, H, Sq, Sk) ALiBi bias was built: the call did not run ALiBi inside the Triton kernels")


@pytest.mark.parametrize("name", sorted(name for name, case in CASES.items() if case.get("alibi")))
def test_kvcache_alibi_runs_inside_the_triton_kernels(name, monkeypatch):
    """With backend "triton" the slopes and each item's length go to the kernels (the bias composer
    raises here); one query (decode) needs no mask at all."""
    from gpuparity.flash_attn import _compose as C
    monkeypatch.setattr(C, "alibi_bias", _no_bias)
    if name.startswith("decode"):
        monkeypatch.setattr(C, "item_allowed", _no_bias)
    check_kvcache_case(name, dict(BACKENDS, attention="triton"))


def check_kvcache_case(name, backends):
    case = CASES[name]
    q_len, new_len = case.get("q_len", 3), (case.get("new_len", 2) if case.get("new", True) else 0)
    cache_rows = 2 * BATCH if case.get("batch_idx") else BATCH
    t = case_inputs(q_len, max(new_len, 1), cache_rows, seed=len(name))
    seqlens = torch.tensor([3, 0, 11], dtype=torch.int32)
    leftpad = torch.tensor([1, 0, 5], dtype=torch.int32) if case.get("leftpad") else None
    batch_idx = torch.tensor([4, 0, 2], dtype=torch.int32) if case.get("batch_idx") else None
    slopes = None
    if case.get("alibi"):
        slopes = torch.rand((HEADS,) if case["alibi"] == "head" else (BATCH, HEADS),
                            generator=torch.Generator().manual_seed(1)) * 0.4 + 0.05
    causal, window = case.get("causal", False), case.get("window", (-1, -1))
    k_new, v_new = (t["k"], t["v"]) if new_len else (None, None)
    rows = torch.arange(BATCH) if batch_idx is None else batch_idx.long()
    # what the cache rows must hold afterwards, and the queries the attention must see
    k_want, v_want = t["k_cache"][rows].clone(), t["v_cache"][rows].clone()
    q_seen = t["q"]
    positions = seqlens.long().view(-1, 1) + torch.arange(new_len).view(1, -1)
    if new_len:
        k_put = rotate(k_new, t["cos"], t["sin"], positions, case["interleaved"]) if case.get("rotary") else k_new
        for b in range(BATCH):
            k_want[b, positions[b]] = k_put[b]
            v_want[b, positions[b]] = v_new[b]
    if case.get("rotary"):
        local = causal or window != (-1, -1)
        q_positions = seqlens.long().view(-1, 1) + (torch.arange(q_len).view(1, -1) if local else 0)
        q_seen = rotate(t["q"], t["cos"], t["sin"], q_positions.expand(BATCH, q_len), case["interleaved"])
    caches = [t["k_cache"].clone().to(DEVICE), t["v_cache"].clone().to(DEVICE)]
    move = (lambda x: None if x is None else x.to(DEVICE))
    with flash_attn.backends(**backends):
        out, lse = flash_attn.flash_attn_with_kvcache(
            t["q"].to(DEVICE), *caches, k=move(k_new), v=move(v_new),
            rotary_cos=move(t["cos"]) if case.get("rotary") else None,
            rotary_sin=move(t["sin"]) if case.get("rotary") else None, cache_seqlens=seqlens.to(DEVICE),
            cache_batch_idx=move(batch_idx), cache_leftpad=move(leftpad), causal=causal, window_size=window,
            rotary_interleaved=case.get("interleaved", True), alibi_slopes=move(slopes), return_softmax_lse=True)
    torch.testing.assert_close(caches[0][rows.to(DEVICE)].cpu(), k_want, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(caches[1][rows.to(DEVICE)].cpu(), v_want)
    kwargs = dict(causal=causal, window=window, alibi=slopes, q_lens=torch.full((BATCH,), q_len),
                  k_lens=seqlens + new_len, key_start=leftpad)
    ref, ref_lse, empty = reference(q_seen.double(), k_want.double(), v_want.double(), **kwargs)
    base = reference(q_seen, k_want, v_want, dtype=torch.float32, **kwargs)[0]
    check([out], [ref], [base], torch.float32, names=("out",),
          must_be_zero=empty.view(BATCH, q_len, 1, 1).expand(out.shape))
    finite = torch.isfinite(ref_lse)
    torch.testing.assert_close(lse.cpu().double()[finite], ref_lse[finite], rtol=1e-5, atol=1e-5)
    assert torch.isposinf(lse.cpu()[~finite]).all()
    if name.startswith("no_new_kv"):
        assert empty.any()   # item 1 has an empty cache: its rows see nothing


def paged_copy(k_cache, v_cache, page, seed=0, spare=3):
    """A contiguous (B, S, Hkv, D) cache moved onto shuffled pages of a pool with spare pages."""
    k_cache, v_cache = k_cache.cpu(), v_cache.cpu()
    batch, width = k_cache.shape[:2]
    blocks = -(-width // page)
    pool = batch * blocks + spare
    order = torch.randperm(pool, generator=torch.Generator().manual_seed(seed))[:batch * blocks].view(batch, blocks)
    k_pool = torch.randn(pool, page, *k_cache.shape[2:])
    v_pool = torch.randn(pool, page, *k_cache.shape[2:])
    for b in range(batch):
        for j in range(blocks):
            piece = slice(j * page, min(width, (j + 1) * page))
            count = piece.stop - piece.start
            k_pool[order[b, j], :count], v_pool[order[b, j], :count] = k_cache[b, piece], v_cache[b, piece]
    return k_pool.to(DEVICE), v_pool.to(DEVICE), order.to(DEVICE, torch.int32)


@pytest.mark.parametrize("page", [4, 7])
def test_paged_kvcache_equals_the_contiguous_cache(page):
    """Append (crossing a page boundary) with rotary, GQA and causal on a shuffled paged pool: the
    same output and lse as the contiguous cache, and the pages hold what the contiguous rows hold."""
    t = {name: x.to(DEVICE) for name, x in case_inputs(q_len=3, new_len=3, seed=page).items()}
    width = -(-SEQ_CACHE // page) * page
    pad = torch.zeros(BATCH, width - SEQ_CACHE, KV_HEADS, HEAD_DIM, device=DEVICE)
    k_cache, v_cache = torch.cat([t["k_cache"], pad], dim=1), torch.cat([t["v_cache"], pad], dim=1)
    k_pool, v_pool, table = paged_copy(k_cache, v_cache, page)
    seqlens = torch.tensor([page - 1, 0, SEQ_CACHE - 3], dtype=torch.int32, device=DEVICE)
    common = dict(k=t["k"], v=t["v"], rotary_cos=t["cos"], rotary_sin=t["sin"], cache_seqlens=seqlens, causal=True,
                  alibi_slopes=torch.full((HEADS,), 0.25, device=DEVICE), return_softmax_lse=True)
    with flash_attn.backends(**BACKENDS):
        want, want_lse = flash_attn.flash_attn_with_kvcache(t["q"], k_cache, v_cache, **common)
        got, got_lse = flash_attn.flash_attn_with_kvcache(t["q"], k_pool, v_pool, block_table=table, **common)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(got_lse, want_lse)
    reread = k_pool[table.long()].reshape(BATCH, width, KV_HEADS, HEAD_DIM)
    torch.testing.assert_close(reread, k_cache)
    assert not torch.equal(k_cache[:, :SEQ_CACHE], t["k_cache"])   # the append happened


def test_paged_capacity_and_pool_errors():
    """As FlashAttention's block-table bounds test: a sequence past max_num_blocks_per_seq *
    page_block_size raises naming block_table (a RuntimeError, as FlashAttention's), exactly at
    capacity does not; a table entry past the pool raises."""
    page = 4
    k_pool, v_pool = torch.randn(4, page, 1, 8), torch.randn(4, page, 1, 8)
    table = torch.zeros(1, 1, dtype=torch.int32)
    q = torch.randn(1, 1, 1, 8)
    with flash_attn.backends(**BACKENDS):
        with pytest.raises(RuntimeError, match="block_table"):
            flash_attn.flash_attn_with_kvcache(q, k_pool, v_pool, k=torch.randn(1, 1, 1, 8), v=torch.randn(1, 1, 1, 8),
                                               cache_seqlens=torch.tensor([page], dtype=torch.int32), block_table=table)
        with pytest.raises(RuntimeError, match="block_table"):
            flash_attn.flash_attn_with_kvcache(q, k_pool, v_pool, cache_seqlens=torch.tensor([page + 1], dtype=torch.int32),
                                               block_table=table)
        out = flash_attn.flash_attn_with_kvcache(q, k_pool, v_pool, cache_seqlens=torch.tensor([page], dtype=torch.int32),
                                                 block_table=table)
        assert out.shape == (1, 1, 1, 8) and torch.isfinite(out).all()
        with pytest.raises(ValueError, match=r"block_table: entries in use must be page indices in \[0, 4\)"):
            flash_attn.flash_attn_with_kvcache(q, k_pool, v_pool, cache_seqlens=2,
                                               block_table=torch.tensor([[4]], dtype=torch.int32))


def test_kvcache_argument_errors():
    t = case_inputs()
    q, k_cache, v_cache = t["q"], t["k_cache"], t["v_cache"]
    with pytest.raises(ValueError, match="q: requires grad.*inference only"):
        flash_attn.flash_attn_with_kvcache(q.clone().requires_grad_(), k_cache, v_cache, cache_seqlens=2)
    with pytest.raises(ValueError, match="alibi_slopes: expected shape"):
        flash_attn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=2, alibi_slopes=torch.ones(BATCH, 2))
    with pytest.raises(ValueError, match="rotary_cos: rotary embedding applies to new keys"):
        flash_attn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=2, rotary_cos=t["cos"],
                                           rotary_sin=t["sin"])
    with pytest.raises(ValueError, match="cache_seqlens: expected 0 <= cache_seqlens"):
        flash_attn.flash_attn_with_kvcache(q, k_cache, v_cache, k=t["k"], v=t["v"], cache_seqlens=SEQ_CACHE - 1)
    with pytest.raises(ValueError, match="cache_batch_idx: expected rows of k_cache"):
        flash_attn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=2,
                                           cache_batch_idx=torch.tensor([0, 1, BATCH], dtype=torch.int32))
    with pytest.raises(ValueError, match="k_cache: expected"):
        flash_attn.flash_attn_with_kvcache(q, k_cache[..., :8], v_cache[..., :8], cache_seqlens=2)


@pytest.mark.parametrize("decode_backend", ["composition", "triton"])
def test_decode_case_runs_the_decode_op_and_equals_the_general_path(decode_backend, monkeypatch):
    """Causal, no ALiBi/leftpad/lse, Sq <= 16: the call goes to gpuparity.attention_decode (the
    split-KV kernel for "triton") and equals the masked dense path, cache append and rotary included;
    a paged copy of the cache gives the same output and pages."""
    from gpuparity.flash_attn import flash_attn_interface
    calls = []
    real = flash_attn_interface.attention_decode
    monkeypatch.setattr(flash_attn_interface, "attention_decode", lambda *a, **k: calls.append(1) or real(*a, **k))
    t = {name: x.to(DEVICE) for name, x in case_inputs(q_len=2, new_len=2, seed=21).items()}
    seqlens = torch.tensor([5, 0, 9], dtype=torch.int32, device=DEVICE)
    results = []
    for lse in (False, True):
        caches = [t["k_cache"].clone(), t["v_cache"].clone()]
        with flash_attn.backends(attention_decode=decode_backend, **BACKENDS):
            out = flash_attn.flash_attn_with_kvcache(t["q"], *caches, k=t["k"], v=t["v"], rotary_cos=t["cos"],
                                                     rotary_sin=t["sin"], cache_seqlens=seqlens, causal=True,
                                                     return_softmax_lse=lse)
        results.append((out[0] if lse else out, caches))
    k_pool, v_pool, table = paged_copy(t["k_cache"], t["v_cache"], page=4, seed=2)
    with flash_attn.backends(attention_decode=decode_backend, **BACKENDS):
        paged_out = flash_attn.flash_attn_with_kvcache(t["q"], k_pool, v_pool, k=t["k"], v=t["v"], rotary_cos=t["cos"],
                                                       rotary_sin=t["sin"], cache_seqlens=seqlens, causal=True,
                                                       block_table=table)
    assert len(calls) == 2
    torch.testing.assert_close(results[0][0], results[1][0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(paged_out, results[0][0])
    torch.testing.assert_close(results[0][1][0], results[1][1][0])
    torch.testing.assert_close(k_pool[table.long()].reshape(results[0][1][0].shape), results[0][1][0])


def test_gpuparity_attention_decode_return_lse():
    """gpuparity.attention_decode(return_lse=True): (out, lse (B, H, Sq)), bottom-right on each
    item's length, -inf for a query that sees no key."""
    import gpuparity
    t = case_inputs(q_len=3, seed=30)
    q, k_cache, v_cache = (t[n].to(DEVICE) for n in ("q", "k_cache", "v_cache"))
    seqlens = torch.tensor([5, 1, SEQ_CACHE], dtype=torch.int32, device=DEVICE)
    args = (q.transpose(1, 2), k_cache.transpose(1, 2), v_cache.transpose(1, 2), seqlens)
    out, lse = gpuparity.attention_decode(*args, backend="composition", softcap=3.0, return_lse=True)
    torch.testing.assert_close(out, gpuparity.attention_decode(*args, backend="composition", softcap=3.0))
    _, want, empty = reference(t["q"].double(), t["k_cache"].double(), t["v_cache"].double(), causal=True,
                               softcap=3.0, k_lens=seqlens.cpu(), q_lens=torch.full((BATCH,), 3))
    assert empty.any() and torch.isneginf(lse.cpu()[empty.view(BATCH, 1, 3).expand(BATCH, HEADS, 3)]).all()
    finite = torch.isfinite(want)
    torch.testing.assert_close(lse.cpu().double()[finite], want[finite], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("page", [16, 5])
def test_paged_decode_reads_the_pages_in_place(page, monkeypatch):
    """The decode case on a paged pool (append crossing a page, rotary, GQA, causal) goes to the
    split-KV kernel with the block table: no page is gathered into a copy (pages of 16 hold a
    whole interpreter tile, pages of 5 split every tile), and the output and pages equal the
    contiguous cache's."""
    from gpuparity.backends import triton_decode
    from gpuparity.flash_attn import _compose
    t = {name: x.to(DEVICE) for name, x in case_inputs(q_len=1, new_len=3, seed=40 + page).items()}
    seqlens = torch.tensor([page - 2, 0, SEQ_CACHE - 3], dtype=torch.int32, device=DEVICE)
    caches = [t["k_cache"].clone(), t["v_cache"].clone()]
    k_pool, v_pool, table = paged_copy(t["k_cache"], t["v_cache"], page, seed=page)
    common = dict(k=t["k"], v=t["v"], rotary_cos=t["cos"], rotary_sin=t["sin"], cache_seqlens=seqlens, causal=True)
    with flash_attn.backends(attention_decode="triton", **BACKENDS):
        want = flash_attn.flash_attn_with_kvcache(t["q"], *caches, **common)
        for module in (_compose, triton_decode):
            monkeypatch.setattr(module, "gather_pages", lambda *a: pytest.fail("pages gathered into a copy"))
        got = flash_attn.flash_attn_with_kvcache(t["q"], k_pool, v_pool, block_table=table, **common)
    monkeypatch.undo()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    width = table.shape[1] * page
    reread = k_pool[table.long()].reshape(BATCH, width, KV_HEADS, HEAD_DIM)[:, :SEQ_CACHE]
    torch.testing.assert_close(reread, caches[0])


def _decode_alibi_inputs(alibi, seed):
    t = {name: x.to(DEVICE) for name, x in case_inputs(q_len=2, new_len=2, seed=seed).items()}
    slopes = torch.rand((HEADS,) if alibi == "head" else (BATCH, HEADS), generator=torch.Generator().manual_seed(3))
    common = dict(k=t["k"], v=t["v"], rotary_cos=t["cos"], rotary_sin=t["sin"], causal=True,
                  cache_seqlens=torch.tensor([5, 0, 9], dtype=torch.int32, device=DEVICE),
                  alibi_slopes=(slopes * 0.4 + 0.05).to(DEVICE))
    return t, common


@pytest.mark.parametrize("page, alibi", [(None, "head"), (None, "batch"), (5, "batch"), (16, "head")])
def test_decode_case_with_alibi_runs_the_split_kv_kernel_and_equals_the_masked_path(page, alibi, monkeypatch):
    """The decode case (causal, Sq <= 16, no leftpad/lse) with alibi_slopes on the Triton decode
    backend: the slopes go into the split-KV kernel (no bias or mask is composed, no page gathered),
    and the output equals the masked path's (decode backend "composition": the bias composed over
    the cache) with the append and rotary; a paged pool (shuffled pages of 5: every tile split, 16:
    a whole interpreter tile) holds the contiguous cache's rows afterwards."""
    from gpuparity.backends import triton_decode
    from gpuparity.flash_attn import _compose
    t, common = _decode_alibi_inputs(alibi, seed=50 + (page or 0))
    caches = [t["k_cache"].clone(), t["v_cache"].clone()]
    with flash_attn.backends(attention_decode="composition", **BACKENDS):
        want = flash_attn.flash_attn_with_kvcache(t["q"], *caches, **common)
    if page is None:
        k_cache, v_cache, table = t["k_cache"].clone(), t["v_cache"].clone(), None
    else:
        k_cache, v_cache, table = paged_copy(t["k_cache"], t["v_cache"], page, seed=page)
    calls = []
    real = triton_decode.triton_decode
    monkeypatch.setattr(triton_decode, "triton_decode",
                        lambda *a, **kw: calls.append(kw["alibi_slopes"]) or real(*a, **kw))
    for name in ("alibi_bias", "item_allowed", "gather_pages"):
        monkeypatch.setattr(_compose, name, _no_bias)
    monkeypatch.setattr(triton_decode, "gather_pages", _no_bias)
    with flash_attn.backends(attention_decode="triton", **BACKENDS):
        got = flash_attn.flash_attn_with_kvcache(t["q"], k_cache, v_cache, block_table=table, **common)
    monkeypatch.undo()
    assert len(calls) == 1 and torch.equal(calls[0].reshape(-1, HEADS).expand(BATCH, HEADS),
                                           common["alibi_slopes"].reshape(-1, HEADS).expand(BATCH, HEADS))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    rows = k_cache if table is None else k_cache[table.long()].reshape(BATCH, -1, KV_HEADS, HEAD_DIM)
    torch.testing.assert_close(rows[:, :SEQ_CACHE], caches[0])


@pytest.mark.parametrize("alibi_verdict", ["triton", "none"])
def test_auto_decode_alibi_in_the_kernel_only_where_it_passed_the_alibi_cases(alibi_verdict, monkeypatch):
    """Under auto, the decode case with ALiBi runs in the split-KV kernel only where the kernel also
    passed the attention_decode contract's ALiBi cases here (asked as kind "<kind>+alibi"); else
    the masked path composes the bias. Both equal the masked path on the composition."""
    from gpuparity.backends import triton_decode
    from gpuparity.dispatch import get as get_backend
    from gpuparity.flash_attn import _compose
    from gpuparity.flash_attn import flash_attn_interface as F
    from gpuparity.registry import BackendUnavailable
    t, common = _decode_alibi_inputs("batch", seed=60)
    with flash_attn.backends(attention_decode="composition", **BACKENDS):
        want = flash_attn.flash_attn_with_kvcache(t["q"], t["k_cache"].clone(), t["v_cache"].clone(), **common)
    asked = []
    real_resolve = F._dropout.resolve

    def resolve(problem, backend):
        if problem.op != "attention_decode":
            return real_resolve(problem, backend)
        asked.append(problem.kind)
        if problem.kind.endswith("+alibi") and alibi_verdict == "none":
            raise BackendUnavailable("no backend can serve this attention_decode call")
        return get_backend("attention_decode", "triton")
    monkeypatch.setattr(F._dropout, "resolve", resolve)
    used = {"kernel": 0, "bias": 0}
    real_kernel, real_bias = triton_decode.triton_decode, _compose.alibi_bias
    monkeypatch.setattr(triton_decode, "triton_decode",
                        lambda *a, **kw: used.update(kernel=used["kernel"] + 1) or real_kernel(*a, **kw))
    monkeypatch.setattr(_compose, "alibi_bias",
                        lambda *a, **kw: used.update(bias=used["bias"] + 1) or real_bias(*a, **kw))
    with flash_attn.backends(attention_decode="auto", **BACKENDS):
        got = flash_attn.flash_attn_with_kvcache(t["q"], t["k_cache"].clone(), t["v_cache"].clone(), **common)
    assert asked == ["default", "default+alibi"]
    assert used == ({"kernel": 1, "bias": 0} if alibi_verdict == "triton" else {"kernel": 0, "bias": 1})
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
