"""The cuDNN SDPA known issues on a GPU (issue 29 item 3), in three modes:

  probes  the known-issue probes new in the base, called directly (JSON to $OUT/probes.json)
  auto    backend="auto" with every attention backend on massive-activation inputs ($OUT/auto.json)
  sdpa    backend="auto" restricted to SDPA's math and cuDNN backends, so cuDNN would otherwise be
          chosen: in the SDPA-CUDNN-MASK-LSE regime auto must take math ($OUT/auto_sdpa.json)

Run after `gpuparity doctor` (which evaluates the base and stores the regime with the verdicts):
  PYTHONPATH=src python3 benchmarks/scripts/known_issue_regime.py probes|auto|sdpa
"""
import json
import os
import sys
import time

import torch

PROBES = ["sdpa_cudnn_mask_lse", "sdpa_cudnn", "sdpa_cudnn_sq1_lse", "sdpa_noncontig_v", "sdpa_fp32_lse_race",
          "gemm_small_dim_fp32", "gemm_transposed_fp32", "sdpa_long_mask", "layer_norm_2pow32", "cumsum_2pow32"]
# (key length, attn_mask given, gradients required)
CALLS = ((192, True, True), (1088, True, True), (256, True, True), (192, False, True), (192, True, False))


def run_probes(out_dir):
    from gpuparity.known import probes
    results = {}
    for name in PROBES:
        start = time.monotonic()
        try:
            results[name] = getattr(probes, name)("cuda:0")
        except Exception as exc:  # noqa: BLE001 - reported per probe
            results[name] = {"error": f"{type(exc).__name__}: {exc}"}
        results[name]["seconds"] = round(time.monotonic() - start, 2)
        print(name, json.dumps(results[name], default=str)[:600], flush=True)
        torch.cuda.empty_cache()
    with open(os.path.join(out_dir, "probes.json"), "w") as handle:
        json.dump(results, handle, indent=1, default=str)


def run_calls(out_dir, restrict):
    import gpuparity
    from gpuparity import dispatch
    from gpuparity.known.probes.attention import massive_activation_qkv
    from gpuparity.ops.attention import explain_attention
    if restrict:
        table = {b.name: b for b in dispatch.backends("attention")}
        dispatch.backends = lambda op: [table["sdpa_math"], table["sdpa_cudnn"], table["composition"]]
        dispatch.forget()
    rows = []
    for k_len, mask_on, grad in CALLS:
        q, k, v = massive_activation_qkv(k_len, 64, torch.device("cuda"), torch.bfloat16)
        q, k, v = (t.requires_grad_(grad) for t in (q, k, v))
        mask = torch.ones(k_len, k_len, dtype=torch.bool, device="cuda").tril()[None, None] if mask_on else None
        counts = {}
        with torch.set_grad_enabled(grad):
            info = explain_attention(q, k, v, attn_mask=mask)
            for backend in ("auto", "sdpa_cudnn") if restrict else ("auto",):
                q.grad = None
                out = gpuparity.attention(q, k, v, attn_mask=mask, backend=backend)
                if grad:
                    out.backward(torch.randn_like(out))
                    counts[backend] = int((~torch.isfinite(q.grad)).sum())
        cudnn = [r for r in info["candidates"] if r["name"] == "sdpa_cudnn"]
        row = {"k_len": k_len, "mask": mask_on, "grad": grad, "auto_chose": info["chosen"],
               "sdpa_cudnn_row": cudnn[0] if cudnn else None, "nonfinite_grad_q": counts}
        rows.append(row)
        print(json.dumps(row)[:700], flush=True)
    with open(os.path.join(out_dir, "auto_sdpa.json" if restrict else "auto.json"), "w") as handle:
        json.dump(rows, handle, indent=1, default=str)


if __name__ == "__main__":
    mode, out_dir = sys.argv[1], os.environ.get("OUT", ".")
    if mode == "probes":
        run_probes(out_dir)
    else:
        run_calls(out_dir, restrict=(mode == "sdpa"))
