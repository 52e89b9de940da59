"""The state at the end of every fit, saved as ``last.ckpt`` beside the run's other checkpoints."""

from __future__ import annotations

import os

import pytorch_lightning as pl
from pytorch_lightning.callbacks import ModelCheckpoint


class FinalCheckpoint(pl.Callback):
    """Saves ``<checkpoint dir>/last.ckpt`` when ``fit`` ends (the ``total_env_steps`` budget, the
    Trainer's limits or ``EarlyStopping``), whatever the ``ModelCheckpoint``'s monitor and cadence.

    A ``ModelCheckpoint`` saves at epoch ends or after validation, so a budget that runs out
    between them (``evaluation_interval > 1``, or mid-epoch) would leave the final weights and
    counters nowhere. The directory is the Trainer's ``ModelCheckpoint``'s (under the logger's
    version folder by default); ``enable_checkpointing=False`` (no ``ModelCheckpoint``) saves
    nothing, and neither does ``fast_dev_run``. The file is that ``ModelCheckpoint``'s
    ``last_model_path`` afterwards, so ``trainer.fit(model, ckpt_path="last")`` resumes it.
    Saving is collective under DDP: ``on_train_end`` runs on every rank.
    """

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        checkpoint = model_checkpoint(trainer)
        if checkpoint is None or checkpoint.dirpath is None or trainer.fast_dev_run:
            return
        path = os.path.join(checkpoint.dirpath, checkpoint.CHECKPOINT_NAME_LAST + checkpoint.FILE_EXTENSION)
        trainer.save_checkpoint(path, weights_only=False)
        for callback in trainer.checkpoint_callbacks:
            if isinstance(callback, ModelCheckpoint) and callback.dirpath == checkpoint.dirpath:
                # its own save_last (if set) then writes this same file rather than last-v1.ckpt
                callback.last_model_path = path


def model_checkpoint(trainer: pl.Trainer) -> ModelCheckpoint | None:
    """The Trainer's first ``ModelCheckpoint`` (``trainer.checkpoint_callback`` is the first
    ``Checkpoint`` of any kind, an ``OnExceptionCheckpoint`` too)."""
    return next((cb for cb in trainer.checkpoint_callbacks if isinstance(cb, ModelCheckpoint)), None)
