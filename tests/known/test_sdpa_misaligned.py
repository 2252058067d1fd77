"""SDPA-CUDNN-MISALIGNED: the probe confirms a backend that faults on a query whose data pointer
is not 16-byte aligned, and gpuparity's SDPA wrappers hand torch an aligned copy instead."""
import pytest
import torch
import torch.nn.functional as F

from device_env import ON_GPU, TEST_DEVICE
from gpuparity.backends import sdpa
from gpuparity.backends.triton_decode import decode_sdpa
from gpuparity.contracts.decode import decode_reference
from gpuparity.known import probes
from gpuparity.known.probes.alignment import at_offset


def test_probe_confirms_a_backend_that_faults_on_a_misaligned_query(monkeypatch):
    monkeypatch.setattr(probes.base, "needs_gpu", lambda dev: None)

    def faulting(backend, q, k, v, mask):
        if backend == "efficient" and q.data_ptr() % 16:
            raise RuntimeError("CUDA error: misaligned address\nCUDA kernel errors might be asynchronously reported")
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    monkeypatch.setattr(probes.alignment, "_sdpa_call", faulting)
    result = probes.sdpa_misaligned(device="cpu")
    assert result["failed"] is True and result["backend"] == "efficient"
    assert "misaligned address" in result["detail"] and "6 bytes past 16-byte alignment" in result["detail"]
    monkeypatch.setattr(probes.alignment, "_sdpa_call", lambda backend, q, k, v, mask:
                        F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True))
    assert probes.sdpa_misaligned(device="cpu")["failed"] is False


def test_silent_probe_confirms_wrong_numbers_on_a_misaligned_v_and_stops_at_a_fault(monkeypatch):
    """SDPA-MISALIGNED-SILENT: a backend whose output is wrong, without an error, when v is off
    16-byte alignment is confirmed; one that raises the misaligned fault first cannot tell; an
    aligned control that already fails is another bug, not this one."""
    monkeypatch.setattr(probes.base, "needs_gpu", lambda dev: None)

    def call(backend, q, k, v, mask):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)

    def wrong_on_misaligned_v(backend, q, k, v, mask):
        out = call(backend, q, k, v, mask)
        return out * 1.5 if backend == "default" and v.data_ptr() % 16 else out
    monkeypatch.setattr(probes.alignment, "_sdpa_call", wrong_on_misaligned_v)
    result = probes.sdpa_misaligned_silent(device="cpu")
    assert result["failed"] is True and "v 2 bytes past 16-byte alignment" in result["detail"], result["detail"]

    def faults(backend, q, k, v, mask):
        if v.data_ptr() % 16:
            raise RuntimeError("CUDA error: misaligned address")
        return call(backend, q, k, v, mask)
    monkeypatch.setattr(probes.alignment, "_sdpa_call", faults)
    result = probes.sdpa_misaligned_silent(device="cpu")
    assert result["failed"] is None and "SDPA-CUDNN-MISALIGNED" in result["detail"]

    monkeypatch.setattr(probes.alignment, "_sdpa_call", lambda *a: call(*a) * 1.5)
    result = probes.sdpa_misaligned_silent(device="cpu")
    assert result["failed"] is None and "wrong already on aligned inputs" in result["detail"]
    monkeypatch.setattr(probes.alignment, "_sdpa_call", call)
    assert probes.sdpa_misaligned_silent(device="cpu")["failed"] is False


def test_misaligned_pointers_are_recognised():
    x = torch.randn(2, 3, 8, dtype=torch.bfloat16)
    assert sdpa.misaligned(at_offset(x, 3)) and not sdpa.misaligned(at_offset(x, 8))
    assert torch.equal(at_offset(x, 3), x)
    assert sdpa.aligned(at_offset(x, 3)).data_ptr() % 16 == 6    # the CPU kernels need no copy


@pytest.mark.skipif(not ON_GPU, reason="the fault and its fix are GPU ones (GPUPARITY_TEST_DEVICE=cuda)")
def test_sdpa_wrappers_hand_torch_an_aligned_copy():
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(3, 4, 1, 32, generator=gen).to(TEST_DEVICE, torch.bfloat16)
    k, v = (torch.randn(3, 2, 40, 32, generator=gen).to(TEST_DEVICE, torch.bfloat16) for _ in range(2))
    shifted = at_offset(q, 3)
    copy = sdpa.aligned(shifted)
    assert copy.data_ptr() % 16 == 0 and torch.equal(copy, q)
    lengths = torch.tensor([40, 1, 20], dtype=torch.int32, device=TEST_DEVICE)
    out = decode_sdpa(shifted, k, v, lengths)
    torch.cuda.synchronize()
    ref = decode_reference(*(t.cpu().double() for t in (q, k, v)), lengths.cpu())
    assert float((out.cpu().double() - ref).norm() / ref.norm()) < 1e-2


def test_efficient_probe_confirms_a_fault_off_alignment_and_passes_torch_refusals(monkeypatch):
    """SDPA-EFFICIENT-MISALIGNED: an fp32 q 4 bytes off 16-byte alignment faults on the H100's efficient
    kernel; torch's own "not correctly aligned" error (its check for fp16 q/k) is a refusal, not the bug."""
    monkeypatch.setattr(probes.base, "needs_gpu", lambda dev: None)
    calls = []

    def efficient(fault):
        def run(backend, q, k, v, **kwargs):
            misaligned = [name for name, t in (("q", q), ("k", k), ("v", v)) if t.data_ptr() % 16]
            calls.append((q.dtype, misaligned))
            if misaligned and fault(q.dtype, misaligned):
                raise RuntimeError("CUDA error: misaligned address\nCUDA kernel errors might be asynchronously reported")
            if misaligned:
                raise RuntimeError(f"p.{misaligned[0]}_ptr is not correctly aligned")
            return F.scaled_dot_product_attention(q, k, v)
        return run
    monkeypatch.setattr(probes.alignment, "run_sdpa", efficient(lambda dtype, names: dtype == torch.float32))
    result = probes.sdpa_efficient_misaligned(device="cpu")
    assert result["failed"] is True and "float32 q 4 bytes past 16-byte alignment" in result["detail"]
    assert calls == [(torch.float32, []), (torch.float32, ["q"])]        # control first, stops at the fault
    monkeypatch.setattr(probes.alignment, "run_sdpa", efficient(lambda dtype, names: False))
    refused = probes.sdpa_efficient_misaligned(device="cpu")
    assert refused["failed"] is False and "refused" in refused["detail"]
    monkeypatch.setattr(probes.attention, "run_sdpa", lambda backend, q, k, v, **kw: F.scaled_dot_product_attention(q, k, v))
    assert probes.sdpa_efficient_misaligned(device="cpu")["failed"] is False   # right answers, no fault
