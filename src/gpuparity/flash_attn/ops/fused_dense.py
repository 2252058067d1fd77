"""FlashAttention's flash_attn.ops.fused_dense, refused at import (see gpuparity.flash_attn._refused)."""
from gpuparity.flash_attn._refused import refuse

refuse(__name__)
