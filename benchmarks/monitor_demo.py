"""gpuparity.monitor on a planted model: a tiny transformers Qwen2 from a config (random weights,
no download) whose layer-1 head 0 is a "massive activation" head: its q and k biases point
against each other along the slowest rotary pair, so every logit of every query row of that head
is about -290 and the row's logsumexp is far below -88.7. Batches are right-padded, so
transformers hands SDPA an attention mask; seq 192 (64 mod 128), head dim 64, bf16. On an
H100/H200 with torch 2.11+cu130 (cuDNN 9.19) the default SDPA backend (cuDNN) returns NaN in
grad_q there (pytorch/pytorch#196678); the monitor is to flag it at the first sampled call of
that layer.

    PYTHONPATH=src python benchmarks/monitor_demo.py --out out/monitor       # GPU
    PYTHONPATH=src python benchmarks/monitor_demo.py --device cpu --dtype fp32 --steps 2   # smoke
    gpuparity explain benchmarks/monitor_demo.py:planted_qwen2 --dtype bfloat16
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

PLANT = 48.0     # bias size: logits about -PLANT**2 / sqrt(head_dim) = -288


def planted_qwen2(device="cpu", dtype=torch.float32, seq: int = 192, layers: int = 2, planted_layer: int = 1,
                  batch: int = 2):
    """(model, inputs): the planted Qwen2 (SPEC factory for `gpuparity explain` / `model`)."""
    import transformers
    config = transformers.Qwen2Config(hidden_size=256, intermediate_size=512, num_hidden_layers=layers,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=1000,
                                      max_position_embeddings=max(512, seq), attn_implementation="sdpa")
    torch.manual_seed(0)
    model = transformers.Qwen2ForCausalLM(config)
    head_dim = config.hidden_size // config.num_attention_heads
    slow = head_dim // 2 - 1          # the rotary pair (slow, slow + head_dim/2) turns least over the sequence
    attn = model.model.layers[planted_layer].self_attn
    with torch.no_grad():
        attn.q_proj.bias[slow] = PLANT            # query head 0
        attn.k_proj.bias[slow] = -PLANT           # key head 0 (read by query heads 0 and 1)
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, config.vocab_size, (batch, seq), generator=gen)
    mask = torch.ones(batch, seq, dtype=torch.long)
    mask[1:, seq - seq // 4:] = 0                 # right padding: transformers passes SDPA a mask
    labels = ids.masked_fill(mask == 0, -100)
    model = model.to(device=device, dtype=dtype)
    return model, {"input_ids": ids.to(device), "attention_mask": mask.to(device), "labels": labels.to(device)}


def row_logsumexp(model, inputs) -> float:
    """The smallest logsumexp over the planted layer's SDPA rows (float64 of the actual inputs)."""
    import torch.nn.functional as F
    seen = []
    original = F.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, **kw):
        scores = (q.double() @ k.double().transpose(-2, -1)) * q.shape[-1] ** -0.5
        if attn_mask is not None:
            scores = scores.masked_fill(~attn_mask, float("-inf")) if attn_mask.dtype == torch.bool else \
                scores + attn_mask.double()
        seen.append(float(torch.logsumexp(scores, -1).min()))
        return original(q, k, v, attn_mask=attn_mask, **kw)
    F.scaled_dot_product_attention = spy
    try:
        with torch.no_grad():
            model(**inputs)
    finally:
        F.scaled_dot_product_attention = original
    return min(seen)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="bf16", choices=("bf16", "fp16", "fp32"))
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--every", type=int, default=3,
                   help="sample every N-th call of each op (2 SDPA calls a step: layer 1's are calls 1, 3, 5, ...)")
    p.add_argument("--out", default="out/monitor")
    args = p.parse_args(argv)
    import gpuparity
    os.makedirs(args.out, exist_ok=True)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    model, inputs = planted_qwen2(args.device, dtype)
    model.train()
    lse = row_logsumexp(model, inputs)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
    log = {"lse_min": lse, "steps": []}
    started = time.perf_counter()
    with gpuparity.monitor(model, every=args.every, repro_dir=os.path.join(args.out, "repro"), max_pending=8,
                           max_overhead=None) as mon:
        for step in range(args.steps):
            mon.step(step)
            loss = model(**inputs).loss
            loss.backward()
            nonfinite = sum(int((~torch.isfinite(q.grad)).sum()) for q in model.parameters() if q.grad is not None)
            log["steps"].append({"step": step, "loss": float(loss.detach()), "nonfinite_param_grads": nonfinite})
            if not nonfinite:     # as a grad scaler does: a step with NaN gradients is skipped
                optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    report = mon.report()
    log["seconds"] = time.perf_counter() - started
    log["report"] = report.to_dict()
    first = report.failures[0] if report.failures else None
    log["first_failure"] = None if first is None else {k: first[k] for k in ("op", "backend", "step", "call", "reason")}
    if first is not None:
        print(f"first failure: {first['op']} [{first['backend']}] at step {first['step']}, call {first['call']}")
    with open(os.path.join(args.out, "monitor.json"), "w") as handle:
        json.dump(log, handle, indent=1, default=str)
    print(f"planted head: min row logsumexp {lse:.1f}")
    for entry in log["steps"]:
        print(f"step {entry['step']}: loss {entry['loss']:.4f}, non-finite parameter grads {entry['nonfinite_param_grads']}")
    print(report.summary())
    return 0


if __name__ == "__main__":
    sys.exit(main())
