"""A training progress bar that counts env steps toward the model's ``total_env_steps``."""

from __future__ import annotations

import sys
from typing import Any

import pytorch_lightning as pl
from pytorch_lightning.callbacks import RichProgressBar, TQDMProgressBar
from pytorch_lightning.callbacks.progress.tqdm_progress import Tqdm

# Shown by the bar itself (n and rate), or noise in a one-line view.
HIDDEN_METRICS = ("v_num", "env_steps", "steps/s")


class EnvStepProgressBar(TQDMProgressBar):
    """One bar for the whole fit: global env steps (``module.global_counters[module.budget_counter]``)
    out of ``module.total_env_steps``, with the rate and ETA, never reset at epoch ends (an
    epoch is ``iterations_per_epoch`` iterations, which says little about an RL run's progress).
    Without ``total_env_steps`` it counts env steps without a total. The description names the
    epoch; the postfix holds what is logged with ``prog_bar=True`` (the episode return mean,
    ``val/episode_return_mean``), less what the bar shows already. Validation keeps
    Lightning's own bar.

    ``Algorithm.configure_callbacks`` puts it in place of a plain ``TQDMProgressBar`` or
    ``RichProgressBar`` (Lightning's default: the Rich one when ``rich`` is installed), with the
    public settings of a TQDM bar (``like``; ``leave`` is not public: the default, False); any
    other progress bar is left alone.
    """

    BAR_FORMAT = "{l_bar}{bar}| {n_fmt}/{total_fmt} env steps [{elapsed}<{remaining}, {rate_noinv_fmt}{postfix}]"
    COUNT_FORMAT = "{desc}{n_fmt} env steps [{elapsed}, {rate_noinv_fmt}{postfix}]"

    def __init__(self, refresh_rate: int = 1, process_position: int = 0, leave: bool = False) -> None:
        super().__init__(refresh_rate=refresh_rate, process_position=process_position, leave=leave)
        self._total: int | None = None
        self._start = 0

    @classmethod
    def like(cls, bar: TQDMProgressBar | RichProgressBar) -> EnvStepProgressBar:
        """One with the public settings of ``bar``: a TQDM bar's refresh rate and position (a Rich
        bar's refresh rate counts something else: the defaults)."""
        if isinstance(bar, RichProgressBar):
            return cls()
        return cls(refresh_rate=bar.refresh_rate, process_position=bar.process_position)

    @staticmethod
    def env_steps(pl_module: pl.LightningModule) -> int:
        return int(pl_module.global_counters[pl_module.budget_counter])

    def init_train_tqdm(self) -> Tqdm:
        return Tqdm(
            desc=self.train_description,
            total=self._total,
            initial=self._start,  # resumed: the rate counts only this fit's steps
            position=2 * self.process_position,
            disable=self.is_disabled,
            leave=True,
            dynamic_ncols=True,
            file=sys.stdout,
            smoothing=0,
            unit=" steps",
            bar_format=self.BAR_FORMAT if self._total else self.COUNT_FORMAT,
        )

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        total = getattr(pl_module, "total_env_steps", None)
        self._total = int(total) if total else None
        self._start = self.env_steps(pl_module)
        self.train_progress_bar = self.init_train_tqdm()

    def on_train_epoch_start(self, trainer: pl.Trainer, *_: Any) -> None:
        self.train_progress_bar.set_description(f"Epoch {trainer.current_epoch}", refresh=False)

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        bar = self.train_progress_bar
        if bar is None or bar.disable:
            return
        if (batch_idx + 1) % self.refresh_rate == 0 or trainer.should_stop:
            bar.n = self.env_steps(pl_module)
            if bar.total is not None and bar.n > bar.total:  # the last iteration overshoots the budget
                bar.total = bar.n
            bar.set_postfix(self.get_metrics(trainer, pl_module))  # refreshes

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not self.train_progress_bar.disable:
            self.train_progress_bar.set_postfix(self.get_metrics(trainer, pl_module))

    def get_metrics(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> dict[str, Any]:
        items = super().get_metrics(trainer, pl_module)
        for name in HIDDEN_METRICS:
            items.pop(name, None)
        return items
