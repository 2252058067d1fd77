"""The op manifest's promise, pinned: the battery's ops in the same order, the same backends per op in
the same order (the order "auto" ranks ties in and `dispatch.backends(op)` lists), each op's contract
and its public exports, as they stood before the manifest (at 1a586e9, from contracts.CONTRACTS,
backends.MODULES and gpuparity._LAZY written by hand)."""
from __future__ import annotations

import gpuparity
from gpuparity import backends, contracts, dispatch

OPS = ("attention", "softmax", "layer_norm", "rms_norm", "rotary", "matmul", "conv2d", "cross_entropy",
       "attention_varlen", "attention_decode", "linear_cross_entropy", "swiglu", "residual_norm")

BACKENDS = {
    "attention": ["sdpa_math", "sdpa_efficient", "sdpa_flash", "sdpa_cudnn", "composition", "triton", "flex"],
    "softmax": ["torch", "composition"],
    "layer_norm": ["torch", "composition", "triton", "compile"],
    "rms_norm": ["torch", "composition", "triton", "compile"],
    "rotary": ["composition", "triton", "compile"],
    "matmul": ["torch", "composition"],
    "conv2d": ["torch", "composition"],
    "cross_entropy": ["torch", "composition"],
    "attention_varlen": ["triton", "composition"],
    "attention_decode": ["triton", "sdpa", "composition"],
    "linear_cross_entropy": ["composition", "torch", "triton"],
    "swiglu": ["torch", "composition", "triton"],
    "residual_norm": ["composition", "triton"],
}

CONTRACTS = {
    "attention": ("gpuparity.contracts.attention", "SPEC"),
    "softmax": ("gpuparity.contracts.basic", "SOFTMAX_SPEC"),
    "layer_norm": ("gpuparity.contracts.norms", "LN_SPEC"),
    "rms_norm": ("gpuparity.contracts.norms", "RMS_SPEC"),
    "rotary": ("gpuparity.contracts.rotary", "SPEC"),
    "matmul": ("gpuparity.contracts.basic", "MATMUL_SPEC"),
    "conv2d": ("gpuparity.contracts.basic", "CONV2D_SPEC"),
    "cross_entropy": ("gpuparity.contracts.basic", "CROSS_ENTROPY_SPEC"),
    "attention_varlen": ("gpuparity.contracts.varlen", "SPEC"),
    "attention_decode": ("gpuparity.contracts.decode", "SPEC"),
    "linear_cross_entropy": ("gpuparity.contracts.linear_cross_entropy", "SPEC"),
    "swiglu": ("gpuparity.contracts.swiglu", "SPEC"),
    "residual_norm": ("gpuparity.contracts.residual_norm", "SPEC"),
}

# every module load_all imports (the backend families and the contracts whose compositions it registers)
REGISTERING = {
    "gpuparity.backends.ce_composition", "gpuparity.backends.compiled", "gpuparity.backends.flex",
    "gpuparity.backends.sdpa", "gpuparity.backends.torch_ops", "gpuparity.backends.triton_attention",
    "gpuparity.backends.triton_cross_entropy", "gpuparity.backends.triton_decode", "gpuparity.backends.triton_norms",
    "gpuparity.backends.triton_residual_norm", "gpuparity.backends.triton_rotary", "gpuparity.backends.triton_swiglu",
    "gpuparity.contracts.attention", "gpuparity.contracts.basic", "gpuparity.contracts.decode",
    "gpuparity.contracts.norms", "gpuparity.contracts.residual_norm", "gpuparity.contracts.rotary",
    "gpuparity.contracts.swiglu", "gpuparity.contracts.varlen"}

# the ops' public functions among gpuparity's lazy exports
EXPORTS = {
    "attention": "gpuparity.ops.attention", "attention_dropout_mask": "gpuparity.ops.attention",
    "attention_decode": "gpuparity.ops.decode", "kv_cache_append": "gpuparity.ops.decode",
    "attention_varlen": "gpuparity.ops.varlen",
    "rms_norm": "gpuparity.ops.norms", "layer_norm": "gpuparity.ops.norms",
    "apply_rotary": "gpuparity.ops.rotary",
    "linear_cross_entropy": "gpuparity.ops.linear_cross_entropy",
    "swiglu": "gpuparity.ops.swiglu",
    "residual_norm": "gpuparity.ops.residual_norm",
}
OTHER_EXPORTS = {"check": "gpuparity.api", "get_device": "gpuparity.device", "patch": "gpuparity.patching",
                 "prepare": "gpuparity.ops.select", "safe_compile": "gpuparity.compile", "monitor": "gpuparity.shadow",
                 "explain": "gpuparity.explain_run"}


def test_the_battery_lists_the_same_ops_in_the_same_order():
    assert contracts.OPS == OPS
    assert contracts.CONTRACTS == CONTRACTS and list(contracts.CONTRACTS) == list(CONTRACTS)


def test_each_op_lists_the_same_backends_in_the_same_order():
    assert {op: [b.name for b in dispatch.backends(op)] for op in OPS} == BACKENDS


def test_load_all_imports_the_same_modules():
    assert len(backends.MODULES) == len(set(backends.MODULES)) and set(backends.MODULES) == REGISTERING


def test_gpuparity_exports_the_same_names_from_the_same_modules():
    assert gpuparity._LAZY == {**EXPORTS, **OTHER_EXPORTS}
    assert set(gpuparity.__all__) == {"__version__", *EXPORTS, *OTHER_EXPORTS, "nn", "trace", "profile"}
