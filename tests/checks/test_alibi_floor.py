"""attention's and attention_varlen's tolerance floor measure the logit peak on the biased logits
of an ALiBi case (the ones the kernels exponentiate and the referee adds), as attention_decode's
does: a row whose allowed keys all lie far from its diagonal has a large negative row max that
the unbiased scores do not show."""
from __future__ import annotations

import torch

from gpuparity.checks import families
from gpuparity.contracts import get_spec
from gpuparity.contracts.attention import alibi_bias, alibi_slopes, attention_logit_peak, with_alibi
from gpuparity.contracts.varlen import bottom_right_allowed


def _inputs(op, case):
    spec = get_spec(op)
    params = families.lookup(spec, case).params
    assert params.get("alibi"), case
    return spec, params, spec.make_inputs(params, torch.Generator().manual_seed(0))


def test_the_dense_alibi_floor_takes_the_bias():
    spec, p, inputs = _inputs("attention", "alibi_sq_gt_sk_bool_mask")   # Sq 40 > Sk 13: rows far from keys
    q, k = inputs["q"], inputs["k"]
    plain = attention_logit_peak(q, k, attn_mask=inputs.get("attn_mask"), is_causal=p["causal"], scale=p["scale"])
    biased = attention_logit_peak(q, k, attn_mask=with_alibi(inputs.get("attn_mask"),
                                                             alibi_bias(alibi_slopes(p, q.device), p["Sq"], p["Sk"])),
                                  is_causal=p["causal"], scale=p["scale"])
    assert biased > 2 * plain                    # the bias dominates this case's row maxima
    terms = spec.error_terms(inputs, p)
    assert terms["out"]["logit_peak"] == biased and terms["grad_v"]["logit_peak"] == biased


def test_the_varlen_alibi_floor_takes_each_sequences_bias():
    spec, p, inputs = _inputs("attention_varlen", "alibi_causal_gqa_per_batch")
    q, k = inputs["q"], inputs["k"]
    slopes = alibi_slopes({"H": p["H"], "B": len(p["q_lens"]), "alibi": p["alibi"]}, "cpu").expand(len(p["q_lens"]), p["H"])
    bq, bk = inputs["cu_seqlens_q"].tolist(), inputs["cu_seqlens_k"].tolist()
    plain = biased = 0.0
    for b in range(len(bq) - 1):
        (qs, qe), (ks, ke) = bq[b:b + 2], bk[b:b + 2]
        if qe > qs and ke > ks:
            mask = bottom_right_allowed(qe - qs, ke - ks, p["causal"], None, q.device)
            q_i, k_i = (t.transpose(0, 1).unsqueeze(0) for t in (q[qs:qe], k[ks:ke]))
            plain = max(plain, attention_logit_peak(q_i, k_i, attn_mask=mask, scale=p["scale"]))
            biased = max(biased, attention_logit_peak(q_i, k_i, attn_mask=with_alibi(mask, alibi_bias(
                slopes[b], qe - qs, ke - ks)), scale=p["scale"]))
    assert biased != plain
    assert spec.error_terms(inputs, p)["out"]["logit_peak"] == biased
