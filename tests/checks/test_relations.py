"""Equivalence relations (checks/relations.py): each kills a planted bug that the float64 check
of the same case passes; correct implementations (the compositions, torch's SDPA and norms,
gpuparity's CPU backends) pass every relation that holds; the battery runs them and a
relation check reruns by its --case name."""
from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

from gpuparity import targets
from gpuparity.checks import execute, families, relations
from gpuparity.checks.plan import plan
from gpuparity.checks.results import Status
from gpuparity.contracts import get_spec
from gpuparity.dispatch import get as get_backend

PLANTED = os.path.join(os.path.dirname(__file__), "planted_relations.py")


def sdpa(q, k, v, *, attn_mask=None, key_padding_mask=None, is_causal=False, scale=None):
    if key_padding_mask is not None:
        keep = ~key_padding_mask[:, None, None, :]
        attn_mask = keep if attn_mask is None else (attn_mask & keep if attn_mask.dtype == torch.bool
                                                    else attn_mask.masked_fill(~keep, float("-inf")))
    if is_causal and attn_mask is not None:
        band = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril()
        attn_mask = attn_mask & band if attn_mask.dtype == torch.bool else attn_mask.masked_fill(~band, float("-inf"))
        is_causal = False
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal, scale=scale,
                                          enable_gqa=q.shape[1] != k.shape[1])


def torch_layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5):
    return F.layer_norm(x, normalized_shape, weight, bias, eps)


def torch_rms_norm(x, normalized_shape, weight=None, eps=None):
    return F.rms_norm(x, normalized_shape, weight, eps)


KILLS = [
    ("attention", "batch_items", "batch_of_one_ignores_padding", "key_padding_varlen"),
    ("attention", "key_permutation", "padding_taken_as_suffix", "key_padding_varlen"),
    ("attention", "scale_fold", "scale_clamped_to_one", "causal_scale_sq_lt_sk"),
    ("attention", "gqa_repeat", "heads_past_one_without_gqa", "gqa_key_padding"),
    ("attention", "causal_band", "square_2d_mask_transposed", "mqa_causal"),
    ("attention", "contiguous_copy", "contiguous_path_drops_odd_key", "strided_bshd_d40"),
    ("attention", "padding_appended", "uniform_padding_ignored", "plain"),
    ("rms_norm", "rows_split", "rms_small_batch_drops_weight", "strided_rows"),
    ("rms_norm", "features_permuted", "rms_weight_cached_by_shape", "rows_32"),
    ("rms_norm", "contiguous_copy", "rms_contiguous_path_shifts_weight", "strided_rows"),
    ("layer_norm", "rows_split", "ln_small_batch_drops_bias", "strided_rows"),
    ("layer_norm", "features_permuted", "ln_weight_cached_by_shape", "rows_32"),
    ("layer_norm", "contiguous_copy", "ln_contiguous_path_shifts_bias", "strided_rows"),
    ("rotary", "items_offsets_folded", "rotary_table_from_storage_start", "half_batch3_offsets"),
    ("rotary", "heads_permuted", "rotary_contiguous_odd_heads", "transposed_bhsd_view"),
    ("rotary", "contiguous_copy", "rotary_contiguous_first_offset", "layouts.x_sliced"),
    ("attention_varlen", "sequences_alone", "varlen_single_sequence_top_left", "causal_sq_ne_sk_bottom_right"),
    ("attention_varlen", "contiguous_copy", "varlen_contiguous_scale_over_d", "layouts.q_sliced"),
    ("attention_decode", "paged_gathered", "decode_contiguous_cache_drops_softcap", "paged_softcap_p16"),
    ("attention_decode", "batch_items", "decode_batch_of_one_full_cache", "lengths_0_1_full"),
    ("attention_decode", "contiguous_copy", "decode_contiguous_gqa_modulo", "strided_cache_bshd"),
    ("cross_entropy", "rows_split", "ce_small_batch_drops_smoothing", "label_smoothing"),
    ("cross_entropy", "rows_permuted", "ce_ignored_rows_taken_as_suffix", "targets.padded_suffix"),
    ("cross_entropy", "logit_shift", "ce_logits_clamped_at_60", "classes_10"),
    ("cross_entropy", "ignored_rows_appended", "ce_mean_over_every_row", "classes_10"),
    ("cross_entropy", "reduced_from_none", "ce_none_drops_smoothing", "label_smoothing"),
    ("cross_entropy", "contiguous_copy", "ce_contiguous_path_drops_last_class", "layouts.logits_sliced"),
]


def test_every_relation_has_a_planted_bug():
    named = {(op, rel) for op, rel, _, _ in KILLS}
    assert named == {(op, r.name) for op in relations.RELATIONS for r in relations.relations_of(op)} - {
        ("layer_norm", "none")}


@pytest.mark.parametrize("op, name, bug, case", KILLS)
def test_relation_kills_a_bug_the_float64_case_misses(op, name, bug, case):
    planted = targets.load(f"{PLANTED}:__name__")  # noqa: F841 - the module, loaded once
    module = targets.load(f"{PLANTED}:PREPARED")
    bug = targets.load(f"{PLANTED}:{bug}")
    spec = get_spec(op)
    params = families.lookup(spec, case).params
    rel = relations.relation(name, op)
    assert relations.applicable(rel, params)
    module.clear()
    status, _, reason = execute.run_case(op, bug, params, torch.float32, torch.device("cpu"), 7,
                                         get_backend(op, "composition").fn)
    assert status == Status.PASS, f"the float64 case already catches it: {reason}"
    module.clear()
    found = relations.check(op, bug, rel, params, torch.float32, seed=7)
    assert found.status == Status.FAIL, found
    assert name in found.reason


@pytest.mark.parametrize("op, fn, level, dtype", [
    # (attention at --level full: building its triples' array alone takes ~35 s here)
    ("attention", sdpa, "default", torch.float32), ("attention", sdpa, "default", torch.bfloat16),
    ("layer_norm", torch_layer_norm, "full", torch.float32), ("layer_norm", torch_layer_norm, "default", torch.bfloat16),
    ("rms_norm", torch_rms_norm, "full", torch.bfloat16), ("rms_norm", torch_rms_norm, "default", torch.float32),
])
def test_torch_passes_the_relations_the_battery_draws(op, fn, level, dtype):
    # torch's own SDPA, F.layer_norm and F.rms_norm on the relation checks the plan of
    # `check --impl` draws (covering-array rows; --level full's come from the triples' array),
    # the cheapest of each relation
    tasks, _ = plan([op], level, "cpu", impl="x:y", seed=3)
    params = {t.case: t.params for t in tasks if t.params.get("relation")}
    assert len(params) >= len(relations.relations_of(op))
    ran = 0
    spec = get_spec(op)
    cheapest = {}
    for case, p in sorted(params.items(), key=lambda item: spec.work(item[1]), reverse=True):
        cheapest[p["relation"]] = (case, p)
    for case, p in cheapest.values():
        result = relations.check(op, fn, relations.relation(p["relation"], op), p, dtype, seed=5)
        assert result.status in (Status.PASS, Status.SKIP), (case, result.reason)
        ran += result.status == Status.PASS
    assert ran, "no relation check ran"


@pytest.mark.parametrize("op, backend, case", [
    ("attention", "sdpa_math", "causal_key_padding"), ("attention", "sdpa_math", "gqa_key_padding"),
    ("attention_decode", "sdpa", "paged_p5_sq3_mqa"), ("attention_decode", "sdpa", "strided_cache_bshd"),
    ("rotary", "composition", "varlen_offsets_half"), ("attention_varlen", "composition", "gqa_window"),
])
def test_gpuparity_cpu_backends_pass_every_relation_that_holds(op, backend, case):
    params = families.lookup(get_spec(op), case).params
    for dtype in (torch.float32, torch.bfloat16):
        results = relations.check_case(op, get_backend(op, backend).fn, params, dtype, seed=11)
        assert results and all(r.status in (Status.PASS, Status.SKIP) for r in results), [r.reason for r in results]
        assert any(r.status == Status.PASS for r in results)


def test_the_battery_plans_relations_in_one_dtype_at_default_and_full_not_quick(monkeypatch):
    tasks, _ = plan(["attention"], "default", "cpu", impl="x:y", seed=0)
    related = [t for t in tasks if t.params.get("relation")]
    names = {t.params["relation"] for t in related}
    assert names == {r.name for r in relations.relations_of("attention")}
    assert len(related) == len({t.case for t in related}) <= 2 * len(names)   # one dtype each
    assert all(t.case.startswith("relation.") and ".cover" in t.case for t in related)
    assert not [t for t in plan(["attention"], "quick", "cpu", impl="x:y")[0] if t.params.get("relation")]
    monkeypatch.setenv(relations.COUNT_ENV, "0")
    assert not [t for t in plan(["attention"], "default", "cpu", impl="x:y")[0] if t.params.get("relation")]
    monkeypatch.setenv(relations.COUNT_ENV, "1")
    assert len([t for t in plan(["rms_norm"], "default", "cpu", impl="x:y")[0] if t.params.get("relation")]) == 3
    # the doctor: every backend but the baseline gets them
    tasks, _ = plan(["rms_norm"], "default", "cpu", seed=0)
    backends = {t.backend for t in tasks if t.params.get("relation")}
    assert "torch" in backends and "composition" not in backends


def test_a_relation_failure_reruns_by_its_case_name_shrinks_and_has_a_repro(tmp_path):
    from gpuparity.api import check
    impl = f"{PLANTED}:rms_contiguous_path_shifts_weight"
    tasks, _ = plan(["rms_norm"], "default", "cpu", impl=impl, seed=0)
    for task in tasks:   # every relation check the battery plans is named so that --case finds it
        if task.params.get("relation"):
            assert relations.lookup(get_spec("rms_norm"), task.case).params == task.params
    name = "relation.contiguous_copy.strided_rows"
    run = check("rms_norm", impl, cases=[name], dtypes=["float32"], device="cpu", repro_dir=str(tmp_path),
                shrink_seconds=20)
    failed = [r for r in run.results if r.status == Status.FAIL]
    assert failed and failed[0].case == name and "contiguous_copy" in failed[0].reason
    shrunk = run.shrunk[0]
    assert shrunk.repro and os.path.exists(shrunk.repro)
    import subprocess
    import sys
    done = subprocess.run([sys.executable, shrunk.repro], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert done.returncode == 1, done.stdout + done.stderr
    assert "FAILS: the two sides of contiguous_copy disagree" in done.stdout
    with pytest.raises(ValueError, match="does not have"):
        check("rms_norm", impl, cases=["relation.no_such.rows_32"], device="cpu")


def test_a_backend_that_cannot_take_the_second_call_skips_the_relation():
    # padding_appended passes a key padding mask, causal_band a bool mask, paged_gathered a
    # contiguous cache: the plan asks each backend's reasons() about that call too
    assert relations.second_params("attention", {"relation": "padding_appended", "mask": "none"})["mask"] == "key_padding"
    band = relations.second_params("attention", {"relation": "causal_band", "mask": "none", "causal": True})
    assert band["mask"] == "bool" and band["causal"] is False
    assert relations.second_params("attention_decode", {"relation": "paged_gathered", "page": 16})["page"] is None
    same = {"relation": "batch_items", "B": 2}
    assert relations.second_params("attention", same) == same


def test_an_exactly_zero_side_is_the_reference():
    # grad_q of a query that sees one key vanishes: one side exactly zero, the other rounding noise
    # must agree (as against a float64 zero in the battery), whichever side is the zero one; a
    # wrong nonzero gradient still disagrees
    from gpuparity.checks.relations import _disagreement
    zero, noise = torch.zeros(4, 8), torch.full((4, 8), 1e-7)
    assert _disagreement({"g": zero}, {"g": noise})["g"] < 1e-6
    assert _disagreement({"g": noise}, {"g": zero})["g"] < 1e-6
    assert _disagreement({"g": zero}, {"g": torch.full((4, 8), 0.1)})["g"] > 0.05
    assert _disagreement({"g": torch.ones(4, 8)}, {"g": torch.ones(4, 8) * 1.5})["g"] > 0.3


def test_two_noisy_sides_of_a_vanishing_gradient_agree_and_a_wrong_one_still_fails():
    """A query that sees one key (Sq = 1 with causal) has grad_q = grad_k = 0 exactly: torch's CPU
    SDPA gives rounding noise (~1e-7) on each side of gqa_repeat, whose relative difference is ~1
    (a false alarm at --level full, cover3.192, before). Where the float64 referee is exactly 0 the
    sides are judged by the root mean square of their difference, as the battery judges a side
    against that 0; a gradient that is wrong on one side only still fails."""
    from test_false_alarms import sdpa

    def wrong(q, k, v, **kwargs):   # grad_q off by 1e-3 x grad_out on the grouped call only
        out = sdpa(q, k, v, **kwargs)
        return out + (q - q.detach()) * 1e-3 if q.shape[1] != k.shape[1] else out

    params = families.lookup(get_spec("attention"), "cover3.192").params
    assert params["Sq"] == 1 and params["causal"] and params["H"] != params["Hkv"]
    rel = relations.relation("gqa_repeat")
    for seed in range(3):
        assert relations.check("attention", sdpa, rel, params, torch.float32, seed=seed).status == Status.PASS
        found = relations.check("attention", wrong, rel, params, torch.float32, seed=seed)
        assert found.status == Status.FAIL and "grad_q" in found.reason, found.reason
