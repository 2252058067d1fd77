"""The probes added with the 2026-12 tracker review: each gives a well-formed outcome on the CPU
(a finding, or "cannot tell" where it needs a GPU), and each decision confirms a planted wrong
output and passes a right one."""
import json

import pytest
import torch
import torch.nn.functional as F

from gpuparity.known import evaluate, load_issues, probes
from gpuparity.known.engine import DOES_NOT_APPLY, MAY_APPLY
from gpuparity.known.probes import collectives, compile as compile_probes, scaled, sizes

NEW_GPU_PROBES = ["scaled_mm_scale_result", "grouped_mm_repeat", "compile_layer_norm_reciprocal",
                  "compile_layer_norm_bf16", "all_reduce_one_rank_avg", "conv3d_bf16_large"]


def well_formed(result):
    assert set(result) >= {"failed", "detail"} and result["failed"] in (True, False, None) and result["detail"]
    json.dumps(result)     # crosses the process boundary as JSON
    return result


@pytest.mark.parametrize("name", NEW_GPU_PROBES)
def test_new_gpu_probes_cannot_tell_on_a_cpu(name):
    result = well_formed(getattr(probes, name)(device="cpu"))
    assert result["failed"] is None and "needs a GPU device" in result["detail"]


def test_lstm_probe_passes_on_the_cpu_and_confirms_a_planted_wrong_lstm(monkeypatch):
    assert well_formed(probes.lstm_vs_fp64(device="cpu"))["failed"] is False

    class OffByOnePercent(torch.nn.LSTM):
        """Wrong only on the fused (cuDNN/MIOpen) path in fp32: the float64 reference and the
        native baseline (cudnn disabled) stay right."""
        def forward(self, *args, **kwargs):
            out, state = super().forward(*args, **kwargs)
            if torch.backends.cudnn.enabled and out.dtype == torch.float32:
                out = out * 1.01
            return out, state

    monkeypatch.setattr(torch.nn, "LSTM", OffByOnePercent)
    result = well_formed(probes.lstm_vs_fp64(device="cpu"))
    assert result["failed"] is True and "LSTM output" in result["detail"]


# ---------------------------------------------------------------- torch._scaled_mm scale_result
def _fp8(values):
    return values.to(torch.float8_e4m3fn)


def test_scale_result_decision():
    product = torch.tensor([[4.0, -8.0], [12.0, 64.0]], dtype=torch.float64)
    right = scaled.scale_result_finding(_fp8(product * 0.5), _fp8(product), product, 0.5)
    assert right["failed"] is False
    ignored = scaled.scale_result_finding(_fp8(product), _fp8(product), product, 0.5)
    assert ignored["failed"] is True and "ignored scale_result=0.5" in ignored["detail"]
    off = scaled.scale_result_finding(_fp8(product * 0.6), _fp8(product), product, 0.5)
    assert off["failed"] is True
    divided = scaled.scale_result_finding(_fp8(product / 0.5), _fp8(product), product, 0.5)
    assert divided["failed"] is None and "divisor" in divided["detail"]


def test_scaled_mm_probe_code_runs_on_cpu_tensors(monkeypatch):
    # The CPU _scaled_mm divides by scale_result (torch 2.13): the probe says so and cannot tell.
    monkeypatch.setattr(probes.base, "needs_gpu", lambda dev: None)
    well_formed(probes.scaled_mm_scale_result(device="cpu"))


# ---------------------------------------------------------------- torch._grouped_mm in a loop
def test_grouped_mm_probe_passes_on_cpu_tensors(monkeypatch):
    monkeypatch.setattr(probes.base, "needs_gpu", lambda dev: None)
    result = well_formed(probes.grouped_mm_repeat(device="cpu", runs=2))
    assert result["failed"] is False and result["distinct_results"] == 1


def test_grouped_mm_decision_confirms_one_wrong_run():
    generator = torch.Generator().manual_seed(0)
    ref = torch.randn(64, 32, generator=generator, dtype=torch.float64)
    right = ref.to(torch.bfloat16)
    wrong = right.clone()
    wrong[-8:] = 0            # one run whose last rows were never written
    result = scaled.repeated_grouped_mm_finding([right, right, wrong], ref, right)
    assert result["failed"] is True and result["distinct_results"] == 2 and "run 2" in result["detail"]
    assert scaled.repeated_grouped_mm_finding([right, right], ref, right)["failed"] is False


# ---------------------------------------------------------------- inductor layer_norm epilogue and decomposition
def test_layer_norm_reciprocal_decision():
    x = torch.randn(64, 128, generator=torch.Generator().manual_seed(0))
    eager = compile_probes.layer_norm_reciprocal(x)
    ref = compile_probes.layer_norm_reciprocal(x.double())
    assert compile_probes.epilogue_finding(eager.clone(), eager, ref)["failed"] is False
    planted = eager + 0.9      # the report's smallest difference
    assert compile_probes.epilogue_finding(planted, eager, ref)["failed"] is True


def test_layer_norm_decomposition_decision():
    generator = torch.Generator().manual_seed(0)
    normalized = torch.randn(512, 256, generator=generator, dtype=torch.float64)
    proj = torch.randn(256, 64, generator=generator, dtype=torch.float64) * 0.06
    ref = (normalized, normalized @ proj)
    eager = (normalized.to(torch.bfloat16), (normalized.to(torch.bfloat16).double() @ proj).to(torch.bfloat16))
    same = compile_probes.decomposition_finding((eager[0].clone(), eager[1].clone()), eager, ref)
    assert same["failed"] is False and same["tipped"] == 0
    tipped = eager[0].clone()
    tipped[7, 3] = (tipped[7, 3].float() * (1 + 2 ** -7)).to(torch.bfloat16)   # one rounding tipped one step
    result = compile_probes.decomposition_finding((tipped, eager[1]), eager, ref)
    assert result["failed"] is True and result["tipped"] == 1 and "1 of 131072" in result["detail"]


# ---------------------------------------------------------------- NCCL one-rank AVG
def test_one_rank_avg_decision():
    inputs = {4099: torch.randn(4099, generator=torch.Generator().manual_seed(1)).bfloat16()}
    assert collectives.unreduced_tail_finding({4099: inputs[4099].clone()}, inputs)["failed"] is False
    tail_left = inputs[4099].clone()
    tail_left[-3:] = 0         # nElts % blocks trailing elements never written
    result = collectives.unreduced_tail_finding({4099: tail_left}, inputs)
    assert result["failed"] is True and result["wrong"][4099] == {"wrong": 3, "first": 4096}


# ---------------------------------------------------------------- cuDNN conv3d bf16 on large inputs
def test_conv3d_probe_checks_slices_and_confirms_a_planted_wrong_slice(monkeypatch):
    monkeypatch.setattr(probes.base, "needs_gpu", lambda dev: None)
    monkeypatch.setattr(sizes, "memory_shortfall", lambda dev, needed: None)
    small = (4, 5, 10, 12)
    assert well_formed(probes.conv3d_bf16_large(device="cpu", shape=small))["failed"] is False
    real_conv3d = F.conv3d

    def last_slice_zero(x, weight, *args, **kwargs):
        out = real_conv3d(x, weight, *args, **kwargs)
        out[:, :, -1] = 0
        return out

    monkeypatch.setattr(F, "conv3d", last_slice_zero)
    result = well_formed(probes.conv3d_bf16_large(device="cpu", shape=small))
    assert result["failed"] is True and "depth slice 4" in result["detail"]


# ---------------------------------------------------------------- the entries
REVIEWED = {"TRITON-FP8-TSTORE-NAN", "SCALED-MM-SCALE-RESULT", "COMPILE-LN-RECIPROCAL", "COMPILE-LN-BF16-DECOMP",
            "GROUPED-MM-BF16-DIV", "TRITON-CONVERGENT-JUMPTHREAD", "NCCL-GH200-SLINGSHOT", "NCCL-ONERANK-AVG",
            "CUDNN-SDPA-BWD-DQ-NAN-SM100", "FA3-GATED-PRECISION", "LIGER-FLCE-NONE-GRAD", "SONIC-MOE-B200-SWIGLU",
            "TRITON-GFX950-BF16-NAN-COMPILE", "TRITON-AMD-BUFFER-STORE-WAR", "TRITON-GFX1151-SCFFOR",
            "TRITON-AMD-LOOP-BARRIER", "TRITON-AMD-BUFFER-LOAD-OTHER", "TRITON-AMD-FNUZ-NAN-DECODE",
            "AITER-GFX950-PIPELINER", "RCCL-GFX1100-INIT-COPY", "RCCL-ALLREDUCE-BIAS-GFX950", "TE-ROCM-NVFP4-BWD-GEMM",
            "COMPILE-RDNA-GEMMA3-NAN", "MIOPEN-LSTM-WRONG", "HIP-MEMCPYBATCH-GRAPH-GFX908", "CUDNN-CONV3D-BF16-LARGE",
            "ROCM714-MOE-GRADNORM", "RCCL-MSCCLPP-LL-GRAPH", "AO-FP8-FNUZ-448"}


def test_the_reviewed_entries_cite_public_trackers_and_say_when_unconfirmed():
    issues = {issue["id"]: issue for issue in load_issues()}
    assert REVIEWED <= set(issues)
    for issue_id in REVIEWED:
        issue = issues[issue_id]
        assert issue["reviewed"] == "2026-12-06" and issue["found_by"] == "tracker review"
        assert all(source.startswith("https://github.com/") for source in issue["sources"]), issue_id
        if issue["unconfirmed"]:
            assert issue["rule_note"].startswith("Unconfirmed"), issue_id
        if "amd" in json.dumps(issue["rule"]) and "nvidia" not in json.dumps(issue["rule"]):
            assert "this project's hardware" in issue["rule_note"], issue_id


@pytest.mark.parametrize("fixture, applies, excluded", [
    ("h100_cuda", {"SCALED-MM-SCALE-RESULT", "GROUPED-MM-BF16-DIV", "NCCL-ONERANK-AVG", "CUDNN-CONV3D-BF16-LARGE",
                   "FA3-GATED-PRECISION"},
     {"NCCL-GH200-SLINGSHOT", "CUDNN-SDPA-BWD-DQ-NAN-SM100", "MIOPEN-LSTM-WRONG"}),
    ("strix_halo_gfx1151", {"TRITON-GFX1151-SCFFOR", "COMPILE-RDNA-GEMMA3-NAN", "TRITON-AMD-FNUZ-NAN-DECODE",
                            "NCCL-ONERANK-AVG"},
     {"SCALED-MM-SCALE-RESULT", "TRITON-AMD-LOOP-BARRIER", "AO-FP8-FNUZ-448", "ROCM714-MOE-GRADNORM"}),
    ("mi300a_rocm62", {"TRITON-AMD-LOOP-BARRIER", "AO-FP8-FNUZ-448", "TE-ROCM-NVFP4-BWD-GEMM"},
     {"TRITON-AMD-FNUZ-NAN-DECODE", "RCCL-MSCCLPP-LL-GRAPH", "TRITON-GFX950-BF16-NAN-COMPILE"}),
])
def test_new_rules_on_recorded_platforms(fixture_platform, fixture, applies, excluded):
    results = {r.id: r.status for r in evaluate(fixture_platform(fixture), probes=False)}
    assert {i for i in applies if results[i] != MAY_APPLY} == set()
    assert {i for i in excluded if results[i] != DOES_NOT_APPLY} == set()


@pytest.mark.parametrize("name", ["compile_layer_norm_reciprocal", "compile_layer_norm_bf16"])
def test_compile_probe_bodies_on_cpu_tensors(monkeypatch, name):
    # torch.compile stood in by the identity (inductor on a CPU takes minutes here): the compiled
    # output is eager's, so the probe passes; a compile that raises cannot tell.
    monkeypatch.setattr(probes.base, "needs_gpu", lambda dev: None)
    monkeypatch.setattr(torch, "compile", lambda fn, **kwargs: fn)
    assert well_formed(getattr(probes, name)(device="cpu"))["failed"] is False

    def broken(fn, **kwargs):
        raise RuntimeError("LoweringException: planted")

    monkeypatch.setattr(torch, "compile", broken)
    result = well_formed(getattr(probes, name)(device="cpu"))
    assert result["failed"] is None and "planted" in result["detail"]
