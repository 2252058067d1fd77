"""The platform report never raises and says why when it cannot read a fact."""
from __future__ import annotations

import json

import torch

from gpuparity import platform


def test_collect_is_json_and_has_schema_version():
    report = platform.collect()
    assert report["schema_version"] == platform.SCHEMA_VERSION
    json.dumps(report)
    assert report["vendor"] in ("cpu", "nvidia", "amd")
    assert report["torch"]["version"] == torch.__version__
    assert "float32_matmul_precision" in report["numerics"]


def test_a_probe_that_raises_becomes_unknown_with_the_reason(monkeypatch):
    def broken():
        raise RuntimeError("HIP version could not be parsed")
    monkeypatch.setattr(platform, "_torch_build", broken)
    monkeypatch.setattr(platform, "_cpu_model", broken)
    report = platform.collect()
    assert platform.is_unknown(report["torch"]) and "HIP version" in report["torch"]["unknown"]
    assert platform.is_unknown(report["cpu_model"])
    platform.summary_line(report)  # still renders
    platform.fingerprint_key(report)


def test_env_vars_that_change_numerics_are_recorded(monkeypatch):
    monkeypatch.setenv("HSA_OVERRIDE_GFX_VERSION", "11.0.0")
    monkeypatch.setenv("NCCL_P2P_DISABLE", "1")
    monkeypatch.setenv("UNRELATED_SECRET", "x")
    report = platform.collect()
    assert report["env"]["NCCL_P2P_DISABLE"] == "1" and "UNRELATED_SECRET" not in report["env"]
    assert report["hsa_override"]["as_arch"] == "gfx1100"


def test_versions():
    assert platform.parse_version("2.5.1+rocm6.2") == (2, 5, 1)
    assert platform.parse_version(None) == ()
    assert platform.rocm_version({"torch": {"version": "2.5.1+rocm6.2", "hip": None}}) == (6, 2)


def test_driver_versions_from_the_files_drivers_expose(tmp_path):
    from gpuparity import platform as plat
    proprietary = tmp_path / "nvidia-proprietary"
    proprietary.write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.183.01  Sun May 12 19:39:15 UTC 2024\n")
    open_module = tmp_path / "nvidia-open"
    open_module.write_text("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build\n")
    amd = tmp_path / "amdgpu"
    amd.write_text("6.8.5\n")
    assert plat._driver({"nvidia": str(proprietary)}) == {"nvidia": "535.183.01"}
    assert plat._driver({"nvidia": str(open_module), "amdgpu": str(amd)}) == {"nvidia": "580.159.04", "amdgpu": "6.8.5"}
    assert plat.is_unknown(plat._driver({"nvidia": str(tmp_path / "absent")}))
    garbled = tmp_path / "garbled"
    garbled.write_text("something else\n")
    assert plat.is_unknown(plat._driver({"nvidia": str(garbled)})["nvidia"])


def test_a_driver_update_changes_the_cache_fingerprint():
    from gpuparity import platform as plat
    report = plat.collect()
    before = plat.fingerprint_key({**report, "driver": {"nvidia": "535.183.01"}})
    after = plat.fingerprint_key({**report, "driver": {"nvidia": "580.159.04"}})
    assert before != after
    # no readable driver file (CPU machines, containers): the key does not depend on the reason
    assert plat.fingerprint_key({**report, "driver": plat.unknown("a")}) == \
        plat.fingerprint_key({**report, "driver": plat.unknown("b")})


def test_numerics_env_overrides_change_the_cache_fingerprint(monkeypatch):
    """NVIDIA_TF32_OVERRIDE and friends change fp32 results beneath torch's switches: a verdict
    made under one value must not be reused under another; unset, the key is unchanged."""
    from gpuparity import platform as plat
    report = plat.collect()
    for name in plat.NUMERICS_ENV:
        monkeypatch.delenv(name, raising=False)
    plain = plat.fingerprint_key(report)
    for name, value in (("NVIDIA_TF32_OVERRIDE", "0"), ("TORCH_ALLOW_TF32_CUBLAS_OVERRIDE", "1"),
                        ("HIPBLASLT_ALLOW_TF32", "1")):
        monkeypatch.setenv(name, value)
        changed = plat.fingerprint_key(report)
        assert changed != plain, name
        monkeypatch.delenv(name)
        assert plat.fingerprint_key(report) == plain
