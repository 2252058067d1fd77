"""What every training workload shares: a size preset (data config, model config, steps, lr),
command-line overrides of its fields, and batches drawn from its data set."""
from __future__ import annotations

import dataclasses
from typing import Any, Dict, Optional


class PresetWorkload:
    """Base of AamWorkload and CnnWorkload; a subclass sets name and sizes and builds self.data."""
    name = ""
    sizes: Dict[str, Dict[str, Any]] = {}

    def _apply_preset(self, size: str, overrides: Optional[Dict[str, Any]], **model_fields) -> None:
        if size not in self.sizes:
            raise ValueError(f"size: expected one of {sorted(self.sizes)}, got {size!r}")
        preset = self.sizes[size]
        self.size = size
        self.data_config = dataclasses.replace(preset["data"])
        self.model_config = dataclasses.replace(preset["model"], **model_fields)
        self.default_steps = preset["steps"]
        self.lr = preset["lr"]
        self.eval_batches = preset["eval_batches"]
        for key, value in (overrides or {}).items():
            for target in (self.data_config, self.model_config):
                if hasattr(target, key):
                    setattr(target, key, value)
                    break
            else:
                raise ValueError(f"{self.name}: no setting {key!r} (data: {list(vars(self.data_config))}, "
                                 f"model: {list(vars(self.model_config))})")

    def config(self) -> Dict[str, Any]:
        return {"size": self.size, "data": dataclasses.asdict(self.data_config),
                "model": dataclasses.asdict(self.model_config), "lr": self.lr}

    def batch(self, index: int):
        return self.data.batch(index)
