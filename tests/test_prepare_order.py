"""gpuparity.patch queues the first-call checks a torch.compile'd forward waits for (the kinds the
plan swaps under compile) ahead of the eager-only ones (patching.compiled_first)."""
from __future__ import annotations

import torch

from gpuparity import patching
from gpuparity.registry import Problem

OPS = ["rms_norm", "rotary", "attention", "swiglu", "linear_cross_entropy", "rms_norm"]


def calls():
    return [Problem(op, torch.device("cpu"), torch.bfloat16, f"kind{i}", ()) for i, op in enumerate(OPS)]


def test_on_nvidia_in_auto_mode_what_the_trace_resolves_goes_first():
    ordered = patching.compiled_first(calls(), patching.Plan("nvidia", "auto"))
    assert [(p.op, p.kind) for p in ordered] == [
        ("rotary", "kind1"), ("attention", "kind2"), ("linear_cross_entropy", "kind4"),
        ("rms_norm", "kind0"), ("swiglu", "kind3"), ("rms_norm", "kind5")]


def test_eager_mode_and_forced_kinds_keep_the_forward_order():
    assert patching.compiled_first(calls(), patching.Plan("nvidia", "eager")) == calls()
    assert patching.compiled_first(calls(), patching.Plan("nvidia", "auto", tuple(patching.KINDS))) == calls()
