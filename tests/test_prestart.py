"""The first-call worker starts at `import gpuparity` beside a torch program on a GPU machine
(decided from the device files, without initializing CUDA), and is started again when the
caller changes what a worker reads once at its start (fp32 switches, visible devices)."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import gpuparity
from gpuparity.checks import selection


class _Version:
    def __init__(self, cuda=None, hip=None):
        self.cuda, self.hip = cuda, hip


class _Torch:
    def __init__(self, **builds):
        self.version = _Version(**builds)


def test_the_import_starts_a_worker_only_beside_torch_on_a_gpu_machine():
    wants = gpuparity._wants_prestart
    gpu_files = lambda path: True        # noqa: E731
    no_files = lambda path: False        # noqa: E731
    cuda, rocm, cpu = _Torch(cuda="13.0"), _Torch(hip="7.1"), _Torch()
    assert wants({}, {"torch": cuda}, gpu_files)
    assert wants({}, {"torch": rocm}, lambda path: path == "/dev/kfd")
    assert not wants({}, {"torch": rocm}, lambda path: path == "/dev/nvidiactl")   # the other vendor's node
    assert not wants({}, {"torch": cuda}, no_files)                               # a CUDA build, no GPU
    assert not wants({}, {"torch": cpu}, gpu_files)                               # a CPU build
    assert not wants({}, {}, gpu_files)                                           # no torch program yet (the CLI)
    assert not wants({gpuparity.PRESTART: "0"}, {"torch": cuda}, gpu_files)       # turned off
    assert not wants({gpuparity.PRESTART: "off"}, {"torch": cuda}, gpu_files)
    assert not wants({"GPUPARITY_PARENT_PID": "1"}, {"torch": cuda}, gpu_files)   # gpuparity's own child


SCRIPT = textwrap.dedent("""
    import os, time, torch
    torch.version.cuda = "13.0"                        # a CUDA build ...
    real_exists = os.path.exists
    os.path.exists = lambda p: p == "/dev/nvidiactl" or real_exists(p)   # ... on a GPU machine
    started = time.monotonic()
    import gpuparity
    took = time.monotonic() - started
    os.path.exists = real_exists
    from gpuparity.checks import selection
    pool = selection._POOLS["verify"][1]
    ready = pool.wait_ready(120)
    print("import s", round(took, 2), "ready", ready, "alive", pool.proc.poll() is None,   # READY, not an exit
          "cuda initialized", torch.cuda.is_initialized())
""")


def test_a_worker_started_at_import_is_ready_and_cuda_is_left_alone():
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=180,
                          env={**__import__("os").environ, "GPUPARITY_PROBE": "subprocess"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    line = proc.stdout.strip().splitlines()[-1]
    assert "ready True alive True cuda initialized False" in line, line
    assert float(line.split()[2]) < 5.0, line    # the import only spawns it


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
