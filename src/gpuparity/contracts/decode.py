"""The attention_decode contract (new queries against a KV cache, inference only): its argument
checks and `Problem`, float64 reference, plain composition and the battery's cases: cache
lengths of 0, 1 and full, fewer keys than new queries, 1 to 16 new queries, GQA/MQA, softcap on
large logits, paged caches (a block table into shuffled pages of 1 to 256 tokens); the forward
against the float64 item-by-item reference."""
from __future__ import annotations

from typing import Any, Dict, List, Tuple

import torch

from ..registry import Backend, BackendUnavailable, Problem
from .masks import decode_allowed, expand_kv, gather_pages
from ..numerics import matmul_tf32
from .attention import alibi_bias, alibi_slopes, attention_floor_terms
from .base import (INDEX_DTYPES, TILE_OFFSETS, TILES, Case, Covering, OpSpec, capturing, check_softcap, family, randn, takes,
                   tf32_precision, tile_size, view_members)
import numbers
from ..validation import FLOAT_DTYPES, describe, expect_same_device, expect_same_dtype, expect_tensor
from .signature import Arg, Signature

# gpuparity.attention_decode's signature, its torch.library op's (forward only) and the backends'
# (contracts/signature.py); block_table came after the op's first schema
ATTENTION_DECODE = Signature("attention_decode", (
    Arg("q", "Tensor"),
    Arg("k_cache", "Tensor"),
    Arg("v_cache", "Tensor"),
    Arg("cache_seqlens", "Tensor"),
    Arg("scale", "float?", None, keyword=True),
    Arg("softcap", "float?", None, keyword=True),
    Arg("block_table", "Tensor?", None, keyword=True, appended=True),
    Arg("backend", "str", "auto", keyword=True, backend=False),
    Arg("return_lse", "bool", False, keyword=True, library=False, backend=False),
))


# --------------------------------------------------------------------------- the call: arguments checked, and the Problem the dispatcher gets
MAX_NEW_QUERIES = 16


def check_cache(k_cache, v_cache, cache_seqlens, block_table=None) -> Tuple[int, int, int, int]:
    """(B, Hkv, S_max, D) of a contiguous cache, or of a paged one (B = block_table's rows, S_max =
    its pages x page_size); checks the table's form (its entries: check_pages)."""
    layout = "(B, Hkv, S_max, D)" if block_table is None else "(num_blocks, Hkv, page_size, D) (a page pool)"
    expect_tensor("k_cache", k_cache, ndim=(4,), dtypes=FLOAT_DTYPES)
    expect_tensor("v_cache", v_cache, ndim=(4,), dtypes=FLOAT_DTYPES)
    expect_same_dtype("k_cache", k_cache, v_cache=v_cache)
    expect_same_device("k_cache", k_cache, v_cache=v_cache)
    if tuple(v_cache.shape) != tuple(k_cache.shape):
        raise ValueError(f"v_cache: expected the shape of k_cache {tuple(k_cache.shape)} {layout}, "
                         f"got {describe(v_cache)}")
    batch, kv_heads, s_max, head_dim = k_cache.shape
    if block_table is not None:
        expect_tensor("block_table", block_table, ndim=(2,), dtypes=INDEX_DTYPES)
        expect_same_device("k_cache", k_cache, block_table=block_table)
        if s_max < 1:
            raise ValueError(f"k_cache: expected a page pool {layout} with page_size >= 1, got {describe(k_cache)}")
        batch, s_max = block_table.shape[0], block_table.shape[1] * s_max
    expect_tensor("cache_seqlens", cache_seqlens, ndim=(1,), dtypes=INDEX_DTYPES)
    if cache_seqlens.shape[0] != batch:
        raise ValueError(f"cache_seqlens: expected one length per batch item, shape ({batch},), "
                         f"got {describe(cache_seqlens)}")
    expect_same_device("k_cache", k_cache, cache_seqlens=cache_seqlens)
    return batch, kv_heads, s_max, head_dim


def check_pages(block_table, pool, needed) -> None:
    """Every page an item uses (its first ceil(needed[b] / page_size) table entries) must be a
    page of the pool: raises ValueError naming block_table. Reads device values on the host."""
    num_blocks, page = pool.shape[0], pool.shape[2]
    used = torch.arange(block_table.shape[1], device=block_table.device).view(1, -1) * page < needed.view(-1, 1)
    entries = block_table[used]
    if entries.numel():
        low, high = (int(x) for x in torch.stack([entries.min(), entries.max()]).tolist())
        if low < 0 or high >= num_blocks:
            raise ValueError(f"block_table: entries in use must be page indices in [0, {num_blocks}) (the pool "
                             f"k_cache holds {num_blocks} pages), got min {low}, max {high}")


def decode_problem(q, k_cache, v_cache, cache_seqlens, *, scale=None, softcap=None, block_table=None) -> Problem:
    """Validate the inputs of `attention_decode` and describe the call for the dispatcher.
    Raises TypeError/ValueError naming the argument, what it got and what it needs."""
    expect_tensor("q", q, ndim=(4,), dtypes=FLOAT_DTYPES)
    batch, kv_heads, s_max, head_dim = check_cache(k_cache, v_cache, cache_seqlens, block_table)
    expect_same_dtype("q", q, k_cache=k_cache, v_cache=v_cache)
    expect_same_device("q", q, k_cache=k_cache, v_cache=v_cache)
    if q.shape[0] != batch or q.shape[3] != head_dim:
        against = "k_cache (B, Hkv, S_max, D)" if block_table is None else \
            "block_table (B, max_blocks) and the page pool k_cache (num_blocks, Hkv, page_size, D)"
        raise ValueError(f"q: expected shape (B={batch}, H, Sq, D={head_dim}) to match {against}, got {describe(q)}")
    heads, q_len = q.shape[1], q.shape[2]
    if kv_heads == 0 or heads % kv_heads:
        raise ValueError(f"k_cache: expected a number of heads Hkv that divides q's H={heads} (GQA/MQA), "
                         f"got Hkv={kv_heads} in {describe(k_cache)}")
    if not 1 <= q_len <= MAX_NEW_QUERIES:
        raise ValueError(f"q: expected 1 to {MAX_NEW_QUERIES} new queries (dim 2) for decode, got Sq={q_len} in "
                         f"{describe(q)}; use gpuparity.attention for prefill")
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, numbers.Real)):
        raise TypeError(f"scale: expected None or a real number, got {describe(scale)}")
    softcap = check_softcap(softcap)
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k_cache, v_cache)):
        name = next(n for n, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)) if t.requires_grad)
        raise ValueError(f"{name}: attention_decode is inference only (no backward), got a tensor that requires "
                         f"grad; call it under torch.no_grad() / torch.inference_mode() or pass {name}.detach()")
    # free to check on the CPU (no device sync); while traced, the library op checks it when it runs
    if cache_seqlens.device.type == "cpu" and cache_seqlens.numel() and not capturing(q.device):
        low, high = int(cache_seqlens.min()), int(cache_seqlens.max())
        if low < 0 or high > s_max:
            raise ValueError(f"cache_seqlens: expected lengths in [0, S_max={s_max}], got min {low}, max {high}"
                             + ("" if block_table is None else " (S_max: block_table's pages x page_size)"))
        if block_table is not None:   # on the CPU too (same device): the pages the lengths use
            check_pages(block_table, k_cache, cache_seqlens.long().clamp(0, s_max))
    features = (("head_dim", int(head_dim)), ("gqa", kv_heads != heads), ("q_len", int(q_len)))
    if softcap is not None:
        features += (("softcap", softcap),)
    if block_table is not None:
        features += (("page_size", int(k_cache.shape[2])),)
    return Problem(op="attention_decode", device=q.device, dtype=q.dtype,
                   kind=decode_kind(softcap is not None, block_table is not None), features=features)


# --------------------------------------------------------------------------- the float64 reference
def decode_reference(q, k_cache, v_cache, cache_seqlens, *, scale=None, softcap=None,
                     alibi_slopes=None) -> torch.Tensor:
    """The float64 referee (the battery's and the tests'), written item by item and query by
    query, independent of the backends' mask construction: out[b, h, i] = softmax over keys
    j < L_b - Sq + 1 + i, on the CPU. alibi_slopes (H,) or (B, H): FlashAttention's ALiBi,
    -slope * |L_b - Sq + i - j| added to the (softcapped) scores (query i at key position L_b - Sq + i)."""
    q, k_cache, v_cache = (t.detach().to("cpu", torch.float64) for t in (q, k_cache, v_cache))
    slopes = None if alibi_slopes is None else \
        alibi_slopes.detach().to("cpu", torch.float64).reshape(-1, q.shape[1]).expand(q.shape[0], q.shape[1])
    batch, heads, q_len, head_dim = q.shape
    group = heads // k_cache.shape[1]
    scale = head_dim ** -0.5 if scale is None else float(scale)
    out = torch.zeros_like(q)
    s_max = k_cache.shape[2]
    lengths = torch.as_tensor(cache_seqlens).tolist()
    for b in range(batch):
        length = min(max(int(lengths[b]), 0), s_max)
        for i in range(q_len):
            visible = length - q_len + 1 + i
            if visible <= 0:
                continue
            for h in range(heads):
                keys = k_cache[b, h // group, :visible]
                scores = keys @ q[b, h, i] * scale
                if softcap is not None:
                    scores = softcap * torch.tanh(scores / softcap)
                if slopes is not None:   # keys 0..visible-1, the query at position visible - 1
                    scores = scores - slopes[b, h] * (visible - 1 - torch.arange(visible, dtype=torch.float64)).abs()
                weights = torch.softmax(scores, dim=0)
                out[b, h, i] = weights @ v_cache[b, h // group, :visible]
    return out


def paged_decode_reference(q, k_cache, v_cache, cache_seqlens, *, scale=None, softcap=None,
                           block_table=None, alibi_slopes=None) -> torch.Tensor:
    """decode_reference, on a paged cache too: with block_table (B, max_blocks), k_cache and v_cache
    are page pools (num_blocks, Hkv, page_size, D) and item b's key j is page block_table[b, j //
    page_size], slot j % page_size, read here by index arithmetic (not the backends' gather).
    Entries are clamped into the pool, as the kernel clamps them (the battery's tables are valid)."""
    if block_table is not None:
        page = k_cache.shape[2]
        keys = torch.arange(block_table.shape[1] * page)
        pages = torch.as_tensor(block_table).detach().cpu().long().clamp(0, k_cache.shape[0] - 1)[:, keys // page]
        # pool[pages (B, S), :, slots (S,)] is (B, S, Hkv, D): the cache (B, Hkv, S, D) transposed
        k_cache, v_cache = (pool.detach().cpu()[pages, :, keys % page].transpose(1, 2) for pool in (k_cache, v_cache))
    return decode_reference(q, k_cache, v_cache, cache_seqlens, scale=scale, softcap=softcap,
                            alibi_slopes=alibi_slopes)


def decode_kind(softcap: bool, paged: bool) -> str:
    """A decode call's kind (what a verdict vouches for): default, softcap, paged, paged-softcap."""
    if paged:
        return "paged-softcap" if softcap else "paged"
    return "softcap" if softcap else "default"


# --------------------------------------------------------------------------- the trusted composition (the op's "composition" backend)
def decode_composition(q, k_cache, v_cache, cache_seqlens, *, scale=None, softcap=None, block_table=None,
                       alibi_slopes=None):
    """repeat_kv, scores over the whole cache, masked softmax in fp32: the trusted baseline (a
    paged cache gathered into a contiguous one first). alibi_slopes: the ALiBi bias in fp32, as
    decode_reference's (the battery's baseline for the kernel's ALiBi cases; ALiBi is opt-in, so
    auto never sends such a call here)."""
    if block_table is not None:
        k_cache, v_cache = gather_pages(k_cache, block_table), gather_pages(v_cache, block_table)
    k, v = expand_kv(q, k_cache, v_cache)
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    scores = torch.matmul(q, k.transpose(-2, -1)).float() * scale
    if softcap is not None:
        scores = softcap * torch.tanh(scores / softcap)
    if alibi_slopes is not None:   # query i of item b at key position L_b - Sq + i
        position = cache_seqlens.long().view(-1, 1, 1, 1) - q.shape[2] + \
            torch.arange(q.shape[2], device=q.device).view(1, 1, -1, 1)
        distance = (position - torch.arange(k.shape[2], device=q.device).view(1, 1, 1, -1)).abs().float()
        scores = scores - alibi_slopes.float().reshape(-1, q.shape[1], 1, 1) * distance
    allowed = decode_allowed(cache_seqlens, q.shape[2], k.shape[2])
    empty = ~allowed.any(-1, keepdim=True)
    scores = scores.masked_fill(~allowed, float("-inf")).masked_fill(empty, 0.0)
    probs = torch.softmax(scores, dim=-1).masked_fill(empty, 0.0)
    return torch.matmul(probs.to(q.dtype), v)


# registered by backends.load in the order its line of gpuparity.manifest gives (after triton and sdpa)
COMPOSITIONS = (Backend("composition", "attention_decode", decode_composition,
                        "repeat_kv, masked softmax in fp32 over the whole cache: the trusted fallback (paged caches "
                        "gathered first)", fallback=True),)


# --------------------------------------------------------------------------- the battery's cases
def _case(name, level="default", **params) -> Case:
    # page: None (a contiguous cache) or the page size of a paged pool, its pages shuffled among
    # spare ones (make_inputs); alibi: None, "head" (slopes (H,)) or "batch" ((B, H))
    defaults = dict(B=3, H=4, Hkv=2, Sq=1, S_max=40, D=32, lengths=None, softcap=None, scale=None,
                    logit_scale=1.0, seqlens_dtype="int32", layout="bhsd", forward_only=True, page=None,
                    alibi=None)
    defaults.update(params)
    if defaults["lengths"] is None:
        defaults["lengths"] = [0, 1, defaults["S_max"]][:defaults["B"]]
    return Case(name, defaults, level)


CASES: List[Case] = [
    # quick: the hostile core (small: the probe runs these under Triton's interpreter on a CPU)
    _case("lengths_0_1_full", "quick"),
    _case("sq4_fewer_keys_than_queries", "quick", Sq=4, lengths=[0, 3, 40]),
    _case("sq16_mqa", "quick", Sq=16, H=4, Hkv=1, lengths=[16, 40, 7]),
    _case("softcap_x30_logits", "quick", Sq=2, logit_scale=30.0, softcap=20.0, lengths=[40, 23, 2]),
    _case("scale_int64_lengths", "quick", Sq=3, scale=0.2, seqlens_dtype="int64", lengths=[5, 0, 33]),
    # default: realistic head dims and longer caches
    _case("d64_gqa_long", B=4, H=8, Hkv=2, D=64, S_max=300, Sq=1, lengths=[300, 1, 0, 157]),
    _case("d128_sq8", B=2, H=4, Hkv=4, D=128, S_max=200, Sq=8, lengths=[200, 64]),
    _case("d256_mqa", B=2, H=4, Hkv=1, D=256, S_max=70, Sq=1, lengths=[70, 35]),
    _case("d80_softcap_sq5", B=2, H=6, Hkv=3, D=80, S_max=90, Sq=5, softcap=30.0, lengths=[90, 4]),
    _case("strided_cache_bshd", B=2, H=4, Hkv=2, D=64, S_max=50, Sq=2, layout="bshd", lengths=[50, 17]),
    # paged (vLLM-style block table, shuffled pages): pages that hold whole key tiles and pages
    # that split a tile, lengths at page remainders, GQA/MQA, FlashAttention's pool layout
    _case("paged_p16_gqa", "quick", H=8, Hkv=2, S_max=48, page=16, lengths=[0, 17, 48]),
    _case("paged_p5_sq3_mqa", "quick", Sq=3, H=4, Hkv=1, S_max=40, page=5, lengths=[4, 5, 36]),
    _case("paged_softcap_p16", "quick", Sq=2, logit_scale=30.0, softcap=20.0, page=16, lengths=[40, 15, 16]),
    _case("paged_p256_gqa", B=2, H=8, Hkv=2, D=64, S_max=600, page=256, lengths=[600, 255]),
    _case("paged_p16_fa_layout_d128", B=2, H=8, Hkv=2, D=128, S_max=200, Sq=2, page=16, layout="bshd",
          lengths=[200, 33]),
    _case("paged_p64_sq8", B=3, H=4, Hkv=4, D=64, S_max=192, Sq=8, page=64, lengths=[63, 64, 129]),
    # ALiBi (gpuparity.flash_attn's alibi_slopes in its decode case), query i at key position
    # L_b - Sq + i: one case per kind a decode call with ALiBi can have (contiguous, softcap, paged,
    # paged + softcap), per-head and per-batch slopes, GQA/MQA, shuffled pages that hold whole tiles
    # and pages that split them, FlashAttention's pool layout. Default level, as the attention
    # contract's: only implementations taking alibi_slopes run them (the kernel opts in to "alibi")
    _case("alibi_gqa_per_batch_sq4", H=8, Hkv=2, Sq=4, lengths=[3, 40, 17], alibi="batch"),
    _case("alibi_softcap_mqa", Sq=2, H=4, Hkv=1, logit_scale=30.0, softcap=20.0, lengths=[40, 0, 9], alibi="head"),
    _case("paged_alibi_p16_gqa_fa_layout", H=8, Hkv=2, Sq=2, S_max=48, page=16, layout="bshd", lengths=[0, 17, 48],
          alibi="batch"),
    _case("paged_alibi_softcap_p5_sq3", Sq=3, H=4, Hkv=1, page=5, logit_scale=30.0, softcap=20.0,
          lengths=[4, 36, 40], alibi="head"),
    # full: a long cache
    _case("long_4096", "full", B=2, H=8, Hkv=1, D=128, S_max=4096, Sq=1, lengths=[4096, 2500]),
]


class DecodeSpec(OpSpec):
    op = "attention_decode"
    # speed priors per device family, fastest first (priors.py: what they mean, the records)
    priors = {"cuda": ["triton", "sdpa"], "cpu": ["sdpa", "composition"]}
    signature = ATTENTION_DECODE.call_line()
    grad_inputs = ()            # inference only: the op refuses tensors that require grad
    reference_fn = staticmethod(paged_decode_reference)
    # passed only to implementations that take it (an --impl without it gets the ALiBi cases as SKIP)
    optional_keywords = ("alibi_slopes",)

    def keywords_needed(self, p):
        return ("alibi_slopes",) if p.get("alibi") else ()

    def normalize(self, params):
        params = dict(params)
        if params.get("lengths") is not None:
            lengths = list(params["lengths"])[:params["B"]]
            lengths += [params["S_max"]] * (params["B"] - len(lengths))
            params["lengths"] = [min(length, params["S_max"]) for length in lengths]
        return params

    def work(self, p):
        return p["B"] * p["H"] * p["Sq"] * p["S_max"]

    def kind(self, p):
        kind = decode_kind(p["softcap"] is not None, p.get("page") is not None)
        return kind + "+alibi" if p.get("alibi") else kind   # verdicts of their own, as gpuparity.flash_attn asks

    def problem(self, p, dtype, device):
        # the features ops.decode.decode_problem gives the dispatcher
        features = (("head_dim", p["D"]), ("gqa", p["H"] != p["Hkv"]), ("q_len", p["Sq"]))
        if p["softcap"] is not None:
            features += (("softcap", float(p["softcap"])),)
        if p.get("page") is not None:
            features += (("page_size", p["page"]),)
        if p.get("alibi"):
            features += (("alibi", True),)   # an OPT_IN feature: backends that do not opt in SKIP
        return Problem(self.op, device, dtype, self.kind(p), features)

    def make_inputs(self, p, gen) -> Dict[str, Any]:
        B, H, Hkv, Sq, S, D = p["B"], p["H"], p["Hkv"], p["Sq"], p["S_max"], p["D"]
        inputs = {"q": randn(gen, B, H, Sq, D) * p["logit_scale"]}
        if p.get("page") is None:
            cache_shape = (B, S, Hkv, D) if p["layout"] == "bshd" else (B, Hkv, S, D)
        else:   # a pool of B * ceil(S_max / page) pages and 3 spare ones, each item's pages shuffled in it
            page = p["page"]
            blocks = -(-S // page)
            num_blocks = B * blocks + 3
            cache_shape = (num_blocks, page, Hkv, D) if p["layout"] == "bshd" else (num_blocks, Hkv, page, D)
            order = torch.randperm(num_blocks, generator=gen)[:B * blocks]
            inputs["block_table"] = order.view(B, blocks).to(torch.int32)
        inputs.update(k_cache=randn(gen, *cache_shape), v_cache=randn(gen, *cache_shape),
                      cache_seqlens=torch.tensor(p["lengths"], dtype=getattr(torch, p["seqlens_dtype"])))
        return inputs

    def call(self, fn, inputs, p):
        k_cache, v_cache = inputs["k_cache"], inputs["v_cache"]
        if p["layout"] == "bshd":   # a (B, S_max, Hkv, D) cache (or pool of pages) viewed as (B, Hkv, S_max, D)
            k_cache, v_cache = k_cache.transpose(1, 2), v_cache.transpose(1, 2)
        # only a paged call passes block_table (the signature every decode backend had before)
        extras = {} if p.get("page") is None else {"block_table": inputs["block_table"]}
        if p.get("alibi"):   # the referee and the baseline take the slopes too
            if not takes(fn, "alibi_slopes"):
                raise BackendUnavailable(f"{getattr(fn, '__name__', 'the implementation')}: takes no alibi_slopes "
                                         "argument, which this case needs")
            extras["alibi_slopes"] = alibi_slopes(p, inputs["q"].device)
        return fn(inputs["q"], k_cache, v_cache, inputs["cache_seqlens"], scale=p["scale"], softcap=p["softcap"],
                  **extras)

    def zero_masks(self, inputs, p):
        lengths = inputs["cache_seqlens"].long().clamp(0, p["S_max"]).view(-1, 1, 1, 1)
        visible = lengths - p["Sq"] + 1 + torch.arange(p["Sq"]).view(1, 1, -1, 1)
        empty = visible <= 0   # (B, 1, Sq, 1): queries that see no key return zeros
        return {"out": empty} if bool(empty.any()) else {}

    def error_terms(self, inputs, p):
        """out's floor terms: attention's (attention_floor_terms), item by item on the keys the
        reference reads (pages gathered, up to the item's length, under the decode mask and any
        ALiBi bias), the largest over the items: out sums over up to the longest cache's keys (a
        correct long bf16 reduction errs past the flat floor) and exponentiates the logits."""
        k_cache = inputs["k_cache"].transpose(1, 2) if p["layout"] == "bshd" else inputs["k_cache"]
        if p.get("page") is not None:
            k_cache = gather_pages(k_cache, inputs["block_table"])
        lengths = inputs["cache_seqlens"].long().clamp(0, k_cache.shape[2])
        slopes = alibi_slopes(p, "cpu").expand(p["B"], p["H"]) if p.get("alibi") else None
        terms = {"reduction": 0, "logit_peak": 0.0}
        for b, length in enumerate(lengths.tolist()):
            mask = decode_allowed(lengths[b:b + 1], p["Sq"], length)
            if slopes is not None:
                mask = alibi_bias(slopes[b], p["Sq"], length).masked_fill(~mask, float("-inf"))
            keys, _ = attention_floor_terms(inputs["q"][b:b + 1], k_cache[b:b + 1, :, :length], attn_mask=mask,
                                            scale=p["scale"], softcap=p["softcap"])
            terms = {name: max(value, keys[name]) for name, value in terms.items()}
        return {"out": terms}

    def precision(self, dtype, device):
        return tf32_precision(dtype, device, matmul_tf32())


FAMILIES = [
    family("tile", [("cache_192_lengths_64_65", dict(S_max=192, lengths=[192, 64, 65], D=64)),
                        ("cache_129", dict(S_max=129, lengths=[127, 128, 129])),
                        ("cache_320_sq4", dict(S_max=320, Sq=4, lengths=[320, 63, 1])),
                        ("cache_256_sq2", dict(S_max=256, Sq=2, lengths=[255, 256, 2]))]),
    family("batch", [("b5_distinct", dict(B=5, lengths=[40, 0, 17, 1, 33])),
                         ("b8_mqa", dict(B=8, H=4, Hkv=1, S_max=20, lengths=[20, 19, 1, 0, 7, 8, 15, 2]))]),
    family("head_dim", [("d128_sq3", dict(D=128, Sq=3, lengths=[40, 9, 2])),
                            ("d64_sq16", dict(D=64, Sq=16, lengths=[16, 40, 20])), ("d96", dict(D=96))]),
    family("gqa", [("h8_hkv2", dict(H=8, Hkv=2)), ("h6_hkv1", dict(H=6, Hkv=1)), ("h12_hkv4", dict(H=12, Hkv=4))]),
    family("values", [("logits_x30", dict(logit_scale=30.0, lengths=[40, 23, 2])),
                          ("denormal_cache", dict(values={"k_cache": "denormal_mix", "v_cache": "denormal_mix"}))]),
    family("layouts", view_members(("q", "k_cache", "v_cache"), ("offset", "sliced", "transposed"))),
    family("paged", [("page_1", dict(page=1, S_max=24, lengths=[24, 1, 13])),
                     ("page_7_sq4", dict(page=7, Sq=4, lengths=[40, 6, 8])),
                     ("page_64_tile_edges", dict(page=64, S_max=192, D=64, lengths=[63, 65, 192])),
                     ("page_16_gqa_h12", dict(page=16, H=12, Hkv=4, lengths=[16, 31, 33]))]),
    family("long", [("cache_16448", dict(B=2, H=2, Hkv=1, S_max=16448, lengths=[16448, 4097])),
                        ("cache_131136", dict(B=1, H=2, Hkv=1, S_max=131136, lengths=[131136]))], sized=True),
]


# The argument space as dimensions: the `cover` family is a covering array over them
# (checks/covering.py). The longest cache length sits on and off every tile of 16/32/64/128
# (`cache`: the cache exactly that long, with spare slots, or long, ~2048 + the offset);
# `others` the other items' lengths (the batch: 0 and 1, distinct, fewer than the new queries,
# equal, none, many); the page size (none: a contiguous cache) with the lengths at and off its
# edges as they fall. ALiBi, an optional keyword, is left to the listed cases.
DECODE_HEADS = {"h1": (1, 1), "h2": (2, 2), "h4_kv2": (4, 2), "h4_kv1": (4, 1), "h6_kv3": (6, 3), "h8_kv2": (8, 2)}
DECODE_MODIFIERS = {"plain": {}, "scale": dict(scale=0.2), "softcap": dict(softcap=20.0),
                    "softcap_x30": dict(softcap=20.0, logit_scale=30.0), "x30": dict(logit_scale=30.0)}
DECODE_LAYOUTS = {"bhsd": {}, "bshd": dict(layout="bshd"), "q_sliced": dict(views={"q": "sliced"}),
                  "q_transposed": dict(views={"q": "transposed"}), "k_cache_offset": dict(views={"k_cache": "offset"}),
                  "v_cache_sliced": dict(views={"v_cache": "sliced"})}
DECODE_DIMENSIONS = (
    ("len_tile", TILES), ("len_offset", TILE_OFFSETS), ("cache", ("exact", "spare", "long")),
    ("others", ("single", "zero_one", "distinct", "lt_sq", "equal", "many")), ("sq", (1, 2, 5, 16)),
    ("heads", tuple(DECODE_HEADS)), ("head_dim", (16, 32, 64, 80, 128)), ("page", (None, 1, 5, 16, 64)),
    ("modifier", tuple(DECODE_MODIFIERS)), ("seqlens_dtype", ("int32", "int64")), ("layout", tuple(DECODE_LAYOUTS)),
    ("values", ("normal", "denormal_cache")))


def _decode_allowed(row):
    if row.get("page") is not None and row.get("layout") in ("k_cache_offset", "v_cache_sliced"):
        return False   # a view of the page pool: the layouts family's, of a contiguous cache
    if row.get("cache") == "long":
        if row.get("others", "single") == "many" or row.get("heads", "h1") in ("h6_kv3", "h8_kv2"):
            return False
        if row.get("page") == 1 or row.get("modifier") in ("x30", "softcap_x30"):
            return False
    return True


def _decode_cover_params(row):
    long = row["cache"] == "long"
    length = tile_size(row["len_tile"], row["len_offset"], 2048 // row["len_tile"] if long else 1 + (row["len_tile"] < 64))
    lengths = {"single": [length], "zero_one": [length, 0, 1], "distinct": [length, length // 2 + 1, 3],
               "lt_sq": [length, 2], "equal": [length, length, length],
               "many": [length, 0, 17, 1, max(0, length - 1)]}[row["others"]]
    H, Hkv = DECODE_HEADS[row["heads"]]
    p = {**dict(B=len(lengths), H=H, Hkv=Hkv, Sq=row["sq"], D=row["head_dim"], lengths=lengths,
                S_max=length + (37 if row["cache"] == "spare" else 0), page=row["page"],
                seqlens_dtype=row["seqlens_dtype"]),
         **DECODE_MODIFIERS[row["modifier"]], **DECODE_LAYOUTS[row["layout"]]}
    if row["values"] == "denormal_cache":
        p["values"] = {"k_cache": "denormal_mix", "v_cache": "denormal_mix"}
    return p


# A second array for ALiBi (an optional keyword: its rows SKIP for an implementation without
# alibi_slopes, and only they do): per-head and per-item slopes paired with the lengths, Sq,
# heads, pages, softcap, the lengths' dtype and layouts.
DECODE_ALIBI_DIMENSIONS = (
    ("alibi", ("head", "batch")), ("len_tile", TILES), ("len_offset", TILE_OFFSETS),
    ("others", ("single", "zero_one", "distinct", "lt_sq")), ("sq", (1, 2, 5)), ("heads", ("h2", "h4_kv2", "h4_kv1")),
    ("page", (None, 5, 16)), ("modifier", ("plain", "scale", "softcap")), ("seqlens_dtype", ("int32", "int64")),
    ("layout", ("bhsd", "bshd", "q_sliced")))


def _decode_alibi_params(row):
    p = _decode_cover_params({**row, "cache": "exact", "head_dim": 64, "values": "normal"})
    p["alibi"] = row["alibi"]
    return p


COVERING = {"attention_decode": {
    "cover": Covering(DECODE_DIMENSIONS, _decode_cover_params, _decode_allowed, seed=45),
    "cover_alibi": Covering(DECODE_ALIBI_DIMENSIONS, _decode_alibi_params, seed=45)}}


SPEC = DecodeSpec()

# what `gpuparity.reference` (contracts/reference.py) exports from this contract
REFERENCES = ("decode_reference",)
