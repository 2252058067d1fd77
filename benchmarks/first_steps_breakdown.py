"""Where the first training steps of a `gpuparity.patch`ed model spend their time (issue 31:
"first 3 eager steps with the patch: at most the unpatched model's + 5 s with an empty probe
cache").

Each run is a fresh process with its own empty GPUPARITY_CACHE_DIR: a transformers
LlamaForCausalLM from a config, `gpuparity.patch(model)` (or not: the "unpatched" variant),
AdamW, then 3 training steps (forward with labels, backward, optimizer step), each timed. With
GPUPARITY_PROBE=subprocess (the default here) the first-call checks run in the kept "verify"
worker, as on a GPU machine. The child wraps, without changing them, the functions the first
calls cross and writes a timeline:

- worker: when the kept worker process was spawned (`WorkerPool._start`) and each task's
  round-trip (`WorkerPool.run`: op, backend, case, seconds); the first task also waits for the
  worker's imports, so its round-trip minus the later ones' is about the worker start left over;
- verify: each first-call verification (`checks.selection.verify`: op, kind, backend, number of
  checks, seconds), the checks' share (`run_tasks`) and the known-issue probes' (`_veto_known`);
- prepare: what `gpuparity.patch` queued ahead of the first forward (`selection.prepare`, where
  the code has it), and when the answers came back;
- resolve: each resolution that walked the candidates (`dispatch._explain_ranked`: op, kind,
  seconds, so the time the step itself waited);
- pending: each resolution served by the op's baseline while its candidate's verdict was still
  being made (`dispatch.Pending`: op, kind, the candidate, the baseline), where the code has it;
- steps: each step's seconds, and the patch, optimizer and data setup between.

With `--compile` both variants wrap the model in `torch.compile` after the patch (the first
step's time then includes the compilation); `--first-calls wait|baseline` sets
GPUPARITY_FIRST_CALLS for the patched runs (unset: the code's default). `--define NAME:K=V,...`
adds a patched variant NAME run with those environment variables (an A/B of switches such as
GPUPARITY_COMPILED_KERNELS=opaque or GPUPARITY_WORKER_WARM=1 in one call; list it in
--variants); `--fresh-inductor-cache` gives every run an empty TORCHINDUCTOR_CACHE_DIR of its own
(each compiled run cold, none warmed by the one before); `--compile-times` keeps torch's
compile phases; `--budget-s` starts no run that would likely end past that many seconds.

    python benchmarks/first_steps_breakdown.py                      # unpatched vs patched, 2 repeats
    python benchmarks/first_steps_breakdown.py --repeats 3 --json out/first-steps.json
    python benchmarks/first_steps_breakdown.py --device cuda --dtype bf16 --layers 8 --hidden 2048 \
        --heads 16 --kv-heads 4 --seq 2048 --vocab 32000            # the issue's model on a GPU
    python benchmarks/first_steps_breakdown.py --compile            # both variants under torch.compile

The machine's load average is printed before and after: on a shared machine other work slows
every figure. This is a script: it prints.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(os.path.dirname(HERE), "src")

CHILD = r'''
import json, os, sys, threading, time
T0 = time.perf_counter()
events = []

def now():
    return time.perf_counter() - T0

def note(what, start, **fields):
    events.append({"what": what, "start": round(start, 4), "s": round(now() - start, 4), **fields})

args = json.loads(sys.argv[1])
import torch
import transformers
if args["patched"] and not args["late_import"]:
    # `import gpuparity` where a script has it, at the top, beside torch: on a GPU machine it
    # starts the first-call worker, whose start then overlaps the model's construction
    import gpuparity
torch.manual_seed(0)
dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[args["dtype"]]
device = torch.device(args["device"])
config = transformers.LlamaConfig(hidden_size=args["hidden"], intermediate_size=args["intermediate"],
                                  num_hidden_layers=args["layers"], num_attention_heads=args["heads"],
                                  num_key_value_heads=args["kv_heads"], vocab_size=args["vocab"],
                                  max_position_embeddings=max(2048, args["seq"]), attn_implementation="sdpa")
model = transformers.LlamaForCausalLM(config).to(device=device, dtype=dtype)
imported = now()
patched = args["patched"]
if patched:
    import gpuparity
    from gpuparity import dispatch
    from gpuparity.checks import pool, selection
    # wrap (not change) what the first calls cross; each wrapper records its span
    real_start, real_run = pool.WorkerPool._start, pool.WorkerPool.run
    def _start(self):
        t = now(); real_start(self); note("worker-spawn", t, pid=self.proc.pid)
        def ready(pool=self, pid=self.proc.pid, t=t, event=self.ready):
            event.wait(); note("worker-ready", t, pid=pid, info=dict(getattr(pool, "ready_info", {}) or {}))
        threading.Thread(target=ready, daemon=True).start()
    def run(self, task, timeout):
        t = now(); answer = real_run(self, task, timeout)
        note("task", t, op=task.op, backend=task.backend, case=task.case, mode=task.mode,
             status=answer.get("status"), pid=self.proc.pid if self.proc else None)
        return answer
    pool.WorkerPool._start, pool.WorkerPool.run = _start, run
    real_verify, real_tasks, real_veto = selection.verify, selection.run_tasks, selection._veto_known
    def verify(op, dtype_, kind, device_, backend):
        t = now(); out = real_verify(op, dtype_, kind, device_, backend)
        note("verify", t, op=op, call_kind=kind, backend=backend, dtype=str(dtype_).replace("torch.", ""),
             thread=threading.current_thread().name)
        return out
    def run_tasks(tasks, **kw):
        tasks = list(tasks); t = now(); out = real_tasks(tasks, **kw)
        note("run_tasks", t, n=len(tasks), ops=sorted({x.op for x in tasks}), modes=sorted({x.mode for x in tasks}))
        return out
    def veto(verdicts, op, dtype_, device_, backends):
        t = now(); out = real_veto(verdicts, op, dtype_, device_, backends)
        note("known-issues", t, op=op, backends=list(backends))
        return out
    selection.verify, selection.run_tasks, selection._veto_known = verify, run_tasks, veto
    real_explain = dispatch._explain_ranked
    def explain(problem, verdict, rank, full):
        t = now()
        try:
            out = real_explain(problem, verdict, rank, full)
        except Exception as exc:
            if type(exc).__name__ == "Pending":
                note("pending", t, op=problem.op, call_kind=problem.kind, candidate=exc.candidate.name,
                     baseline=exc.baseline.name, thread=threading.current_thread().name)
            raise
        note("resolve", t, op=problem.op, call_kind=problem.kind, dtype=str(problem.dtype).replace("torch.", ""),
             chosen=out["chosen"], full=full, thread=threading.current_thread().name)
        return out
    dispatch._explain_ranked = explain
    real_prepare = getattr(selection, "prepare", None)
    if real_prepare is not None:
        def prepare(*a, **kw):
            t = now(); out = real_prepare(*a, **kw); note("prepare-queued", t)
            return out
        selection.prepare = prepare
    t = now()
    summary = gpuparity.patch(model)
    note("patch", t, replaced=len(summary), left=len(getattr(summary, "left", [])))
    # the modules the patch left are not of this measurement; the swapped ones' first calls are
if args["compile"]:
    model = torch.compile(model)
setup = now()
model.train()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=device.type != "cuda",
                              fused=device.type == "cuda")
gen = torch.Generator().manual_seed(1)
ids = torch.randint(0, args["vocab"], (args["batch"], args["seq"]), generator=gen)
mask = torch.ones_like(ids)
mask[1:, args["seq"] // 2:] = 0
labels = ids.masked_fill(mask == 0, -100)
ids, mask, labels = ids.to(device), mask.to(device), labels.to(device)
if args["user_setup_s"]:
    time.sleep(args["user_setup_s"])   # a user's own setup (data loading), where the patch's work may overlap
note("user-setup", setup)
sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
losses = []
for i in range(args["steps"]):
    t = now()
    loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
    sync(); note("forward", t, step=i)
    t2 = now()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    sync(); note("backward+optimizer", t2, step=i)
    note("step", t, step=i)
    if args["compile"]:   # graphs dynamo compiled so far (a recompilation adds one)
        from torch._dynamo.utils import counters
        note("graphs", t, step=i, graphs=int(counters["stats"]["unique_graphs"]))
    losses.append(float(loss.detach()))
out = {"events": events, "losses": losses, "import_and_model_s": imported,
       "torch": torch.__version__, "transformers": transformers.__version__}
if args["compile"] and args["compile_times"]:
    from torch._dynamo.utils import compile_times
    out["compile_times"] = compile_times(repr="str")
if patched:
    from gpuparity.ops import kernel_analysis
    out["kernel_analysis"] = kernel_analysis.stats() if hasattr(kernel_analysis, "stats") else None
if patched:
    from gpuparity.checks import verdicts
    out["verdicts"] = sorted(verdicts.load(verdicts.cache_path(device)))
print("BREAKDOWN " + json.dumps(out))
'''


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--intermediate", type=int, default=None, help="MLP width (default 2.75 x hidden)")
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--vocab", type=int, default=1024)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="fp32", choices=("fp32", "bf16", "fp16"))
    p.add_argument("--probe", default="subprocess", choices=("subprocess", "inprocess", "auto"),
                   help="GPUPARITY_PROBE for the patched runs (subprocess: checks in the kept worker, as on a GPU)")
    p.add_argument("--refine", default="off", choices=("off", "background"),
                   help="GPUPARITY_PROBE_REFINE (off: the background timing does not compete with the steps)")
    p.add_argument("--user-setup-s", type=float, default=0.0,
                   help="seconds of the user's own setup after patch() and before the first step (a sleep)")
    p.add_argument("--late-import", action="store_true",
                   help="import gpuparity only after the model is built (by default a patched run imports it at "
                        "the top, beside torch, as a script does: on a GPU machine that starts the first-call worker)")
    p.add_argument("--compile", action="store_true",
                   help="wrap the model (patched or not) in torch.compile: the first step includes its compilation")
    p.add_argument("--first-calls", default=None, choices=("baseline", "wait"),
                   help="GPUPARITY_FIRST_CALLS for the patched runs (baseline: a first call runs on the op's baseline "
                        "while its verdict is pending; wait: it waits for it); unset: the code's default")
    p.add_argument("--repeats", type=int, default=2, help="runs of each variant, alternated")
    p.add_argument("--define", action="append", default=[], metavar="NAME:K=V[,K=V]",
                   help="a patched variant NAME run with these environment variables (list NAME in --variants)")
    p.add_argument("--fresh-inductor-cache", action="store_true",
                   help="an empty TORCHINDUCTOR_CACHE_DIR for every run (each compiled run cold)")
    p.add_argument("--compile-times", action="store_true", help="keep torch._dynamo's compile phases per run")
    p.add_argument("--budget-s", type=float, default=None,
                   help="start no run once the elapsed time plus the longest run so far would pass this")
    p.add_argument("--variants", default="unpatched,patched")
    p.add_argument("--src", default=SRC, help="PYTHONPATH for the child (another checkout's src to compare)")
    p.add_argument("--json", default=None, help="write every run's events here")
    p.add_argument("--timeout", type=float, default=600.0)
    return p.parse_args(argv)


def definitions(args):
    """--define NAME:K=V,K=V -> {NAME: {K: V}}; "patched" is the plain patched variant."""
    found = {"patched": {}}
    for text in args.define:
        name, _, pairs = text.partition(":")
        if not name or name == "unpatched" or not pairs:
            raise SystemExit(f"--define: expected NAME:K=V[,K=V] with NAME not 'unpatched', got {text!r}")
        env = {}
        for pair in pairs.split(","):
            key, eq, value = pair.partition("=")
            if not eq or not key:
                raise SystemExit(f"--define {name}: expected K=V, got {pair!r}")
            env[key] = value
        found[name] = env
    return found


def one(args, variant):
    spec = {k: getattr(args, k) for k in ("layers", "hidden", "heads", "kv_heads", "vocab", "seq", "batch", "steps",
                                           "device", "dtype", "user_setup_s", "late_import", "compile",
                                           "compile_times")}
    spec["intermediate"] = args.intermediate or int(args.hidden * 2.75)
    spec["variant"] = variant
    defined = definitions(args)
    if variant != "unpatched" and variant not in defined:
        raise SystemExit(f"variant {variant!r}: not 'unpatched', 'patched' or one named by --define")
    spec["patched"] = variant != "unpatched"
    with tempfile.TemporaryDirectory(prefix="gpuparity-first-steps-") as cache:
        env = {**os.environ, "GPUPARITY_CACHE_DIR": cache, "PYTHONPATH": args.src,
               "GPUPARITY_PROBE": args.probe, "GPUPARITY_PROBE_REFINE": args.refine}
        env.pop("GPUPARITY_TRUST_UNPROBED", None)
        env.pop("GPUPARITY_FIRST_CALLS", None)
        if args.first_calls:
            env["GPUPARITY_FIRST_CALLS"] = args.first_calls
        if args.fresh_inductor_cache:
            env["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(cache, "inductor")
        env.update(defined.get(variant, {}))
        started = time.perf_counter()
        proc = subprocess.run([sys.executable, "-c", CHILD, json.dumps(spec)], env=env, capture_output=True,
                              text=True, timeout=args.timeout)
        wall = time.perf_counter() - started
    lines = [line for line in proc.stdout.splitlines() if line.startswith("BREAKDOWN ")]
    if proc.returncode != 0 or not lines:
        return {"variant": variant, "error": proc.stderr.strip()[-3000:], "wall_s": wall}
    row = json.loads(lines[-1][len("BREAKDOWN "):])
    row.update(variant=variant, wall_s=wall, stderr=[x for x in proc.stderr.splitlines() if x.strip()][-20:])
    return row


def steps_s(row):
    return [e["s"] for e in row["events"] if e["what"] == "step"]


def describe(row):
    """The breakdown of one patched run, in lines."""
    ev = row["events"]
    lines = []
    first_step = next(e for e in ev if e["what"] == "step")
    patch = next((e for e in ev if e["what"] == "patch"), None)
    if patch:
        lines.append(f"  patch() {patch['s']:.2f} s at t={patch['start']:.2f}; first step starts t={first_step['start']:.2f}")
    for e in ev:
        if e["what"] == "worker-spawn":
            lines.append(f"  worker spawned at t={e['start']:.2f} (pid {e['pid']}, Popen {e['s']:.3f} s)")
        if e["what"] == "worker-ready":
            info = e.get("info") or {}
            spent = ", ".join(f"{k} {v:.2f} s" for k, v in (info.get("spent") or {}).items())
            lines.append(f"  worker pid {e['pid']} READY {e['s']:.2f} s after its spawn (t={e['start'] + e['s']:.2f})"
                         + (f"; set up {info.get('warm')}: {spent}" if info.get("warm") else ""))
        if e["what"] == "prepare-queued":
            lines.append(f"  prepare queued at t={e['start']:.2f} ({e['s']:.3f} s in the caller)")
    tasks = [e for e in ev if e["what"] == "task"]
    if tasks:
        first = tasks[0]
        rest = [t["s"] for t in tasks[1:]]
        lines.append(f"  {len(tasks)} worker tasks, {sum(t['s'] for t in tasks):.2f} s of round-trips; the first "
                     f"{first['s']:.2f} s (waits for the worker's imports), the others median "
                     f"{statistics.median(rest) if rest else 0:.3f} s")
    by_op = {}
    for t in tasks:
        by_op.setdefault((t["op"], t["backend"]), []).append(t["s"])
    for (op, backend), ss in by_op.items():
        lines.append(f"    {op} on {backend}: {len(ss)} checks, {sum(ss):.2f} s")
    for e in ev:
        where = {"gpuparity-prepare": "background (prepare)",
                 "gpuparity-first-call": "background (a first call's)"}.get(e.get("thread"), "caller")
        if e["what"] == "verify":
            lines.append(f"  verify {e['op']} ({e['call_kind']}, {e['dtype']}) on {e['backend']}: {e['s']:.2f} s "
                         f"at t={e['start']:.2f}, in the {where}")
        elif e["what"] == "known-issues":
            lines.append(f"    known-issue probes for {e['op']} {e['backends']}: {e['s']:.3f} s")
        elif e["what"] == "resolve" and e["s"] > 0.05:
            lines.append(f"  resolve {e['op']} ({e['call_kind']}) -> {e['chosen']}: {e['s']:.2f} s at t={e['start']:.2f}, "
                         f"in the {where}")
    pending = {}
    for e in ev:
        if e["what"] == "pending":
            pending.setdefault((e["op"], e["call_kind"], e["candidate"], e["baseline"]), []).append(e["start"])
    for (op, kind, candidate, baseline), starts in pending.items():
        lines.append(f"  {op} ({kind}) served by {baseline} while {candidate}'s verdict was pending: {len(starts)} "
                     f"resolution{'s' * (len(starts) != 1)}, t={min(starts):.2f}..{max(starts):.2f}")
    waited = sum(e["s"] for e in ev if e["what"] == "resolve" and not e.get("thread", "").startswith("gpuparity-"))
    lines.append(f"  the steps waited {waited:.2f} s in resolutions in all")
    graphs = [e["graphs"] for e in ev if e["what"] == "graphs"]
    if graphs:
        lines.append(f"  graphs dynamo compiled by the end of each step: {graphs}")
    for e in ev:
        if e["what"] in ("forward", "backward+optimizer"):
            lines.append(f"  step {e['step']} {e['what']}: {e['s']:.2f} s")
    return lines


PHASES = ("_compile.compile_inner", "bytecode_tracing", "aot_collect_metadata", "aot_trace_joint_graph",
          "compile_fx.<locals>.fw_compiler_base", "compile_fx.<locals>.bw_compiler", "async_compile.wait",
          "PyCodeCache.load_by_key_path")


def compile_phases(text):
    """The lines of torch._dynamo's compile_times table that say where a compile went (torch 2.11
    aligns its columns with spaces, 2.13 separates them with commas)."""
    rows = [line.replace(",", " ").split() for line in text.splitlines()]
    return ["  compile: " + " ".join(row) for row in rows if row and row[0] in PHASES]


def main(argv=None):
    args = parse_args(argv)
    variants = args.variants.split(",")
    print(f"load average before: {os.getloadavg()}; cores: {os.cpu_count()}", flush=True)
    for variant in variants:   # a misspelt variant fails here, before any run
        if variant != "unpatched" and variant not in definitions(args):
            raise SystemExit(f"variant {variant!r}: not 'unpatched', 'patched' or one named by --define")
    rows = []
    started, longest = time.perf_counter(), 0.0
    for repeat in range(args.repeats):
        for variant in (variants if repeat % 2 == 0 else variants[::-1]):
            if args.budget_s is not None and time.perf_counter() - started + longest > args.budget_s:
                print(f"{variant} repeat {repeat}: not run (--budget-s {args.budget_s:g} would be passed)", flush=True)
                continue
            row = one(args, variant)
            longest = max(longest, row["wall_s"])
            row["repeat"] = repeat
            rows.append(row)
            if "error" in row:
                print(f"{variant} repeat {repeat}: FAILED\n{row['error']}", flush=True)
                continue
            s = steps_s(row)
            print(f"{variant} repeat {repeat}: first {len(s)} steps {sum(s):.2f} s ({', '.join(f'{x:.2f}' for x in s)}); "
                  f"import + model {row['import_and_model_s']:.2f} s; stderr lines {len(row['stderr'])}", flush=True)
            if variant != "unpatched":
                print("\n".join(describe(row)), flush=True)
            if row.get("compile_times"):
                print("\n".join(compile_phases(row["compile_times"])), flush=True)
    print(f"load average after: {os.getloadavg()}")
    for variant in variants:
        totals = [sum(steps_s(r)) for r in rows if r["variant"] == variant and "error" not in r]
        if totals:
            later = [x for r in rows if r["variant"] == variant and "error" not in r for x in steps_s(r)[1:]]
            print(f"{variant}: first {args.steps} steps median {statistics.median(totals):.2f} s "
                  f"(min {min(totals):.2f}, max {max(totals):.2f}, {len(totals)} runs)"
                  + (f"; the steps after the first: median {1000 * statistics.median(later):.1f} ms" if later else ""))
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as handle:
            json.dump({"args": vars(args), "rows": rows}, handle, indent=1)


if __name__ == "__main__":
    main()
