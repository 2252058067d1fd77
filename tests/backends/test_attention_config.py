"""Choices the attention launcher makes without running a kernel: the fp32 dot on NVIDIA, which
runtime ints Triton specializes on, and that the package imports (and says why) without triton."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from gpuparity.backends import triton_attention as ta
from gpuparity.backends.triton_attention import launch

triton = pytest.importorskip("triton")


@pytest.fixture
def fresh_choice(monkeypatch):
    # the cache strict_fp32_dot reads lives in launch.py (the package only re-exports functions)
    monkeypatch.setattr(launch, "_STRICT_DOT", [])
    yield
    launch._STRICT_DOT.clear()


def test_strict_fp32_dot_defaults_to_split_tf32_where_triton_has_it(monkeypatch, fresh_choice):
    monkeypatch.delenv("GPUPARITY_FP32_DOT", raising=False)
    from triton.backends.nvidia.compiler import CUDAOptions
    expected = "tf32x3" if "tf32x3" in CUDAOptions.allowed_dot_input_precisions else "ieee"
    assert ta.strict_fp32_dot() == expected


def test_strict_fp32_dot_can_be_asked_for_fma(monkeypatch, fresh_choice):
    monkeypatch.setenv("GPUPARITY_FP32_DOT", "ieee")
    assert ta.strict_fp32_dot() == "ieee"


def test_strict_fp32_dot_rejects_unknown_values(monkeypatch, fresh_choice):
    monkeypatch.setenv("GPUPARITY_FP32_DOT", "fp64")
    with pytest.raises(ValueError, match="GPUPARITY_FP32_DOT.*ieee or tf32x3.*'fp64'"):
        ta.strict_fp32_dot()


def test_fp32_dot_follows_torchs_tf32_switch_on_nvidia(monkeypatch, fresh_choice):
    monkeypatch.delenv("GPUPARITY_FP32_DOT", raising=False)
    monkeypatch.setattr(ta.triton_common, "interpreting", lambda: False)
    monkeypatch.setattr(ta.triton_common, "vendor", lambda: "nvidia")
    assert torch.backends.cuda.matmul.allow_tf32 is False  # torch's default
    monkeypatch.setattr(torch, "get_float32_matmul_precision", lambda: "highest")
    assert ta.dot_precision(torch.float32) == ta.strict_fp32_dot()
    assert ta.dot_precision(torch.bfloat16) == "ieee"            # 16-bit inputs: the flag is ignored
    monkeypatch.setattr(torch, "get_float32_matmul_precision", lambda: "high")
    assert ta.dot_precision(torch.float32) == "tf32"
    monkeypatch.setattr(ta.triton_common, "vendor", lambda: "amd")
    assert ta.dot_precision(torch.float32) == "ieee"             # AMD's Triton: FMA dots only


def test_lengths_and_seed_are_not_specialized_but_strides_are():
    # The kernels as Triton compiles them: in a process without the interpreter (the test run
    # sets TRITON_INTERPRET=1, whose kernel objects keep no parameter table).
    code = ("import json; from gpuparity.backends import triton_attention as ta; "
            "print(json.dumps({n: {p.name: p.do_not_specialize for p in k.params} for n, k in ta.kernel_table().items()}))")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    params = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(params) == {"fwd", "dq", "dkdv", "dkdv_tma", "bwd", "dropout_mask"}
    for name, table in params.items():
        if name == "dropout_mask":   # (Keep, dropout_p, seed, q_len, k_len): one compile for every shape and seed
            assert all(table[arg] is True for arg in ("seed", "q_len", "k_len")), table
            continue
        for arg in ("q_len", "k_len", "seed", "num_heads"):
            assert table[arg] is True, (name, arg)
        assert table["stride_qm"] is False and table["group_size"] is False
        if name == "bwd":   # the one-launch backward: its split point between dq and dk/dv programs too
            assert table["q_blocks"] is True
        if name == "dkdv_tma":   # the descriptors' row origins (batch * rb + head * rh) are lengths
            assert table["q_rb"] is True and table["k_rh"] is True and table["QDesc"] is False


def test_package_imports_without_triton_and_the_backend_says_why():
    # sys.modules["triton"] = None makes every `import triton` fail, as on a machine without it:
    # the package must still import (kernels.py, which imports triton, only loads on launch)
    code = ("import sys; sys.modules['triton'] = None\n"
            "import gpuparity.backends.triton_attention as ta\n"
            "from gpuparity import dispatch\n"
            "assert 'gpuparity.backends.triton_attention.kernels' not in sys.modules\n"
            "print('REASON', dispatch.get('attention', 'triton').unavailable_reason())\n"
            "try:\n"
            "    ta.kernel_table()\n"
            "except ImportError as exc:\n"
            "    print('LAUNCH', type(exc).__name__)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = dict(line.split(" ", 1) for line in proc.stdout.splitlines() if line.startswith(("REASON", "LAUNCH")))
    assert lines["REASON"].startswith("triton: not importable (ModuleNotFoundError"), lines
    assert lines["LAUNCH"] == "ModuleNotFoundError", lines


def test_package_import_leaves_the_kernels_module_unloaded_and_launch_loads_it():
    code = ("import sys, gpuparity.backends.triton_attention as ta\n"
            "names = ['gpuparity.backends.triton_attention.kernels', 'gpuparity.backends.triton_attention.backward_kernels']\n"
            "print(any(n in sys.modules for n in names), sorted(ta.kernel_table()), all(n in sys.modules for n in names))")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == "False ['bwd', 'dkdv', 'dkdv_tma', 'dq', 'dropout_mask', 'fwd'] True"
