"""The probes themselves: they run where they can, say "cannot tell" where they cannot, and
catch the bug they are for when it is planted."""
import json
import types

import pytest
import torch
import torch.nn.functional as F

from gpuparity.isolate import call_isolated
from gpuparity.known import probes


def check_shape(result):
    assert set(result) >= {"failed", "detail"}
    assert result["failed"] in (True, False, None)
    assert result["detail"]
    json.dumps(result)  # crosses the process boundary as JSON
    return result


@pytest.mark.parametrize("name, kwargs", [
    ("sdpa_fullmask_nan", {}), ("norm_weight_grads", {}), ("softmax_fp64_odd", {}), ("gemm_large_m", {}),
    ("conv2d_vs_fp64", {}), ("conv_train_step", {}), ("layer_norm_huge_rows", {"rows": 2 ** 12 + 8}),
])
def test_cpu_capable_probes_pass_on_the_cpu(name, kwargs):
    result = check_shape(getattr(probes, name)(device="cpu", **kwargs))
    assert result["failed"] is False, result["detail"]


def test_checkpoint_probe_reports_the_forward_only_pattern_as_torch_behaviour():
    result = check_shape(probes.checkpoint_masked_attention(device="cpu"))
    assert result["failed"] is None
    assert "Recomputed values" in result["detail"]


GPU_ONLY = ["sdpa_mask_dtype", "sdpa_cudnn", "sdpa_cudnn_gqa", "sdpa_eff_stride0", "sdpa_maskgrad", "sdpa_fused_vs_fp64",
            "sdpa_aotriton_rdna35", "sdpa_fused_launch", "sdpa_flash_alone", "tf32_defaults", "xf32_high_precision",
            "gemm_2gib_tail", "bf16_emulated", "det_cublas_workspace", "gemv_twice_bitwise", "flex_attention_twice",
            "arch_smoke", "apu_memory", "numa_spill", "sdpa_cudnn_mask_lse", "sdpa_cudnn_sq1_lse", "sdpa_noncontig_v",
            "sdpa_fp32_lse_race", "sdpa_misaligned", "sdpa_misaligned_silent", "gemm_small_dim_fp32", "gemm_transposed_fp32", "layer_norm_2pow32", "cumsum_2pow32",
            "gemm_4gib_tail", "gemm_huge_m", "triton_buffer_ops_2gib", "sdpa_long_mask"]


@pytest.mark.parametrize("name", GPU_ONLY)
def test_gpu_probes_cannot_tell_on_a_cpu(name):
    result = check_shape(getattr(probes, name)(device="cpu"))
    assert result["failed"] is None and "needs a GPU device" in result["detail"]


@pytest.mark.parametrize("name", ["sdpa_mask_dtype", "sdpa_cudnn", "sdpa_eff_stride0", "sdpa_maskgrad",
                                  "sdpa_fused_vs_fp64", "sdpa_fused_launch", "sdpa_flash_alone", "tf32_defaults",
                                  "xf32_high_precision", "det_cublas_workspace", "gemv_twice_bitwise",
                                  "sdpa_cudnn_mask_lse", "sdpa_cudnn_sq1_lse", "sdpa_noncontig_v", "sdpa_misaligned",
                                  "sdpa_misaligned_silent",
                                  "gemm_small_dim_fp32", "gemm_transposed_fp32"])
def test_gpu_probe_code_runs_on_cpu_tensors(name, monkeypatch):
    # No GPU here: let the GPU probes run on CPU tensors so their code paths are exercised; a
    # backend the CPU lacks must come back as "cannot tell", never as an exception.
    monkeypatch.setattr(probes.base, "needs_gpu", lambda dev: None)
    result = check_shape(getattr(probes, name)(device="cpu"))
    assert result["failed"] in (False, None), result["detail"]


def test_sdpa_mask_probe_catches_an_ignored_mask(monkeypatch):
    # The planted bug of user story 1: the "efficient" backend that ignores the mask.
    monkeypatch.setattr(probes.attention, "run_sdpa", lambda backend, q, k, v, **kwargs: F.scaled_dot_product_attention(q, k, v))
    result = check_shape(probes.sdpa_mask_rocm(device="cpu"))
    assert result["failed"] is True
    assert "relative error" in result["detail"]


def test_sdpa_mask_probe_passes_a_correct_kernel(monkeypatch):
    def math_backend(backend, q, k, v, **kwargs):
        return F.scaled_dot_product_attention(q, k, v, **kwargs)
    monkeypatch.setattr(probes.attention, "run_sdpa", math_backend)
    assert check_shape(probes.sdpa_mask_rocm(device="cpu"))["failed"] is False


def test_fullmask_probe_catches_nan_rows(monkeypatch):
    def naive(backend, q, k, v, attn_mask=None, **kwargs):
        scores = (q @ k.transpose(-2, -1)).masked_fill(~attn_mask, float("-inf"))
        return torch.softmax(scores, dim=-1) @ v  # NaN on a row with no key
    monkeypatch.setattr(probes.attention, "run_sdpa", naive)
    result = check_shape(probes.sdpa_fullmask_nan(device="cpu"))
    assert result["failed"] is True and "NaN in the output and gradients" in result["detail"]


def test_norm_probe_catches_a_wrong_weight_gradient(monkeypatch):
    # The wave32 bug: forward right, weight gradient wrong. Halve the gradient that reaches weight.
    def layer_norm(x, shape, weight, bias, eps=1e-5):
        return F.layer_norm(x, shape, weight.detach() + 0.5 * (weight - weight.detach()), bias, eps)
    monkeypatch.setattr(probes.numerics, "F", types.SimpleNamespace(layer_norm=layer_norm, rms_norm=F.rms_norm))
    result = check_shape(probes.norm_weight_grads(device="cpu"))
    assert result["failed"] is True and "layer_norm dweight" in result["detail"]


def test_hsa_override_against_the_hardware(tmp_path, monkeypatch):
    def topology(*targets):
        for index, target in enumerate([0] + list(targets)):  # node 0 is the CPU
            node = tmp_path / "nodes" / str(index)
            node.mkdir(parents=True, exist_ok=True)
            (node / "properties").write_text(f"cpu_cores_count 8\ngfx_target_version {target}\n")
        return str(tmp_path / "nodes")

    root = topology(100300)  # an RX 6800 XT: gfx1030
    monkeypatch.delenv("HSA_OVERRIDE_GFX_VERSION", raising=False)
    assert probes.hsa_override("cpu", root)["failed"] is False
    monkeypatch.setenv("HSA_OVERRIDE_GFX_VERSION", "11.0.0")
    stale = check_shape(probes.hsa_override("cpu", root))
    assert stale["failed"] is True and "does not match the hardware gfx1030" in stale["detail"]
    monkeypatch.setenv("HSA_OVERRIDE_GFX_VERSION", "10.3.0")
    assert probes.hsa_override("cpu", topology(100300, 100301))["failed"] is False  # gfx1031 run as gfx1030
    monkeypatch.setenv("HSA_OVERRIDE_GFX_VERSION", "gfx1030")
    assert probes.hsa_override("cpu", root)["failed"] is True
    monkeypatch.setenv("HSA_OVERRIDE_GFX_VERSION", "10.3.0")
    assert probes.hsa_override("cpu", str(tmp_path / "missing"))["failed"] is None


def test_gfx_target_conversions():
    assert probes.gfx_name(90010) == "gfx90a"
    assert probes.gfx_name(90402) == "gfx942"
    assert probes.gfx_name(110001) == "gfx1101"
    assert probes.override_target("9.4.2") == 90402
    assert probes.override_target("11.0") is None


def test_rocm_perms_without_a_driver_cannot_tell(monkeypatch):
    monkeypatch.setattr(probes.system.os.path, "exists", lambda path: False if path == "/dev/kfd" else True)
    result = check_shape(probes.rocm_perms())
    assert result["failed"] is None and "no /dev/kfd" in result["detail"]


def test_compile_failures_are_classified():
    assert probes._compile_failure(RuntimeError("InvalidCxxCompiler: No working C++ compiler found"))["failed"] is None
    assert probes._compile_failure(RuntimeError("Failed to find C compiler. Please specify via CC"))["failed"] is None
    triton = probes._compile_failure(RuntimeError("CompilationError: Loop-carried variable _tmp2 has initial type "
                                                  "<[1, 2], int1> but is re-assigned to <[1, 2], int8>"))
    assert triton["failed"] is True and "Loop-carried" in triton["detail"]
    too_old = probes._compile_failure(RuntimeError("Found Tesla P100 which is too old to be supported by the triton "
                                                   "GPU compiler"))
    assert too_old["failed"] is True
    # Where wrong results are the symptom, a compile error cannot confirm them.
    assert probes._compile_failure(RuntimeError("NotImplementedError: no backward"), confirms=False)["failed"] is None


def test_compile_probe_without_a_compiler_cannot_tell():
    outcome = call_isolated("gpuparity.known.probes:compile_masked_pooling", {"device": "cpu"}, timeout=240,
                            env={"CXX": "/nonexistent/g++"})
    assert outcome.status == "ok", outcome.error or outcome.stderr_tail
    assert outcome.value["failed"] is None
    assert "toolchain problem" in outcome.value["detail"]


@pytest.mark.slow
def test_compile_probe_compiles_and_matches_eager():
    outcome = call_isolated("gpuparity.known.probes:compile_masked_pooling", {"device": "cpu"}, timeout=300)
    assert outcome.status == "ok", outcome.error or outcome.stderr_tail
    # A toolchain problem on the machine running the tests is "cannot tell", never a false alarm.
    assert outcome.value["failed"] in (False, None), outcome.value["detail"]


@pytest.mark.slow
def test_all_reduce_probe_runs_two_processes():
    outcome = call_isolated("gpuparity.known.probes:all_reduce_size_sweep", {"device": "cpu"}, timeout=150)
    assert outcome.status == "ok", outcome.error or outcome.stderr_tail
    assert outcome.value["failed"] is False, outcome.value["detail"]
    assert outcome.value["sizes"] == [8, 1024, 64 * 1024, 512 * 1024, 2 ** 20, 4 * 2 ** 20]
    assert outcome.value["wrong"] == 0


def test_probe_decorator_sets_up_the_device_and_the_gpu_check(monkeypatch):
    # The shared preamble: a bare "cuda" means cuda:0, options pass through, gpu=True answers
    # "cannot tell" on a CPU device without running the body.
    from gpuparity.known.probes import base
    monkeypatch.setattr(base, "PROBES", [])
    seen = []

    @base.probe(default="cpu")
    def echo(dev, scale=1):
        seen.append((dev, scale))
        return base.finding(False, "ran")

    @base.probe(gpu=True)
    def gpu_only(dev):
        seen.append(dev)
        return base.finding(False, "ran")

    assert base.PROBES == ["echo", "gpu_only"]
    echo()
    echo("cuda", 3)
    assert seen == [(torch.device("cpu"), 1), (torch.device("cuda", 0), 3)]
    seen.clear()
    result = gpu_only(device="cpu")
    assert result["failed"] is None and "needs a GPU device, got cpu" in result["detail"] and not seen


@pytest.mark.parametrize("name", ["layer_norm_2pow32", "cumsum_2pow32", "gemm_4gib_tail", "gemm_huge_m",
                                  "triton_buffer_ops_2gib", "sdpa_long_mask"])
def test_size_probes_say_why_they_did_not_run(name, monkeypatch):
    monkeypatch.setattr(probes.base, "needs_gpu", lambda dev: None)
    result = check_shape(getattr(probes, name)(device="cpu"))
    assert result["failed"] is None and result["detail"].startswith("not run: ") and "GiB" in result["detail"]


def test_massive_activation_rows_have_a_logsumexp_below_the_fp32_exp_limit():
    q, k, _ = probes.attention.massive_activation_qkv(192, 64, torch.device("cpu"), torch.float32)
    lse = torch.logsumexp((q @ k.transpose(-2, -1)) * 64 ** -0.5, dim=-1)
    assert float(lse.max()) < -88.7


class _NanGradQ(torch.autograd.Function):
    """Identity forward; a NaN gradient for q (what cuDNN's backward returns in the regime)."""
    @staticmethod
    def forward(ctx, q):
        return q.view_as(q)

    @staticmethod
    def backward(ctx, grad):
        return torch.full_like(grad, float("nan"))


def _math(backend, q, k, v, **kwargs):
    return F.scaled_dot_product_attention(q, k, v, **kwargs)


def test_the_cudnn_regime_probe_catches_nan_grad_q(monkeypatch):
    monkeypatch.setattr(probes.base, "needs_gpu", lambda dev: None)
    planted = {"cudnn": lambda q, k, v, **kw: _math("cudnn", _NanGradQ.apply(q), k, v, **kw)}
    monkeypatch.setattr(probes.attention, "run_sdpa",
                        lambda backend, q, k, v, **kw: planted.get(backend, lambda *a, **k2: _math(backend, *a, **k2))(q, k, v, **kw))
    result = check_shape(probes.sdpa_cudnn_mask_lse(device="cpu"))
    assert result["failed"] is True and "non-finite grad_q in 5/5 calls" in result["detail"]
    assert result["nonfinite_grad_q"]["efficient D64 bool causal"] == 0
    monkeypatch.setattr(probes.attention, "run_sdpa", _math)
    assert check_shape(probes.sdpa_cudnn_mask_lse(device="cpu"))["failed"] is False
