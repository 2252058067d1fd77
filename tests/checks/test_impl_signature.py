"""An --impl whose parameters cannot take the battery's calls is bad input: exit 2 with the
signature it needs, before any check runs."""
from __future__ import annotations

import subprocess
import sys

import pytest

from gpuparity import api
from gpuparity.checks.signature import call_shapes, signature_mismatch


def test_attention_with_one_parameter_exits_2_with_the_needed_signature_and_runs_nothing(tmp_path):
    impl = tmp_path / "mine.py"
    impl.write_text("def attention(a):\n    return a\n")
    out = tmp_path / "check.json"
    proc = subprocess.run([sys.executable, "-m", "gpuparity", "check", "--op", "attention", "--impl",
                           f"{impl}:attention", "--device", "cpu", "--json", str(out)],
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "got:    attention(a)" in proc.stderr and "too many positional arguments" in proc.stderr
    assert "needed: fn(q, k, v, *, attn_mask=None, key_padding_mask=None, is_causal=False, scale=None)" in proc.stderr
    assert not out.exists() and "pass," not in proc.stdout  # no check ran, no tally


def test_the_wrong_signature_message_is_short_and_says_each_error_once():
    """The six attention call shapes differ only in optional keywords (window, softcap,
    alibi_slopes): the message gives the one TypeError once, in the parameter names --signature
    lists, on a few short lines, and names no argument --signature does not list."""
    def attention(a):
        return a

    message = signature_mismatch(attention, "attention", "--impl 'mine.py:attention'")
    lines = message.splitlines()
    assert message.count("too many positional arguments") == 1
    assert len(lines) <= 8 and max(map(len, lines)) <= 120, message
    assert "--impl 'mine.py:attention' cannot be called" in lines[0]
    assert "got:    attention(a)" in message and "fix:" in lines[-2]
    assert "fn(q, k, v, attn_mask=..., key_padding_mask=..., is_causal=..., scale=...)" in message
    assert not any(name in message for name in ("window", "softcap", "alibi_slopes"))


def test_linear_cross_entropy_impl_is_signature_checked():
    """Its spec calls .to on the implementation's output: recording the call shapes must not
    trip on that (it did, and the signature check was skipped for this op)."""
    assert call_shapes("linear_cross_entropy") == {(7, ())}

    def lce(hidden, weight, target):
        return hidden

    message = signature_mismatch(lce, "linear_cross_entropy")
    assert "fn(hidden, weight, target, bias, ignore_index, reduction, softcap)" in message
    assert signature_mismatch(lambda hidden, weight, target, bias=None, ignore_index=-100, reduction="mean",
                              softcap=None: hidden, "linear_cross_entropy") is None


def test_no_check_runs_for_a_wrong_signature(tmp_path):
    impl = tmp_path / "mine.py"
    impl.write_text("def rotary(x, cos, sin, *, interleaved=False, seqlen_offsets=0):\n    return x\n")
    seen = []
    with pytest.raises(ValueError, match="unexpected keyword argument 'cu_seqlens'"):
        api.check("rotary", f"{impl}:rotary", device="cpu", level="quick", progress=lambda *a: seen.append(a))
    assert seen == []


def test_star_args_and_kwargs_pass_and_run(tmp_path):
    impl = tmp_path / "mine.py"
    impl.write_text("import torch\n\ndef softmax(*args, **kwargs):\n    return torch.softmax(*args, **kwargs)\n")
    run = api.check("softmax", f"{impl}:softmax", device="cpu", level="quick", dtypes=["float32"],
                    cases=["rows_17"])
    assert run.ok and [r.status.value for r in run.results] == ["PASS"]


def test_signature_mismatch_binds_every_call_shape():
    def attention(q, k, v, *, attn_mask=None, key_padding_mask=None, is_causal=False, scale=None):
        pass

    def no_is_causal(q, k, v, attn_mask=None, key_padding_mask=None, scale=None):
        pass

    assert signature_mismatch(attention, "attention") is None
    assert signature_mismatch(lambda *a, **k: None, "attention") is None
    assert "unexpected keyword argument 'is_causal'" in signature_mismatch(no_is_causal, "attention")
    # rotary's varlen cases pass cu_seqlens and max_seqlen: two call shapes
    assert len(call_shapes("rotary")) == 2


def test_an_impl_without_window_or_softcap_skips_those_cases_with_the_reason():
    """The window/softcap cases pass those keywords; a user's kernel with the classic signature
    is not wrong for lacking them: its signature passes and those cases are SKIP, with why."""
    import torch

    from gpuparity.registry import BackendUnavailable
    from gpuparity.checks.signature import signature_mismatch
    from gpuparity.contracts import get_spec

    def classic(q, k, v, *, attn_mask=None, key_padding_mask=None, is_causal=False, scale=None):
        return q

    assert signature_mismatch(classic, "attention") is None
    spec = get_spec("attention")
    case = next(c for c in spec.cases() if c.params.get("window") is not None)
    inputs = spec.make_inputs(case.params, torch.Generator().manual_seed(0))
    with pytest.raises(BackendUnavailable, match="classic: takes no window"):
        spec.call(classic, inputs, case.params)
    plain = next(c for c in spec.cases() if c.params.get("window") is None and c.params.get("softcap") is None)
    spec.call(classic, spec.make_inputs(plain.params, torch.Generator().manual_seed(0)), plain.params)


def test_the_cases_an_impl_cannot_take_are_skipped_in_the_plan_before_any_input_is_built(tmp_path):
    """An --impl without window/softcap/alibi_slopes: its preflight names them, and plan() makes
    every case that needs one a SKIP with the reason the call would give, so no input or float64
    reference is built for it (they were: 160 of cover_features' 224 checks); the others still run."""
    from gpuparity.checks.plan import plan
    from gpuparity.contracts import get_spec

    impl = tmp_path / "mine.py"
    impl.write_text("from gpuparity.contracts.attention import composition\n\n"
                    "def classic(q, k, v, *, attn_mask=None, key_padding_mask=None, is_causal=False, scale=None):\n"
                    "    return composition(q, k, v, attn_mask=attn_mask, key_padding_mask=key_padding_mask,\n"
                    "                       is_causal=is_causal, scale=scale)\n")
    target = f"{impl}:classic"
    assert api.impl_preflight(target, "attention") == {"error": None,
                                                       "lacks": ["window", "softcap", "alibi_slopes"]}
    spec = get_spec("attention")
    lacks = ["window", "softcap", "alibi_slopes"]
    tasks, decided = plan(["attention"], "default", "cpu", impl=target, impl_lacks=lacks)
    lacking = [r for r in decided if "takes no" in r.reason]
    needing = {item.case: spec.keywords_needed(item.params) for item in list(tasks) + lacking}
    assert lacking and all(needing[r.case] for r in lacking)
    assert not any(needing[t.case] for t in tasks)   # what runs needs none of them
    window = next(r for r in lacking if r.params.get("window") is not None and r.params.get("softcap") is None
                  and not r.params.get("alibi"))
    assert window.reason == "classic: takes no window argument, which this case needs"
    alibi = next(r for r in lacking if r.params.get("alibi") and r.params.get("window") is not None)
    assert alibi.reason == "classic: takes no window or softcap or alibi_slopes argument, which this case needs"
    # without the preflight's answer the plan is as before: the check finds out when it calls
    all_tasks, _ = plan(["attention"], "default", "cpu", impl=target)
    assert len(all_tasks) == len(tasks) + len(lacking)
    # end to end: api.check's preflight feeds the plan; the skipped cases are not among the checks run
    seen = []
    run = api.check("attention", target, device="cpu", dtypes=["float32"],
                    cases=["window_local", "softcap_x30_logits", "plain"], shrink=False,
                    progress=lambda done, total, result: seen.append(total))
    assert {(r.case, r.status.value) for r in run.results} == {
        ("window_local", "SKIP"), ("softcap_x30_logits", "SKIP"), ("plain", "PASS")}
    assert set(seen) == {1}
