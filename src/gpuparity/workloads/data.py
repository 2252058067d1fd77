"""Synthetic, seeded training data with a learnable signal, the same on every machine (made on
the CPU with torch.Generator, then moved).

- Nucleotide sets (aam): a family of motifs descends from one root sequence (a Markov chain, so
  a nucleotide is predictable from its neighbours); each sequence is a motif with substitutions,
  cut to a random length and padded. Samples are padded sets of sequences. Targets: masked
  nucleotides, and the pairwise distance between the motifs two sequences came from.
  Training batches are padded to their longest sequence (dynamic padding), evaluation batches
  further, to pad_len: a correct model does not depend on padding, so this costs it nothing,
  while a model whose attention mask is broken meets padding it never saw in training.
- Images (cnn): one smooth template per class plus noise.
"""
from __future__ import annotations

import dataclasses
from typing import Dict, Optional

import torch

PAD, A, C, G, T, MASK = 0, 1, 2, 3, 4, 5
VOCAB = 6
IGNORE = -100


def _generator(seed: int, stream: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(int(seed) * 1_000_003 + int(stream))


@dataclasses.dataclass
class NucleotideConfig:
    sets: int = 16            # samples per batch
    set_size: int = 32        # sequence slots per sample (16 x 32 = 512 sequences)
    min_len: int = 64         # sequence lengths are drawn from [min_len, max_len]
    max_len: int = 150
    pad_len: int = 256        # evaluation batches are padded to this length
    motifs: int = 16
    mutation: float = 0.05    # substitutions per position, sequence vs its motif
    mask_prob: float = 0.15
    min_fill: float = 0.5     # a set holds between min_fill * set_size and set_size sequences
    markov_stay: float = 0.7  # P(next nucleotide = the one the chain prefers)


class NucleotideSets:
    """Batches of padded sets of padded nucleotide sequences. `batch(i)` depends only on the
    seed and i."""

    def __init__(self, config: NucleotideConfig, seed: int = 0):
        self.config = config
        self.seed = seed
        g = _generator(seed)
        cfg = config
        # The root: a Markov chain that prefers nucleotide (prev + 1) mod 4.
        root = torch.empty(cfg.pad_len, dtype=torch.long)
        root[0] = torch.randint(0, 4, (1,), generator=g)
        for pos in range(1, cfg.pad_len):
            if torch.rand(1, generator=g).item() < cfg.markov_stay:
                root[pos] = (root[pos - 1] + 1) % 4
            else:
                root[pos] = torch.randint(0, 4, (1,), generator=g)
        # Motifs diverge from the root at different rates, so their distances spread out.
        rates = torch.linspace(0.03, 0.6, cfg.motifs)
        motifs = root.repeat(cfg.motifs, 1)
        for i in range(cfg.motifs):
            changed = torch.rand(cfg.pad_len, generator=g) < rates[i]
            motifs[i][changed] = torch.randint(0, 4, (int(changed.sum()),), generator=g)
        self.motifs = motifs + A  # tokens A..T
        within = self.motifs[:, :cfg.max_len]
        self.motif_distance = (within[:, None, :] != within[None, :, :]).float().mean(-1)

    def batch(self, index: int, pad_to: Optional[int] = None) -> Dict[str, torch.Tensor]:
        """tokens (B, S, L) with MASK at masked positions and PAD beyond each length and in empty
        slots; targets (B, S, L): the nucleotide class 0..3 at masked positions, else -100;
        distances (B, S, S) and pair_mask (B, S, S): the pairs of real, distinct sequences.
        L is pad_to, or the longest sequence of the batch when pad_to is None."""
        cfg = self.config
        if pad_to is not None and not cfg.max_len <= pad_to <= cfg.pad_len:
            raise ValueError(f"pad_to: expected a length in [{cfg.max_len}, {cfg.pad_len}], got {pad_to}")
        g = _generator(self.seed, 1 + index)
        batch, slots, length = cfg.sets, cfg.set_size, cfg.pad_len
        low = max(1, int(round(cfg.min_fill * slots)))
        counts = torch.randint(low, slots + 1, (batch,), generator=g)
        present = torch.arange(slots)[None, :] < counts[:, None]                         # (B, S)
        motif_id = torch.randint(0, cfg.motifs, (batch, slots), generator=g)
        lengths = torch.randint(cfg.min_len, cfg.max_len + 1, (batch, slots), generator=g)
        clean = self.motifs[motif_id]                                                    # (B, S, L)
        mutate = torch.rand(batch, slots, length, generator=g) < cfg.mutation
        clean = torch.where(mutate, torch.randint(A, T + 1, (batch, slots, length), generator=g), clean)
        real = (torch.arange(length)[None, None, :] < lengths[..., None]) & present[..., None]
        clean = clean.masked_fill(~real, PAD)
        masked = (torch.rand(batch, slots, length, generator=g) < cfg.mask_prob) & real
        tokens = clean.masked_fill(masked, MASK)
        targets = torch.where(masked, clean - A, torch.full_like(clean, IGNORE))
        distances = self.motif_distance[motif_id[:, :, None], motif_id[:, None, :]]
        pair_mask = present[:, :, None] & present[:, None, :] & ~torch.eye(slots, dtype=torch.bool)[None]
        keep = pad_to if pad_to is not None else int((lengths * present).max())
        return {"tokens": tokens[..., :keep].contiguous(), "targets": targets[..., :keep].contiguous(),
                "distances": distances, "pair_mask": pair_mask}


@dataclasses.dataclass
class ImageConfig:
    batch: int = 256
    size: int = 32
    classes: int = 10
    channels: int = 3
    signal: float = 0.6       # template amplitude against unit noise


class ImageClasses:
    """Noisy images whose class is a fixed smooth template."""

    def __init__(self, config: ImageConfig, seed: int = 0):
        self.config = config
        self.seed = seed
        g = _generator(seed)
        coarse = torch.randn(config.classes, config.channels, 4, 4, generator=g)
        templates = torch.nn.functional.interpolate(coarse, size=(config.size, config.size), mode="bilinear",
                                                    align_corners=False)
        self.templates = templates / templates.flatten(1).std(1).view(-1, 1, 1, 1)

    def batch(self, index: int) -> Dict[str, torch.Tensor]:
        cfg = self.config
        g = _generator(self.seed, 1 + index)
        labels = torch.randint(0, cfg.classes, (cfg.batch,), generator=g)
        noise = torch.randn(cfg.batch, cfg.channels, cfg.size, cfg.size, generator=g)
        return {"images": cfg.signal * self.templates[labels] + noise, "labels": labels}
