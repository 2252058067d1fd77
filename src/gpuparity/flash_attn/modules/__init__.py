"""FlashAttention's `flash_attn.modules` package: its modules (mha, mlp) are refused at import,
with gpuparity's equivalent named."""
