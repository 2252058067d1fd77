"""Runtime probes of the known-issue base: each confirms or rules out one entry on this machine.
known/engine.py calls them by name as `gpuparity.known.probes:<name>`; PROBES lists every name."""
# Every probe is called in a fresh process (gpuparity.known.engine.run_probe) as
# `probe(device="cuda:0")` and returns {"failed": True | False | None, "detail": str, numbers...}:
# failed True confirms the issue here, False rules it out, None means it could not tell (no such
# kernel, no second GPU, ...). A crash or hang of the process is judged by the caller. Probes call
# torch directly (raw SDPA, raw norms), never gpuparity's own wrappers, because they test the
# platform, and they keep memory modest. The families are imported in registry order.
from .base import PROBES, finding, inconclusive, probe, summarize
from .attention import (NO_KERNEL, SDPA_MEMBERS, NoKernel, attention_vs_fp64, run_sdpa, sdpa_aotriton_rdna35,
                        sdpa_cudnn, sdpa_cudnn_gqa, sdpa_cudnn_mask_lse, sdpa_cudnn_sq1_lse, sdpa_eff_stride0,
                        sdpa_flash_alone, sdpa_fp32_lse_race, sdpa_fullmask_nan, sdpa_fused_launch, sdpa_fused_vs_fp64,
                        sdpa_mask_dtype, sdpa_mask_rocm, sdpa_maskgrad, sdpa_noncontig_v)
from .alignment import sdpa_efficient_misaligned, sdpa_misaligned, sdpa_misaligned_silent
from .numerics import (BF16_LEVEL, TF32_LEVEL, bf16_emulated, conv2d_vs_fp64, conv_train_step,
                       cpu_bf16_layer_norm_grad, cpu_fp16_layer_norm_grad, fp16_cross_entropy_mean, bf16_cross_entropy_onehot,
                       gemm_2gib_tail, gemm_large_m, gemm_small_dim_fp32,
                       gemm_transposed_fp32, layer_norm_huge_rows, lstm_vs_fp64, norm_weight_grads, softmax_fp64_odd,
                       tf32_defaults, xf32_high_precision)
from .scaled import grouped_mm_repeat, scaled_mm_scale_result
from .compile import (ENVIRONMENT_PROBLEMS, _compile_failure, compile_bf16_block, compile_layer_norm_bf16,
                      compile_layer_norm_reciprocal, compile_masked_pooling, masked_pooling)
from .determinism import checkpoint_masked_attention, det_cublas_workspace, flex_attention_twice, gemv_twice_bitwise
from .collectives import all_reduce_one_rank_avg, all_reduce_size_sweep, all_reduce_small_repeated, all_reduce_timed
from .sizes import (conv3d_bf16_large, cumsum_2pow32, gemm_4gib_tail, gemm_huge_m, layer_norm_2pow32, memory_shortfall,
                    sdpa_long_mask, triton_buffer_ops_2gib)
from .system import (apu_memory, arch_smoke, gfx_name, hsa_override, kfd_gfx_targets, numa_spill, override_target,
                     rocm_perms)

__all__ = [
    "PROBES", "probe", "finding", "inconclusive", "summarize",
    "SDPA_MEMBERS", "NO_KERNEL", "NoKernel", "run_sdpa", "attention_vs_fp64", "TF32_LEVEL", "BF16_LEVEL",
    "memory_shortfall", "ENVIRONMENT_PROBLEMS", "_compile_failure", "masked_pooling", "kfd_gfx_targets", "gfx_name", "override_target",
    # the probes, in registry order
    "sdpa_mask_rocm", "sdpa_fullmask_nan", "sdpa_mask_dtype", "sdpa_cudnn", "sdpa_cudnn_gqa", "sdpa_cudnn_mask_lse",
    "sdpa_cudnn_sq1_lse", "sdpa_noncontig_v", "sdpa_fp32_lse_race", "sdpa_eff_stride0",
    "sdpa_maskgrad", "sdpa_fused_vs_fp64", "sdpa_aotriton_rdna35", "sdpa_fused_launch", "sdpa_flash_alone",
    "sdpa_misaligned", "sdpa_efficient_misaligned", "sdpa_misaligned_silent",
    "cpu_bf16_layer_norm_grad", "cpu_fp16_layer_norm_grad", "fp16_cross_entropy_mean", "bf16_cross_entropy_onehot", "norm_weight_grads", "layer_norm_huge_rows", "softmax_fp64_odd", "tf32_defaults",
    "xf32_high_precision", "gemm_large_m", "gemm_2gib_tail", "bf16_emulated", "conv2d_vs_fp64", "conv_train_step",
    "compile_masked_pooling", "compile_bf16_block", "checkpoint_masked_attention", "det_cublas_workspace",
    "gemv_twice_bitwise", "flex_attention_twice", "all_reduce_timed", "all_reduce_size_sweep",
    "all_reduce_small_repeated", "layer_norm_2pow32", "cumsum_2pow32", "gemm_4gib_tail", "gemm_huge_m", "triton_buffer_ops_2gib", "sdpa_long_mask",
    "gemm_small_dim_fp32", "gemm_transposed_fp32", "arch_smoke",
    "lstm_vs_fp64", "scaled_mm_scale_result", "grouped_mm_repeat", "compile_layer_norm_reciprocal",
    "compile_layer_norm_bf16", "all_reduce_one_rank_avg", "conv3d_bf16_large",
    "rocm_perms", "hsa_override", "apu_memory", "numa_spill",
]
