"""The checking worker starts ahead of the first calls only when asked: `gpuparity.prepare()` (and
`gpuparity.patch`, which calls it) starts it without initializing CUDA, never an import
(tests/test_architecture.py: importing gpuparity and its ops starts no process); and it is started
again when the caller changes what a worker reads once at its start (fp32 switches, visible devices)."""
from __future__ import annotations

import subprocess
import sys

from gpuparity.checks import selection
from test_architecture import IMPORT_EVERY_OP, processes_started_by


def test_prepare_starts_the_worker_that_the_import_did_not_and_leaves_cuda_alone():
    # a CUDA torch on a GPU machine, checks in workers (the conditions that started it at import before)
    after = ("import time\nfrom gpuparity.checks import selection\n"
             "print('kept before', 'verify' in selection._POOLS)\n"
             "started = time.monotonic()\nqueued = gpuparity.prepare()\ntook = time.monotonic() - started\n"
             "pool = selection._POOLS['verify'][1]\nready = pool.wait_ready(120)\n"
             "print('queued', queued, 'ready', ready, 'alive', pool.proc.poll() is None, 'children', len(children()),"
             " 'cuda initialized', torch.cuda.is_initialized(), 'took', round(took, 2))\n")
    count, lines = processes_started_by(IMPORT_EVERY_OP, after=after)
    assert count == 0 and lines[0] == "kept before False", lines
    words = lines[1].split()
    assert words[:11] == ["queued", "0", "ready", "True", "alive", "True", "children", "1",
                          "cuda", "initialized", "False"], lines
    assert float(words[12]) < 5.0, lines    # prepare only spawns it


def test_a_kept_worker_restarts_when_the_visible_devices_change(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    first = selection._pool("test-prestart")
    assert selection._pool("test-prestart") is first
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    second = selection._pool("test-prestart")
    assert second is not first
    with selection._POOLS_LOCK:
        selection._POOLS.pop("test-prestart", None)


def test_the_worker_imports_what_a_first_backward_would_before_it_is_ready():
    """The worker's start includes torch's symbolic-shapes module (and sympy with it), which torch
    2.11's autograd imports at its first backward on a GPU: 3.8 s of a first check's 5 s on the
    H100 test machine. A fresh interpreter, so that nothing imported it before."""
    script = ("import sys\nfrom gpuparity.checks import worker\n"
              "before = 'torch.fx.experimental.symbolic_shapes' in sys.modules\n"
              "worker._preimport_autograd_helpers()\n"
              "print(before, 'torch.fx.experimental.symbolic_shapes' in sys.modules)\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["False", "True"], proc.stdout
