"""FlashAttention's `flash_attn.losses` package on gpuparity: `losses.cross_entropy`."""
