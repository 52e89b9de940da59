"""Logs learner info as ``learner/<policy_id>/<path>`` each iteration."""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterator, Mapping
from typing import Any

import pytorch_lightning as pl
import torch

from lightning_rl.callbacks.metrics import should_log, stage


def flatten_scalars(tree: Mapping[str, Any], prefix: str) -> Iterator[tuple[str, float]]:
    """``(path, value)`` of every numeric scalar leaf; arrays (``td_error``), ``None`` and text are skipped."""
    for key, value in tree.items():
        path = f"{prefix}/{key}"
        if isinstance(value, Mapping):
            yield from flatten_scalars(value, path)
        elif isinstance(value, numbers.Number) and not isinstance(value, bool):
            yield path, float(value)


LIGHTNING_LOG_EVERY_N_STEPS = 50  # the Trainer's default: what "not set" looks like
LOG_POINTS = 100


def default_log_every_n_steps(total_iterations: int, points: int = LOG_POINTS) -> int:
    """Every ``total_iterations // points`` iterations (at least 1): between ``points`` and
    ``2 * points`` logged points over the run (or every iteration of a shorter run)."""
    return max(1, total_iterations // points)


class LogCadence(pl.Callback):
    """Picks ``trainer.log_every_n_steps`` from the length of the run when the user left it at
    Lightning's default (50, which gives only ~8 points over a default PPO run of ~390 iterations;
    an explicit 50 reads the same and is replaced too). The run's length in iterations is
    ``total_env_steps`` over the env steps of an iteration, measured on the first one (logged
    as the cadence is not known yet), else the Trainer's ``max_steps``/``max_epochs``. Logging
    every iteration is avoided because writing a row costs more than a small-batch iteration."""

    def __init__(self) -> None:
        self.auto: bool | None = None  # decided at the first fit (later fits find our own value)
        self._pending = False
        self._start_steps = 0
        self._iterations = 0

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.auto is None:
            self.auto = trainer.log_every_n_steps == LIGHTNING_LOG_EVERY_N_STEPS
        if not self.auto:
            return
        trainer.log_every_n_steps = 1  # until an iteration's size is known
        self._pending = True
        self._start_steps = pl_module.global_counters[pl_module.budget_counter]
        self._iterations = 0

    def on_train_batch_end(self, trainer: pl.Trainer, *_: Any) -> None:
        self._iterations += 1

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *_: Any) -> None:
        if not self._pending or not self._iterations:
            return
        self._pending = False
        per_iteration = (pl_module.global_counters[pl_module.budget_counter] - self._start_steps) / self._iterations
        lengths = []
        total = getattr(pl_module, "total_env_steps", None)
        if total and per_iteration > 0:
            lengths.append(math.ceil(total / per_iteration))
        if trainer.max_steps > 0:
            lengths.append(trainer.max_steps)
        max_epochs = trainer.fit_loop.max_epochs
        if max_epochs is not None and max_epochs > 0 and math.isfinite(trainer.num_training_batches):
            lengths.append(max_epochs * int(trainer.num_training_batches))
        trainer.log_every_n_steps = (
            default_log_every_n_steps(min(lengths)) if lengths else LIGHTNING_LOG_EVERY_N_STEPS
        )


def reduce_fx_for(path: str) -> str:
    """Across DDP ranks the builder's rules hold: ``min_*`` min, ``max_*`` max, else mean."""
    leaf = path.rsplit("/", 1)[-1]
    if leaf.startswith("min_"):
        return "min"
    if leaf.startswith("max_"):
        return "max"
    return "mean"


class LearnerInfoCallback(pl.Callback):
    """Observes the ``learner_info`` a training step returns and logs its scalars (see ``should_log``)."""

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if not outputs or "learner_info" not in outputs or not should_log(trainer, batch_idx):
            return
        items = [(path, value) for policy_id, info in outputs["learner_info"].items()
                 for path, value in flatten_scalars(info, f"learner/{policy_id}")]
        if trainer.world_size > 1:
            items = reduce_over_ranks(items, pl_module.device)
        stage(trainer, dict(items))


def reduce_over_ranks(items: list[tuple[str, float]], device: torch.device) -> list[tuple[str, float]]:
    """Every rank's values in one ``all_gather`` (not one all-reduce per stat), reduced here by
    ``reduce_fx_for``. Every rank has the same paths: they come from the same algorithm."""
    if not items:  # nothing learned yet: the same on every rank (learning starts on global counters)
        return items
    local = torch.tensor([v for _, v in items], dtype=torch.float64, device=device)
    gathered = torch.empty(torch.distributed.get_world_size() * local.numel(), dtype=local.dtype, device=device)
    torch.distributed.all_gather_into_tensor(gathered, local)  # gloo wants the flat [world * n] layout
    gathered = gathered.view(-1, local.numel())
    reduced = torch.stack([gathered.nanmean(0), gathered.min(0).values, gathered.max(0).values]).tolist()
    row = {"mean": 0, "min": 1, "max": 2}
    return [(path, reduced[row[reduce_fx_for(path)]][i]) for i, (path, _) in enumerate(items)]
