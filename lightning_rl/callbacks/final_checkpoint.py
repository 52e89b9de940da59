"""A run's checkpoints beyond Lightning's own: the state at the end of every fit (``last.ckpt``
beside the run's other checkpoints), ``ModelCheckpoint(every_n_train_steps=N)`` at iteration ends,
and the files ``fit(ckpt_path="last")`` resumes from a new Trainer."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
from pytorch_lightning.callbacks import ModelCheckpoint

INTERRUPTED_FILENAME = "interrupted"  # InterruptCheckpoint's file, without .ckpt


class FinalCheckpoint(pl.Callback):
    """Saves ``<checkpoint dir>/last.ckpt`` when ``fit`` ends (the ``total_env_steps`` budget, the
    Trainer's limits or ``EarlyStopping``), whatever the ``ModelCheckpoint``'s monitor and cadence.

    A ``ModelCheckpoint`` saves at epoch ends or after validation, so a budget that runs out
    between them (``evaluation_interval > 1``, or mid-epoch) would leave the final weights and
    counters nowhere. The directory is the Trainer's ``ModelCheckpoint``'s (under the logger's
    version folder by default); ``enable_checkpointing=False`` (no ``ModelCheckpoint``) saves
    nothing, and neither does ``fast_dev_run``. The file is that ``ModelCheckpoint``'s
    ``last_model_path`` afterwards, so ``trainer.fit(model, ckpt_path="last")`` resumes it, from
    this Trainer or a new one (``PreviousRuns``). Saving is collective under DDP: ``on_train_end``
    runs on every rank.
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


class StepCadence(pl.Callback):
    """``ModelCheckpoint(every_n_train_steps=N)`` saves at the first iteration end at or past each
    multiple of N optimizer steps (``trainer.global_step``); an iteration that passes several
    multiples saves once.

    Lightning saves only at an iteration end where ``global_step`` is a multiple of N, which an
    iteration of several optimizer steps (a PPO iteration's minibatches, DQN's
    ``num_gradient_steps``) mostly steps over, and then warns about manual optimization. This
    callback saves first (Lightning runs checkpoint callbacks last), as the ``ModelCheckpoint``
    would (its top-k and ``save_last``, or, when its monitored metric is not logged yet, after the
    next validation); its own hook then finds the step saved. It calls ``ModelCheckpoint``'s private
    save methods (Lightning 2.6), as no public one saves on demand. ``global_step`` is the same on
    every DDP rank, so every rank saves (collectively) at the same iteration."""

    def __init__(self) -> None:
        self._previous = 0

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._previous = trainer.global_step  # a resumed run's too

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *_: Any) -> None:
        step, previous = trainer.global_step, self._previous
        self._previous = step
        for checkpoint in trainer.checkpoint_callbacks:
            every = getattr(checkpoint, "_every_n_train_steps", 0) if isinstance(checkpoint, ModelCheckpoint) else 0
            if every < 1 or step // every == previous // every or checkpoint._should_skip_saving_checkpoint(trainer):
                continue
            candidates = checkpoint._monitor_candidates(trainer)
            if checkpoint.monitor is not None and checkpoint.monitor not in candidates:
                checkpoint._defer_save_until_validation = True
                continue
            checkpoint._save_topk_checkpoint(trainer, candidates)
            checkpoint._save_last_checkpoint(trainer, candidates)


class PreviousRuns(ModelCheckpoint):
    """Offers ``fit(ckpt_path="last")`` the files earlier Trainers left for the run
    (``resumable_checkpoints``): Lightning's ``"last"`` looks in this Trainer's own checkpoint
    folder only, with a logger a new version folder, empty. Lightning resumes the newest of
    every candidate (by modification time).

    A ``ModelCheckpoint`` that saves nothing, on the Trainer only while ``fit`` resolves its
    ``ckpt_path``: ``TrainerWiring.attached`` adds it, ``TrainerWiring.callbacks`` (the module's
    ``configure_callbacks``, which Lightning calls next) removes it. Lightning asks each
    ``ModelCheckpoint`` for its last files through ``_find_last_checkpoints``; a
    ``OnExceptionCheckpoint`` would be asked too, but its presence makes Lightning resume
    ``"last"`` when no ``ckpt_path`` is given. Under DDP every rank resolves before the ranks
    connect, from the same files, so to the same path."""

    def __init__(self) -> None:
        super().__init__(save_top_k=0)

    def _find_last_checkpoints(self, trainer: pl.Trainer) -> set[str]:
        return resumable_checkpoints(trainer)

    @classmethod
    def offer(cls, trainer: pl.Trainer) -> None:
        cls.withdraw(trainer)
        trainer.callbacks.append(cls())

    @classmethod
    def withdraw(cls, trainer: pl.Trainer) -> None:
        trainer.callbacks[:] = [cb for cb in trainer.callbacks if not isinstance(cb, cls)]


def resumable_checkpoints(trainer: pl.Trainer) -> set[str]:
    """The files a run of ``trainer`` can resume: each ``last.ckpt`` (``FinalCheckpoint``, or a
    ``ModelCheckpoint``'s ``save_last``) and ``interrupted.ckpt`` (``InterruptCheckpoint``) in the
    folders its runs save to: ``<default_root_dir>/checkpoints``, a ``ModelCheckpoint``'s
    ``dirpath``, and, with a logger, every version folder's ``checkpoints`` (``<save_dir>/<name>/
    */checkpoints``) and ``<save_dir>/checkpoints``."""
    folders = {Path(trainer.default_root_dir) / "checkpoints"}
    folders.update(Path(cb.dirpath) for cb in trainer.checkpoint_callbacks
                   if isinstance(cb, ModelCheckpoint) and cb.dirpath and not isinstance(cb, PreviousRuns))
    if trainer.loggers:
        logger = trainer.loggers[0]
        save_dir = Path(logger.save_dir or trainer.default_root_dir)
        folders.add(save_dir / "checkpoints")
        folders.update((save_dir / (logger.name or "")).glob("*/checkpoints"))
    last = ModelCheckpoint.CHECKPOINT_NAME_LAST
    names = (f"{last}.ckpt", f"{last}-v*.ckpt", f"{INTERRUPTED_FILENAME}.ckpt")
    return {os.path.normpath(path) for folder in folders for name in names for path in folder.glob(name)}
