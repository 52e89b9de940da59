"""The training metrics of a logged iteration, written in one go.

``self.log`` costs 0.3-0.5 ms per name in Lightning's result collection (a tensor, a
``_ResultMetric`` update and its device move per call); a logged PPO iteration has about 36
names, which made logging 15% of a CartPole fit. The callbacks here stage their scalars
(``stage``) and ``MetricsWriter`` writes them once per logged iteration, where ``self.log``
of an on-step value would have put them: one logger row at the run's global env steps,
``trainer.callback_metrics`` (what ``ModelCheckpoint(monitor=...)`` and ``EarlyStopping``
read) and ``trainer.progress_bar_metrics``. Lightning's own path stays for what a user's
module or callback logs, and for validation.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from weakref import WeakKeyDictionary

import pytorch_lightning as pl
import torch

_STAGED: WeakKeyDictionary[pl.Trainer, tuple[dict[str, float], dict[str, float]]] = WeakKeyDictionary()


def should_log(trainer: pl.Trainer, batch_idx: int) -> bool:
    """Log on the iterations Lightning writes to its loggers (every ``log_every_n_steps``) and
    on the last of each epoch, for epoch-end monitors. Writing costs more than an iteration of
    small-batch RL, and on other iterations Lightning would discard a logged value."""
    return batch_idx + 1 >= trainer.num_training_batches or writes_row(trainer)


def writes_row(trainer: pl.Trainer) -> bool:
    """Whether Lightning would write a logged value of this training step to the loggers:
    every ``log_every_n_steps`` batches of the fit, and when it stops. (On the other
    iterations ``should_log`` picks, a value only reaches ``trainer.callback_metrics``.)"""
    if trainer.should_stop:
        return True
    # the fit's batches so far, this one included: the step Lightning's logger cadence counts
    step = trainer.fit_loop.epoch_loop.batch_progress.total.ready
    return trainer.log_every_n_steps > 0 and step % trainer.log_every_n_steps == 0


def stage(trainer: pl.Trainer, metrics: Mapping[str, float], progress_bar: Mapping[str, float] | None = None) -> None:
    """Adds ``metrics`` (to the loggers and ``callback_metrics``) and ``progress_bar`` (to the
    bar only) to what ``MetricsWriter`` writes at the end of this training step."""
    logged, bar = _STAGED.setdefault(trainer, ({}, {}))
    logged.update(metrics)
    bar.update(progress_bar or {})


def write_staged(trainer: pl.Trainer, step: int) -> None:
    """Writes what was staged: into ``trainer.callback_metrics``, and as one logger row at
    x-axis ``step`` where Lightning writes one (``writes_row``); nothing when nothing was staged."""
    logged, bar = _STAGED.pop(trainer, ({}, {}))
    if logged:
        tensors = {name: torch.tensor(value) for name, value in logged.items()}
        tensors["step"] = torch.tensor(float(step))  # as a logged "step" was: ModelCheckpoint's {step}
        trainer.callback_metrics.update(tensors)
        if writes_row(trainer):
            trainer.logged_metrics.update(tensors)
            for logger in trainer.loggers:  # (loggers write on global rank zero only)
                logger.log_metrics(dict(logged), step=step)
                logger.save()
    trainer.progress_bar_metrics.update(bar)


class MetricsWriter(pl.Callback):
    """Writes the metrics this package's callbacks staged during a training step, after them
    (``TrainerWiring`` adds it behind them), at the module's global env steps."""

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: Any, *_: Any) -> None:
        write_staged(trainer, int(pl_module.global_counters["num_env_steps_sampled"]))

    def on_train_end(self, trainer: pl.Trainer, pl_module: Any) -> None:
        _STAGED.pop(trainer, None)  # a step that raised leaves nothing behind for the next fit
