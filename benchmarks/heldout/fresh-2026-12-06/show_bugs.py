"""Show each held-out bug is real: one input where the buggy function's output (or gradient) is
off the float64 referee beyond the check's usual fp32 bound while `correct` (the same code without
the bug) is on it. Run: PYTHONPATH=src python benchmarks/heldout/fresh-2026-12-06/show_bugs.py"""
import importlib.util
import os

import torch

from gpuparity.contracts import attention as attn_contract
from gpuparity.contracts import basic, decode, norms, varlen

HERE = os.path.dirname(os.path.abspath(__file__))
BOUND = 1e-3   # far above fp32 rounding at these sizes


def load(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(HERE, name + ".py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def rel(a, b):
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


def report(name, fn_name, call, reference):
    mod = load(name)
    ref = reference()
    bad, good = rel(call(getattr(mod, fn_name)), ref), rel(call(mod.correct), ref)
    verdict = "REAL" if bad > BOUND and good < bad / 100 else "NOT SHOWN"
    print(f"{name:34s} buggy {bad:.3e}  correct {good:.3e}  {verdict}")


g = torch.Generator().manual_seed(0)


def rn(*shape):
    return torch.randn(*shape, generator=g)


def rotary_ref(x, cos, sin, pos):
    half = cos.shape[1]
    c, s = cos.double()[pos].unsqueeze(-2), sin.double()[pos].unsqueeze(-2)
    x = x.double()
    x1, x2 = x[..., :half], x[..., half:2 * half]
    return torch.cat([x1 * c - x2 * s, x1 * s + x2 * c, x[..., 2 * half:]], dim=-1)


# attention: GQA 4 query heads over 2 kv heads
q, k, v = rn(2, 4, 9, 16), rn(2, 2, 11, 16), rn(2, 2, 11, 16)
report("attn_gqa_modulo", "attention", lambda f: f(q, k, v),
       lambda: attn_contract.attention(q.double(), k.double(), v.double()))
# attention: a finite float bias (relative positions) as attn_mask
bias = -0.5 * (torch.arange(11)[None, :] - torch.arange(9)[:, None]).abs().float()
q1, k1, v1 = rn(1, 2, 9, 16), rn(1, 2, 11, 16), rn(1, 2, 11, 16)
report("attn_float_mask_scaled", "attention", lambda f: f(q1, k1, v1, attn_mask=bias),
       lambda: attn_contract.attention(q1.double(), k1.double(), v1.double(), attn_mask=bias.double()))
# varlen: softcap 5 on x3 logits
cu = torch.tensor([0, 7, 20], dtype=torch.int32)
qv, kv, vv = 3 * rn(20, 2, 16), 3 * rn(20, 2, 16), rn(20, 2, 16)
report("varlen_softcap_unscaled", "attention_varlen", lambda f: f(qv, kv, vv, cu, cu, 13, 13, softcap=5.0),
       lambda: varlen.attention_varlen_reference(qv, kv, vv, cu, cu, softcap=5.0))
report("varlen_window_right_literal", "attention_varlen", lambda f: f(qv, kv, vv, cu, cu, 13, 13, window=(3, -1)),
       lambda: varlen.attention_varlen_reference(qv, kv, vv, cu, cu, window=(3, -1)))
# decode: 4 new queries, items of lengths 30 and 12
qd, kc, vc = rn(2, 4, 4, 16), rn(2, 2, 32, 16), rn(2, 2, 32, 16)
lens = torch.tensor([30, 12], dtype=torch.int32)
report("decode_causal_max_length", "attention_decode", lambda f: f(qd, kc, vc, lens),
       lambda: decode.decode_reference(qd, kc, vc, lens))
# decode: a paged cache, pages of 8, 2 kv heads
pool_k, pool_v = rn(10, 2, 8, 16), rn(10, 2, 8, 16)
table = torch.tensor([[3, 7, 1, 0], [9, 2, 5, 4]], dtype=torch.int32)
report("decode_pages_no_permute", "attention_decode", lambda f: f(qd, pool_k, pool_v, lens, block_table=table),
       lambda: decode.paged_decode_reference(qd, pool_k, pool_v, lens, block_table=table))
# rms_norm: rows of tiny activations (mean square ~ eps)
xr = 3e-4 * rn(5, 64)
report("rms_eps_outside_sqrt", "rms_norm", lambda f: f(xr, (64,)),
       lambda: norms.rms_norm(xr.double(), (64,), eps_dtype=torch.float32))
# layer_norm: rows of mean 30, spread 0.01
xl = 30 + 0.01 * rn(5, 256)
report("ln_one_pass_variance", "layer_norm", lambda f: f(xl, (256,)),
       lambda: norms.layer_norm(xl.double(), (256,)))
# rotary: two packed sequences of 5 and 7 tokens
xp, cos_t, sin_t = rn(12, 2, 16), torch.cos(0.3 * rn(20, 8)), torch.sin(0.3 * rn(20, 8))
cur = torch.tensor([0, 5, 12], dtype=torch.int32)
report("rotary_varlen_global_positions", "rotary", lambda f: f(xp, cos_t, sin_t, cu_seqlens=cur),
       lambda: rotary_ref(xp, cos_t, sin_t, torch.cat([torch.arange(5), torch.arange(7)])))
# cross_entropy: ignore_index 0 (a valid class), some targets 0
logits, target = rn(9, 13), torch.tensor([0, 3, 0, 5, 12, 0, 1, 2, 0])
report("ce_ignore_negative", "cross_entropy", lambda f: f(logits, target, ignore_index=0),
       lambda: basic.cross_entropy(logits.double(), target, ignore_index=0))
