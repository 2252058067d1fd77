"""`gpuparity.monitor` as a transformers `TrainerCallback`:

    from gpuparity.integrations.monitor_callback import MonitorCallback
    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[MonitorCallback(every=100)])
    trainer.train()        # sampled calls checked in the background; failures logged as they come
    print(trainer.callback_handler.callbacks[-1].report.summary())

Importable without transformers (the class then derives from object and can be driven by any
loop that calls the same hooks); the monitor itself never imports transformers.
"""
from __future__ import annotations

import logging
from typing import Any, Optional

from ..shadow import Monitor, MonitorReport

LOG = logging.getLogger("gpuparity")

try:   # a subclass when transformers is there, so Trainer's callback handler accepts it
    from transformers import TrainerCallback as _Base
except ImportError:   # pragma: no cover - exercised where transformers is absent
    _Base = object


class MonitorCallback(_Base):
    """Watch the Trainer's model from on_train_begin to on_train_end; steps are the Trainer's
    global_step. options: those of gpuparity.monitor (repro_dir, max_pending, ...)."""

    def __init__(self, every: int = 100, **options: Any):
        self.every, self.options = every, options
        self.monitor: Optional[Monitor] = None
        self.report: Optional[MonitorReport] = None
        Monitor(None, every, **options)   # bad arguments fail here, before training starts

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self.monitor = Monitor(model, self.every, **self.options)
        self.monitor.__enter__()

    def on_step_begin(self, args, state, control, **kwargs):
        if self.monitor is not None:
            self.monitor.step(state.global_step)

    def on_train_end(self, args, state, control, **kwargs):
        if self.monitor is None:
            return
        self.monitor.close()
        self.report = self.monitor.report()
        self.monitor = None
        (LOG.warning if self.report.failures else LOG.info)("%s", self.report.summary())
