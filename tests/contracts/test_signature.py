"""Each op's signature is declared once in its contract (contracts/signature.py): the
torch.library schemas are generated from the declarations and must stay what graphs exported
before were saved with; the declarations agree with the public functions."""
from __future__ import annotations

import inspect

import pytest
import torch

import gpuparity
from gpuparity.contracts.attention import ATTENTION, ATTENTION_BACKWARD
from gpuparity.contracts.decode import ATTENTION_DECODE
from gpuparity.contracts.linear_cross_entropy import LINEAR_CROSS_ENTROPY, LINEAR_CROSS_ENTROPY_BACKWARD
from gpuparity.contracts.norms import LAYER_NORM, NORM_BACKWARD, RMS_NORM
from gpuparity.contracts.residual_norm import RESIDUAL_NORM, RESIDUAL_NORM_BACKWARD
from gpuparity.contracts.rotary import APPLY_ROTARY, APPLY_ROTARY_PAIR
from gpuparity.contracts.signature import REQUIRED, Arg, Signature
from gpuparity.contracts.swiglu import SWIGLU, SWIGLU_BACKWARD
from gpuparity.contracts.varlen import ATTENTION_VARLEN, ATTENTION_VARLEN_BACKWARD
from gpuparity.ops import (decode, library, library_ce, library_varlen, residual_norm, rotary,  # noqa: F401
                           swiglu)   # importing them registers the ops

# the schemas as the ops had them before they were generated (a change breaks exported graphs)
PINNED = {
    "rms_norm": "(Tensor x, SymInt[] normalized_shape, Tensor? weight, float? eps, str backend) -> (Tensor, Tensor)",
    "layer_norm": "(Tensor x, SymInt[] normalized_shape, Tensor? weight, Tensor? bias, float eps, str backend) "
                  "-> (Tensor, Tensor)",
    "swiglu": "(Tensor gate, Tensor up, str backend) -> Tensor",
    "residual_norm": "(Tensor x, Tensor? residual, Tensor weight, Tensor? bias, float? eps, str norm, "
                     "bool residual_in_fp32, str backend, Tensor? rowscale=None, bool zero_centered_weight=False, "
                     "ScalarType? out_dtype=None) -> (Tensor, Tensor, Tensor)",
    "apply_rotary": "(Tensor x, Tensor cos, Tensor sin, bool interleaved, SymInt offset, Tensor? offsets, "
                    "Tensor? cu_seqlens, SymInt? max_seqlen, str backend) -> Tensor",
    "apply_rotary_pair": "(Tensor q, Tensor k, Tensor cos, Tensor sin, bool interleaved, bool conjugate, "
                         "str backend) -> (Tensor, Tensor)",
    "attention": "(Tensor q, Tensor k, Tensor v, Tensor? attn_mask, Tensor? key_padding_mask, bool is_causal, "
                 "float? scale, bool mask_grad, str backend, SymInt[]? window=None, float? softcap=None, "
                 "float dropout_p=0., Tensor? seed=None) -> (Tensor, Tensor)",
    "attention_varlen": "(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_k, SymInt max_seqlen_q, "
                        "SymInt max_seqlen_k, bool causal, SymInt[]? window, float? softcap, float? scale, str backend) "
                        "-> (Tensor, Tensor)",
    "attention_decode": "(Tensor q, Tensor k_cache, Tensor v_cache, Tensor cache_seqlens, float? scale, float? softcap, "
                        "str backend, Tensor? block_table=None) -> Tensor",
    "linear_cross_entropy": "(Tensor hidden, Tensor weight, Tensor target, Tensor? bias, SymInt ignore_index, "
                            "str reduction, float? softcap, str backend, bool[] wanted) "
                            "-> (Tensor, Tensor, Tensor, Tensor)",
    # the backward ops the autograd formulas call (no public function)
    "norm_backward": "(Tensor grad, Tensor x, SymInt[] normalized_shape, Tensor? weight, Tensor? bias, float? eps, "
                     "Tensor stats, bool is_rms, str backend, bool[] wanted) -> (Tensor, Tensor, Tensor)",
    "attention_backward": "(Tensor grad, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, Tensor? attn_mask, "
                          "Tensor? key_padding_mask, bool is_causal, float? scale, bool mask_grad, str backend, "
                          "SymInt[]? window=None, float? softcap=None, float dropout_p=0., Tensor? seed=None) "
                          "-> (Tensor, Tensor, Tensor, Tensor)",
    "swiglu_backward": "(Tensor grad, Tensor gate, Tensor up, str backend) -> (Tensor, Tensor)",
    "residual_norm_backward": "(Tensor? grad_out, Tensor? grad_new_residual, Tensor new_residual, Tensor weight, "
                              "Tensor? bias, Tensor stats, float? eps, str norm, ScalarType x_dtype, bool has_residual, "
                              "str backend, Tensor? rowscale=None, bool zero_centered_weight=False) "
                              "-> (Tensor, Tensor, Tensor, Tensor)",
    "linear_cross_entropy_backward": "(Tensor grad, Tensor hidden, Tensor weight, Tensor target, Tensor? bias, "
                                     "SymInt ignore_index, float? softcap, str backend, bool[] wanted) "
                                     "-> (Tensor, Tensor, Tensor)",
    "attention_varlen_backward": "(Tensor grad, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, "
                                 "Tensor cu_seqlens_q, Tensor cu_seqlens_k, SymInt max_seqlen_q, SymInt max_seqlen_k, "
                                 "bool causal, SymInt[]? window, float? softcap, float? scale, str backend) "
                                 "-> (Tensor, Tensor, Tensor)",
}
NO_TWIN = {"attention_varlen", "attention_decode", "linear_cross_entropy",   # opaque op only, as before
           "attention_varlen_backward", "linear_cross_entropy_backward"}
DECLARED = {s.library_name: s for s in (RMS_NORM, LAYER_NORM, SWIGLU, RESIDUAL_NORM, APPLY_ROTARY, APPLY_ROTARY_PAIR,
                                         ATTENTION, ATTENTION_VARLEN, ATTENTION_DECODE, LINEAR_CROSS_ENTROPY,
                                         NORM_BACKWARD, ATTENTION_BACKWARD, SWIGLU_BACKWARD, RESIDUAL_NORM_BACKWARD,
                                         LINEAR_CROSS_ENTROPY_BACKWARD, ATTENTION_VARLEN_BACKWARD)}
PUBLIC = {"rms_norm": gpuparity.rms_norm, "layer_norm": gpuparity.layer_norm, "swiglu": gpuparity.swiglu,
          "residual_norm": gpuparity.residual_norm, "apply_rotary": gpuparity.apply_rotary,
          "apply_rotary_pair": rotary.apply_rotary_pair, "attention": gpuparity.attention,
          "attention_varlen": gpuparity.attention_varlen, "attention_decode": gpuparity.attention_decode,
          "linear_cross_entropy": gpuparity.linear_cross_entropy}


@pytest.mark.parametrize("name", sorted(PINNED))
def test_registered_schema_is_the_declared_one_and_unchanged(name):
    for registered in (name, f"{name}_kernels"):
        packet = getattr(torch.ops.gpuparity, registered, None)
        if packet is None:          # no triton_op in this torch (or for this op): no twin
            assert registered.endswith("_kernels") and (name in NO_TWIN or not library.TRITON_OP)
            continue
        assert registered == name or name not in NO_TWIN
        schema = str(packet.default._schema)
        assert schema == f"gpuparity::{registered}{PINNED[name]}"
    # the declaration's own text parses to the same schema (0.0 prints as 0.)
    assert DECLARED[name].schema().replace("=0.0)", "=0.)").replace("=0.0,", "=0.,") == PINNED[name]


def test_every_declared_op_is_pinned_and_only_the_public_ones_have_public_arguments():
    """Each Signature a contract module declares has its schema pinned above; a backward op
    (public=False) has no public function, so no public parameters, positional ones, gradients
    or backend call convention."""
    import importlib

    from gpuparity.contracts import MODULES
    declared = {v.library_name for m in MODULES for v in vars(importlib.import_module(m)).values()
                if isinstance(v, Signature)}
    assert declared == set(DECLARED) == set(PINNED)
    for name, signature in DECLARED.items():
        assert signature.public == (name in PUBLIC), name
        if not signature.public:
            assert (signature.public_args(), signature.positional(), signature.tensors(),
                    signature.backend_args()) == ((), (), (), ()), name


@pytest.mark.parametrize("name", sorted(PUBLIC))
def test_public_function_takes_the_declared_arguments(name):
    """The public function's parameters (names, order, keyword-only, defaults) are the declaration's."""
    declared = [a for a in DECLARED[name].args if a.public]
    params = list(inspect.signature(PUBLIC[name]).parameters.values())
    assert [p.name for p in params] == [a.name for a in declared]
    for p, a in zip(params, declared):
        assert (p.kind == inspect.Parameter.KEYWORD_ONLY) == a.keyword, p.name
        assert (p.default is inspect.Parameter.empty) == a.required, p.name
        if not a.required:
            assert p.default == a.default, p.name


def test_declaration_orders_the_schema_and_refuses_repeated_names():
    sig = Signature("toy", (Arg("x", "Tensor", grad=True), Arg("late", "bool", False, appended=True),
                            Arg("eps", "float?", None), Arg("backend", "str", "auto", keyword=True, backend=False)))
    # required ones in order, then backend, then the appended ones with their defaults
    assert sig.schema() == "(Tensor x, float? eps, str backend, bool late=False) -> Tensor"
    # an argument after backend need not have a default (linear_cross_entropy's `wanted`)
    assert Signature("toy", (Arg("x", "Tensor"), Arg("wanted", "bool[]", public=False, appended=True),
                             Arg("backend", "str", "auto", keyword=True))).schema() == \
        "(Tensor x, str backend, bool[] wanted) -> Tensor"
    assert sig.call_line() == "fn(x, late=False, eps=None)"
    a = sig.library_args((torch.zeros(1), None, "auto"))
    assert (a.eps, a.backend, a.late) == (None, "auto", False)
    assert sig.bind((1,), {"eps": 2}) == {"x": 1, "late": False, "eps": 2}
    assert sig.backend_params()[0] == ("x", REQUIRED)
    with pytest.raises(ValueError, match="names repeat"):
        Signature("bad", (Arg("x", "Tensor"), Arg("x", "Tensor?")))


def test_the_batterys_signature_lines_come_from_the_declarations_unchanged():
    """`gpuparity check --signature` prints OpSpec.signature: for the declared ops it is the
    declaration's call line, the same text as before it was generated."""
    from gpuparity.contracts import get_spec
    assert {op: get_spec(op).signature for op in ("rms_norm", "swiglu", "attention", "rotary", "attention_varlen",
                                                  "attention_decode", "residual_norm")} == {
        "rms_norm": "fn(x, normalized_shape, weight=None, eps=None)",
        "swiglu": "fn(gate, up)",
        "attention": "fn(q, k, v, *, attn_mask=None, key_padding_mask=None, is_causal=False, scale=None)",
        "rotary": "fn(x, cos, sin, *, interleaved=False, seqlen_offsets=0, cu_seqlens=None, max_seqlen=None)",
        "attention_varlen": "fn(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, causal=False, "
                            "window=None, softcap=None, scale=None)",
        "attention_decode": "fn(q, k_cache, v_cache, cache_seqlens, *, scale=None, softcap=None, block_table=None)",
        "residual_norm": "fn(x, residual, weight, bias=None, *, eps=None, norm='rms', residual_in_fp32=False, "
                         "rowscale=None, zero_centered_weight=False, out_dtype=None) -> (out, new_residual)"}
