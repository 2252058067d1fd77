"""Each bug is real: off the float64 referee where `correct` is on it."""
import importlib.util
import os

import torch

from gpuparity.contracts import attention as A, basic, decode, norms, varlen

HERE = os.path.dirname(os.path.abspath(__file__))
g = torch.Generator().manual_seed(0)


def rn(*shape):
    return torch.randn(*shape, generator=g)


def rel(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm())


def report(name, fn, call, ref):
    spec = importlib.util.spec_from_file_location(name, os.path.join(HERE, name + ".py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    bad, good = rel(call(getattr(mod, fn)), ref), rel(call(mod.correct), ref)
    print(f"{name:32s} buggy {bad:.3e}  correct {good:.3e}  {'REAL' if bad > 1e-3 and good < bad / 100 else 'NOT SHOWN'}")


q, k, v = rn(2, 4, 9, 16), rn(2, 2, 11, 16), rn(2, 2, 11, 16)   # GQA 4 / 2
report("attn_gqa_modulo", "attention", lambda f: f(q, k, v), A.attention(q.double(), k.double(), v.double()))
bias = -0.5 * (torch.arange(11)[None, :] - torch.arange(9)[:, None]).abs().float()   # a finite float mask
q, k, v = rn(1, 2, 9, 16), rn(1, 2, 11, 16), rn(1, 2, 11, 16)
report("attn_float_mask_scaled", "attention", lambda f: f(q, k, v, attn_mask=bias),
       A.attention(q.double(), k.double(), v.double(), attn_mask=bias.double()))
cu = torch.tensor([0, 7, 20], dtype=torch.int32)
q, k, v = 3 * rn(20, 2, 16), 3 * rn(20, 2, 16), rn(20, 2, 16)
report("varlen_softcap_unscaled", "attention_varlen", lambda f: f(q, k, v, cu, cu, 13, 13, softcap=5.0),
       varlen.attention_varlen_reference(q, k, v, cu, cu, softcap=5.0))
report("varlen_window_right_literal", "attention_varlen", lambda f: f(q, k, v, cu, cu, 13, 13, window=(3, -1)),
       varlen.attention_varlen_reference(q, k, v, cu, cu, window=(3, -1)))
q, kc, vc, lens = rn(2, 4, 4, 16), rn(2, 2, 32, 16), rn(2, 2, 32, 16), torch.tensor([30, 12], dtype=torch.int32)
report("decode_causal_max_length", "attention_decode", lambda f: f(q, kc, vc, lens),
       decode.decode_reference(q, kc, vc, lens))
pk, pv, table = rn(10, 2, 8, 16), rn(10, 2, 8, 16), torch.tensor([[3, 7, 1, 0], [9, 2, 5, 4]], dtype=torch.int32)
report("decode_pages_no_permute", "attention_decode", lambda f: f(q, pk, pv, lens, block_table=table),
       decode.paged_decode_reference(q, pk, pv, lens, block_table=table))
x = 3e-4 * rn(5, 64)   # mean square ~ eps
report("rms_eps_outside_sqrt", "rms_norm", lambda f: f(x, (64,)), norms.rms_norm(x.double(), (64,), eps_dtype=torch.float32))
x = 30 + 0.01 * rn(5, 256)
report("ln_one_pass_variance", "layer_norm", lambda f: f(x, (256,)), norms.layer_norm(x.double(), (256,)))
x, cos, sin = rn(12, 2, 16), torch.cos(0.3 * rn(20, 8)), torch.sin(0.3 * rn(20, 8))
pos = torch.cat([torch.arange(5), torch.arange(7)])   # two packed sequences
c, s, xd = cos.double()[pos][:, None], sin.double()[pos][:, None], x.double()
report("rotary_varlen_global_positions", "rotary", lambda f: f(x, cos, sin, cu_seqlens=torch.tensor([0, 5, 12])),
       torch.cat([xd[..., :8] * c - xd[..., 8:] * s, xd[..., :8] * s + xd[..., 8:] * c], -1))
logits, target = rn(9, 13), torch.tensor([0, 3, 0, 5, 12, 0, 1, 2, 0])
report("ce_ignore_negative", "cross_entropy", lambda f: f(logits, target, ignore_index=0),
       basic.cross_entropy(logits.double(), target, ignore_index=0))
