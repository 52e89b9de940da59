"""The logger a run gets when it names none: TensorBoard when installed, else CSV.

That is Lightning's own default (``Trainer(logger=True)``), but without tensorboard Lightning
prints a notice to install another package (``lightning[extra]``) before falling back to CSV;
the CLI and the examples choose the logger with :func:`default_logger` and print nothing.
"""

from __future__ import annotations

import importlib.util
from os import PathLike

from pytorch_lightning.loggers import CSVLogger, Logger, TensorBoardLogger

__all__ = ["default_logger", "tensorboard_available"]


def tensorboard_available() -> bool:
    """Whether ``TensorBoardLogger`` can write: ``tensorboard`` or ``tensorboardX`` is installed."""
    return any(importlib.util.find_spec(name) is not None for name in ("tensorboard", "tensorboardX"))


def default_logger(save_dir: str | PathLike[str], name: str = "lightning_logs",
                   version: int | str | None = None) -> Logger:
    """``TensorBoardLogger(save_dir, name, version)`` when tensorboard is installed, else
    ``CSVLogger`` with the same folders (``<save_dir>/<name>/version_N``)."""
    cls = TensorBoardLogger if tensorboard_available() else CSVLogger
    return cls(save_dir, name=name, version=version)
