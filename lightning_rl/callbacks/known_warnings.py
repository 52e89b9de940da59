"""Lightning warnings that every run would print and that no user can act on, silenced while a
``fit``/``validate``/``test``/``predict`` runs, each by its exact message."""

from __future__ import annotations

import warnings

import pytorch_lightning as pl

# (category, message regex): what Lightning prints, and why it says nothing to act on
KNOWN_WARNINGS: tuple[tuple[type[Warning], str], ...] = (
    # pytorch_lightning's own pytree helper building torch's deprecated LeafSpec (newer torch):
    # printed when Lightning combines the dataloaders of every run.
    (FutureWarning, r"`isinstance\(treespec, LeafSpec\)` is deprecated"),
    # Learner info is logged on the last iteration of every epoch too (callbacks/learner_info.py),
    # so an epoch shorter than log_every_n_steps loses nothing, unlike what this says.
    (UserWarning, r"The number of training batches \(\d+\) is smaller than the logging interval"),
    # Without evaluation_interval the val loader is empty by design (Algorithm.val_dataloader).
    (UserWarning, r"Total length of `list` across ranks is zero"),
    # Sampling steps envs with the live policy, so it runs in the training process: the advice to
    # add DataLoader workers, and the caveat about __len__ with several of them, do not apply.
    (UserWarning, r"The '\w+' does not have many workers"),
    (UserWarning, r"Your `IterableDataset` has `__len__` defined"),
)


class KnownWarnings(pl.Callback):
    """Installs ``ignore`` filters for :data:`KNOWN_WARNINGS` in ``setup`` and restores the warning
    filters as they were in ``teardown`` (or when the run fails), so nothing outside a Lightning
    run, and no other message, is silenced. Lightning's ``PossibleUserWarning`` is a
    ``UserWarning``."""

    def __init__(self) -> None:
        self._catch: warnings.catch_warnings | None = None

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self._catch is not None:
            return
        self._catch = warnings.catch_warnings()
        self._catch.__enter__()
        for category, message in KNOWN_WARNINGS:
            warnings.filterwarnings("ignore", message=message, category=category)

    def _restore(self) -> None:
        if self._catch is not None:
            catch, self._catch = self._catch, None
            catch.__exit__(None, None, None)

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._restore()

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        self._restore()
