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
    ``val/episode_return_mean``), less what the bar shows already.

    The bars of the sanity check, validation and test count the evaluation's episodes (``3/10
    episodes``) out of the module's ``evaluation_num_episodes`` (per process under DDP): the
    evaluation (``evaluation.log_evaluation``) reports each episode's end to
    ``evaluation_episodes``; Lightning's own count, of batches, is one per evaluation.

    ``Algorithm.configure_callbacks`` puts it in place of a plain ``TQDMProgressBar`` or
    ``RichProgressBar`` (Lightning's default: the Rich one when ``rich`` is installed), with the
    public settings of a TQDM bar (``like``; ``leave`` is not public: the default, False); any
    other progress bar is left alone.
    """

    BAR_FORMAT = "{l_bar}{bar}| {n_fmt}/{total_fmt} env steps [{elapsed}<{remaining}, {rate_noinv_fmt}{postfix}]"
    EPISODES_FORMAT = "{l_bar}{bar}| {n_fmt}/{total_fmt} episodes [{elapsed}<{remaining}{postfix}]"
    COUNT_FORMAT = "{desc}{n_fmt} env steps [{elapsed}, {rate_noinv_fmt}{postfix}]"

    def __init__(self, refresh_rate: int = 1, process_position: int = 0, leave: bool = False) -> None:
        super().__init__(refresh_rate=refresh_rate, process_position=process_position, leave=leave)
        self._total: int | None = None
        self._start = 0
        self._episode_bar: Tqdm | None = None  # the sanity check's, validation's or test's

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

    # ------------------------------------------------------------ evaluation: episodes
    def _evaluation_episodes(self) -> int | None:
        try:
            module = self.trainer.lightning_module
        except TypeError:  # not attached to a Trainer yet
            return None
        episodes = getattr(module, "evaluation_num_episodes", None)
        return int(episodes) if episodes else None

    def _episodes_bar(self, desc: str, position: int, leave: bool) -> Tqdm:
        """A bar of the evaluation's episodes, as Lightning makes its evaluation bars but for the count."""
        bar = Tqdm(desc=desc, total=self._evaluation_episodes(), position=position, disable=self.is_disabled,
                   leave=leave, dynamic_ncols=True, file=sys.stdout, bar_format=self.EPISODES_FORMAT)
        self._episode_bar = bar
        return bar

    def init_sanity_tqdm(self) -> Tqdm:
        if self._evaluation_episodes() is None:
            return super().init_sanity_tqdm()
        return self._episodes_bar(self.sanity_check_description, 2 * self.process_position, leave=False)

    def init_validation_tqdm(self) -> Tqdm:
        if self._evaluation_episodes() is None:
            return super().init_validation_tqdm()
        has_main_bar = self.trainer.state.fn != "validate"  # (as Lightning's: no training bar in validate)
        return self._episodes_bar(self.validation_description, 2 * self.process_position + has_main_bar,
                                  leave=not has_main_bar)

    def init_test_tqdm(self) -> Tqdm:
        if self._evaluation_episodes() is None:
            return super().init_test_tqdm()
        return self._episodes_bar(self.test_description, 2 * self.process_position, leave=True)

    def evaluation_episodes(self, finished: int) -> None:
        """The evaluation in progress finished ``finished`` of its episodes."""
        bar = self._episode_bar
        if bar is not None and not bar.disable and bar.n != finished:
            bar.n = finished
            bar.refresh()

    def _start_episodes(self, bar: Tqdm | None, description: str, dataloader_idx: int) -> bool:
        """Whether ``bar`` counts episodes: then it starts at 0 of the evaluation's episodes (not
        Lightning's one batch)."""
        total = self._evaluation_episodes()
        if bar is None or bar is not self._episode_bar or total is None:
            return False
        if self.has_dataloader_changed(dataloader_idx):
            bar.reset(total=total)
            bar.set_description(f"{description} DataLoader {dataloader_idx}")
        return True

    def _end_episodes(self, bar: Tqdm | None) -> bool:
        """Whether ``bar`` counts episodes: then the evaluation is over and all are finished."""
        if bar is None or bar is not self._episode_bar or bar.total is None:
            return False
        self.evaluation_episodes(int(bar.total))
        return True

    def on_validation_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                                  batch_idx: int, dataloader_idx: int = 0) -> None:
        desc = self.sanity_check_description if trainer.sanity_checking else self.validation_description
        if not self._start_episodes(self._active_bar(testing=False), desc, dataloader_idx):
            super().on_validation_batch_start(trainer, pl_module, batch, batch_idx, dataloader_idx)

    def on_validation_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                                batch_idx: int, dataloader_idx: int = 0) -> None:
        if not self._end_episodes(self._active_bar(testing=False)):
            super().on_validation_batch_end(trainer, pl_module, outputs, batch, batch_idx, dataloader_idx)

    def on_test_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                            batch_idx: int, dataloader_idx: int = 0) -> None:
        if not self._start_episodes(self._active_bar(testing=True), self.test_description, dataloader_idx):
            super().on_test_batch_start(trainer, pl_module, batch, batch_idx, dataloader_idx)

    def on_test_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                          batch_idx: int, dataloader_idx: int = 0) -> None:
        if not self._end_episodes(self._active_bar(testing=True)):
            super().on_test_batch_end(trainer, pl_module, outputs, batch, batch_idx, dataloader_idx)

    def _active_bar(self, testing: bool) -> Tqdm | None:
        try:
            return self.test_progress_bar if testing else self.val_progress_bar
        except TypeError:  # Lightning's property when it made none
            return None
