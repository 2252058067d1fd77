"""pytest plugin for benchmarks/scripts/fa_own_tests.py: runs FlashAttention's own test files,
unmodified, against gpuparity.flash_attn.install(), and records every test's outcome.

Load it with `-p fa_own_tests_plugin` (this folder on PYTHONPATH). What it does:

* install(): `gpuparity.flash_attn.install()` in pytest_configure, before any test module is
  imported, so the files' `import flash_attn` / `from flash_attn... import` get gpuparity's.
* sampling: the parametrized cases of each test function are sampled deterministically (seeded
  by --fa-seed and the test's name): a greedy covering first (every value of every parameter
  appears in at least one selected case), then up to --fa-max-cases-per-test cases in all
  (the covering is kept whole even when it is larger). Covering cases of every test run before
  the extra ones, so a --fa-deadline that runs out cuts extras first.
* C++ internals: a test whose source calls FlashAttention's CUDA extension or its private
  wrappers (INTERNALS) is deselected and listed with the reason, an allowed skip.
* tests/layers/test_rotary.py imports transformers functions removed long ago; while that file
  is imported (and only then) the plugin supplies them in the transformers modules, written from
  the old transformers formulas (SUPPLIED), then restores the modules. They are listed in the
  results as "supplied by the harness".
* --fa-results FILE.json: per test case outcome (passed / failed / skipped with reason /
  not_run_budget), collection errors, sampling, deselected internals.
* --fa-backend NAME (default auto): gpuparity.flash_attn's backends (flash_attn_interface.backends())
  set to NAME for every op of it that has a backend so named, for the whole session, and recorded
  ("backends"). "triton" runs FlashAttention's tests on gpuparity's own Triton kernels by name:
  no first-call verification of each new (op, dtype, kind) (the battery's cases, each compiling
  its Triton specialisations), no background timing of the other backends competing for the GPU,
  and no call handed by auto to torch's SDPA kernels (which FlashAttention's tests would then be
  checking instead of gpuparity's).
* --fa-select FILE: run only the node ids listed in FILE (one a line), in that order (fa_own_tests.py's
  shards of a file, from its collection's sample): the sampling is not redone, the listed cases
  are kept where pytest makes them; a listed id not collected is recorded in "select_missing". Every selected case's parameters (repr of each value) are recorded in
  "params", which the driver's sharding groups on.
* --fa-assume-capability MAJOR.MINOR: only where CUDA is absent (the CPU plumbing check with
  --collect-only), torch.cuda.get_device_capability returns it, since the files call it at import.
"""
from __future__ import annotations

import contextlib
import inspect
import json
import os
import random
import re
import sys
import time
import zlib
from typing import Any, Dict, Hashable, List, Optional, Sequence, Tuple

import pytest

INTERNALS = re.compile(r"\b(flash_attn_gpu|flash_attn_2_cuda|flash_attn_cuda|_flash_attn_(?:varlen_)?(?:forward|backward)"
                       r"|_wrapped_flash_attn_\w+|flash_attn_with_kvcache_cuda)\b")
BUDGET_REASON = "fa_own_tests harness: time budget exhausted before this case"

_backends = contextlib.ExitStack()   # the session's backends() (--fa-backend)
_state: Dict[str, Any] = {"tests": {}, "collect_errors": [], "sampling": {}, "deselected_internals": [],
                          "supplied_by_harness": [], "install": None, "assumed_capability": None}


# ---------------------------------------------------------------- covering sampler (pure, tested)

def covering_sample(cases: Sequence[Dict[str, Hashable]], max_cases: int, seed: int) -> Tuple[List[int], int]:
    """Indices of `cases` (each a dict parameter -> value key) to run: a greedy covering, in which
    every (parameter, value) pair that occurs in `cases` occurs in a selected case, then more
    cases in a seeded order up to max_cases in all. Returns (indices, size of the covering).
    Deterministic for a given seed; the covering is kept whole when larger than max_cases."""
    if max_cases < 0:
        raise ValueError(f"max_cases: expected >= 0, got {max_cases!r}")
    order = list(range(len(cases)))
    random.Random(seed).shuffle(order)
    pairs = [set(case.items()) for case in cases]
    uncovered = set().union(*pairs) if pairs else set()
    chosen: List[int] = []
    taken = set()
    while uncovered:
        best, gain = -1, 0
        most = len({arg for arg, _ in uncovered})     # no case covers more than one value per parameter
        for i in order:
            if i in taken:
                continue
            g = len(pairs[i] & uncovered)
            if g > gain:
                best, gain = i, g
                if g == most:
                    break
        chosen.append(best)
        taken.add(best)
        uncovered -= pairs[best]
    cover = len(chosen)
    for i in order:
        if len(chosen) >= max_cases:
            break
        if i not in taken:
            chosen.append(i)
            taken.add(i)
    return chosen, cover


def _seed_for(seed: int, name: str) -> int:
    return seed * 1_000_003 + zlib.crc32(name.encode())


# ---------------------------------------------------------------- transformers functions removed long ago

def _neox_rotary_embedding():
    import torch

    class RotaryEmbedding(torch.nn.Module):
        """GPT-NeoX's rotary cache as old transformers had it (modeling_gpt_neox.RotaryEmbedding):
        inv_freq = 1 / base^(2i/dim) in fp32, emb = cat(freqs, freqs); forward returns the
        [1, 1, seq, dim] cos and sin caches (old transformers sliced dim 0, so the whole cache)."""

        def __init__(self, dim, max_position_embeddings, base=10000, device=None):
            super().__init__()
            inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2).float().to(device) / dim))
            self.register_buffer("inv_freq", inv_freq)
            self._build(max_position_embeddings)

        def _build(self, seq_len):
            self.max_seq_len_cached = seq_len
            t = torch.arange(seq_len, device=self.inv_freq.device, dtype=self.inv_freq.dtype)
            freqs = torch.einsum("i,j->ij", t, self.inv_freq)
            emb = torch.cat((freqs, freqs), dim=-1)
            self.cos_cached = emb.cos()[None, None, :, :]
            self.sin_cached = emb.sin()[None, None, :, :]

        def forward(self, x, seq_len=None):
            if seq_len is not None and seq_len > self.max_seq_len_cached:
                self._build(seq_len)
            return self.cos_cached[:seq_len, ...].to(x.device), self.sin_cached[:seq_len, ...].to(x.device)

    return RotaryEmbedding


def _neox_rotate_half(x):
    import torch
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def neox_apply_rotary_pos_emb(q, k, cos, sin, offset: int = 0):
    """Old transformers' gpt_neox apply_rotary_pos_emb(q, k, cos, sin, offset): the cache rows
    offset .. offset + seq, rotate_half of the halves."""
    cos = cos[..., offset:q.shape[-2] + offset, :]
    sin = sin[..., offset:q.shape[-2] + offset, :]
    return (q * cos) + (_neox_rotate_half(q) * sin), (k * cos) + (_neox_rotate_half(k) * sin)


def gptj_fixed_pos_embedding(x, seq_dim=1, seq_len=None):
    """Old transformers' gptj fixed_pos_embedding: (sin, cos) of position * 1 / 10000^(2i/dim), fp32."""
    import torch
    dim = x.shape[-1]
    if seq_len is None:
        seq_len = x.shape[seq_dim]
    inv_freq = 1.0 / (10000 ** (torch.arange(0, dim, 2) / dim))
    sinusoid = torch.einsum("i , j -> i j", torch.arange(seq_len, dtype=torch.float), inv_freq).to(x.device).float()
    return torch.sin(sinusoid), torch.cos(sinusoid)


def _gptj_rotate_every_two(x):
    import torch
    return torch.stack((-x[:, :, :, 1::2], x[:, :, :, ::2]), dim=-1).flatten(-2)


def _duplicate_interleave(m):
    return m.reshape(-1, 1).repeat(1, 2).reshape(m.shape[0], -1)


def gptj_apply_rotary_pos_emb(x, sincos, offset=0):
    """Old transformers' gptj apply_rotary_pos_emb(x, sincos, offset) on x [batch, seq, heads, dim]:
    sin and cos rows offset .. offset + seq, each value repeated for its pair, rotate_every_two."""
    sin, cos = (_duplicate_interleave(t)[None, offset:x.shape[1] + offset, None, :] for t in sincos)
    return (x * cos) + (_gptj_rotate_every_two(x) * sin)

SUPPLIED = (
    ("transformers.models.gpt_neox.modeling_gpt_neox", "RotaryEmbedding", _neox_rotary_embedding,
     "old transformers' GPT-NeoX RotaryEmbedding(dim, max_position_embeddings, base, device); absent in transformers 5"),
    ("transformers.models.gpt_neox.modeling_gpt_neox", "apply_rotary_pos_emb", lambda: neox_apply_rotary_pos_emb,
     "old signature (q, k, cos, sin, offset=0); transformers 5 has (q, k, cos, sin, unsqueeze_dim) without offset"),
    ("transformers.models.gptj.modeling_gptj", "fixed_pos_embedding", lambda: gptj_fixed_pos_embedding,
     "old transformers' GPT-J fixed_pos_embedding(x, seq_dim, seq_len); absent in transformers 5"),
    ("transformers.models.gptj.modeling_gptj", "apply_rotary_pos_emb", lambda: gptj_apply_rotary_pos_emb,
     "old signature (x, sincos, offset=0); transformers 5 has (tensor, sin, cos)"),
)
SUPPLIED_FOR = ("layers", "test_rotary.py")     # the file (folder, name) that needs them


def _supply_old_transformers() -> List[Tuple[Any, str, Any]]:
    """Put SUPPLIED into the transformers modules; returns what to restore."""
    import importlib
    saved = []
    for module_name, attr, make, why in SUPPLIED:
        module = importlib.import_module(module_name)
        missing = object()
        saved.append((module, attr, getattr(module, attr, missing)))
        setattr(module, attr, make())
        entry = {"name": f"{module_name}.{attr}", "why": why, "for": "/".join(SUPPLIED_FOR)}
        if entry not in _state["supplied_by_harness"]:
            _state["supplied_by_harness"].append(entry)
    return saved


def _restore(saved) -> None:
    for module, attr, old in reversed(saved):
        if old.__class__ is object:
            delattr(module, attr)
        else:
            setattr(module, attr, old)


# ---------------------------------------------------------------- pytest hooks

def pytest_addoption(parser):
    group = parser.getgroup("fa_own_tests")
    group.addoption("--fa-max-cases-per-test", type=int, default=16,
                    help="cases per test function after the covering (which is kept whole); default 16")
    group.addoption("--fa-seed", type=int, default=0, help="sampling seed; default 0")
    group.addoption("--fa-deadline", type=float, default=0.0,
                    help="epoch seconds after which remaining cases are skipped as not_run_budget")
    group.addoption("--fa-results", default=None, help="write the JSON record here")
    group.addoption("--fa-select", default=None,
                    help="file of node ids (one a line): run only these among the sampled cases")
    group.addoption("--fa-assume-capability", default=None,
                    help="MAJOR.MINOR returned by torch.cuda.get_device_capability where CUDA is absent")
    group.addoption("--fa-backend", default="auto",
                    help="gpuparity backend name for every flash_attn op that has one (default auto)")


# flash_attn_interface._BACKENDS' keys -> the gpuparity op whose backends they name
BACKEND_OPS = {"attention": "attention", "attention_varlen": "attention_varlen", "attention_decode": "attention_decode",
               "rotary": "rotary", "cross_entropy": "linear_cross_entropy", "residual_norm": "residual_norm"}


def backend_names(name: str) -> Dict[str, str]:
    """The backends() keyword arguments that name `name` wherever the op has such a backend ("auto":
    none); a name no op has is an error."""
    if name == "auto":
        return {}
    from gpuparity import dispatch
    names = {key: name for key, op in BACKEND_OPS.items() if name in {b.name for b in dispatch.backends(op)}}
    if not names:
        raise pytest.UsageError(f"--fa-backend: no gpuparity.flash_attn op has a backend named {name!r}")
    return names


def _reset() -> None:
    _state.update({"tests": {}, "collect_errors": [], "sampling": {}, "deselected_internals": [],
                   "supplied_by_harness": [], "install": None, "assumed_capability": None})
    for key in ("selected", "params", "select_missing"):
        _state.pop(key, None)
    _covering_ids.clear()
    _select.clear()


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    _reset()
    _config[0] = config
    cap = config.getoption("--fa-assume-capability")
    if cap:
        import torch
        if not torch.cuda.is_available():
            major, minor = (int(p) for p in cap.split("."))
            torch.cuda.get_device_capability = lambda device=None: (major, minor)
            _state["assumed_capability"] = [major, minor]
    import gpuparity.flash_attn as ours
    try:
        ours.install()
        _state["install"] = {"forced": False}
    except RuntimeError as exc:     # a real flash_attn is installed: replace it for this process
        ours.install(force=True)
        _state["install"] = {"forced": True, "why": str(exc)}
    _state["install"]["flash_attn"] = getattr(sys.modules["flash_attn"], "__name__", None)
    _state["install"]["version"] = getattr(sys.modules["flash_attn"], "__version__", None)
    _backends.enter_context(ours.backends(**backend_names(config.getoption("--fa-backend"))))
    _state["backends"] = dict(ours.flash_attn_interface._BACKENDS)


def pytest_unconfigure(config):
    _backends.close()


def _needs_supply(collector) -> bool:
    path = getattr(collector, "path", None)
    return (isinstance(collector, pytest.Module) and path is not None
            and (path.parent.name, path.name) == SUPPLIED_FOR)


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    saved = _supply_old_transformers() if _needs_supply(collector) else None
    try:
        yield
    finally:
        if saved is not None:
            _restore(saved)


def pytest_collectreport(report):
    if report.failed:
        _state["collect_errors"].append({"nodeid": report.nodeid, "error": _text(report.longrepr, 4000)})


def _internals_used(function) -> List[str]:
    try:
        source = inspect.getsource(function)
    except (OSError, TypeError):
        return []
    return sorted(set(INTERNALS.findall(source)))


def _test_name(node) -> str:
    return f"{node.nodeid.split('::')[0]}::{getattr(node, 'originalname', node.name)}"


@pytest.hookimpl(hookwrapper=True)
def pytest_generate_tests(metafunc):
    """Samples the cases right where pytest has made them from the parametrize marks (its own
    pytest_generate_tests runs inside this wrapper), so the unselected ones never become items:
    test_flash_attn.py's full grid takes minutes to collect."""
    yield
    if not hasattr(metafunc, "_calls"):     # pytest's own list of cases, there since pytest 2
        raise pytest.UsageError("fa_own_tests_plugin: this pytest's Metafunc has no _calls, so the cases "
                                "cannot be sampled before they become items (the full grids take minutes)")
    calls = metafunc._calls
    name = _test_name(metafunc.definition)
    used = _internals_used(metafunc.function)
    if used:
        _state["deselected_internals"].append({
            "test": name, "calls": used, "cases": max(1, len(calls or ())),
            "reason": "calls FlashAttention's C++ extension / private wrappers (" + ", ".join(used)
                      + "), which gpuparity does not provide: allowed skip"})
        if calls:
            metafunc._calls = calls[:1]     # deselected in pytest_collection_modifyitems
        return
    if not calls:
        return
    config = metafunc.config
    wanted = _select_ids(config)
    if wanted is not None:     # a shard: the driver's collection sampled; only its ids here (no covering to redo)
        ids = wanted.get(metafunc.definition.nodeid, set())
        metafunc._calls = [call for call in calls if call.id in ids] or calls[:1]    # calls[:1]: deselected later
        return
    keys = [{arg: repr(value) for arg, value in call.params.items()} for call in calls]
    picked, cover = covering_sample(keys, config.getoption("--fa-max-cases-per-test"),
                                    _seed_for(config.getoption("--fa-seed"), name))
    metafunc._calls = [calls[i] for i in picked]
    _covering_ids[name] = {calls[i].id for i in picked[:cover]}
    values: Dict[str, set] = {}
    for key in keys:
        for arg, value in key.items():
            values.setdefault(arg, set()).add(value)
    _state["sampling"][name] = {"cases": len(calls), "covering": cover, "selected": len(picked),
                                "values": {arg: len(v) for arg, v in values.items()}}


_covering_ids: Dict[str, set] = {}
_select: Dict[str, Any] = {}     # --fa-select's file, read once: "order" (node ids) and "ids" (test -> call ids)


def _select_ids(config) -> Optional[Dict[str, set]]:
    path = config.getoption("--fa-select")
    if not path:
        return None
    if _select.get("path") != path:
        with open(path) as f:
            order = [line.rstrip("\n") for line in f if line.strip()]
        ids: Dict[str, set] = {}
        for nodeid in order:
            name, _, rest = nodeid.partition("[")
            if rest:
                ids.setdefault(name, set()).add(rest[:-1])
        _select.update(path=path, order=order, ids=ids)
    return _select["ids"]
_config: List[Any] = [None]     # the session's config, for _dump after each case


def pytest_collection_modifyitems(session, config, items):
    """Deselects the tests that call C++ internals; runs every test's covering cases first, then
    the extra cases round-robin over the tests (a deadline that runs out cuts extras first)."""
    internal = {d["test"] for d in _state["deselected_internals"]}
    deselected = [item for item in items if _test_name(item) in internal]
    covering, extras = [], {}
    for item in items:
        name = _test_name(item)
        if name in internal:
            continue
        callspec = getattr(item, "callspec", None)
        if callspec is None or callspec.id in _covering_ids.get(name, ()):
            covering.append(item)
        else:
            extras.setdefault(name, []).append(item)
    rounds = []
    for k in range(max((len(e) for e in extras.values()), default=0)):
        rounds.extend(e[k] for e in extras.values() if k < len(e))
    items[:] = covering + rounds
    if _select_ids(config) is not None:      # a shard: its ids, in the order listed
        position = {nodeid: k for k, nodeid in enumerate(_select["order"])}
        deselected += [item for item in items if item.nodeid not in position]
        items[:] = sorted((item for item in items if item.nodeid in position), key=lambda item: position[item.nodeid])
        _state["select_missing"] = sorted(set(position) - {item.nodeid for item in items})
    if deselected:
        config.hook.pytest_deselected(items=deselected)
    _state["selected"] = [item.nodeid for item in items]
    _state["params"] = {item.nodeid: {arg: repr(value) for arg, value in item.callspec.params.items()}
                        for item in items if getattr(item, "callspec", None) is not None}


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    deadline = item.config.getoption("--fa-deadline")
    if deadline and time.time() > deadline:
        pytest.skip(BUDGET_REASON)


def _text(longrepr, limit: int) -> str:
    if longrepr is None:
        return ""
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2])
    text = str(longrepr)
    return text if len(text) <= limit else text[:limit // 4] + "\n...\n" + text[-3 * limit // 4:]


def _first_error_line(text: str) -> str:
    for line in text.splitlines():
        if line.startswith("E "):
            return line[1:].strip()[:300]
    lines = [l for l in text.splitlines() if l.strip()]
    return lines[-1][:300] if lines else ""


def pytest_runtest_logreport(report):
    _record(report)
    if report.when == "teardown" and _config[0] is not None:
        _dump(_config[0])


def _record(report) -> None:
    rec = _state["tests"].setdefault(report.nodeid, {"outcome": None, "duration_s": 0.0})
    rec["duration_s"] = round(rec["duration_s"] + report.duration, 4)
    if report.skipped:
        reason = _text(report.longrepr, 1000)
        if hasattr(report, "wasxfail"):
            rec["outcome"], rec["reason"] = "xfailed", report.wasxfail
        elif BUDGET_REASON in reason:
            rec["outcome"], rec["reason"] = "not_run_budget", BUDGET_REASON
        else:
            rec["outcome"], rec["reason"] = "skipped", reason.removeprefix("Skipped: ")
    elif report.failed:
        text = _text(report.longrepr, 6000)
        if rec["outcome"] != "failed":
            rec["outcome"] = "failed" if report.when == "call" else f"error_{report.when}"
            rec["message"] = _first_error_line(text)
            rec["longrepr"] = text
    elif report.when == "call" and rec["outcome"] is None:
        rec["outcome"] = "xpassed" if hasattr(report, "wasxfail") else "passed"


def _dump(config, exitstatus: Optional[int] = None) -> None:
    """Write the record (atomically): after collection, after every case and at the end, so a run
    killed past its budget keeps what it had done."""
    path = config.getoption("--fa-results")
    if not path:
        return
    out = dict(_state)
    out["exitstatus"] = exitstatus
    out["collect_only"] = bool(config.getoption("collectonly"))
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path + ".tmp", "w") as f:
        json.dump(out, f, indent=1, default=str)
    os.replace(path + ".tmp", path)


def pytest_collection_finish(session):
    _dump(session.config)


def pytest_sessionfinish(session, exitstatus):
    _dump(session.config, int(exitstatus))
