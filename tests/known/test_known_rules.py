"""The rule language: clause semantics, unknown facts, combinators and unconfirmed bounds."""
import pytest

from gpuparity.known.rules import (RuleOutcome, arch_in_wheel, cudnn_version, describe_rule, evaluate_rule,
                                   in_range, miopen_version, rocm_release)


def amd_report(**overrides):
    report = {
        "schema_version": 1, "vendor": "amd",
        "torch": {"version": "2.5.1+rocm6.2", "hip": "6.2.41133-dd7f95766", "cuda": None,
                  "arch_list": ["gfx90a", "gfx942", "gfx1030"]},
        "devices": [{"index": 0, "name": "AMD Instinct MI300A", "arch": "gfx942", "capability": [9, 4],
                     "is_apu": True}],
        "libraries": {"aotriton": "0.7", "rccl": "2.20.5", "miopen": "3002000"},
        "numerics": {"deterministic_algorithms": False, "cudnn_allow_tf32": True},
        "env": {"HSA_XNACK": "1"},
        "kernel_params": {"amdgpu": {"amdgpu.noretry": "0"}, "iommu": {"iommu": "pt"}},
        "kfd": {"exists": True, "readable_writable": True},
        "hsa_override": None, "cuda_available": True, "os": "Linux 6.8.0",
    }
    report.update(overrides)
    return report


def outcome(rule, report=None):
    return evaluate_rule(rule, report or amd_report())


def test_version_ranges_compare_as_padded_integers():
    assert in_range((2, 5, 1), {"<": "2.7"})
    assert in_range((2, 5), {"==": "2.5.0"})
    assert not in_range((2, 10, 0), {"<": "2.9"})  # not a string comparison
    assert in_range((2, 5, 1), {">=": "2.5", "<": "2.6"})
    assert not in_range((2, 6), {">=": "2.5", "<": "2.6"})


def test_library_versions_are_decoded():
    assert cudnn_version("91002") == (9, 10, 2)
    assert cudnn_version("8907") == (8, 9, 7)
    assert cudnn_version("9.15.1") == (9, 15, 1)
    assert miopen_version("3002000") == (3, 2, 0) and miopen_version("6.2.1") == (6, 2, 1)
    assert cudnn_version(None) == () and miopen_version("unknown") == ()
    assert rocm_release(amd_report()) == (6, 2)
    assert rocm_release(amd_report(torch={"version": "2.6.0+rocm6.2.4", "hip": "6.2.41134"})) == (6, 2, 4)


def test_match_says_which_facts_matched_in_words():
    result = outcome({"vendor": "amd", "torch_version": {"<": "2.7"}, "library": {"aotriton": {"<": "0.8.2"}}})
    assert result.outcome == RuleOutcome.MATCH
    assert result.matched == ["ROCm build (torch 2.5.1+rocm6.2)", "torch 2.5.1+rocm6.2 < 2.7", "aotriton 0.7 < 0.8.2"]


def test_one_hard_miss_excludes_and_says_why():
    result = outcome({"vendor": "amd", "torch_version": {">=": "2.7"}})
    assert result.outcome == RuleOutcome.MISS
    assert result.missed == ["torch 2.5.1+rocm6.2 is not >= 2.7"]
    result = outcome({"vendor": "nvidia"})
    assert result.missed == ["not a CUDA build: ROCm build (torch 2.5.1+rocm6.2)"]


@pytest.mark.parametrize("change, rule", [
    ({"libraries": {"aotriton": {"unknown": "not named in torch.__config__.show()"}}},
     {"library": {"aotriton": {"<": "0.8.2"}}}),
    ({"devices": {"unknown": "torch.cuda.is_available() is False"}}, {"arch_in": ["gfx942"]}),
    ({"devices": [{"unknown": "RuntimeError: HIP error"}]}, {"arch_prefix": ["gfx103"]}),
    ({"env": {"unknown": "PermissionError"}}, {"env_unset": ["CUBLAS_WORKSPACE_CONFIG"]}),
    ({"kernel_params": {"unknown": "no /proc/cmdline"}}, {"kernel_param_absent": ["iommu=pt"]}),
    ({"torch": {"version": {"unknown": "ImportError"}}}, {"torch_version": {"<": "2.7"}}),
    ({"numerics": {"unknown": "ImportError"}}, {"numerics": {"cudnn_allow_tf32": True}}),
    ({"devices": [{"index": 0, "name": "x", "arch": "gfx942", "is_apu": None}]}, {"is_apu": True}),
])
def test_unknown_facts_never_exclude(change, rule):
    result = outcome(rule, amd_report(**change))
    assert result.outcome == RuleOutcome.UNKNOWN
    assert result.applies
    assert result.unknown and not result.missed


def test_unknown_does_not_rescue_a_hard_miss():
    report = amd_report(libraries={"aotriton": {"unknown": "?"}})
    result = outcome({"vendor": "nvidia", "library": {"aotriton": {"<": "0.8.2"}}}, report)
    assert result.outcome == RuleOutcome.MISS


def test_unconfirmed_bounds_cannot_rule_out():
    result = outcome({"vendor": "amd", "unconfirmed": {"torch_version": {"<": "2.5"}}})
    assert result.applies and result.outcome == RuleOutcome.UNKNOWN
    assert "unconfirmed" in result.soft_missed[0] and "torch 2.5.1+rocm6.2 is not < 2.5" in result.soft_missed[0]
    inside = outcome({"unconfirmed": {"torch_version": {"<": "2.6"}}})
    assert inside.outcome == RuleOutcome.MATCH and inside.matched[0].endswith("(unconfirmed)")
    # ... but a hard clause beside it still excludes.
    assert not outcome({"vendor": "nvidia", "unconfirmed": {"torch_version": {"<": "2.5"}}}).applies


def test_any_of_all_of_not():
    assert outcome({"any_of": [{"vendor": "nvidia"}, {"arch_in": ["gfx942"]}]}).outcome == RuleOutcome.MATCH
    missed = outcome({"any_of": [{"vendor": "nvidia"}, {"arch_in": ["gfx950"]}]})
    assert missed.outcome == RuleOutcome.MISS and missed.missed[0].startswith("none of:")
    assert outcome({"all_of": [{"vendor": "amd"}, {"is_apu": True}]}).outcome == RuleOutcome.MATCH
    assert outcome({"not": {"arch_in": ["gfx942"]}}).outcome == RuleOutcome.MISS
    assert outcome({"not": {"arch_in": ["gfx1151"]}}).outcome == RuleOutcome.MATCH


def test_device_clauses_match_any_device():
    report = amd_report(devices=[
        {"index": 0, "name": "AMD Radeon RX 6800 XT", "arch": "gfx1030", "capability": [10, 3], "is_apu": False},
        {"index": 1, "name": "AMD Radeon Graphics", "arch": "gfx1036", "capability": [10, 3], "is_apu": True}])
    result = outcome({"arch_prefix": ["gfx103"], "is_apu": True, "device_count": {">=": "2"}}, report)
    assert result.outcome == RuleOutcome.MATCH
    assert "device 0 AMD Radeon RX 6800 XT is gfx1030" in result.matched[0]
    assert "and 1 more device" in result.matched[0]
    assert outcome({"arch_in": ["gfx942"]}, amd_report(devices=[])).missed == ["no GPU devices in the report"]


def test_env_and_kernel_param_clauses():
    assert outcome({"env_set": ["HSA_XNACK"]}).matched == ["HSA_XNACK=1 is set"]
    assert outcome({"env_set": {"HSA_XNACK": "0"}}).outcome == RuleOutcome.MISS
    assert outcome({"env_unset": {"HSA_XNACK": "0"}}).outcome == RuleOutcome.MATCH
    assert outcome({"env_unset": ["HSA_XNACK"]}).outcome == RuleOutcome.MISS
    assert outcome({"kernel_param_absent": ["iommu=pt"]}).outcome == RuleOutcome.MISS
    assert outcome({"kernel_param_present": ["amdgpu.noretry=0"]}).outcome == RuleOutcome.MATCH
    assert outcome({"kernel_param_present": ["amdgpu.noretry=1"]}).outcome == RuleOutcome.MISS
    assert outcome({"kernel_param_absent": ["amdgpu.vm_fragment_size=9"]}).outcome == RuleOutcome.MATCH


def test_other_clauses():
    assert outcome({"rocm_version": {">=": "6.2"}}).outcome == RuleOutcome.MATCH
    assert outcome({"rocm_version": {"<": "5.7"}}).missed == ["ROCm 6.2 is not < 5.7"]
    assert outcome({"numerics": {"cudnn_allow_tf32": True}}).outcome == RuleOutcome.MATCH
    assert outcome({"numerics": {"deterministic_algorithms": True}}).outcome == RuleOutcome.MISS
    assert outcome({"kfd": {"exists": True, "readable_writable": False}}).outcome == RuleOutcome.MISS
    assert outcome({"cuda_available": False}).outcome == RuleOutcome.MISS
    assert outcome({"os": "(?i)windows"}).outcome == RuleOutcome.MISS
    assert outcome({"always": True}).outcome == RuleOutcome.MATCH
    assert outcome({"hsa_override": True}).outcome == RuleOutcome.MISS
    stale = amd_report(hsa_override={"value": "11.0.0", "as_arch": "gfx1100", "device_archs": ["gfx1030"]})
    result = outcome({"hsa_override": True}, stale)
    assert result.outcome == RuleOutcome.MATCH and "wrong for some of them" in result.matched[0]


def test_arch_in_wheel():
    cu130 = ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120", "compute_120"]
    assert arch_in_wheel("sm_90", cu130, "nvidia")
    assert arch_in_wheel("sm_89", cu130, "nvidia")       # sm_86 cubin runs on sm_89
    assert not arch_in_wheel("sm_60", cu130, "nvidia")
    assert arch_in_wheel("sm_121", cu130, "nvidia")      # sm_120 cubin, same major
    assert not arch_in_wheel("sm_103", ["sm_100a"], "nvidia")  # arch-specific cubins do not carry over
    assert arch_in_wheel("sm_130", ["compute_120"], "nvidia")  # PTX JIT
    assert arch_in_wheel("gfx942", ["gfx90a", "gfx942"], "amd")
    assert not arch_in_wheel("gfx1031", ["gfx1030"], "amd")
    report = amd_report(devices=[{"index": 0, "name": "AMD Radeon RX 6700 XT", "arch": "gfx1031"}])
    assert outcome({"arch_not_in_wheel": True}, report).outcome == RuleOutcome.MATCH
    assert outcome({"arch_not_in_wheel": True}).outcome == RuleOutcome.MISS
    unknown_list = amd_report(torch={"version": "2.5.1+rocm6.2", "arch_list": {"unknown": "RuntimeError"}})
    assert outcome({"arch_not_in_wheel": True}, unknown_list).outcome == RuleOutcome.UNKNOWN


def test_describe_rule_reads_like_a_sentence():
    text = describe_rule({"vendor": "amd", "torch_version": {"<": "2.7"}, "library": {"aotriton": {"<": "0.8.2"}},
                          "unconfirmed": {"arch_in": ["gfx942"]}})
    assert text == "ROCm and torch < 2.7 and aotriton < 0.8.2 and [unconfirmed: arch gfx942]"
