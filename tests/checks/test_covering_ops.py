"""The covering arrays of attention_varlen, attention_decode and residual_norm (COVERING in their
contracts): every allowed pair of values of every two dimensions is in a row, every row is a
valid case, and correct implementations written on torch's own kernels (F.scaled_dot_product_attention
per packed sequence, gpuparity's decode `sdpa` backend, F.rms_norm / F.layer_norm after the
residual add) pass the rows that together hold every value of every dimension, in fp32 and bf16
on the CPU: no false alarm."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from gpuparity.checks import covering, families
from gpuparity.checks.battery import plan, run_battery
from gpuparity.checks.results import Status
from gpuparity.contracts import get_spec
from gpuparity.dispatch import BackendUnavailable
from gpuparity.numerics import default_rms_eps

OPS = ("attention_varlen", "attention_decode", "residual_norm")
HERE = __file__


def _rows(op):
    declared = families.covering_declaration(get_spec(op))
    return declared, covering.build(declared.dimensions, 2, declared.seed, declared.allowed, groups=declared.groups)


@pytest.mark.parametrize("op", OPS)
def test_every_pair_of_the_dimensions_is_in_a_row(op):
    declared, rows = _rows(op)
    assert covering.missing(rows, declared.dimensions, 2, declared.allowed, groups=declared.groups) == []
    assert all(declared.allowed(row) for row in rows)
    spec = get_spec(op)
    members = families.cover_family(spec, "cover").members
    assert len(members) == len(rows) < 80   # a few dozen rows, not the product of the values
    for label, params in members:
        assert spec.normalize(spec.make_case(f"cover.{label}", **params).params) is not None


def _every_value(op):
    """Row labels that together hold every value of every dimension (greedy, the cheaper row of equal gain)."""
    declared, rows = _rows(op)
    spec = get_spec(op)
    work = [spec.work(spec.make_case("row", **declared.params(row)).params) or 0 for row in rows]
    wanted = {(name, repr(value)) for name, values in declared.dimensions for value in values
              if any(repr(row[name]) == repr(value) for row in rows)}
    chosen = []
    while wanted:
        best = max(range(len(rows)), key=lambda i: (len({(n, repr(v)) for n, v in rows[i].items()} & wanted), -work[i]))
        chosen.append(str(best))
        wanted -= {(n, repr(v)) for n, v in rows[best].items()}
    return chosen


# --------------------------------------------------------------------------- correct implementations on torch's kernels
def varlen_sdpa(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, causal=False, window=None,
                softcap=None, scale=None):
    """Each packed sequence through F.scaled_dot_product_attention with its bottom-right band."""
    if softcap is not None:
        raise BackendUnavailable("varlen_sdpa: SDPA has no logit softcap")
    starts_q, starts_k = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    pieces = []
    for b in range(len(starts_q) - 1):
        (qs, qe), (ks, ke) = starts_q[b:b + 2], starts_k[b:b + 2]
        m, n = qe - qs, ke - ks
        if m == 0:
            continue
        if n == 0:
            pieces.append(torch.zeros_like(q[qs:qe]))
            continue
        qi, ki, vi = (t.transpose(0, 1).unsqueeze(0) for t in (q[qs:qe], k[ks:ke], v[ks:ke]))
        offset = torch.arange(n).view(1, n) - torch.arange(m).view(m, 1) - (n - m)
        keep = torch.ones(m, n, dtype=torch.bool)
        if causal:
            keep &= offset <= 0
        if window is not None and window[0] >= 0:
            keep &= offset >= -window[0]
        if window is not None and window[1] >= 0:
            keep &= offset <= window[1]
        empty = ~keep.any(-1, keepdim=True)
        out = F.scaled_dot_product_attention(qi, ki, vi, attn_mask=keep | empty, scale=scale,
                                             enable_gqa=qi.shape[1] != ki.shape[1])
        pieces.append(torch.where(empty, torch.zeros_like(out), out)[0].transpose(0, 1))
    return torch.cat(pieces) if pieces else torch.zeros_like(q)


def residual_norm_torch(x, residual, weight, bias=None, eps=None, norm="rms", residual_in_fp32=False, rowscale=None,
                        zero_centered_weight=False, out_dtype=None):
    """The residual add, then F.rms_norm / F.layer_norm in fp32."""
    dtype = torch.float32 if residual_in_fp32 else (x.dtype if residual is None else residual.dtype)
    if rowscale is not None:
        x = x.float() * rowscale.float()[..., None]
    s = x.to(dtype) if residual is None else x.to(dtype) + residual.to(dtype)
    w = (weight.float() + 1.0) if zero_centered_weight else weight.float()
    shape = (s.shape[-1],)
    if norm == "rms":
        out = F.rms_norm(s.float(), shape, w, default_rms_eps(x.dtype) if eps is None else eps)
    else:
        out = F.layer_norm(s.float(), shape, w, None if bias is None else bias.float(), 1e-5 if eps is None else eps)
        bias = None
    if bias is not None:
        out = out + bias.float()
    return out.to(out_dtype or x.dtype), s


CORRECT = {"attention_varlen": dict(impl=f"{HERE}:varlen_sdpa"),
           "attention_decode": dict(backends=["sdpa"]),
           "residual_norm": dict(impl=f"{HERE}:residual_norm_torch")}


@pytest.mark.parametrize("op", OPS)
def test_no_false_alarm_of_the_rows_on_torch_kernels(op):
    names = {f"cover.{label}" for label in _every_value(op)}
    run = run_battery([op], "default", "cpu", isolate=False, case_filter=lambda _op, case: case.name in names,
                      **CORRECT[op])
    ran = [r for r in run.results if r.status != Status.SKIP]
    assert len(ran) >= len(names), [(r.case, r.status.value, r.reason[:100]) for r in run.results]
    bad = [(r.case, r.dtype, r.status.value, r.reason[:200]) for r in run.results if r.status.bad]
    assert not bad
    skipped = [r.reason for r in run.results if r.status == Status.SKIP]
    assert all("softcap" in reason for reason in skipped), skipped   # SDPA has no softcap: those rows only


def test_the_arrays_hold_what_the_battery_lacked():
    """Pairs no listed case or hand-written member of these ops had: a paged cache with Sq > 1 and
    a length one past a page edge; packed sequences with a key length one less than a 128 tile
    under causal; a float32 residual stream with residual_in_fp32 off."""
    def rows(op):
        return [params for _, params in families.cover_family(get_spec(op), "cover").members]
    assert any(p["page"] and p["Sq"] > 1 and any(n % p["page"] == 1 for n in p["lengths"])
               for p in rows("attention_decode"))
    assert any(p.get("causal") and any(n % 128 == 127 for n in p["k_lens"]) for p in rows("attention_varlen"))
    assert any(p["residual_fp32"] and not p["residual_in_fp32"] for p in rows("residual_norm"))
    assert math.prod(len(v) for _, v in families.covering_declaration(get_spec("attention_decode")).dimensions) > 10 ** 6


def varlen_window_open_side_as_zero(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, causal=False,
                                    window=None, softcap=None, scale=None):
    """Planted: a window's open side (-1, unbounded) read as 0, no key past the diagonal on that
    side; right under causal with (left, -1), wrong for a window open on either side without it."""
    if window is not None:
        window = [max(int(side), 0) for side in window]
    return varlen_sdpa(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=causal, window=window,
                       softcap=softcap, scale=scale)


def test_a_window_open_on_one_side_is_a_value_of_the_varlen_array():
    """-1 on either side of a window, without causal, is in varlen's array: the listed cases had
    it only as (6, -1) under causal, where reading it as 0 changes nothing, so every other case
    with a window passes the planted bug and only those rows fail."""
    planted = f"{HERE}:varlen_window_open_side_as_zero"
    tasks, _ = plan(["attention_varlen"], "default", "cpu", impl=planted)
    windowed = {t.case: t.params for t in tasks if t.params.get("window") and not t.case.startswith("relation.")}
    open_rows = {case for case, p in windowed.items() if -1 in p["window"] and not p.get("causal")}
    assert {windowed[case]["window"].index(-1) for case in open_rows} == {0, 1}   # the left side and the right
    assert open_rows <= {case for case in windowed if case.startswith("cover.")}
    run = run_battery(["attention_varlen"], "default", "cpu", impl=planted, dtypes=["float32"], isolate=False,
                      case_filter=lambda _op, case: case.name in windowed)
    failed = {r.case for r in run.results if r.status.bad}
    passed = {r.case for r in run.results if r.status == Status.PASS}
    # an open right side changes nothing where each sequence has one query (Sq = 1: no key past it)
    assert failed <= open_rows and {windowed[case]["window"].index(-1) for case in failed} == {0, 1}, sorted(failed)
    # the other cases with a window pass it (those with ALiBi or softcap SKIP: SDPA has neither)
    assert "causal_window_scale" in passed and len(passed - open_rows) >= 10, sorted(passed)
