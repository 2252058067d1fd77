"""A small conv net training loop: user story 2's crash scenario (consumer AMD GPUs died with
HSA memory aperture violations in convolutions and training loops while basic ops passed).
`gpuparity workload run cnn` runs it in a separate process, so a crash becomes a result.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Dict, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from .data import ImageClasses, ImageConfig
from .preset import PresetWorkload


@dataclasses.dataclass
class CnnConfig:
    channels: int = 3
    width: int = 32
    classes: int = 10


def conv_block(c_in: int, c_out: int, stride: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False),
                         nn.BatchNorm2d(c_out), nn.ReLU())


class SmallCNN(nn.Module):
    def __init__(self, cfg: CnnConfig):
        super().__init__()
        w = cfg.width
        self.features = nn.Sequential(conv_block(cfg.channels, w, 1), conv_block(w, 2 * w, 2),
                                      conv_block(2 * w, 4 * w, 2))
        self.head = nn.Linear(4 * w, cfg.classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(images).mean(dim=(2, 3)))


SIZES = {
    "full": {"data": ImageConfig(), "model": CnnConfig(), "steps": 200, "lr": 2e-3, "eval_batches": 4},
    "small": {"data": ImageConfig(batch=32, size=16), "model": CnnConfig(width=8), "steps": 30, "lr": 3e-3,
              "eval_batches": 4},
}


class CnnWorkload(PresetWorkload):
    name = "cnn"
    metrics = ("loss", "acc")
    sizes = SIZES

    def __init__(self, size: str = "full", seed: int = 0, attn: Optional[str] = None,
                 overrides: Optional[Dict[str, Any]] = None):
        self._apply_preset(size, overrides)
        if attn not in (None, "auto"):
            raise ValueError(f"attn: the cnn workload has no attention, got --attn {attn!r}")
        self.model_config.classes = self.data_config.classes
        self.model_config.channels = self.data_config.channels
        self.data = ImageClasses(self.data_config, seed)

    def model(self) -> nn.Module:
        return SmallCNN(self.model_config)

    def eval_batch(self, index: int) -> Dict[str, torch.Tensor]:
        return self.data.batch(10_000_000 + index)

    def step(self, model: nn.Module, batch: Dict[str, torch.Tensor]) -> Tuple[torch.Tensor, Dict[str, float]]:
        logits = model(batch["images"]).float()
        loss = F.cross_entropy(logits, batch["labels"])
        acc = (logits.argmax(-1) == batch["labels"]).float().mean()
        return loss, {"loss": loss.item(), "acc": acc.item()}


def trace_factory(device="cpu", dtype=torch.float32, size: str = "small", seed: int = 0):
    """SPEC factory for `gpuparity trace`: the conv net (eval mode, initialised on the CPU) and one batch."""
    workload = CnnWorkload(size=size, seed=seed)
    torch.manual_seed(seed)
    model = workload.model().eval()
    images = workload.batch(0)["images"]
    return model.to(device=device, dtype=dtype), (images.to(device=device, dtype=dtype),)
