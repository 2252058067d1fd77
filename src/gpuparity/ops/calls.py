"""What a call of each op is: its arguments checked (a TypeError/ValueError names the argument,
what it got and what it needs) and its description for the dispatcher (`Problem`). Shared by
the public functions (ops/attention.py, norms.py, rotary.py) and their torch.library ops."""
from __future__ import annotations

import numbers
import weakref
from typing import Any, Callable, Dict, Optional, Sequence, Tuple, Union

import torch

from ..backends.masks import attention_kind
from ..backends.registry import Problem
from ..validation import (FLOAT_DTYPES, describe, expect_broadcastable, expect_same_device, expect_same_dtype,
                          expect_tensor)
from .. import caches


# ----------------------------------------------------------------------------- attention
def check_window(window, q_len: int, k_len: int) -> Optional[Tuple[int, int]]:
    """`window` as (left, right) ints, or None when absent or unbounded on both sides ((-1, -1))."""
    if window is None:
        return None
    if isinstance(window, (str, bytes)) or not isinstance(window, Sequence) or len(window) != 2:
        raise TypeError(f"window: expected None or a pair (left, right) of ints >= -1, got {describe(window)}")
    if not all(isinstance(w, numbers.Integral) and not isinstance(w, bool) for w in window):
        raise TypeError(f"window: expected a pair (left, right) of ints >= -1, got {tuple(window)!r}")
    left, right = int(window[0]), int(window[1])
    if left < -1 or right < -1:
        raise ValueError(f"window: expected left and right >= -1 (-1 = unbounded on that side), got {(left, right)}")
    longest = max(int(q_len), int(k_len))
    for side, size in (("left", left), ("right", right)):
        if size > longest:
            raise ValueError(f"window: {side} = {size} is larger than the sequence (max(Sq, Sk) = {longest}); "
                             f"pass -1 for a side without a bound")
    if left == -1 and right == -1:
        return None
    return left, right


def check_softcap(softcap) -> Optional[float]:
    """`softcap` as a float > 0, or None when absent or 0 (FlashAttention's "off")."""
    if softcap is None:
        return None
    if isinstance(softcap, bool) or not isinstance(softcap, numbers.Real):
        raise TypeError(f"softcap: expected None or a real number > 0, got {describe(softcap)}")
    value = float(softcap)
    if value == 0.0:
        return None
    if not (value > 0.0 and value != float("inf")):
        raise ValueError(f"softcap: expected a finite number > 0 (scores become softcap * tanh(scores / softcap)), "
                         f"got {softcap!r}")
    return value


def check_dropout(dropout_p) -> float:
    """`dropout_p` as a float in [0, 1)."""
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, numbers.Real):
        raise TypeError(f"dropout_p: expected a float in [0, 1), got {describe(dropout_p)}")
    value = float(dropout_p)
    if not 0.0 <= value < 1.0:
        raise ValueError(f"dropout_p: expected a probability 0 <= dropout_p < 1, got {dropout_p!r}")
    return value


def attention_problem(q, k, v, *, attn_mask=None, key_padding_mask=None, is_causal=False, scale=None,
                      mask_requires_grad: Optional[bool] = None, window=None, softcap=None,
                      dropout_p=0.0, requires_grad: Optional[bool] = None) -> Problem:
    """Validate the inputs of `attention` and describe the call for the dispatcher.
    mask_requires_grad overrides what attn_mask.requires_grad says (inside a torch.library op,
    where tensors carry no autograd state, the traced call's answer is passed down).
    requires_grad: whether gradients are required (default: grad mode on and q, k or v requires
    grad; inside a torch.library op, where that cannot be seen, assumed True), a feature only
    when True: a known issue's regime may rule a backend out for training calls (known/avoid.py).

    Raises TypeError/ValueError naming the argument, what it got and what it needs.
    """
    expect_tensor("q", q, ndim=(4,), dtypes=FLOAT_DTYPES)
    expect_tensor("k", k, ndim=(4,), dtypes=FLOAT_DTYPES)
    expect_tensor("v", v, ndim=(4,), dtypes=FLOAT_DTYPES)
    expect_same_dtype("q", q, k=k, v=v)
    expect_same_device("q", q, k=k, v=v)
    batch, heads, q_len, head_dim = q.shape
    if k.shape[0] != batch or k.shape[3] != head_dim:
        raise ValueError(f"k: expected shape (B={batch}, Hkv, Sk, D={head_dim}) to match q (B, H, Sq, D), "
                         f"got {describe(k)}")
    kv_heads, k_len = k.shape[1], k.shape[2]
    if tuple(v.shape) != tuple(k.shape):
        raise ValueError(f"v: expected the shape of k {tuple(k.shape)}, got {describe(v)}")
    if kv_heads == 0 or heads % kv_heads:
        raise ValueError(f"k: expected a number of heads Hkv that divides q's H={heads} (GQA/MQA), "
                         f"got Hkv={kv_heads} in {describe(k)}")
    if not isinstance(is_causal, bool):
        raise TypeError(f"is_causal: expected a bool, got {describe(is_causal)}")
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, numbers.Real)):
        raise TypeError(f"scale: expected None or a real number, got {describe(scale)}")

    inside_op = mask_requires_grad is not None   # the torch.library op passes it down
    if attn_mask is None:
        mask_requires_grad = False
    else:
        if not isinstance(attn_mask, torch.Tensor):
            raise TypeError(f"attn_mask: expected None or a torch.Tensor, got {describe(attn_mask)}")
        if attn_mask.dtype != torch.bool and not attn_mask.is_floating_point():
            raise TypeError(f"attn_mask: expected dtype bool (True = attend) or a float dtype (added to the "
                            f"scores), got {describe(attn_mask)}")
        if attn_mask.dim() > 4:
            raise ValueError(f"attn_mask: expected at most 4 dims, broadcastable to (B, H, Sq, Sk) = "
                             f"{(batch, heads, q_len, k_len)}, got {describe(attn_mask)}")
        expect_broadcastable("attn_mask", attn_mask, (batch, heads, q_len, k_len),
                             "(B, H, Sq, Sk) as in scaled_dot_product_attention")
        expect_same_device("q", q, attn_mask=attn_mask)
        mask_requires_grad = (attn_mask.is_floating_point() and attn_mask.requires_grad
                              if mask_requires_grad is None else mask_requires_grad)
    if key_padding_mask is not None:
        if not isinstance(key_padding_mask, torch.Tensor):
            raise TypeError(f"key_padding_mask: expected None or a torch.Tensor, got {describe(key_padding_mask)}")
        if key_padding_mask.dtype != torch.bool:
            raise TypeError(f"key_padding_mask: expected dtype bool (True = padding, ignored), got "
                            f"{describe(key_padding_mask)}; pass a float mask as attn_mask[:, None, None, :]")
        if tuple(key_padding_mask.shape) != (batch, k_len):
            raise ValueError(f"key_padding_mask: expected shape (B, Sk) = {(batch, k_len)}, got "
                             f"{describe(key_padding_mask)}")
        expect_same_device("q", q, key_padding_mask=key_padding_mask)
    window = check_window(window, q_len, k_len)
    softcap = check_softcap(softcap)
    dropout_p = check_dropout(dropout_p)

    features = (
        ("head_dim", int(head_dim)),
        ("has_mask", attn_mask is not None or key_padding_mask is not None),
        ("gqa", kv_heads != heads),
        ("mask_requires_grad", bool(mask_requires_grad)),
        ("is_causal", bool(is_causal)),
        ("q_len", int(q_len)),
        ("k_len", int(k_len)),
    )
    if window is not None:   # absent when unset: the problems of plain calls stay as they were
        features += (("window", window),)
    if softcap is not None:
        features += (("softcap", softcap),)
    if dropout_p > 0.0:   # an OPT_IN feature: only backends that implement dropout serve it
        features += (("dropout", dropout_p),)
    if requires_grad is None:
        requires_grad = (True if inside_op else
                         torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad))
    if requires_grad:
        features += (("requires_grad", True),)
    return Problem(op="attention", device=q.device, dtype=q.dtype,
                   kind=attention_kind(attn_mask, key_padding_mask, is_causal, window, softcap), features=features)


# Validated calls by signature: a training loop repeats a few shapes, and validating every
# argument again costs host time the short shapes cannot hide (~50 us per call on the H100
# host, where the kernels of a BERT layer take ~0.1 ms). A signature holds everything
# attention_problem reads: each tensor's type, shape, dtype and device (and attn_mask's
# requires_grad), each other argument's type and value. Values of a type the signature does not
# describe exactly (a list window, a numpy float) are validated on every call.
_PLAIN = (type(None), bool, int, float)
_SIGNED: Dict[tuple, Tuple[Problem, Dict[str, Any]]] = caches.register("ops.calls.signed", {})
_SIGNED_MAX = 1024


def _tensor_signature(t) -> tuple:
    return (None,) if t is None else (type(t), t.shape, t.dtype, t.device)


def attention_signature(q, k, v, attn_mask, key_padding_mask, is_causal, scale, window, softcap,
                        dropout_p) -> Optional[tuple]:
    """A hashable key of everything attention_problem reads, or None when an argument is of a
    kind that is validated on every call."""
    if not (type(is_causal) in _PLAIN and type(scale) in _PLAIN and type(softcap) in _PLAIN
            and type(dropout_p) in _PLAIN):
        return None
    if window is not None:
        if type(window) is not tuple or len(window) != 2 or type(window[0]) is not int or type(window[1]) is not int:
            return None
    try:
        return (_tensor_signature(q), _tensor_signature(k), _tensor_signature(v), _tensor_signature(attn_mask),
                None if attn_mask is None else attn_mask.requires_grad, _tensor_signature(key_padding_mask), type(is_causal), is_causal, type(scale), type(softcap), softcap,
                type(dropout_p), dropout_p, window,
                torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad))
    except AttributeError:   # not a tensor: attention_problem says what it needs
        return None


def attention_call(q, k, v, attn_mask, key_padding_mask, is_causal, scale, window, softcap,
                   dropout_p) -> Tuple[Problem, Dict[str, Any]]:
    """(problem, extras) of a call: attention_problem and attention_extras, remembered per
    signature (a raise is never remembered)."""
    key = attention_signature(q, k, v, attn_mask, key_padding_mask, is_causal, scale, window, softcap, dropout_p)
    known = None if key is None else _SIGNED.get(key)
    if known is not None:
        return known
    problem = attention_problem(q, k, v, attn_mask=attn_mask, key_padding_mask=key_padding_mask,
                                is_causal=is_causal, scale=scale, window=window, softcap=softcap, dropout_p=dropout_p)
    known = (problem, attention_extras(problem))
    if key is not None:
        if len(_SIGNED) >= _SIGNED_MAX:
            _SIGNED.clear()
        _SIGNED[key] = known
    return known


def attention_extras(problem: Problem) -> Dict[str, Any]:
    """window/softcap/dropout_p as backend functions take them, only when set: a backend that
    knows none (a planted or third-party one) keeps its old signature for plain calls."""
    extras: Dict[str, Any] = {}
    if problem.feature("dropout") is not None:
        extras["dropout_p"] = problem.feature("dropout")
    if problem.feature("window") is not None:
        extras["window"] = problem.feature("window")
    if problem.feature("softcap") is not None:
        extras["softcap"] = problem.feature("softcap")
    return extras


# ----------------------------------------------------------------------------- norms
ShapeLike = Union[int, Sequence[int], torch.Size]


def normalized_tuple(name: str, normalized_shape: ShapeLike) -> Tuple[int, ...]:
    if isinstance(normalized_shape, bool):
        raise TypeError(f"{name}: expected an int or a sequence of ints, got {describe(normalized_shape)}")
    if isinstance(normalized_shape, numbers.Integral):
        shape = (int(normalized_shape),)
    else:
        try:
            shape = tuple(normalized_shape)
        except TypeError:
            raise TypeError(f"{name}: expected an int or a sequence of ints, got {describe(normalized_shape)}") from None
        if not all(isinstance(s, numbers.Integral) and not isinstance(s, bool) for s in shape):
            raise TypeError(f"{name}: expected an int or a sequence of ints, got {normalized_shape!r}")
        shape = tuple(int(s) for s in shape)
    if not shape:
        raise ValueError(f"{name}: expected at least one normalized dimension, got {normalized_shape!r}")
    if any(s < 0 for s in shape):
        raise ValueError(f"{name}: expected sizes >= 0, got {shape}")
    return shape


def check_norm_inputs(x, normalized_shape: ShapeLike, weight=None, bias=None, eps=None,
                      *, eps_may_be_none: bool) -> Tuple[int, ...]:
    """Validate the arguments of F.rms_norm / F.layer_norm; returns normalized_shape as a tuple."""
    expect_tensor("x", x, dtypes=FLOAT_DTYPES)
    shape = normalized_tuple("normalized_shape", normalized_shape)
    if x.dim() < len(shape) or tuple(x.shape[x.dim() - len(shape):]) != shape:
        raise ValueError(f"normalized_shape: expected the last {len(shape)} dimension(s) of x, "
                         f"got {shape} for x {describe(x)}")
    for name, param in (("weight", weight), ("bias", bias)):
        if param is None:
            continue
        expect_tensor(name, param, dtypes=FLOAT_DTYPES)
        if tuple(param.shape) != shape:
            raise ValueError(f"{name}: expected shape {shape} (normalized_shape), got {describe(param)}")
    expect_same_device("x", x, weight=weight, bias=bias)
    if eps is None:
        if not eps_may_be_none:
            raise TypeError("eps: expected a float >= 0, got None")
    elif isinstance(eps, bool) or not isinstance(eps, numbers.Real) or not eps >= 0:
        raise ValueError(f"eps: expected a float >= 0{' or None' if eps_may_be_none else ''}, got {describe(eps)}")
    return shape


def _hidden(shape: Tuple[int, ...]) -> int:
    n = 1
    for size in shape:
        n *= size
    return n


LARGE_NORM = 1 << 22


def norm_problem(op: str, x: torch.Tensor, shape: Tuple[int, ...], weight, bias) -> Problem:
    """The dispatcher's description of a validated rms_norm / layer_norm call."""
    # "large": ranked by the training-size timing (contracts/norms.py), where the kernels'
    # time outweighs the host's; from 4M elements (2048 tokens x 2048 hidden)
    features = (("hidden", _hidden(shape)), ("weight", weight is not None), ("large", x.numel() >= LARGE_NORM))
    if op == "layer_norm":
        features += (("bias", bias is not None),)
    return Problem(op, x.device, x.dtype, "default", features)


# ----------------------------------------------------------------------------- rotary
INDEX_DTYPES = (torch.int32, torch.int64)


def rotary_kind(interleaved: bool, cu_seqlens) -> str:
    """The probe key of a rotary call (as the battery's rotary spec names it): "half",
    "interleaved", "varlen-half" or "varlen-interleaved"."""
    return ("varlen-" if cu_seqlens is not None else "") + ("interleaved" if interleaved else "half")


# Checks of tensor values (each one host sync) already passed: key -> (weakrefs to the tensors,
# their _versions, the check's result). A model passes the same cu_seqlens / offsets to every
# layer, so only the first call of a step pays the sync; an in-place change bumps _version and
# is checked again; the weakrefs rule out new tensors that reuse freed ones' ids.
_VALUES_CHECKED: Dict[tuple, tuple] = caches.register("ops.calls.values_checked", {})
_VALUES_CHECKED_MAX = 256


def checked_once(tensors: Sequence[Optional[torch.Tensor]], extra: tuple, check: Callable[[], Any]) -> Any:
    """check()'s result, computed once per (tensors as objects and versions, extra); check
    raises on bad values, and a raise is never remembered."""
    key = tuple(id(t) for t in tensors) + tuple(extra)
    versions = tuple(None if t is None else t._version for t in tensors)
    seen = _VALUES_CHECKED.get(key)
    if seen is not None and seen[1] == versions and all(
            (ref is None and t is None) or (ref is not None and ref() is t) for ref, t in zip(seen[0], tensors)):
        return seen[2]
    result = check()
    if len(_VALUES_CHECKED) >= _VALUES_CHECKED_MAX:
        _VALUES_CHECKED.clear()
    _VALUES_CHECKED[key] = (tuple(None if t is None else weakref.ref(t) for t in tensors), versions, result)
    return result


def _capturing(device: torch.device) -> bool:
    """True while a CUDA graph is captured or torch.compile/export traces: the checks that read
    device values are skipped then (the torch.library op runs them when it runs)."""
    return torch.compiler.is_compiling() or (device.type == "cuda" and torch.cuda.is_current_stream_capturing())


def rotary_problem(x, cos, interleaved: bool, seqlen_offsets, cu_seqlens) -> Problem:
    """The dispatcher's description of a validated apply_rotary call."""
    return Problem("rotary", x.device, x.dtype, rotary_kind(interleaved, cu_seqlens),
                            (("head_dim", x.shape[-1]), ("rotary_dim", 2 * cos.shape[1]),
                             ("offsets", "tensor" if isinstance(seqlen_offsets, torch.Tensor) else "int")))


def check_rotary_inputs(x, cos, sin, *, interleaved, seqlen_offsets, cu_seqlens, max_seqlen, inplace):
    """Validate apply_rotary's arguments; returns max_seqlen (computed when packed and None).

    Checks that need the values of device tensors (cu_seqlens order, offsets within the cos/sin
    table) cost one synchronisation; they are skipped while a CUDA graph is being captured.
    """
    expect_tensor("x", x, dtypes=FLOAT_DTYPES)
    if not isinstance(interleaved, bool):
        raise TypeError(f"interleaved: expected a bool, got {describe(interleaved)}")
    if not isinstance(inplace, bool):
        raise TypeError(f"inplace: expected a bool, got {describe(inplace)}")
    if cu_seqlens is None:
        expect_tensor("x", x, ndim=(4,))
        batch, seqlen = x.shape[0], x.shape[1]
        if max_seqlen is not None:
            raise ValueError(f"max_seqlen: only meaningful with cu_seqlens (packed input), got {describe(max_seqlen)}")
    else:
        if x.dim() != 3:
            raise ValueError(f"x: expected a packed 3-D tensor (total, H, D) with cu_seqlens, got {describe(x)}")
        expect_tensor("cu_seqlens", cu_seqlens, ndim=(1,), dtypes=INDEX_DTYPES)
        if cu_seqlens.numel() < 1:
            raise ValueError(f"cu_seqlens: expected B + 1 >= 1 cumulative lengths, got {describe(cu_seqlens)}")
        expect_same_device("x", x, cu_seqlens=cu_seqlens)
        batch, seqlen = cu_seqlens.numel() - 1, None
        if max_seqlen is not None and (isinstance(max_seqlen, bool) or not isinstance(max_seqlen, numbers.Integral)
                                       or max_seqlen < 0):
            raise ValueError(f"max_seqlen: expected an int >= 0, got {describe(max_seqlen)}")
    head_dim = x.shape[-1]
    for name, table in (("cos", cos), ("sin", sin)):
        expect_tensor(name, table, ndim=(2,), dtypes=FLOAT_DTYPES)
    if cos.shape != sin.shape:
        raise ValueError(f"sin: expected the shape of cos {tuple(cos.shape)}, got {describe(sin)}")
    if cos.dtype != sin.dtype:
        raise TypeError(f"sin: expected the dtype of cos ({str(cos.dtype).replace('torch.', '')}), got {describe(sin)}")
    expect_same_device("x", x, cos=cos, sin=sin)
    rotary_half = cos.shape[1]
    if rotary_half < 1 or 2 * rotary_half > head_dim:
        raise ValueError(f"cos: expected shape (S_max, rotary_dim / 2) with 1 <= rotary_dim <= head dim {head_dim}, "
                         f"got {describe(cos)} (rotary_dim {2 * rotary_half})")
    if torch.is_grad_enabled() and (cos.requires_grad or sin.requires_grad):
        raise ValueError("cos/sin: gradients with respect to cos and sin are not supported (flash-attn's rotary "
                         "contract); pass cos.detach() and sin.detach()")
    table_len = cos.shape[0]
    if isinstance(seqlen_offsets, torch.Tensor):
        expect_tensor("seqlen_offsets", seqlen_offsets, ndim=(1,), dtypes=INDEX_DTYPES)
        if seqlen_offsets.shape[0] != batch:
            raise ValueError(f"seqlen_offsets: expected one offset per sequence ({batch},), got {describe(seqlen_offsets)}")
        expect_same_device("x", x, seqlen_offsets=seqlen_offsets)
    elif isinstance(seqlen_offsets, bool) or not isinstance(seqlen_offsets, numbers.Integral) or seqlen_offsets < 0:
        raise ValueError(f"seqlen_offsets: expected an int >= 0 or a ({batch},) integer tensor, "
                         f"got {describe(seqlen_offsets)}")
    if inplace and x.requires_grad and x.is_leaf and torch.is_grad_enabled():
        raise ValueError(f"x: inplace=True cannot modify a leaf tensor that requires grad, got {describe(x)}")

    if cu_seqlens is None:
        if isinstance(seqlen_offsets, torch.Tensor):
            if not _capturing(x.device) and seqlen_offsets.numel():
                checked_once((seqlen_offsets,), ("rotary-offsets", seqlen, table_len),
                             lambda: _check_offsets(seqlen_offsets, seqlen, table_len))
        else:
            _check_positions(int(seqlen_offsets), int(seqlen_offsets) + seqlen if seqlen else 0, table_len)
        return None
    total = x.shape[0]
    if torch.compiler.is_compiling():
        return max_seqlen   # None: the op computes it when it runs
    if _capturing(x.device):
        if max_seqlen is None:
            raise ValueError("max_seqlen: needed with cu_seqlens while a CUDA graph is being captured")
        return int(max_seqlen)
    offsets_tensor = seqlen_offsets if isinstance(seqlen_offsets, torch.Tensor) else None
    return checked_once((cu_seqlens, offsets_tensor),
                        ("rotary", None if offsets_tensor is not None else int(seqlen_offsets), batch, total,
                         table_len, max_seqlen),
                        lambda: _check_rotary_cu_values(cu_seqlens, seqlen_offsets, batch, total, table_len,
                                                        max_seqlen))


def _check_offsets(offsets: torch.Tensor, seqlen: int, table_len: int) -> None:
    low, high = (int(v) for v in torch.stack([offsets.min(), offsets.max()]).tolist())
    _check_positions(low, high + seqlen, table_len)


def _check_rotary_cu_values(cu_seqlens, seqlen_offsets, batch: int, total: int, table_len: int, max_seqlen) -> int:
    """cu_seqlens from 0 to total, non-decreasing, positions within the table (one host sync);
    returns max_seqlen, or the longest sequence when it is None."""
    cu = cu_seqlens.long()
    lengths = cu[1:] - cu[:-1]
    offsets = seqlen_offsets.long() if isinstance(seqlen_offsets, torch.Tensor) else torch.full_like(lengths, int(seqlen_offsets))
    if batch == 0:
        if total != 0 or int(cu[0]) != 0:
            raise ValueError(f"cu_seqlens: expected [0] for an empty batch with x of {total} rows, got {cu_seqlens.tolist()}")
        return 0
    first, last, decreasing, longest, low, end = (int(v) for v in torch.stack([
        cu[0], cu[-1], (lengths < 0).sum(), lengths.max(), offsets.min(), (lengths + offsets).max()]).tolist())
    if first != 0 or last != total or decreasing:
        raise ValueError(f"cu_seqlens: expected a non-decreasing sequence from 0 to x.shape[0] = {total}, "
                         f"got first {first}, last {last}, {decreasing} decreasing step(s)")
    if max_seqlen is not None and int(max_seqlen) < longest:
        raise ValueError(f"max_seqlen: expected >= the longest sequence ({longest}), got {max_seqlen}")
    _check_positions(low, end, table_len)
    return int(max_seqlen) if max_seqlen is not None else longest


def _check_positions(lowest_offset: int, end: int, table_len: int) -> None:
    if lowest_offset < 0:
        raise ValueError(f"seqlen_offsets: expected offsets >= 0, got {lowest_offset}")
    if end > table_len:
        raise ValueError(f"cos: positions reach {end - 1} (sequence length + seqlen_offsets) but the cos/sin table "
                         f"has {table_len} rows; expected cos.shape[0] >= {end}")


# ----------------------------------------------------------------------------- linear cross entropy
def linear_cross_entropy_problem(hidden, weight, target, bias, ignore_index, reduction, softcap) -> Problem:
    """Validate linear_cross_entropy's arguments and describe the call for the dispatcher."""
    expect_tensor("hidden", hidden, dtypes=FLOAT_DTYPES)
    expect_tensor("weight", weight, ndim=(2,), dtypes=FLOAT_DTYPES)
    if hidden.dim() < 1 or hidden.shape[-1] != weight.shape[1]:
        raise ValueError(f"weight: expected shape (V, H) with H = hidden.shape[-1], got {describe(weight)} "
                         f"for hidden {describe(hidden)}")
    expect_tensor("target", target, dtypes=INDEX_DTYPES)
    if tuple(target.shape) != tuple(hidden.shape[:-1]):
        raise ValueError(f"target: expected shape {tuple(hidden.shape[:-1])} (hidden's without its last dim), "
                         f"got {describe(target)}")
    if bias is not None:
        expect_tensor("bias", bias, ndim=(1,), dtypes=FLOAT_DTYPES)
        if bias.shape[0] != weight.shape[0]:
            raise ValueError(f"bias: expected shape ({weight.shape[0]},) (V), got {describe(bias)}")
    expect_same_dtype("hidden", hidden, weight=weight, bias=bias)
    expect_same_device("hidden", hidden, weight=weight, target=target, bias=bias)
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, numbers.Integral):
        raise TypeError(f"ignore_index: expected an int, got {describe(ignore_index)}")
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"reduction: expected 'mean', 'sum' or 'none', got {reduction!r}")
    softcap = check_softcap(softcap)
    features = (("vocab", int(weight.shape[0])), ("hidden", int(weight.shape[1])), ("bias", bias is not None),
                ("reduction", reduction))
    if softcap is not None:
        features += (("softcap", softcap),)
    return Problem("linear_cross_entropy", hidden.device, hidden.dtype,
                   "softcap" if softcap is not None else "default", features)


# ----------------------------------------------------------------------------- swiglu
def swiglu_problem(gate, up) -> Problem:
    """Validate swiglu's arguments and describe the call for the dispatcher ("large" as the
    norms': ranked by the training-size timing from 4M elements)."""
    expect_tensor("gate", gate, dtypes=FLOAT_DTYPES)
    expect_tensor("up", up, dtypes=FLOAT_DTYPES)
    if gate.dim() == 0 or tuple(up.shape) != tuple(gate.shape):
        raise ValueError(f"up: expected the shape of gate {tuple(gate.shape)} (at least 1-D), got {describe(up)}")
    expect_same_dtype("gate", gate, up=up)
    expect_same_device("gate", gate, up=up)
    return Problem("swiglu", gate.device, gate.dtype, "default", (("large", gate.numel() >= LARGE_NORM),))
