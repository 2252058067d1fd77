"""FlashAttention's `flash_attn.layers` package on gpuparity: `layers.rotary`."""
