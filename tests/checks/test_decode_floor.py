"""attention_decode's tolerance floor follows its reduction and logits (OpSpec.error_terms), as
attention's and attention_varlen's do: a correct bf16 decode over a long cache errs past the
flat floor (its output sums 131136 keys), and the logit peak is measured on the keys the
reference reads (pages gathered, the item's length, the decode mask, softcap and ALiBi)."""
from __future__ import annotations

import pytest
import torch

from gpuparity import tolerance
from gpuparity.backends.triton_decode import decode_allowed, gather_pages
from gpuparity.checks import execute, families
from gpuparity.checks.results import Status
from gpuparity.contracts import get_spec
from gpuparity.contracts.attention import alibi_slopes
from gpuparity.contracts.decode import decode_composition

TILE = 256


def decode_tiled(q, k_cache, v_cache, cache_seqlens, *, scale=None, softcap=None, block_table=None, wrong_scale=1.0):
    """A correct decode: the probabilities in fp32, each tile of 256 keys summed in fp32 and added
    into an output-dtype accumulator (the reduction tolerance.error_floor models)."""
    if block_table is not None:
        k_cache, v_cache = gather_pages(k_cache, block_table), gather_pages(v_cache, block_table)
    group = q.shape[1] // k_cache.shape[1]
    k, v = k_cache.repeat_interleave(group, 1).float(), v_cache.repeat_interleave(group, 1).float()
    scale = (q.shape[-1] ** -0.5 if scale is None else scale) * wrong_scale
    scores = (q.float() @ k.transpose(-2, -1)) * scale
    if softcap is not None:
        scores = softcap * torch.tanh(scores / softcap)
    allowed = decode_allowed(cache_seqlens, q.shape[2], k.shape[2])
    empty = ~allowed.any(-1, keepdim=True)
    probs = torch.softmax(scores.masked_fill(~allowed, float("-inf")).masked_fill(empty, 0.0), -1)
    probs = probs.masked_fill(empty, 0.0)
    acc = torch.zeros(q.shape, dtype=q.dtype)
    for start in range(0, k.shape[2], TILE):
        acc = (acc.float() + probs[..., start:start + TILE] @ v[..., start:start + TILE, :]).to(q.dtype)
    return acc


def decode_wrong_scale(q, k_cache, v_cache, cache_seqlens, *, scale=None, softcap=None, block_table=None):
    return decode_tiled(q, k_cache, v_cache, cache_seqlens, scale=scale, softcap=softcap, block_table=block_table,
                        wrong_scale=1.5)


def _run(fn, case, dtype=torch.bfloat16):
    spec = get_spec("attention_decode")
    params = families.lookup(spec, case).params
    seed = execute.task_seed(0, "attention_decode", case, execute.dtype_name(dtype))
    return execute.run_case("attention_decode", fn, params, dtype, torch.device("cpu"), seed, decode_composition)


def test_correct_long_bf16_decode_passes_where_the_flat_floor_flagged_it():
    # before: out 0.0316 > allowed 0.0109 (2 x the composition's 0.0055): the output sums 131136 keys
    status, comparisons, reason = _run(decode_tiled, "long.cache_131136")
    assert status == Status.PASS, reason
    (out,) = comparisons
    flat = tolerance.allowed_error(out.baseline_err, torch.bfloat16)
    assert out.err > flat and out.allowed == pytest.approx(tolerance.error_floor(torch.bfloat16, reduction=131136))
    # the raised floor still fails a wrong kernel on the same long cache
    status, _, reason = _run(decode_wrong_scale, "long.cache_131136")
    assert status == Status.FAIL, reason


def _independent_peak(spec, params, inputs):
    """The largest |row max| of the logits, item by item and query by query as decode_reference
    reads them (its own page and layout arithmetic)."""
    k = inputs["k_cache"]
    if params["layout"] == "bshd":
        k = k.transpose(1, 2)
    if params.get("page") is not None:   # pool (num_blocks, Hkv, page, D): item b's key j on page table[b, j // page]
        page, table = k.shape[2], inputs["block_table"].long()
        keys = torch.arange(table.shape[1] * page)
        k = k[table[:, keys // page], :, keys % page].transpose(1, 2)
    q, heads = inputs["q"], params["H"]
    group = heads // params["Hkv"]
    scale = params["D"] ** -0.5 if params["scale"] is None else params["scale"]
    slopes = alibi_slopes(params, "cpu").double().expand(params["B"], heads) if params.get("alibi") else None
    peak = 0.0
    for b, length in enumerate(inputs["cache_seqlens"].tolist()):
        for i in range(params["Sq"]):
            visible = length - params["Sq"] + 1 + i
            for h in range(heads if visible > 0 else 0):
                scores = k[b, h // group, :visible] @ q[b, h, i] * scale
                if params["softcap"] is not None:
                    scores = params["softcap"] * torch.tanh(scores / params["softcap"])
                if slopes is not None:
                    scores = scores - slopes[b, h] * (visible - 1 - torch.arange(visible, dtype=torch.float64)).abs()
                peak = max(peak, abs(float(scores.max())))
    return peak


@pytest.mark.parametrize("case", ["softcap_x30_logits", "paged_p16_fa_layout_d128", "paged_softcap_p16",
                                  "strided_cache_bshd", "sq4_fewer_keys_than_queries", "values.logits_x30",
                                  "alibi_softcap_mqa", "paged_alibi_p16_gqa_fa_layout"])
def test_decode_terms_are_the_reduction_and_logit_peak_the_reference_sees(case):
    spec = get_spec("attention_decode")
    found = families.lookup(spec, case)
    if found is None:
        pytest.skip(f"{case}: not a case of this contract")
    params = found.params
    inputs = execute.make_inputs(spec, params, torch.float32, torch.Generator().manual_seed(3))
    inputs = {name: value.double() if isinstance(value, torch.Tensor) and value.is_floating_point() else value
              for name, value in inputs.items()}
    terms = spec.error_terms(inputs, params)
    assert set(terms) == {"out"}
    assert terms["out"]["reduction"] == max(params["lengths"])
    assert terms["out"]["logit_peak"] == pytest.approx(_independent_peak(spec, params, inputs), rel=1e-12)
