"""Shared helpers: short seeded fits with no loggers or progress output."""

from __future__ import annotations

import logging

import pytest
import pytorch_lightning as pl
import torch

logging.getLogger("pytorch_lightning").setLevel(logging.ERROR)
logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)


def quiet_trainer(**kwargs) -> pl.Trainer:
    """A Trainer that writes nothing unless asked (``logger``/``default_root_dir`` in kwargs)."""
    defaults = dict(
        logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        accelerator="cpu", devices=1,
    )
    return pl.Trainer(**{**defaults, **kwargs})


def fit_iterations(model: pl.LightningModule, iterations: int, **trainer_kwargs) -> pl.Trainer:
    """Run exactly ``iterations`` training iterations (Lightning training steps)."""
    trainer = quiet_trainer(max_epochs=1, limit_train_batches=iterations, **trainer_kwargs)
    trainer.fit(model)
    return trainer


@pytest.fixture(autouse=True)
def _deterministic_torch():
    torch.set_num_threads(1)
    yield
