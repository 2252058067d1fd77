"""The reference model after user story 1 (a microbiome sequence transformer), in one file.

Nucleotide tokens -> a per-sequence transformer over padded sequences (of up to 150 tokens) ->
attention pooling to one vector per sequence -> a set-level transformer over padded sets of
sequences -> heads for masked-nucleotide prediction and pairwise-distance regression.
Every attention, including the pooling, goes through `gpuparity.attention` with a key padding
mask and the backend named in the config, so a backend that gets masks wrong shows up here
the way it did for the user.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Dict, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from .data import IGNORE, PAD, VOCAB, NucleotideConfig, NucleotideSets
from .preset import PresetWorkload


@dataclasses.dataclass
class AamConfig:
    positions: int = 256        # the longest padded sequence the model takes
    d_model: int = 128         # 4 heads of 32: the attention shape aam-nuc (512, 4, 150, 32) of docs/targets.md
    heads: int = 4
    seq_layers: int = 2
    set_layers: int = 2
    ffn_mult: int = 4
    attn: str = "auto"          # the gpuparity.attention backend
    dist_weight: float = 1.0


def attention(q, k, v, key_padding_mask, backend: str):
    """gpuparity.attention, or the registered backend itself where the ops layer is absent."""
    if backend.startswith("planted"):
        from . import planted  # noqa: F401 - registers the test-only backends
    try:
        from ..ops.attention import attention as gp_attention
    except ImportError:
        from .. import dispatch
        name = "sdpa_math" if backend == "auto" else backend
        return dispatch.get("attention", name).fn(q, k, v, key_padding_mask=key_padding_mask)
    return gp_attention(q, k, v, key_padding_mask=key_padding_mask, backend=backend)


class Attention(nn.Module):
    """The attention computation alone (no weights): the unit a trace points at."""

    def __init__(self, backend: str):
        super().__init__()
        self.backend = backend

    def forward(self, q, k, v, key_padding_mask):
        return attention(q, k, v, key_padding_mask, self.backend)

    def extra_repr(self) -> str:
        return f"backend={self.backend!r}"


class SelfAttention(nn.Module):
    def __init__(self, cfg: AamConfig):
        super().__init__()
        self.heads = cfg.heads
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.core = Attention(cfg.attn)
        self.out = nn.Linear(cfg.d_model, cfg.d_model)

    def forward(self, x, key_padding_mask):
        batch, length, width = x.shape
        q, k, v = self.qkv(x).view(batch, length, 3, self.heads, width // self.heads).permute(2, 0, 3, 1, 4)
        y = self.core(q, k, v, key_padding_mask)                       # (B, H, L, Dh)
        return self.out(y.transpose(1, 2).reshape(batch, length, width))


class Block(nn.Module):
    """Pre-LayerNorm transformer block."""

    def __init__(self, cfg: AamConfig):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.attn = SelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.mlp = nn.Sequential(nn.Linear(cfg.d_model, cfg.ffn_mult * cfg.d_model), nn.GELU(),
                                 nn.Linear(cfg.ffn_mult * cfg.d_model, cfg.d_model))

    def forward(self, x, key_padding_mask):
        x = x + self.attn(self.ln1(x), key_padding_mask)
        return x + self.mlp(self.ln2(x))


class AttentionPooling(nn.Module):
    """One learned query per head attends over a sequence's tokens (padding masked out)."""

    def __init__(self, cfg: AamConfig):
        super().__init__()
        self.heads = cfg.heads
        self.query = nn.Parameter(torch.randn(1, cfg.heads, 1, cfg.d_model // cfg.heads) * 0.5)
        self.kv = nn.Linear(cfg.d_model, 2 * cfg.d_model)
        self.core = Attention(cfg.attn)
        self.out = nn.Linear(cfg.d_model, cfg.d_model)

    def forward(self, x, key_padding_mask):
        batch, length, width = x.shape
        k, v = self.kv(x).view(batch, length, 2, self.heads, width // self.heads).permute(2, 0, 3, 1, 4)
        q = self.query.to(k.dtype).expand(batch, -1, -1, -1)
        pooled = self.core(q, k, v, key_padding_mask)                  # (B, H, 1, Dh)
        return self.out(pooled.reshape(batch, width))


class AAM(nn.Module):
    def __init__(self, cfg: AamConfig):
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(VOCAB, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.positions, cfg.d_model)
        self.seq_blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.seq_layers))
        self.seq_ln = nn.LayerNorm(cfg.d_model)
        self.nuc_head = nn.Linear(cfg.d_model, 4)
        self.pool = AttentionPooling(cfg)
        self.set_blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.set_layers))
        self.set_ln = nn.LayerNorm(cfg.d_model)
        self.dist_proj = nn.Linear(cfg.d_model, cfg.d_model)

    def forward(self, tokens: torch.Tensor) -> Dict[str, torch.Tensor]:
        """tokens (B, S, L) -> nuc_logits (B, S, L, 4), embeddings (B, S, D), distances (B, S, S)."""
        batch, slots, length = tokens.shape
        flat = tokens.reshape(batch * slots, length)
        padding = flat == PAD                                          # True = ignore this key
        positions = torch.arange(length, device=tokens.device)
        x = self.tok_emb(flat) + self.pos_emb(positions)
        for block in self.seq_blocks:
            x = block(x, padding)
        x = self.seq_ln(x)
        nuc_logits = self.nuc_head(x).view(batch, slots, length, 4)
        h = self.pool(x, padding).view(batch, slots, -1)
        empty_slots = padding.all(-1).view(batch, slots)
        for block in self.set_blocks:
            h = block(h, empty_slots)
        h = self.set_ln(h)
        z = self.dist_proj(h).float()
        gap = z[:, :, None, :] - z[:, None, :, :]
        # eps keeps the gradient finite on the diagonal (distance 0)
        distances = torch.sqrt(gap.pow(2).mean(-1) + 1e-6)
        return {"nuc_logits": nuc_logits, "embeddings": h, "distances": distances}


def loss_and_metrics(out: Dict[str, torch.Tensor], batch: Dict[str, torch.Tensor], dist_weight: float = 1.0
                     ) -> Tuple[torch.Tensor, Dict[str, float]]:
    logits = out["nuc_logits"].float()
    targets = batch["targets"]
    loss_nuc = F.cross_entropy(logits.reshape(-1, 4), targets.reshape(-1), ignore_index=IGNORE)
    picked = targets != IGNORE
    nuc_acc = (logits.argmax(-1)[picked] == targets[picked]).float().mean()
    pair = batch["pair_mask"]
    loss_dist = F.mse_loss(out["distances"][pair], batch["distances"][pair])
    loss = loss_nuc + dist_weight * loss_dist
    return loss, {"loss": loss.item(), "loss_nuc": loss_nuc.item(), "loss_dist": loss_dist.item(),
                  "nuc_acc": nuc_acc.item()}


# --------------------------------------------------------------------------- sizes and workload
SIZES = {
    # user story 1's shape: 512 sequences (16 sets x 32) of up to 150 tokens, 4 heads of dim 32;
    # evaluation pads to 256 (see data.py: a model with a broken mask shows it there)
    "full": {"data": NucleotideConfig(), "model": AamConfig(), "steps": 300, "lr": 3e-3, "eval_batches": 8},
    # small enough for a CPU test
    "small": {"data": NucleotideConfig(sets=4, set_size=6, min_len=6, max_len=16, pad_len=64, motifs=8),
              "model": AamConfig(d_model=32, heads=2), "steps": 30, "lr": 3e-3, "eval_batches": 16},
}


class AamWorkload(PresetWorkload):
    name = "aam"
    metrics = ("loss", "loss_nuc", "loss_dist", "nuc_acc")
    sizes = SIZES

    def __init__(self, size: str = "full", seed: int = 0, attn: str = "auto",
                 overrides: Optional[Dict[str, Any]] = None):
        self._apply_preset(size, overrides, attn=attn)
        if attn != "auto":
            if attn.startswith("planted"):
                from . import planted  # noqa: F401 - registers the test-only backends
            from .. import dispatch
            dispatch.get("attention", attn)  # a ValueError listing the names, before any training
        self.model_config.positions = self.data_config.pad_len
        self.data = NucleotideSets(self.data_config, seed)

    def model(self) -> nn.Module:
        return AAM(self.model_config)

    def eval_batch(self, index: int) -> Dict[str, torch.Tensor]:
        return self.data.batch(10_000_000 + index, pad_to=self.data_config.pad_len)

    def step(self, model: nn.Module, batch: Dict[str, torch.Tensor]):
        out = model(batch["tokens"])
        return loss_and_metrics(out, batch, self.model_config.dist_weight)


def trace_factory(device="cpu", dtype=torch.float32, attn: str = "sdpa_math", size: str = "small", seed: int = 0):
    """SPEC factory for `gpuparity trace`: the aam model (initialised on the CPU) and one batch.

    gpuparity trace record gpuparity.workloads.aam:trace_factory --factory-arg attn=sdpa_math
    """
    workload = AamWorkload(size=size, seed=seed, attn=attn)
    torch.manual_seed(seed)
    model = workload.model().eval()
    tokens = workload.batch(0)["tokens"]
    return model.to(device=device, dtype=dtype), (tokens.to(device),)
