"""Outcomes on the recorded platform fingerprints (rules only: they are other machines)."""
import pytest

from gpuparity.known import (CONFIRMED, DOES_NOT_APPLY, MAY_APPLY, KnownIssueResult, evaluate, load_platform,
                             recommended_env)


def statuses(report):
    return {result.id: result for result in evaluate(report)}


@pytest.fixture
def judge(fixture_platform):
    return lambda name: statuses(fixture_platform(name))


def test_mi300a_user_story_one(judge):
    results = judge("mi300a_rocm62")
    mask = results["SDPA-MASK-ROCM"]
    assert mask.status == MAY_APPLY
    assert mask.why == ["ROCm build (torch 2.5.1+rocm6.2)", "torch 2.5.1+rocm6.2 < 2.7", "aotriton 0.7 < 0.8.2"]
    assert results["COMPILE-ROCM-LOOPCARRIED"].status == MAY_APPLY
    assert results["COMPILE-ROCM-MI3XX"].status == MAY_APPLY
    assert results["MI300A-NUMA-SPILL"].status == MAY_APPLY
    assert results["APU-MEM-REPORT"].status == DOES_NOT_APPLY     # MI300A reports its whole HBM
    assert results["RCCL-IOMMU"].status == DOES_NOT_APPLY         # booted with iommu=pt
    assert results["TF32-DEFAULTS"].status == DOES_NOT_APPLY      # ROCm needs an opt-in for xf32
    assert results["XF32-MI300"].status == MAY_APPLY
    assert results["SDPA-CUDNN"].status == DOES_NOT_APPLY


def test_mi300a_with_a_fixed_stack_drops_the_mask_bug(fixture_platform):
    report = fixture_platform("mi300a_rocm62")
    report["torch"]["version"] = "2.7.1+rocm6.3"
    report["libraries"]["aotriton"] = "0.9.2"
    results = statuses(report)
    assert results["SDPA-MASK-ROCM"].status == DOES_NOT_APPLY
    assert "torch 2.7.1+rocm6.3 is not < 2.7" in results["SDPA-MASK-ROCM"].why


def test_mi300a_with_unknown_aotriton_still_may_apply(fixture_platform):
    report = fixture_platform("mi300a_rocm62")
    report["libraries"]["aotriton"] = {"unknown": "not named in torch.__config__.show()"}
    result = statuses(report)["SDPA-MASK-ROCM"]
    assert result.status == MAY_APPLY
    assert any(line.startswith("cannot tell: aotriton version unknown") for line in result.why)


def test_rdna2_crash_and_its_kernel_parameters(judge):
    result = judge("rdna2_gfx1030_rocm62")["RDNA-MTYPE-CRASH"]
    assert result.status == MAY_APPLY
    assert "amdgpu.vm_fragment_size=9" in result.remedy and "amdgpu.noretry=0" in result.remedy
    assert any("not set here (amdgpu.vm_fragment_size=9 amdgpu.noretry=0)" in line for line in result.why)


def test_rdna2_says_when_the_kernel_parameters_are_already_set(fixture_platform):
    report = fixture_platform("rdna2_gfx1030_rocm62")
    report["kernel_params"]["amdgpu"] = {"amdgpu.vm_fragment_size": "9", "amdgpu.noretry": "0"}
    result = statuses(report)["RDNA-MTYPE-CRASH"]
    assert any("already set here (amdgpu.vm_fragment_size=9 amdgpu.noretry=0)" in line for line in result.why)
    report["kernel_params"]["amdgpu"] = {"amdgpu.vm_fragment_size": "9"}
    result = statuses(report)["RDNA-MTYPE-CRASH"]
    assert any("amdgpu.vm_fragment_size=9 already set; amdgpu.noretry=0 not set" in line for line in result.why)


def test_h100(judge):
    results = judge("h100_cuda")
    assert results["SDPA-MASK-ROCM"].status == DOES_NOT_APPLY
    assert results["SDPA-MASK-ROCM"].why[0] == "not a ROCm build: CUDA build (torch 2.11.0+cu130)"
    assert results["SDPA-CUDNN"].status == MAY_APPLY          # cuDNN 9.10.2 < 9.15.1
    assert "cuDNN 9.10.2 (91002) < 9.15.1" in results["SDPA-CUDNN"].why
    assert results["SDPA-CUDNN-GQA-B200"].status == DOES_NOT_APPLY
    assert results["TF32-DEFAULTS"].status == MAY_APPLY
    assert results["DET-CUBLAS-WS"].status == MAY_APPLY
    assert results["ARCH-NOT-IN-WHEEL"].status == DOES_NOT_APPLY
    assert results["NCCL-P2P-CONSUMER"].status == DOES_NOT_APPLY


def test_cpu_only_nearly_nothing_applies(judge):
    results = judge("cpu_only")
    applies = sorted(r.id for r in results.values() if r.status != DOES_NOT_APPLY)
    # The documented SDPA fact, two entries whose platform or version bound is unconfirmed, and
    # torch's CPU fp16/bf16 kernels gpuparity's battery found wanting.
    assert applies == ["CKPT-METADATA", "SDPA-CAUSAL-ALIGN", "SDPA-FULLMASK-NAN", "TORCH-CPU-BF16-CE-ONEHOT",
                       "TORCH-CPU-BF16-LN-GRAD", "TORCH-CPU-FP16-CE-MEAN", "TORCH-CPU-FP16-LN-GRAD"]
    assert "top-left" in results["SDPA-CAUSAL-ALIGN"].why[0]


def test_b200_gqa(judge):
    results = judge("b200_cuda")
    assert results["SDPA-CUDNN-GQA-B200"].status == MAY_APPLY
    assert "device 0 NVIDIA B200 is sm_100 (and 7 more devices)" in results["SDPA-CUDNN-GQA-B200"].why


def test_rdna3_with_an_override(judge):
    results = judge("rdna3_gfx1101_override")
    assert results["HSA-OVERRIDE"].status == MAY_APPLY
    assert "HSA_OVERRIDE_GFX_VERSION=11.0.0 (gfx1100) is set; devices report gfx1100" in results["HSA-OVERRIDE"].why
    for issue_id in ("SDPA-AOTRITON-NAVI3", "SDPA-GFX1100-LAUNCH", "LN-BWD-WAVE32"):
        assert results[issue_id].status == MAY_APPLY, issue_id
    assert results["RDNA-MTYPE-CRASH"].status == DOES_NOT_APPLY


def test_dual_rtx5090(judge):
    results = judge("rtx5090x2_cuda")
    for issue_id in ("NCCL-BLACKWELL", "NCCL-P2P-CONSUMER", "COMPILE-SM120-BF16"):
        assert results[issue_id].status == MAY_APPLY, issue_id


def test_strix_halo_apu(judge):
    results = judge("strix_halo_gfx1151")
    for issue_id in ("APU-MEM-REPORT", "SDPA-AOTRITON-RDNA35", "LN-BWD-WAVE32"):
        assert results[issue_id].status == MAY_APPLY, issue_id
    assert results["MI300A-NUMA-SPILL"].status == DOES_NOT_APPLY


def test_p100_with_a_wheel_that_dropped_it(judge):
    results = judge("p100_cu130")
    for issue_id in ("ARCH-NOT-IN-WHEEL", "BF16-EMULATED", "COMPILE-PRE-VOLTA"):
        assert results[issue_id].status == MAY_APPLY, issue_id
    assert "not in torch's arch list" in results["ARCH-NOT-IN-WHEEL"].why[0]


def test_saved_reports_are_judged_by_rules_only(fixture_platform):
    results = evaluate(fixture_platform("mi300a_rocm62"), probes=True)
    assert all(result.probe_outcome is None for result in results)


def test_load_platform_reads_the_fixtures(platform_file):
    report = load_platform(platform_file("h100_cuda"))
    assert report["vendor"] == "nvidia" and report["schema_version"] == 1


def test_recommended_env_merge_rule(fixture_platform):
    assert recommended_env(fixture_platform("cpu_only")) == {}
    assert recommended_env(fixture_platform("h100_cuda")) == {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
    assert recommended_env(fixture_platform("rtx5090x2_cuda")) == {"CUBLAS_WORKSPACE_CONFIG": ":4096:8",
                                                                    "NCCL_P2P_DISABLE": "1"}
    # HSA_OVERRIDE's remedy (unset) is scoped to "confirmed": a working override is not removed on a guess.
    assert recommended_env(fixture_platform("rdna3_gfx1101_override")) == {"TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL": "0"}


def _result(issue_id, status, env, scope=MAY_APPLY):
    return KnownIssueResult(id=issue_id, title="", status=status, why=[], remedy="", remedy_env=env, sources=[],
                            remedy_env_scope=scope)


def test_recommended_env_confirmed_first_then_first_wins():
    results = [_result("A", MAY_APPLY, {"X": "may"}), _result("B", CONFIRMED, {"X": "confirmed", "Y": None}),
               _result("C", MAY_APPLY, {"Z": "1"}, scope=CONFIRMED), _result("D", DOES_NOT_APPLY, {"W": "1"}),
               _result("E", MAY_APPLY, {"X": "later", "V": "2"})]
    assert recommended_env(results=results) == {"X": "confirmed", "Y": None, "V": "2"}
