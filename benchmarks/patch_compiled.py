"""Compiled (and eager) training steps of a transformers LlamaForCausalLM built from a config:
unpatched sdpa, attn_implementation="gpuparity" only, gpuparity.patch(model, mode=...) and the
patch with every kind forced, alternated in rounds on one GPU (medians and spread), tokens/s
over every position; then checks that the compiled patched model's inductor code calls the
Triton kernels (triton_op) and that mode="reduce-overhead" (CUDA graphs) runs.

    PYTHONPATH=src python3 benchmarks/patch_compiled.py --layers 4 --rounds 5 --out rows.json

Needs a CUDA GPU and transformers. Prints one line per measurement (a script, not the library).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch


def build(args, variant: str):
    import transformers
    import gpuparity
    from gpuparity.integrations.transformers import register
    config = transformers.LlamaConfig(
        vocab_size=32000, hidden_size=args.hidden, intermediate_size=args.mlp, num_hidden_layers=args.layers,
        num_attention_heads=16, num_key_value_heads=4, max_position_embeddings=8192, attention_dropout=0.0)
    torch.manual_seed(0)
    implementation = "sdpa"
    if variant == "attention-only":
        register()
        implementation = "gpuparity"
    model = transformers.LlamaForCausalLM._from_config(config, attn_implementation=implementation)
    model = model.to(device="cuda", dtype=torch.bfloat16).train()
    summary = None
    if variant == "attention-only":
        for module in model.modules():
            if type(module).__name__.endswith("Attention"):
                module.gpuparity_backend = args.backend     # as patch(backend=...) sets it
    # "-nocache": trained with use_cache=False (what the patch's training rule does);
    # "-cache": the patch without that rule (transformers' default cache in training)
    base_variant, _, suffix = variant.partition("-")
    if suffix == "nocache":
        model.config.use_cache = False
    if variant.startswith("patch"):
        # "patch-all": every kind forced; "patch+rms_norm+swiglu": those kinds forced on top of the plan
        force = True if suffix == "all" else tuple(base_variant.split("+")[1:])
        summary = gpuparity.patch(model, backend=args.backend, mode=args.mode, force=force)
        if suffix == "cache":
            model.model._forward_pre_hooks.clear()
    return model, summary


def batch(args):
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 32000, (args.batch, args.seq), generator=gen)
    mask = torch.ones(args.batch, args.seq, dtype=torch.long)
    mask[1:, args.seq // 2:] = 0          # one item full, the others half padded
    labels = ids.masked_fill(mask == 0, -100)
    return {"input_ids": ids.cuda(), "attention_mask": mask.cuda(), "labels": labels.cuda()}


def make_step(model, compile_mode):
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    forward = model if compile_mode is None else torch.compile(model, mode=compile_mode)

    def step(inputs):
        optimizer.zero_grad(set_to_none=True)
        loss = forward(**inputs).loss
        loss.backward()
        optimizer.step()
        return loss.detach()
    return step


def kernel_check(args):
    """Inductor's code for a small compiled patched model (every kind forced): the Triton kernel
    names it calls and any gpuparity op left opaque."""
    from torch._inductor.utils import run_and_get_code
    small = argparse.Namespace(**{**vars(args), "layers": 2, "hidden": 512, "mlp": 1024, "mode": "compiled"})
    model, summary = build(small, "patch-all")
    inputs = batch(argparse.Namespace(**{**vars(args), "seq": 256}))
    compiled = torch.compile(model)

    def run():
        out = compiled(**inputs)
        out.loss.backward()
        return out.loss
    _, codes = run_and_get_code(run)
    code = "\n".join(codes)
    names = sorted({word for word in ("_attn_fwd_kernel", "_attn_bwd_dq_kernel", "_attn_bwd_dkdv_kernel",
                                      "_attn_bwd_kernel", "_norm_fwd_fused_kernel", "_norm_fwd_looped_kernel",
                                      "_norm_bwd_fused_kernel", "_rotary_kernel", "_swiglu_fwd_kernel",
                                      "_swiglu_bwd_kernel") if word in code})
    opaque = sorted({line.strip().split("(")[0] for line in code.splitlines() if "torch.ops.gpuparity." in line})
    return {"kernels_in_inductor_code": names, "opaque_gpuparity_ops": opaque,
            "summary": summary.lines()}


def cudagraph_check(args):
    small = argparse.Namespace(**{**vars(args), "layers": 2, "hidden": 512, "mlp": 1024})
    model, _ = build(small, "patch-all")
    inputs = batch(argparse.Namespace(**{**vars(args), "seq": 256}))
    step = make_step(model, "reduce-overhead")
    losses = [float(step(inputs)) for _ in range(4)]
    torch.cuda.synchronize()
    return {"reduce_overhead_losses": losses}


def model_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The model's and the patch's options (build, batch), shared with profile_compiled_step.py."""
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--mlp", type=int, default=5632)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--backend", default="triton")
    parser.add_argument("--mode", default="compiled")
    return parser


def main(argv=None):
    parser = model_arguments(argparse.ArgumentParser())
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--variants", default="sdpa,attention-only,patch,patch-all",
                        help="comma-separated; patch+KIND[+KIND] forces kinds (rms_norm, rotary, swiglu, loss); "
                             "sdpa-nocache trains with use_cache=False, patch-cache keeps transformers' training cache")
    parser.add_argument("--eager", action="store_true", help="eager steps instead of compiled")
    parser.add_argument("--checks", action="store_true", help="inductor-code and reduce-overhead checks first")
    parser.add_argument("--compile-times", action="store_true",
                        help="record torch._dynamo's time per compile phase (tracing, AOT, inductor) at the end")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    result = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "args": vars(args)}
    if args.checks:
        for name, check in (("kernels", kernel_check), ("cudagraphs", cudagraph_check)):
            started = time.perf_counter()
            try:
                result[name] = check(args)
            except Exception as exc:   # noqa: BLE001 - record the failure, go on measuring
                result[name] = {"error": f"{type(exc).__name__}: {str(exc)[:2000]}"}
            result[name]["seconds"] = round(time.perf_counter() - started, 1)
            print(name, json.dumps(result[name])[:3000], flush=True)
            torch._dynamo.reset()
    variants = args.variants.split(",")
    steps, summaries, first = {}, {}, {}
    inputs = batch(args)
    for variant in variants:
        started = time.perf_counter()
        model, summary = build(args, variant)
        summaries[variant] = None if summary is None else summary.lines()
        steps[variant] = make_step(model, None if args.eager else "default")
        for _ in range(3):
            steps[variant](inputs)
        torch.cuda.synchronize()
        first[variant] = round(time.perf_counter() - started, 1)
        print(f"{variant}: built, compiled and 3 warm-up steps in {first[variant]} s", flush=True)
    times = {v: [] for v in variants}
    losses = {v: [] for v in variants}
    for _ in range(args.rounds):
        for variant in variants:
            torch.cuda.synchronize()
            started = time.perf_counter()
            for _ in range(args.steps):
                loss = steps[variant](inputs)
            torch.cuda.synchronize()
            times[variant].append((time.perf_counter() - started) / args.steps)
            losses[variant].append(float(loss))
    tokens = args.batch * args.seq
    rows = {}
    for variant in variants:
        median = statistics.median(times[variant])
        rows[variant] = {"ms_per_step": round(median * 1e3, 2),
                         "spread_ms": [round(min(times[variant]) * 1e3, 2), round(max(times[variant]) * 1e3, 2)],
                         "tokens_per_s": round(tokens / median), "first_3_steps_s": first[variant],
                         "last_loss": losses[variant][-1]}
        print(variant, json.dumps(rows[variant]), flush=True)
    base = rows.get("sdpa", {}).get("tokens_per_s")
    if base:
        for variant in variants:
            rows[variant]["vs_sdpa"] = round(rows[variant]["tokens_per_s"] / base, 3)
    result.update(rows=rows, summaries=summaries)
    try:        # torch's IR analyses of our kernels: memo hits / misses (a tree before the memo has none)
        from gpuparity.ops import kernel_analysis
        result["kernel_analysis"] = {**kernel_analysis.stats(), "signatures": kernel_analysis.signatures()}
        print("kernel analysis", json.dumps(result["kernel_analysis"]), flush=True)
    except ImportError:
        pass
    if args.compile_times:
        result["compile_times"] = torch._dynamo.utils.compile_times(repr="str")
        print(result["compile_times"], flush=True)
    print(json.dumps({v: r.get("vs_sdpa") for v, r in rows.items()}), flush=True)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as handle:
            json.dump(result, handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
