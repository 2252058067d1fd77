"""FlashAttention's `flash_attn.ops` package on gpuparity: `ops.triton.rotary` and
`ops.triton.cross_entropy` are served; the CUDA-extension modules (`fused_dense`, `activations`,
`layer_norm`, `rms_norm`) refuse at import with the gpuparity function to use instead."""
