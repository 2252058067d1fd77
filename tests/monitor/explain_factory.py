"""A SPEC factory for the explain tests: a tiny attention model with GQA (4 query heads, 2 KV)."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class GqaBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(32)
        self.q = nn.Linear(32, 32)
        self.kv = nn.Linear(32, 32)

    def forward(self, x):
        h = self.norm(x)
        q = self.q(h).view(2, 10, 4, 8).transpose(1, 2)
        k, v = self.kv(h).view(2, 10, 2, 2, 8).permute(3, 0, 2, 1, 4)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return out.transpose(1, 2).reshape(2, 10, 32)


def tiny(device="cpu", dtype=torch.float32):
    torch.manual_seed(0)
    return GqaBlock().to(device, dtype), (torch.randn(2, 10, 32).to(device, dtype),)
