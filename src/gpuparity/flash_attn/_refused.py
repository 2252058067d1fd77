"""FlashAttention modules gpuparity.flash_attn does not serve (CUDA-extension layers and fused
modules): importing one raises one ImportError line naming gpuparity's equivalent."""
from __future__ import annotations

# FlashAttention's module path -> what to use instead
INSTEAD = {
    "modules.mha": "gpuparity.nn.MultiheadAttention, or your model's own attention calling "
                   "gpuparity.flash_attn.flash_attn_func / gpuparity.attention",
    "modules.mlp": "torch.nn.Linear layers with gpuparity.swiglu (the gated MLP's activation)",
    "ops.fused_dense": "torch.nn.Linear (cuBLAS's GEMM with its bias and activation epilogues under "
                       "torch.compile), and gpuparity.linear_cross_entropy for an LM head",
    "ops.activations": "gpuparity.swiglu, or torch.nn.functional.gelu / silu",
    "ops.layer_norm": "gpuparity.layer_norm (residual add and dropout as torch ops before it)",
    "ops.rms_norm": "gpuparity.rms_norm (residual add and dropout as torch ops before it)",
}


def refuse(module_name: str) -> None:
    """Raise the ImportError for refused module `module_name` (imported as flash_attn.<path> or
    gpuparity.flash_attn.<path>)."""
    path = module_name.split("flash_attn.", 1)[-1]
    raise ImportError(f"flash_attn.{path} is not provided by gpuparity.flash_attn (FlashAttention's CUDA-extension "
                      f"module); use {INSTEAD[path]}", name=module_name)
