"""FlashAttention's `flash_attn.ops.triton` package on gpuparity's verified ops."""
