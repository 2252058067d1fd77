"""Paged KV caches in attention_decode: the split-KV Triton kernel reading the pages in place
through a vLLM-style block table (page sizes that hold whole key tiles and sizes that split a
tile over several pages, shuffled pages with spare ones in the pool, lengths at page
remainders, GQA, several splits) against the float64 reference, kv_cache_append through the
table, the argument errors and the dispatcher's kind."""
from __future__ import annotations

import pytest
import torch
from device_env import TEST_DEVICE, size  # sets TRITON_INTERPRET=1 on the CPU before triton imports

import gpuparity
from gpuparity.backends import triton_decode as td
from gpuparity.contracts.decode import decode_composition
from gpuparity.ops import decode
from gpuparity.ops.decode import attention_decode, decode_reference, kv_cache_append
from gpuparity.tolerance import judge

DEVICE = torch.device(TEST_DEVICE)
pytestmark = pytest.mark.usefixtures("triton_interpreter_is_live")


def paged(batch, kv_heads, blocks, page, head_dim, dtype=torch.float32, seed=0, spare=3):
    """Pools (num_blocks, Hkv, page, D) of random pages and a shuffled (B, blocks) int32 table."""
    gen = torch.Generator().manual_seed(seed)
    num_blocks = batch * blocks + spare
    k_pool = torch.randn(num_blocks, kv_heads, page, head_dim, generator=gen)
    v_pool = torch.randn(num_blocks, kv_heads, page, head_dim, generator=gen)
    table = torch.randperm(num_blocks, generator=gen)[:batch * blocks].view(batch, blocks).to(torch.int32)
    return k_pool.to(DEVICE, dtype), v_pool.to(DEVICE, dtype), table.to(DEVICE)


def check(out, q, k_pool, v_pool, table, seqlens, softcap=None):
    """out against the float64 reference on the gathered pages (the composition in out's dtype
    as the baseline); rows that see no key exactly zero."""
    k, v = td.gather_pages(k_pool, table), td.gather_pages(v_pool, table)
    ref = decode_reference(q, k, v, seqlens.cpu(), softcap=softcap)
    base = decode_composition(q, k, v, seqlens, softcap=softcap)
    visible = seqlens.cpu().long().view(-1, 1, 1, 1) - q.shape[2] + 1 + torch.arange(q.shape[2]).view(1, 1, -1, 1)
    empty = (visible <= 0).expand(q.shape[0], q.shape[1], q.shape[2], 1)
    result = judge("out", out.cpu(), ref, base.cpu(), q.dtype, valid=~empty, must_be_zero=empty)
    assert result.passed, result.reason


@pytest.fixture
def no_gather(monkeypatch):
    """The Triton backend must read the pages in place: a gather of the pool fails the test."""
    def refuse(*args, **kwargs):
        raise AssertionError("the pages were gathered into a copy")
    monkeypatch.setattr(td, "gather_pages", refuse)


# page 16 holds a whole interpreter tile (BLOCK_N 16; 64 on a GPU: there a tile spans 4 pages),
# page 5 splits every tile over pages, 256 holds every tile on both
@pytest.mark.parametrize("page, q_len, splits, dtype", [
    (16, 1, 1, torch.float32), (16, 3, 3, torch.float32), (16, 3, 3, torch.bfloat16), (5, 2, 2, torch.float32),
    (5, 2, 2, torch.bfloat16), (256, 1, None, torch.bfloat16)])
def test_paged_kernel_matches_the_reference(page, q_len, splits, dtype):
    blocks = 1 if page == 256 else 4
    k_pool, v_pool, table = paged(4, 2, blocks, page, 16, dtype, seed=page)
    capacity = blocks * page
    # empty, one short of a page, a page, a page and one, full
    lengths = [0, page - 1, min(page + 1, capacity), capacity] if page < 256 else [0, 15, 17, 256]
    seqlens = torch.tensor(lengths, dtype=torch.int32, device=DEVICE)
    q = torch.randn(4, 8, q_len, 16, generator=torch.Generator().manual_seed(1)).to(DEVICE, dtype)   # GQA 4:1
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(td, "gather_pages", lambda *a: pytest.fail("the Triton kernel gathered the pages"))
        out = td.triton_decode(q, k_pool, v_pool, seqlens, block_table=table, num_splits=splits)
    check(out, q, k_pool, v_pool, table, seqlens)
    # the same numbers as the contiguous kernel on the gathered cache
    k, v = td.gather_pages(k_pool, table), td.gather_pages(v_pool, table)
    flat = td.triton_decode(q, k, v, seqlens, num_splits=splits)
    torch.testing.assert_close(out, flat, rtol=0, atol=0)


def test_flash_attention_pool_layout_int64_table_and_sliced_table(no_gather):
    """FlashAttention's / vLLM's (num_blocks, page, Hkv, D) pool through its transpose(1, 2) view,
    an int64 table and a table of which only the first columns are passed (row stride != width)."""
    k_pool, v_pool, table = paged(3, 2, 6, 8, 16, seed=3)
    k_fa, v_fa = (p.transpose(1, 2).contiguous() for p in (k_pool, v_pool))   # (num_blocks, page, Hkv, D)
    seqlens = torch.tensor([33, 1, 40], dtype=torch.int64, device=DEVICE)
    q = torch.randn(3, 4, 2, 16, generator=torch.Generator().manual_seed(2)).to(DEVICE)
    out = attention_decode(q, k_fa.transpose(1, 2), v_fa.transpose(1, 2), seqlens, block_table=table[:, :5].long(),
                           backend="triton")
    # the pages by hand (gather_pages is refused here)
    k5, v5 = (p[table[:, :5].long()].transpose(1, 2).reshape(3, 2, 40, 16) for p in (k_pool, v_pool))
    ref = decode_reference(q, k5, v5, seqlens.cpu())
    base = decode_composition(q, k5, v5, seqlens)
    result = judge("out", out.cpu(), ref, base.cpu(), q.dtype)
    assert result.passed, result.reason


def test_table_entries_past_the_pool_are_clamped_in_the_kernel():
    """A bad table on the GPU is not read on the host (no sync): the kernel clamps entries into the
    pool, so it reads what the composition's gather reads, never outside the pool."""
    k_pool, v_pool, table = paged(2, 1, 3, 4, 16, seed=4, spare=0)
    table[0, 1] = 10 ** 6
    table[1, 0] = -7
    seqlens = torch.tensor([12, 9], dtype=torch.int32, device=DEVICE)
    q = torch.randn(2, 2, 1, 16, generator=torch.Generator().manual_seed(5)).to(DEVICE)
    out = td.triton_decode(q, k_pool, v_pool, seqlens, block_table=table)
    want = decode_composition(q, k_pool, v_pool, seqlens, block_table=table)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)


def test_append_through_the_table_then_decode_equals_the_contiguous_cache():
    batch, kv_heads, heads, head_dim, page, blocks = 3, 2, 4, 16, 4, 5
    k_pool, v_pool, table = paged(batch, kv_heads, blocks, page, head_dim, seed=6)
    k_flat, v_flat = td.gather_pages(k_pool, table), td.gather_pages(v_pool, table)
    seqlens = torch.tensor([3, 0, 14], dtype=torch.int32, device=DEVICE)   # 3 new tokens cross a page
    gen = torch.Generator().manual_seed(7)
    k_new, v_new = (torch.randn(batch, kv_heads, 3, head_dim, generator=gen).to(DEVICE) for _ in range(2))
    grown = kv_cache_append(k_pool, v_pool, k_new, v_new, seqlens, block_table=table)
    want_len = kv_cache_append(k_flat, v_flat, k_new, v_new, seqlens)
    assert grown.tolist() == want_len.tolist() == [6, 3, 17]
    torch.testing.assert_close(td.gather_pages(k_pool, table), k_flat, rtol=0, atol=0)
    torch.testing.assert_close(td.gather_pages(v_pool, table), v_flat, rtol=0, atol=0)
    q = torch.randn(batch, heads, 3, head_dim, generator=gen).to(DEVICE)
    out = attention_decode(q, k_pool, v_pool, grown, block_table=table, backend="triton")
    torch.testing.assert_close(out, attention_decode(q, k_flat, v_flat, grown, backend="triton"), rtol=0, atol=0)
    check(out, q, k_pool, v_pool, table, grown)


@pytest.mark.parametrize("backend", ["composition", "sdpa"])
def test_composed_backends_take_the_table_too(backend):
    k_pool, v_pool, table = paged(2, 2, 3, 8, 16, seed=8)
    seqlens = torch.tensor([24, 9], dtype=torch.int32, device=DEVICE)
    q = torch.randn(2, 4, 1, 16, generator=torch.Generator().manual_seed(9)).to(DEVICE)
    out, lse = attention_decode(q, k_pool, v_pool, seqlens, block_table=table, backend=backend, return_lse=True)
    check(out, q, k_pool, v_pool, table, seqlens)
    flat = td.gather_pages(k_pool, table), td.gather_pages(v_pool, table)
    _, want_lse = attention_decode(q, *flat, seqlens, backend=backend, return_lse=True)
    torch.testing.assert_close(lse, want_lse)


def test_paged_calls_are_their_own_kind_with_the_page_size():
    k_pool, v_pool, table = paged(2, 2, 3, 8, 16)
    seqlens = torch.tensor([24, 9], dtype=torch.int32, device=DEVICE)
    q = torch.randn(2, 4, 1, 16).to(DEVICE)
    problem = decode.decode_problem(q, k_pool, v_pool, seqlens, block_table=table)
    assert problem.kind == "paged" and problem.feature("page_size") == 8
    assert decode.decode_problem(q, k_pool, v_pool, seqlens, block_table=table, softcap=5.0).kind == "paged-softcap"
    assert decode.decode_problem(q, td.gather_pages(k_pool, table), td.gather_pages(v_pool, table), seqlens).kind == \
        "default"


def _bad(args, **changes):
    q, k_pool, v_pool, seqlens, table = args
    call = dict(q=q, k_cache=k_pool, v_cache=v_pool, cache_seqlens=seqlens, block_table=table)
    call.update(changes)
    return call


@pytest.mark.parametrize("changes, pattern", [
    (lambda a: dict(block_table=a[4].float()), r"block_table: expected dtype in \(int32, int64\)"),
    (lambda a: dict(block_table=a[4][0]), r"block_table: expected a 2-D tensor"),
    (lambda a: dict(block_table=a[4][:1]), r"cache_seqlens: expected one length per batch item, shape \(1,\)"),
    (lambda a: dict(block_table=a[4].clone().fill_(11)), r"block_table: entries in use must be page indices in "
                                                         r"\[0, 9\).*got min 11, max 11"),
    (lambda a: dict(cache_seqlens=a[3] + 20), r"cache_seqlens: expected lengths in \[0, S_max=24\].*block_table's pages"),
    (lambda a: dict(q=a[0][:, :3]), r"k_cache: expected a number of heads Hkv that divides q's H=3"),
    (lambda a: dict(q=a[0][:1]), r"q: expected shape \(B=2, H, Sq, D=16\) to match block_table"),
    (lambda a: dict(k_cache=a[1][:, :, :0], v_cache=a[2][:, :, :0]), r"page_size >= 1"),
])
def test_bad_paged_arguments_are_named(changes, pattern):
    k_pool, v_pool, table = (t.cpu() for t in paged(2, 2, 3, 8, 16))
    args = (torch.randn(2, 4, 1, 16), k_pool, v_pool, torch.tensor([24, 9], dtype=torch.int32), table)
    call = _bad(args, **changes(args))
    with pytest.raises((ValueError, TypeError), match=pattern):
        attention_decode(**call)


def test_append_past_the_pool_names_block_table():
    k_pool, v_pool, table = (t.cpu() for t in paged(1, 1, 2, 4, 8, spare=0))
    table[0, 1] = 2
    new = torch.ones(1, 1, 1, 8)
    kv_cache_append(k_pool, v_pool, new, new, torch.tensor([2]), block_table=table)   # page 0 only: fine
    with pytest.raises(ValueError, match=r"block_table: entries in use must be page indices in \[0, 2\)"):
        kv_cache_append(k_pool, v_pool, new, new, torch.tensor([4]), block_table=table)
    with pytest.raises(ValueError, match=r"cache_seqlens: appending Sn=1 tokens needs .*S_max=8"):
        kv_cache_append(k_pool, v_pool, new, new, torch.tensor([8]), block_table=table)


def test_block_table_passes_through_the_library_op_under_torch_compile():
    """Traced, attention_decode is one gpuparity::attention_decode op: block_table is one of its
    arguments (fullgraph: no break), and the op resolves its backend with the paged kind."""
    k_pool, v_pool, table = paged(2, 2, 3, 8, 16, seed=11)
    seqlens = torch.tensor([20, 3], dtype=torch.int32, device=DEVICE)
    q = torch.randn(2, 4, 1, 16).to(DEVICE)
    compiled = torch.compile(lambda *a: gpuparity.attention_decode(*a[:4], block_table=a[4], backend="composition"),
                             fullgraph=True)
    torch.testing.assert_close(compiled(q, k_pool, v_pool, seqlens, table),
                               attention_decode(q, k_pool, v_pool, seqlens, block_table=table, backend="composition"))
