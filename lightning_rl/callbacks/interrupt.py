"""Save a checkpoint when training is interrupted with Ctrl-C (SIGINT)."""

from __future__ import annotations

from typing import Any

import pytorch_lightning as pl
from pytorch_lightning.callbacks import OnExceptionCheckpoint
from pytorch_lightning.utilities import rank_zero_info


class InterruptCheckpoint(OnExceptionCheckpoint):
    """Lightning's ``OnExceptionCheckpoint``, for ``KeyboardInterrupt`` only: Ctrl-C leaves
    ``<dirpath>/interrupted.ckpt``, which ``trainer.fit(model, ckpt_path=...)`` resumes.
    Other exceptions are bugs to see, not states to resume from."""

    def __init__(self, dirpath: str, filename: str = "interrupted") -> None:
        super().__init__(dirpath, filename)

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        if not isinstance(exception, KeyboardInterrupt):
            return
        super().on_exception(trainer, pl_module, exception)
        rank_zero_info(f"Interrupted: saved {self.ckpt_path}; resume with trainer.fit(model, ckpt_path=...)")

    def state_dict(self) -> dict[str, Any]:
        return {}
