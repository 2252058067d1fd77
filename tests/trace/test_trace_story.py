"""User story 1 in small: an attention backend that ignores the padding mask. trace compare and
trace replay must point at the attention module, and fp32 vs bf16 must raise no false alarm."""
from __future__ import annotations

import pytest
import torch

from gpuparity import trace
from gpuparity.trace import spec

SPEC = "gpuparity.workloads.aam:trace_factory"
ATTENTION = "seq_blocks.0.attn.core"


def _record(tmp_path, name, attn, dtype=None):
    options = {"attn": attn}
    built = spec.build(SPEC, device="cpu", dtype=dtype, options=options)
    return trace.record(built.model, built.inputs, str(tmp_path / name), spec=SPEC, factory_args=options)


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    root = tmp_path_factory.mktemp("aam-traces")
    return {"math": _record(root, "math", "sdpa_math"), "planted": _record(root, "planted", "planted_ignore_mask"),
            "bf16": _record(root, "bf16", "sdpa_math", torch.bfloat16)}


def test_compare_points_at_the_attention_module(traces):
    result = trace.compare(traces["math"], traces["planted"])
    first = result.first_forward
    assert first.key == ATTENTION and first.type == "Attention"
    assert all(r.passed for r in result.forward[:first.index])


def test_replay_points_at_the_attention_module(traces):
    result = trace.replay(traces["planted"], device="cpu", factory_args={"attn": "sdpa_math"})
    assert result.culprit_forward.key == ATTENTION
    assert result.culprit_forward.deviates == "recorded"
    first_failing = next(r for r in result.forward if r.failed)
    assert first_failing.key == ATTENTION
    # every attention (the pooling and the set-level ones too) is wrong on its own, and only those
    wrong_leaves = {r.key for r in result.forward if r.failed and r.leaf}
    assert wrong_leaves and all(key.endswith(".core") for key in wrong_leaves)


def test_aam_fp32_vs_bf16_has_no_false_alarm(traces):
    result = trace.compare(traces["math"], traces["bf16"])
    assert result.passed, (result.first_forward, result.first_backward)
